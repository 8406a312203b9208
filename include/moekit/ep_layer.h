// ExpertParallelLayer: one MoE layer whose experts are spread over the ranks
// of a Communicator (docs/design.md §2.5, docs/expert_parallel.md). It runs the
// same layer pipeline as MoeLayer with an expert-parallel prepare/finalize:
// each rank routes its own tokens (logical ids; capture and replay see only
// those), maps every (token, slot) to a physical replica by the token's
// position, dispatches, runs the experts it holds through the oracle's modular
// kernel, combines and reduces.
//
// The communicator's device decides where it runs: host ranks (loopback) run
// the CPU kernels; GPU ranks (NCCL, bf16) run everything on the device, on the
// stream given to forward(), without host synchronization (graph-capturable).
//
// Every call marked "collective" must be made by every rank, in the same
// order. Host ranks: a bad argument on one rank fails the call on every rank
// (that rank's error names the problem; the others say which rank failed),
// and nothing is written. GPU ranks cannot agree without waiting on the host:
// a rank whose arguments are bad takes part with no tokens and returns its
// error; the others' forwards complete normally.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moekit/comm.h"
#include "moekit/config.h"
#include "moekit/eplb.h"
#include "moekit/kernel.h"
#include "moekit/layer.h"
#include "moekit/oracle.h"
#include "moekit/platform.h"
#include "moekit/status.h"

namespace moekit {

class ExpertParallelLayer : public RoutedLayer {
 public:
  // config.parallel: ep_size == dp_size == comm.size(), ep_rank == dp_rank ==
  // comm.rank(), all2all one of nccl | allgather_reducescatter | auto (the
  // oracle's choose_ep_dispatch decides). weights: the full logical weights
  // ([E, ...], host); this rank keeps only the slots `placement` gives it
  // (contiguous when null). Collective: ranks whose configs or placements
  // differ (rank aside) fail with an error showing both.
  static StatusOr<std::unique_ptr<ExpertParallelLayer>> create(const MoeConfig& config, const MoeWeights& weights,
                                                               Communicator& comm,
                                                               const ExpertPlacement* placement = nullptr,
                                                               const Platform& platform = Platform::probe());
  // The same from only this rank's expert weights, as a serving engine loads
  // them: slot_weights.w13 [slots_per_rank, n1, H] and .w2 [slots_per_rank, H, I]
  // hold, slot by slot, the logical experts `placement` gives this rank (an
  // empty slot's entry is ignored); score_bias as in create().
  static StatusOr<std::unique_ptr<ExpertParallelLayer>> create_from_slots(const MoeConfig& config,
                                                                          const MoeWeights& slot_weights,
                                                                          Communicator& comm,
                                                                          const ExpertPlacement& placement,
                                                                          const Platform& platform = Platform::probe());
  ~ExpertParallelLayer();

  // This rank's tokens, as MoeLayer::forward takes them (hidden [M, H] with
  // M <= max_num_tokens, which may differ between ranks), on the
  // communicator's device; forced_ids on the host. GPU ranks: enqueued on
  // `stream` (host ranks ignore it). Collective.
  Status forward(const LayerForwardArgs& args, Stream stream = nullptr) override;

  // As MoeLayer's (RoutedLayer): this rank's tokens' logical ids, and their
  // routing weights, on the communicator's device; bind() sets them when the
  // layer is in a Model. Every routing method on host and GPU ranks can.
  Status set_capture_target(const TensorView& target, const TensorView& router_weights = {}) override;
  const TensorView& capture_target() const override { return capture_target_; }
  const TensorView& router_weights_target() const override { return router_weights_target_; }
  Status capture_supported() const override { return Status::Ok(); }
  Status router_weights_capture_supported() const override { return Status::Ok(); }
  // "ep<N>/backend/kernel" of the kernel that runs this rank's experts.
  std::string producer() const override;

  const MoeConfig& config() const override { return config_; }
  Device device() const override;
  // The experts stage's workspace (RoutedLayer). rebalance() keeps it (host
  // ranks: grown in place when the new placement needs more; GPU ranks: when
  // the placement keeps its slots per rank).
  size_t workspace_bytes() const override;
  const std::shared_ptr<DeviceBuffer>& workspace_buffer() const override;
  Status use_workspace(std::shared_ptr<DeviceBuffer> buffer) override;
  bool has_run() const override;
  const ExpertPlacement& placement() const { return placement_; }
  // "all_to_all" or "allgather_reduce_scatter", and the oracle's reason.
  const char* dispatch_name() const;
  const std::string& dispatch_reason() const { return dispatch_reason_; }
  // The oracle's report for the kernel that runs this rank's experts.
  const std::vector<CandidateReport>& selection_report() const { return report_; }

  // Load counters. expert_load: tokens this rank routed to each logical
  // expert since the last reset ([E]); computed_pairs: (token, slot) pairs
  // this rank's experts computed since the last reset. GPU ranks count on the
  // device: these read it (waiting for the forwards enqueued so far).
  const std::vector<int64_t>& expert_load() const;
  int64_t computed_pairs() const;
  void reset_load();
  // Benchmarks, GPU ranks only: with phase timing on, each eager forward
  // records CUDA events around its phases (not inside a CUDA graph capture),
  // and last_phase_times() reads them (waiting for that forward).
  //   dispatch: replica choice, pack, all-to-all, unpack (after routing)
  //   experts:  the modular kernel on the received rows
  //   combine:  partials back to their source, summed
  struct PhaseTimes {
    double dispatch_us = 0, experts_us = 0, combine_us = 0;
  };
  Status set_phase_timing(bool on);
  StatusOr<PhaseTimes> last_phase_times() const;

  // Collective: the group's expert_load summed over ranks ([E]), and every
  // rank's computed_pairs ([N]).
  StatusOr<std::vector<int64_t>> gather_expert_load();
  StatusOr<std::vector<int64_t>> gather_computed_pairs();

  // Collective: moves to `placement` (e.g. from plan_eplb): the weights of
  // every new slot come from the lowest rank that held that expert, over the
  // communicator (device to device on GPU ranks). Every rank must pass the same
  // placement, covering every logical expert. On a bad placement nothing
  // changes. GPU ranks with the same slots per rank re-prepare in place: the
  // experts' buffers, workspace and dispatch buffers keep their addresses; if
  // that fails the error says so and the layer must be created again. Other
  // placements build the experts stage anew, then swap it in.
  Status rebalance(const ExpertPlacement& placement);

  // Writes new weights of logical expert `logical` (w13 [n1, H], w2 [H, I],
  // the config's weight dtype, host) into every replica this rank holds. Call
  // it on every rank with the same tensors (each updates its own replicas).
  Status update_expert_weights(int64_t logical, const TensorView& w13, const TensorView& w2);

 private:
  struct State;
  ExpertParallelLayer() = default;
  static StatusOr<std::unique_ptr<ExpertParallelLayer>> create_impl(const MoeConfig& config, const MoeWeights& weights,
                                                                    bool weights_are_slots, Communicator& comm,
                                                                    const ExpertPlacement* placement,
                                                                    const Platform& platform);
  Status validate(const LayerForwardArgs& args) const;

  MoeConfig config_;
  Communicator* comm_ = nullptr;
  ExpertPlacement placement_;
  std::string dispatch_reason_;
  std::vector<CandidateReport> report_;
  mutable std::vector<int64_t> expert_load_;  // [E], refreshed from the routing stage's counters when read
  mutable int64_t computed_pairs_ = 0;        // refreshed from the prepare/finalize when read
  TensorView capture_target_;
  TensorView router_weights_target_;  // [>= max_num_tokens, k] f32, optional, only with capture_target_
  std::unique_ptr<State> state_;
};

}  // namespace moekit

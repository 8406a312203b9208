// The GPU path of ExpertParallelLayer (docs/expert_parallel.md "The GPU
// path"), used when the communicator's buffers live on a CUDA device (NCCL):
// device routing (logical ids; capture and replay as on the host path) ->
// dispatch::EpDeviceAllToAll.prepare -> the oracle's cuda modular kernel on
// the received rows (skip_negative_ids: each row's weighted partial sum over
// the experts this rank holds) -> EpDeviceAllToAll.finalize (partials back to
// their source, summed in rank order).
//
// A forward is enqueued on one stream and never allocates or waits on the
// host (forced ids aside: they are uploaded from the host, as MoeLayer does),
// so it can be captured in a CUDA graph.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "eplb/slot_weights.h"
#include "moekit/comm.h"
#include "moekit/config.h"
#include "moekit/eplb.h"
#include "moekit/layer.h"
#include "moekit/oracle.h"
#include "moekit/platform.h"
#include "moekit/status.h"

namespace moekit {

class EpLayerDevicePath {
 public:
  // weights: this rank's slots (host); score_bias: [E] or empty. Not
  // collective: the caller agrees on the result. Unsupported in a build
  // without CUDA, for a non-bf16 config, and on a device other than the current one.
  static StatusOr<std::unique_ptr<EpLayerDevicePath>> create(const MoeConfig& config, const eplb::SlotWeights& weights,
                                                             const ExpertPlacement& placement,
                                                             const std::vector<float>& score_bias, Communicator& comm,
                                                             const Platform& platform);
  ~EpLayerDevicePath();

  // Collective. `verdict` is this rank's validation of `args`: when it is an
  // error the rank takes part with no tokens (the other ranks' tokens still
  // get its experts), writes none of args' outputs and returns the verdict.
  Status forward(const LayerForwardArgs& args, const TensorView& capture_target,
                 const TensorView& router_weights_target, const Status& verdict,
                 Stream stream);

  // The load counters (reads the device: waits for the work enqueued so far).
  Status read_load(std::vector<int64_t>* expert_load, int64_t* computed_pairs) const;
  Status reset_load();
  // Re-prepares the experts from new slot weights (update_expert_weights).
  Status update_weights(const eplb::SlotWeights& weights);

  // ExpertParallelLayer::set_phase_timing / last_phase_times: microseconds of
  // dispatch, experts, combine of the last timed forward.
  Status set_phase_timing(bool on);
  Status last_phase_times(double* dispatch_us, double* experts_us, double* combine_us) const;

  // Why the modular kernel on the received rows was chosen (the oracle's report).
  const std::vector<CandidateReport>& experts_report() const;

 private:
  struct Impl;
  EpLayerDevicePath() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moekit

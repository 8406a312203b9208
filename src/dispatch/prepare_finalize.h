// PrepareFinalize (docs/design.md §1): the stage between routing and the experts.
// prepare turns this rank's routed tokens into the experts stage's input;
// finalize turns the experts' output into the layer output. One interface,
// three implementations:
//   local     one rank: the experts stage reads the layer's rows and writes its
//             output (the kernel widens, reduces and narrows in place);
//   ep host   host ranks (dispatch/ep_host_exchange.h): physical replica per
//             (token, slot), pairs moved to the ranks holding them, outputs
//             moved back and reduced in slot order;
//   ep device GPU ranks (dispatch/ep_device_all_to_all.h): the same on the
//             device, on one stream, never waiting on the host.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dispatch/ep_host_exchange.h"
#include "moekit/comm.h"
#include "moekit/config.h"
#include "moekit/eplb.h"
#include "moekit/kernel.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::dispatch {

// One forward's routed tokens, on the layer's device.
struct RoutedTokens {
  int64_t num_tokens = 0;   // m; 0: an expert-parallel rank without tokens (it still takes part)
  TensorView hidden;        // [m, H] act dtype
  TensorView topk_ids;      // [m, k] i32 logical ids, spec order
  TensorView topk_weights;  // [m, k] f32
};

class PrepareFinalize {
 public:
  virtual ~PrepareFinalize() = default;
  // "local", "all_to_all", "allgather_reduce_scatter".
  virtual const char* name() const = 0;

  // Whether the forward goes on, given `verdict`, this rank's check of its
  // arguments. Local: stops on an error. Host EP (collective): every rank
  // learns of an error on any rank and all stop. Device EP: the host cannot
  // wait for the others, so a rank with bad arguments goes on without tokens
  // (*without_tokens = true; the caller returns its verdict at the end).
  virtual Status admit(const Status& verdict, bool* without_tokens) = 0;
  // The experts stage's input for this rank; its hidden may have 0 rows (the
  // stage is then skipped). out: the layer output [m, H]. Collective for EP.
  virtual StatusOr<MoeRunArgs> prepare(const RoutedTokens& tokens, const TensorView& out, Stream stream) = 0;
  // After the experts stage ran with status `experts`: writes out [m, H], or
  // returns the experts' error. Collective for EP.
  virtual Status finalize(const RoutedTokens& tokens, const Status& experts, const TensorView& out,
                          Stream stream) = 0;

  // (token, slot) pairs this rank's experts were given since the last reset
  // (device EP: reads the device, waiting for the work enqueued so far).
  virtual StatusOr<int64_t> computed_pairs() const = 0;
  virtual Status reset_computed_pairs() = 0;
  // Benchmarks: with timing on, each eager forward records how long prepare,
  // the experts and finalize took (microseconds; device EP only).
  virtual Status set_phase_timing(bool on);
  // EPLB rebalance in place (device EP): a placement with the same slots per
  // rank, given as its replicas(). Others are rebuilt instead (Unsupported).
  virtual Status use_replicas(const std::vector<std::vector<int32_t>>& replicas);
  virtual Status last_phase_times(double* prepare_us, double* experts_us, double* finalize_us) const;
};

std::unique_ptr<PrepareFinalize> make_local_prepare_finalize();

// Adds the layer's shared expert for this rank's tokens to their fp32 routed
// sum y [m, H] (hidden: the rank's rows, act dtype), before the narrowing.
using SharedExpertPass = std::function<void(const TensorView& hidden, int64_t m, float* y)>;

// Host ranks. kind: kNccl (all-to-all) or kAllgatherReducescatter; replicas:
// placement.replicas(). The experts stage gets pairs (k = 1, weight 1, fp32
// rows: outputs unweighted) and finalize reduces them with the routing weights,
// then runs `shared` (when set) on the sum.
StatusOr<std::unique_ptr<PrepareFinalize>> make_ep_host_prepare_finalize(
    Communicator& comm, const EpShape& shape, All2AllBackend kind, const ExpertPlacement& placement,
    const std::vector<std::vector<int32_t>>& replicas, SharedExpertPass shared = {});

// GPU ranks: the layer's shared expert on this rank's tokens, enqueued on the
// stream (hidden: [m, H] bf16 on the device, m >= 1). What the combine adds to
// each token's fp32 sum: gate[t] * out[t] (gate 1 where it is null). Both stay
// valid until the next call.
struct DeviceSharedAddend {
  const uint16_t* out = nullptr;  // [m, H] bf16
  const float* gate = nullptr;    // [m] f32, or null
};
using DeviceSharedExpertPass = std::function<StatusOr<DeviceSharedAddend>(const TensorView& hidden, Stream stream)>;

// GPU ranks (all-to-all, bf16 rows). The experts stage gets the received rows
// with their local slots (skip_negative_ids) and writes each row's weighted
// partial sum; finalize runs `shared` (when set) on this rank's tokens, sends
// the partials back and sums them in rank order, then adds the shared expert.
// Unsupported in a build without CUDA.
StatusOr<std::unique_ptr<PrepareFinalize>> make_ep_device_prepare_finalize(
    Communicator& comm, const EpShape& shape, const ExpertPlacement& placement,
    const std::vector<std::vector<int32_t>>& replicas, DeviceSharedExpertPass shared = {});

}  // namespace moekit::dispatch

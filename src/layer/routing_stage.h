// The routing step of every MoE layer's forward (docs/design.md §1), whatever runs
// the experts: the forward's ids target, the forced-id upload, routing (or the
// caller's ids), the capture of ids and router weights, the expert counts and
// the load counters. Its buffers are allocated once, for max_num_tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "dispatch/prepare_finalize.h"
#include "moekit/config.h"
#include "moekit/device_buffer.h"
#include "moekit/layer.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit {

// A layer buffer of `bytes` on `device`; a failed allocation names the buffer
// and the max_num_tokens that sized it.
StatusOr<DeviceBuffer> allocate_layer_buffer(Device device, const char* what, size_t bytes, int64_t max_num_tokens);

// What bind() set on a layer (RoutedLayer::set_capture_target), on its device.
struct CaptureTargets {
  TensorView ids;             // [>= max_num_tokens, k] i16, optional
  TensorView router_weights;  // [>= max_num_tokens, k] f32, optional, only with ids
};

// One forward's routing result.
struct Routed {
  dispatch::RoutedTokens tokens;  // hidden and, when the stage routes, ids and weights
  TensorView forced_ids;          // [m, k] i32 on the layer's device, or empty (for a kernel that routes)
  TensorView ids_target;          // where this forward's ids go: the call's routing_replay_out, else the bound target
};

class RoutingStage {
 public:
  struct Options {
    bool in_kernel = false;  // a monolithic kernel routes: the stage only uploads forced ids and picks the target
    bool keep_load = false;  // counts every forward's tokens per expert into load counters (EP layers)
  };
  // score_bias: [E] f32 (host or device) iff config.routing.has_score_bias; copied.
  static StatusOr<RoutingStage> create(const MoeConfig& config, Device device, const TensorView& score_bias,
                                       Options options);

  // Routes the first m tokens of args (m = 0: an EP rank without tokens). The
  // args are checked already (check_forward_args). Enqueued on `stream`.
  StatusOr<Routed> run(const LayerForwardArgs& args, int64_t m, const CaptureTargets& capture, Stream stream);
  // After the experts: a call with its own routing_replay_out copies its rows
  // into the bound capture target too.
  Status finish(const LayerForwardArgs& args, int64_t m, const CaptureTargets& capture, Stream stream) const;

  // Tokens routed to each expert since the last reset ([E]; keep_load only;
  // on a GPU it waits for the forwards enqueued so far).
  Status read_load(std::vector<int64_t>* load) const;
  Status reset_load();

  // A new score_bias ([E] f32, host or device; the layer's own iff the config
  // has one), written over the old one after the device finished reading it.
  Status update_score_bias(const TensorView& score_bias);

 private:
  MoeConfig config_;
  Device device_ = Device::cpu();
  Options options_;
  DeviceBuffer topk_ids_;      // [max_num_tokens, k] i32: the router's ids
  DeviceBuffer topk_weights_;  // [max_num_tokens, k] f32
  DeviceBuffer forced_ids_;    // [max_num_tokens, k] i32, CUDA only: forced ids uploaded from the host
  DeviceBuffer score_bias_;    // [E] f32, deepseek_v3 with a bias only
  DeviceBuffer counts_;        // [E] i32, keep_load only: this forward's counts
  DeviceBuffer load_;          // [E] int64, keep_load only
};

}  // namespace moekit

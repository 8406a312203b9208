// Routing on a CUDA device: the spec of docs/routing.md (same ids, same order,
// same tie rule as route_cpu for the same fp32 scores), enqueued on a stream.
//
// route_cuda() validates the views and launches; launch_routing() is the raw
// launcher that kernels routing inside (Sm90Monolithic) call on pointers they
// have validated already.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/config.h"
#include "moekit/routing.h"
#include "moekit/status.h"

namespace moekit::cuda {

// Most selected experts per token the device router handles (one warp lane per slot).
inline constexpr int kMaxDeviceTopk = 32;

// One routing launch on validated device pointers.
struct RoutingLaunch {
  RoutingConfig config;              // method, top_k, deepseek_v3 parameters
  int64_t num_tokens = 0;            // M (0 is allowed: nothing is launched but the counts memset)
  int64_t num_experts = 0;           // E
  const void* logits = nullptr;      // [M, E] f32 | bf16 bits, row-major
  bool logits_bf16 = false;
  const float* score_bias = nullptr;     // [E] f32, optional (deepseek_v3)
  const int32_t* forced_ids = nullptr;   // [M, k] i32, optional: replay
  int32_t* topk_ids = nullptr;           // [M, k] i32, written
  float* topk_weights = nullptr;         // [M, k] f32, written
  int16_t* routing_replay_out = nullptr;         // [>= M, k] i16, optional: rows [0, M) written
  int32_t* expert_counts = nullptr;      // [E] i32, optional: overwritten
};

// The launch of `config` over logits [M, E] (f32 or bf16): M and E from its shape,
// each optional view's pointer or null. The one place a RoutingLaunch is filled.
RoutingLaunch make_routing_launch(const RoutingConfig& config, const TensorView& logits, const float* score_bias,
                                  const TensorView& forced_ids, int32_t* topk_ids, float* topk_weights,
                                  const TensorView& routing_replay_out, int32_t* expert_counts);

// ok, or why the device router cannot serve this configuration.
Status routing_supported(const RoutingConfig& config, int64_t num_experts);

// Enqueues the routing kernel (and the counts reset) on `stream`. No allocation,
// no host synchronization.
Status launch_routing(const RoutingLaunch& launch, cudaStream_t stream);

// The public contract of route_cpu on device views: validates every argument
// (shapes, dtypes, devices) first, then enqueues on `stream`. Content that only
// the device can see follows the device rule of docs/routing.md §7: a row with
// a non-finite logit or biased score gets id -1 and a NaN weight in every slot
// (its layer output is NaN, its capture the sentinel, its counts nothing). Rows
// whose forced ids are out of range or repeated are treated the same way.
Status route_cuda(const RoutingConfig& config, const RoutingArgs& args, cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

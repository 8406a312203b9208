// A layer's shared expert on its own, for expert-parallel GPU ranks: each rank
// runs it on its own tokens (the routed experts run on the tokens dispatched
// to it), and the device combine adds gate * output to the routed sum in fp32
// before the narrowing, where the single-GPU finalize adds it
// (dispatch::DeviceSharedExpertPass). The GEMMs and the gate are the
// single-GPU pipeline's (moe_pipeline.h run_shared_expert).
#pragma once

#include "dispatch/prepare_finalize.h"
#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::cuda {

// config.shared_intermediate > 0; weights: the layer's MoeWeights (only the
// shared_* tensors are read, checked as the sm90 kernels check them). The pass
// owns its prepared weights and a workspace for config.max_num_tokens tokens,
// so a forward allocates nothing and can be captured in a CUDA graph.
// Unsupported in a build without CUDA.
StatusOr<dispatch::DeviceSharedExpertPass> make_sm90_shared_expert_pass(const MoeConfig& config,
                                                                       const MoeWeights& weights, Device device);

}  // namespace moekit::cuda

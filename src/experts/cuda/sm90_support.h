// What sm90_backend.cpp and sm90_kernels.cpp share: the expert-stage shape of a
// config and the support rules both kernel classes check (monolithic: the
// routing runs inside, so custom routing and dispatch are refused).
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include "experts/cuda/moe_pipeline.h"
#include "moekit/config.h"
#include "moekit/oracle.h"
#include "moekit/platform.h"

namespace moekit::cuda {

ExpertsShape sm90_shape_of(const MoeConfig& config);
Support sm90_supports(const MoeConfig& config, const Platform& platform, bool monolithic);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

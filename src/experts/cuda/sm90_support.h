// What the cuda_sm90 files share: the expert-stage shape of a config, the
// pipeline of its quant scheme, and the support rules both kernel classes
// check (monolithic: the routing runs inside, so custom routing and dispatch
// are refused).
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include "experts/cuda/moe_pipeline.h"
#include "moekit/config.h"
#include "moekit/oracle.h"
#include "moekit/platform.h"

namespace moekit::cuda {

ExpertsShape sm90_shape_of(const MoeConfig& config);

// The expert pipeline a quant scheme runs on: bf16 (moe_pipeline.h), fp8
// W8A8 (moe_pipeline_fp8.h) or 4-bit W4A16 (moe_pipeline_weight4.h). Every
// scheme names its pipeline in one exhaustive switch, so a new scheme cannot
// silently take another's path.
enum class Sm90Pipeline { kBf16, kFp8, kWeight4 };
Sm90Pipeline sm90_pipeline_of(QuantMethod method);

// The two CUDA backends run the same kernel classes and pipelines; they differ
// in the devices they take and the GEMM paths those offer (CudaTarget):
//   kSm90      cuda_sm90: sm_90 devices, every path (CUTLASS wgmma/TMA included)
//   kPortable  cuda_sm80: any device from sm_80 on, the paths built from mma.sync,
//              ldmatrix and cp.async (sm_80/sm_89 SASS and PTX for newer GPUs)
enum class CudaBackend : uint8_t { kSm90, kPortable };

// ok when cuda:device_index is the current CUDA device, else an error naming `who`.
Status require_current_device(int device_index, const char* who);
// The current CUDA device's index when `backend` serves it on `platform`, and its target.
StatusOr<int> current_cuda_device(const Platform& platform, CudaBackend backend, CudaTarget* target);
Support cuda_supports(const MoeConfig& config, const Platform& platform, bool monolithic, CudaBackend backend);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

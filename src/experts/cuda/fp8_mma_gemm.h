// The fp8 schemes' tensor-core grouped GEMM on every GPU from sm_80 on: the
// problem and the math of Fp8GemmLaunch (fp8_gemm_cutlass_sm90.h) on mma.sync,
// for cuda_sm80 (and for Hopper in a build without the CUTLASS kernels).
//
// One CTA computes a 128 x 128 tile of one group's output (32 x 128 where
// groups average few rows; batch-invariant launches keep 128), K in 128-deep steps
// (one scale block each) through a 3-stage cp.async pipeline of e4m3 bytes.
// Each K block's products are summed in a partial fp32 accumulator, which is
// then scaled by the row's activation scale and the block's weight scale and
// added into the tile's fp32 sum: the blockwise math of the other fp8 GEMMs.
// The products are exact either way:
//  - kE4m3 (sm_89 on): mma.sync m16n8k32 on the e4m3 bytes themselves;
//  - kF16 (sm_80, sm_86): every e4m3 value is moved into an f16 by bit
//    operations in registers (e4m3 is a subset of f16 up to a power of two,
//    folded into the scale) and multiplied by mma.sync m16n8k16 f16.
// Rows are not gathered here: group g's rows are A's rows from group_start[g]
// on (the pipeline's permuted copy). A setup kernel lists the row tiles of
// the groups on the device, so nothing waits on the host and a graph replays.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "experts/cuda/fp8_gemm_cutlass_sm90.h"
#include "moekit/status.h"

namespace moekit::cuda {

enum class Fp8MmaOperands : uint8_t { kE4m3, kF16 };

// Bytes of Fp8GemmLaunch::workspace for up to `max_rows` rows in `num_groups` groups.
size_t fp8_mma_gemm_workspace_size(int64_t num_groups, int64_t max_rows);
// Enqueues the tile listing and the GEMM on `stream`; launch.max_rows bounds
// the rows of all groups together. kE4m3 needs an sm_89 or later device.
Status fp8_mma_gemm(const Fp8GemmLaunch& launch, Fp8MmaOperands operands, cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

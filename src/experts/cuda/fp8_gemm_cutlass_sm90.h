// The tensor-core GEMM of the fp8 schemes (docs/fp8.md): a CUTLASS 3.x sm90
// grouped GEMM on e4m3 operands with blockwise scaling (TMA loads, fp8 wgmma,
// each 128-deep K block's fp32 partial scaled by its two scales and promoted
// into an fp32 accumulator), f32 output.
//
// Per group g with rows:  for each row r, column n,
//   D[r, n] = sum over K blocks kb of  sa(r, kb) * sb_g(n / 128, kb) * sum_{c in kb} A[r, c] * B_g[n, c]
// Block-128 feeds its scales as they are; per-tensor feeds its single scales
// repeated over the blocks (fp8_expand_weight_scales, the activation quantizer),
// so one kernel serves both schemes.
//
// The grouped problem (shapes, pointers, strides, scale layouts) is written on
// the device from group_start/group_rows by a setup kernel: nothing waits on
// the host, and a CUDA graph of it replays.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "moekit/config.h"
#include "moekit/status.h"

namespace moekit::cuda {

struct Fp8GemmLaunch {
  int num_groups = 0;                    // G
  int n = 0;                             // N
  int k = 0;                             // K, a multiple of 16 (16-byte e4m3 rows for TMA)
  const uint8_t* a = nullptr;            // [rows, K] e4m3: group g's rows start at group_start[g]
  // Group g's activation scales: [ceil(K/128), group_rows[g]] f32 (row index
  // fastest) at a_scale + group_start[g] * ceil(K/128).
  const float* a_scale = nullptr;
  const uint8_t* b = nullptr;            // group g's [N, K] e4m3 at b + g * b_group_stride
  int64_t b_group_stride = 0;            // elements; N * K for a plain [G, N, K]
  const float* b_scale = nullptr;        // [G, ceil(K/128), ceil(N/128)] f32 (N block fastest)
  float* d = nullptr;                    // [rows, ldd] f32, columns [0, N) written for group rows only
  int ldd = 0;                           // a multiple of 4
  const int32_t* group_start = nullptr;  // [G] i32
  const int32_t* group_rows = nullptr;   // [G] i32, may be 0
  int64_t max_rows = 0;                  // rows of all groups together, at most (the mma.sync GEMM's grid)
  void* workspace = nullptr;             // >= fp8_cutlass_gemm_workspace_size(G) bytes, 256-byte aligned
  // The tile: CUTLASS's 64-row ping-pong tiles (the mma.sync GEMM's 32-row ones)
  // when groups average few rows, else 128-row ones; batch_invariant keeps the
  // 128-row tile for every M.
  int64_t mean_group_rows = 0;           // rows / G
  bool batch_invariant = false;
  // sm90_fp8_tile = m128n128 | m64n128 | m32n128 overrides the choice (MoeConfig::kernel
  // with the environment's applied; null: the environment's alone).
  const KernelOptions* kernel = nullptr;
};

// Whether a launch takes its GEMM's small tile (CUTLASS's 64 rows, the mma.sync
// GEMM's 32): sm90_fp8_tile when set (m128n128 the large tile, m64n128 or
// m32n128 the small one), else groups averaging at most `small_max_rows` rows,
// never in batch-invariant mode (one tile for every M).
inline bool fp8_small_tile(const Fp8GemmLaunch& launch, int64_t small_max_rows) {
  const std::string& forced = kernel_options_or_environment(launch.kernel).sm90_fp8_tile;  // validate() checked it
  if (!forced.empty()) return forced != "m128n128";
  return !launch.batch_invariant && launch.mean_group_rows <= small_max_rows;
}

// Whether this build has the kernel (CUTLASS headers found, MOEKIT_CUTLASS_KERNELS on).
bool fp8_cutlass_gemm_built();
size_t fp8_cutlass_gemm_workspace_size(int64_t num_groups);
// Enqueues setup + GEMM on `stream`; no allocation, no host synchronization.
Status fp8_cutlass_gemm(const Fp8GemmLaunch& launch, cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

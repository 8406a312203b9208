// The CUTLASS path of the grouped GEMM (grouped_gemm_sm90.h, kCutlass) for groups
// of prefill size, in two kernel families behind one adapter:
// - cuda_sm90: a CUTLASS 3.x sm90 warp-specialized persistent grouped GEMM (TMA
//   loads, wgmma, fp32 accumulation, per-group shapes read from device memory),
//   grouped_gemm_cutlass_sm90.cuh;
// - any GPU from sm_80 on (cuda_sm80's prefill): a CUTLASS 2.x grouped GEMM
//   (cp.async multistage mainloop, mma.sync, the same device-side problem
//   tables), grouped_gemm_cutlass_sm80.cuh.
//
// Layout "TN": A [rows, K] K-major, B[g] [N, K] K-major, D [rows, N] row-major.
// A tiny setup kernel writes the per-group problem shapes, pointers and strides
// from group_start/group_rows on the device, so nothing waits on the host. What
// the mainloops cannot do is done around them, in the caller's workspace:
//   gather_a      rows of A copied in group order into a [chunk, K] buffer first
//   kActivation   the GEMM writes the pre-activation [chunk, N] bf16, and a
//                 small kernel applies the activation (kGateUpBlock pairs) into C
// Where a problem needs those buffers, its rows are done in chunks so that they
// take at most about C's size for scratch_rows (>= max_rows) rows plus 32 rows per
// group of (N + K): the MoE workspace stays within (M·k + E·64) rows of 2I and of
// H. A gathered A in the caller's gather_room takes none of it.
// Only bf16 output is instantiated (both GEMMs of the MoE pipeline write bf16),
// in four sm90 and two sm80 tile shapes, one per .cu file; and sm90 mixed-input
// kernels for int4 weights in scale groups of 128 (cutlass_weight4_grouped_gemm), where B is
// packed 4-bit weights with a bf16 scale per (weight row, scale group).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/kernel_instances.h"
#include "experts/cuda/grouped_gemm.h"
#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit::cuda {

// The instantiated tiles. sm90: rows x output columns per CTA tile, K 64,
// clusters of 2 CTAs along M sharing the B tile by TMA multicast; or swapped
// (output columns x rows, K 128, no cluster), for groups of a few dozen rows.
// sm80: rows x output columns, K 64, 64x64 per warp, 3 cp.async stages.
enum class CutlassTile : uint8_t {
  kM128N256,      // cooperative: two consumer warpgroups on one 128x256 tile
  kM64N256,       // ping-pong: two consumer warpgroups on alternate 64x256 tiles
  kSwapN32,       // swapped, cooperative: 128 output columns x 32 rows
  kSwapN64,       // swapped, cooperative: 128 output columns x 64 rows
  kSm80M128N256,  // 8 warps, 144 KB of shared memory (A100, Hopper; not RTX cards)
  kSm80M128N128,  // 4 warps, 96 KB (every GPU from sm_80 on)
};
inline constexpr CutlassTile kAllCutlassTiles[] = {CutlassTile::kM128N256,     CutlassTile::kM64N256,
                                                   CutlassTile::kSwapN32,      CutlassTile::kSwapN64,
                                                   CutlassTile::kSm80M128N256, CutlassTile::kSm80M128N128};
static_assert(names_every_value(kAllCutlassTiles, kSm90CutlassNames),
              "one name per instance, in order (core/kernel_instances.h)");
const char* cutlass_tile_name(CutlassTile t);  // "m128_n256", ...
std::optional<CutlassTile> parse_cutlass_tile(std::string_view name);

// True for the CUTLASS 2.x tiles (mma.sync: any GPU from sm_80 on).
constexpr bool is_sm80_cutlass_tile(CutlassTile t) {
  return t == CutlassTile::kSm80M128N256 || t == CutlassTile::kSm80M128N128;
}

// ok, or why the CUTLASS path cannot serve the problem with the target's own
// family (sm90 tiles for kSm90, sm80 tiles for kSm80/kSm89).
Support cutlass_grouped_gemm_supports(const GroupedGemmProblem& problem);
// ok, or why `tile` cannot: the problem's limits above, and the tile's own (sm90
// tiles need target kSm90; sm80 tiles run on any target whose device has their
// shared memory).
Support cutlass_tile_supports(const GroupedGemmProblem& problem, CutlassTile tile);

// Scratch bytes of one launch: setup tables, CUTLASS's own workspace, and the
// gathered A / pre-activation buffers where the problem needs them.
size_t cutlass_grouped_gemm_workspace_size(const GroupedGemmProblem& problem);

// Enqueues setup (+ gather) + GEMM (+ activation) on `stream`. No allocation,
// no host synchronization. Groups with fewer than min_group_rows rows are
// skipped (left to another kernel).
Status cutlass_grouped_gemm(const GroupedGemmProblem& problem, const GroupedGemmArgs& args, CutlassTile tile,
                            cudaStream_t stream, int min_group_rows = 1);

// The 4-bit kernels' tiles: 128 weight rows x this many token rows x 64 of K.
enum class CutlassW4Tile : uint8_t {
  kN128,  // no cluster
  kN256,  // clusters of 2 along the weight rows, sharing the token tile
};

// The 4-bit weights of cutlass_weight4_grouped_gemm (in place of GroupedGemmArgs::b).
struct CutlassWeight4 {
  QuantMethod method = QuantMethod::kInt4G128;  // the schemes cutlass_weight4_grouped_gemm_supports takes
  const uint8_t* packed = nullptr;   // [G, N, K/2]: int4 in two's complement, two a byte, even column in the low nibble
  const uint16_t* scales = nullptr;  // [G, K/group, N] bf16: weight = value · scale (one bf16 rounding)
};

// ok, or why the 4-bit kernel cannot serve the scheme or the problem: int4_g128
// only (the mainloop's K tile of 64 takes one scale per row, so mxfp4's and
// int4_g32's groups of 32 do not fit), K in whole groups.
Support cutlass_weight4_grouped_gemm_supports(const GroupedGemmProblem& problem, QuantMethod method);
size_t cutlass_weight4_grouped_gemm_workspace_size(const GroupedGemmProblem& problem);
// As cutlass_grouped_gemm, with 4-bit weights (weight rows on the 128-wide MMA side).
Status cutlass_weight4_grouped_gemm(const GroupedGemmProblem& problem, const GroupedGemmArgs& args,
                                    const CutlassWeight4& weights, CutlassW4Tile tile, cudaStream_t stream);

// One launch of an instantiated kernel (grouped_gemm_cutlass_sm{90,80}_<tile>.cu):
// for the rows r of each group g inside [row_begin, row_end),
//   D[r - d_row0] = A[r - a_row0] · B[g]ᵀ,  bf16 in, fp32 accumulate, bf16 out
// (4-bit kernels: B[g] converted from packed values and scales).
struct CutlassGemmLaunch {
  int num_groups = 0;                    // G
  int n = 0;                             // N
  int k = 0;                             // K
  int sm_count = 0;                      // the device's SMs (persistent CTAs), <= kCutlassMaxSmCount
  int row_begin = 0, row_end = 0;        // the rows of this launch (a chunk of [0, max_rows))
  int a_row0 = 0, d_row0 = 0;            // the row held by a[0] / d[0]
  const uint16_t* a = nullptr;           // [.., K] bf16
  const void* b = nullptr;               // [G, N, K] bf16; 4-bit kernels: [G, N, K/2] packed
  const uint16_t* b_scale = nullptr;     // 4-bit kernels: [G, K/scale_group, N] bf16
  int scale_group = 0;                   // 4-bit kernels: K columns per scale
  uint16_t* d = nullptr;                 // [.., N] bf16; only the launch's group rows written
  const int32_t* group_start = nullptr;  // [G] i32
  const int32_t* group_rows = nullptr;   // [G] i32, may be 0
  int min_group_rows = 1;                // smaller groups get no tiles
  void* workspace = nullptr;             // >= cutlass_gemm_workspace_size(tile, G, N) bytes, 256-byte aligned
};

// The SM count CUTLASS's workspace (sm90: per-SM TMA descriptors) is sized for:
// a bound, not the device's count (the launch uses min(device SMs, this)).
inline constexpr int kCutlassMaxSmCount = 160;

// Any tile of either family.
size_t cutlass_gemm_workspace_size(CutlassTile tile, int64_t num_groups, int64_t n);
Status cutlass_gemm(CutlassTile tile, const CutlassGemmLaunch& launch, cudaStream_t stream);

namespace sm90 {
// One per instantiation file.
size_t cutlass_m128n256_workspace_size(int64_t num_groups);
Status cutlass_m128n256_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream);
size_t cutlass_m64n256_workspace_size(int64_t num_groups);
Status cutlass_m64n256_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream);
size_t cutlass_swap_n32_workspace_size(int64_t num_groups);
Status cutlass_swap_n32_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream);
size_t cutlass_swap_n64_workspace_size(int64_t num_groups);
Status cutlass_swap_n64_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream);
// Mixed input (int4, bf16 scales), swapped: CutlassW4Tile.
size_t cutlass_w4_int4_n128_workspace_size(int64_t num_groups);
Status cutlass_w4_int4_n128_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream);
size_t cutlass_w4_int4_n256_workspace_size(int64_t num_groups);
Status cutlass_w4_int4_n256_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream);

}  // namespace sm90

namespace sm80 {
// One per instantiation file (grouped_gemm_cutlass_sm80_<tile>.cu). smem_bytes:
// the shared memory per CTA the device must offer; resident_warps: the warps of
// the CTAs one SM of the current device holds at once (0 when it cannot tell).
size_t cutlass_m128n256_workspace_size(int64_t num_groups, int64_t n);
int cutlass_m128n256_smem_bytes();
int cutlass_m128n256_resident_warps();
Status cutlass_m128n256_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream);
size_t cutlass_m128n128_workspace_size(int64_t num_groups, int64_t n);
int cutlass_m128n128_smem_bytes();
int cutlass_m128n128_resident_warps();
Status cutlass_m128n128_gemm(const CutlassGemmLaunch& launch, cudaStream_t stream);
}  // namespace sm80
}  // namespace moekit::cuda

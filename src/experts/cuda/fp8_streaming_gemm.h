// Weight-streaming grouped GEMM on e4m3 operands for decode-size groups (a few
// to ~64 rows per expert): the fp8 twin of streaming_gemm.h, behind the fp8
// pipeline (moe_pipeline_fp8.h).
//
// Per group g with rows, for each row r and output column n:
//   C[r, n] = sum over K blocks kb of  sa(r, kb) * sw_g(n, kb) * sum_{c in kb} A[r, c] * W_g[n, c]
// the same blockwise math as the tensor-core GEMM (fp8_gemm_cutlass_sm90.h),
// on the weights in their checkpoint layout (no re-layout) with the scales of
// MoeWeights (kernel.h). GEMM1 applies the activation in its epilogue (gate and
// up rows of one intermediate column land in one thread), so it writes the
// f32 activation GEMM2's quantizer reads, with no [rows, 2I] f32 round trip.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/kernel_instances.h"
#include "moekit/config.h"
#include "moekit/status.h"

namespace moekit::cuda {

// Instances: warps per CTA (32 weight rows each) x token tile x K per stage
// (whole 128-deep scale blocks) x pipeline stages.
enum class Fp8StreamVariant : uint8_t {
  kW1T8K128S2,   // 1 warp, 8-token tile, K 128, 2 stages (10 KB: 19 CTAs per SM)
  kW1T8K128S3,   // 1 warp, 8-token tile, K 128, 3 stages (15 KB: 13 CTAs per SM)
  kW1T8K256S2,   // 1 warp, 8-token tile, K 256, 2 stages (20 KB: 10 CTAs per SM)
  kW1T16K128S2,  // 1 warp, 16-token tile, K 128, 2 stages (12 KB: 16 CTAs per SM)
  kW1T16K256S2,  // 1 warp, 16-token tile, K 256, 2 stages (24 KB: 8 CTAs per SM)
  kW1T32K256S2,  // 1 warp, 32-token tile, K 256, 2 stages (32 KB: 6 CTAs per SM)
};
inline constexpr Fp8StreamVariant kAllFp8StreamVariants[] = {
    Fp8StreamVariant::kW1T8K128S2,  Fp8StreamVariant::kW1T8K128S3,  Fp8StreamVariant::kW1T8K256S2,
    Fp8StreamVariant::kW1T16K128S2, Fp8StreamVariant::kW1T16K256S2, Fp8StreamVariant::kW1T32K256S2,
};
static_assert(names_every_value(kAllFp8StreamVariants, kSm90Fp8StreamNames),
              "one name per instance, in order (core/kernel_instances.h)");
const char* fp8_stream_variant_name(Fp8StreamVariant v);  // "w1_t8_k128_s2", ...
std::optional<Fp8StreamVariant> parse_fp8_stream_variant(std::string_view name);

struct Fp8StreamGemm {
  QuantMethod method = QuantMethod::kFp8Block128;
  int64_t num_groups = 0;        // G
  int64_t n = 0;                 // weight rows N (gated GEMM1: 2I)
  int64_t k = 0;                 // K, a multiple of 16
  int64_t parts = 1;             // row parts of W (gate, up) for the scale layout
  int64_t max_rows = 0;          // routed rows: at most min(G, max_rows) groups have rows
  // GEMM1's epilogue: the activation (gated kinds pair gate and up rows and write N/2 columns).
  bool activation = false;
  ActivationConfig act;
  // A [*, K] e4m3: group g's row i is A row a_row_index[group_start[g] + i]
  // (or that index itself when null); its scales by row [*, ceil(K/128)].
  const uint8_t* a = nullptr;
  const int32_t* a_row_index = nullptr;
  const float* a_scale = nullptr;
  const uint8_t* b = nullptr;        // [G, N, K] e4m3, checkpoint layout
  const float* b_scale = nullptr;    // MoeWeights layout (block-128 or per-tensor, kernel.h)
  float* c = nullptr;                // [rows, n_out] f32; with K slices, k_splits slices c_split_stride apart
  int64_t k_splits = 1;              // > 1: each slice writes its partial sum (no epilogue)
  int64_t c_split_stride = 0;        // floats
  const int32_t* group_start = nullptr;  // [G]
  const int32_t* group_rows = nullptr;   // [G]
  int64_t n_out() const { return activation && act.gated() ? n / 2 : n; }
};

// K slices that keep the SMs streaming for few CTAs (1: none), on stage
// boundaries, at least 4 K blocks each, at most kMaxFp8StreamKSplits.
inline constexpr int64_t kMaxFp8StreamKSplits = 8;
int64_t fp8_streaming_k_splits(const Fp8StreamGemm& g, Fp8StreamVariant v, int sm_count);

// Enqueues the GEMM; every row of every group is written (columns [0, n_out)).
Status fp8_streaming_gemm(const Fp8StreamGemm& g, Fp8StreamVariant v, cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

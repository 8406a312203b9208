// Weight-streaming grouped GEMM on 4-bit weights (mxfp4, int4_g32, int4_g128)
// with bf16 activations: the decode kernel of the 4-bit pipeline
// (moe_pipeline_weight4.h).
//
// Per group g with rows, for each row r and output column n:
//   C[r, n] = epilogue( sum over scale groups q of  s_g(n, q) * sum_{c in q} A[r, c] * v_g(n, c) )
// where v is the e2m1 value (mxfp4) or the signed nibble (int4), exact in bf16, so
// the tensor cores multiply exact weight values: mxfp4 with its power-of-two
// scale multiplied into the bf16 weight (exact for codes <= kMxfp4FoldMaxCode),
// int4 (and mxfp4 with larger codes) with each scale group's f32 partial scaled once.
// The packed bytes are unpacked in registers straight from shared memory: one
// read of the weights, no dequantized copy.
//
// Weights as prepare_sm90_weights lays them out (sm90_weights.h):
//   b       [G, N, K/2] u8, the checkpoint's bytes (low nibble = even column;
//           int4 re-biased to two's complement, nibble ^ 8, as CUTLASS's int4b_t),
//           W13's rows in the kGateUpBlock order of the bf16 pipeline;
//   b_scale [G, K/group, N]: the scales transposed so a CTA's rows of one scale
//           group are contiguous (u8 E8M0 for mxfp4, f32 for int4), rows permuted
//           like b, and within each block of 32 rows row r stored at
//           (r % 8) * 4 + r / 8, so a lane's 4 rows are one load
//           (weight4_scale_position).
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

// Instances: warps per CTA (32 weight rows each, one gate/up block pair; the
// warps share the token tile) x token tile x K per stage x pipeline stages.
enum class W4StreamVariant : uint8_t {
  kW1T8K128S3,   // 1 warp, 8-token tile, K 128, 3 stages (12 CTAs per SM)
  kW4T8K128S3,   // 4 warps, 8-token tile, K 128, 3 stages (4 CTAs per SM)
  kW4T16K128S3,  // 4 warps, 16-token tile, K 128, 3 stages (4 CTAs per SM)
  kW4T32K128S3,  // 4 warps, 32-token tile, K 128, 3 stages (3 CTAs per SM)
  kW4T64K128S3,  // 4 warps, 64-token tile, K 128, 3 stages (2 CTAs per SM)
};
inline constexpr W4StreamVariant kAllW4StreamVariants[] = {
    W4StreamVariant::kW1T8K128S3, W4StreamVariant::kW4T8K128S3, W4StreamVariant::kW4T16K128S3,
    W4StreamVariant::kW4T32K128S3, W4StreamVariant::kW4T64K128S3};
static_assert(names_every_value(kAllW4StreamVariants, kSm90W4StreamNames),
              "one name per instance, in order (core/kernel_instances.h)");
// mxfp4 layers whose largest E8M0 code is at most this (scales <= 2) multiply the
// scale into the bf16 weights exactly; others scale each group's f32 partial.
inline constexpr int kMxfp4FoldMaxCode = 128;
const char* w4_stream_variant_name(W4StreamVariant v);  // "t8_k128_s4", ...
std::optional<W4StreamVariant> parse_w4_stream_variant(std::string_view name);

// Where scale row r (of N, a multiple of 32) sits within its scale group's row of b_scale.
constexpr int64_t weight4_scale_position(int64_t r) { return r / 32 * 32 + r % 8 * 4 + r % 32 / 8; }

struct W4StreamGemm {
  QuantMethod method = QuantMethod::kMxfp4;
  int64_t num_groups = 0;  // G
  int64_t n = 0;           // weight rows N (gated GEMM1: 2I in the kGateUpBlock order), a multiple of 32
  int64_t k = 0;           // K, a multiple of the scale group
  int64_t max_rows = 0;    // routed rows: at most min(G, max_rows) groups have rows
  // A [*, K] bf16: group g's row i is A row a_row_index[group_start[g] + i] (or that index when null).
  const uint16_t* a = nullptr;
  const int32_t* a_row_index = nullptr;
  const uint8_t* b = nullptr;
  const void* b_scale = nullptr;
  int mxfp4_max_code = 255;  // the largest E8M0 code of b_scale (known when the weights are prepared)
  const float* bias = nullptr;  // [G, N] f32 in b's row order, added before the activation; optional
  // Epilogue: the activation (gated kinds pair gate and up rows and write N/2 columns).
  bool activation = false;
  ActivationConfig act;
  void* c = nullptr;       // [max_rows, n_out]: bf16, or f32 with out_f32 (and always with K slices)
  bool out_f32 = false;
  int64_t k_splits = 1;    // > 1: each slice writes its f32 partial sum, c_split_stride floats apart (no epilogue)
  int64_t c_split_stride = 0;
  const int32_t* group_start = nullptr;  // [G]
  const int32_t* group_rows = nullptr;   // [G]
  int64_t n_out() const { return activation && act.gated() ? n / 2 : n; }
};

// K slices that keep the SMs streaming for few CTAs (1: none), at least 4
// stages each, at most kMaxW4StreamKSplits.
inline constexpr int64_t kMaxW4StreamKSplits = 8;
int64_t w4_streaming_k_splits(const W4StreamGemm& g, W4StreamVariant v, int sm_count);

// ok, or why the kernel cannot serve `g` (method, N, K, a K split with an epilogue).
Status w4_streaming_gemm_check(const W4StreamGemm& g);

// Enqueues the GEMM; every row of every group is written (columns [0, n_out)).
Status w4_streaming_gemm(const W4StreamGemm& g, W4StreamVariant v, cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

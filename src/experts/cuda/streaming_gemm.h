// Host entry of the weight-streaming grouped GEMM (streaming_gemm.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/kernel_instances.h"
#include "experts/cuda/grouped_gemm.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit::cuda::sm90 {

// The instances: weight rows per CTA (slab) x K per pipeline stage x token tile
// (rows multiplied per pass over the slab) x stages. The tile table picks among
// them (grouped_gemm_sm90.cu); the others stay for comparisons (bench --variant).
enum class StreamVariant : uint8_t {
  kRows128K64,       // 4 warps, 128-token tile, 6 stages (one CTA per SM)
  kRows64K64,        // 2 warps, 64-token tile, 4 stages (three CTAs per SM)
  kRows64K64T32,     // 2 warps, 32-token tile, 6 stages (three CTAs per SM)
  kRows32K64T16,     // 1 warp, 16-token tile, 6 stages (six CTAs per SM)
  kRows32K64T16S4,   // 1 warp, 16-token tile, 4 stages (nine CTAs per SM)
  kRows32K64T16S3,   // 1 warp, 16-token tile, 3 stages (twelve CTAs per SM)
  kRows32K64T32,     // 1 warp, 32-token tile, 4 stages (seven CTAs per SM)
  kRows32K128T16,    // 1 warp, 16-token tile, 4 stages of K 128 (four CTAs per SM)
  kRows32K128T16S3,  // 1 warp, 16-token tile, 3 stages of K 128 (six CTAs per SM)
  kRows32K128T16S2,  // 1 warp, 16-token tile, 2 stages of K 128 (nine CTAs per SM)
};
inline constexpr StreamVariant kAllStreamVariants[] = {
    StreamVariant::kRows128K64,      StreamVariant::kRows64K64,        StreamVariant::kRows64K64T32,
    StreamVariant::kRows32K64T16,    StreamVariant::kRows32K64T16S4,   StreamVariant::kRows32K64T16S3,
    StreamVariant::kRows32K64T32,    StreamVariant::kRows32K128T16,    StreamVariant::kRows32K128T16S3,
    StreamVariant::kRows32K128T16S2,
};
static_assert(names_every_value(kAllStreamVariants, kSm90StreamNames),
              "one name per instance, in order (core/kernel_instances.h)");
const char* stream_variant_name(StreamVariant v);  // "rows128_k64", ...
std::optional<StreamVariant> parse_stream_variant(std::string_view name);
int stream_variant_rows(StreamVariant v);
int stream_variant_block_k(StreamVariant v);
int stream_variant_tokens(StreamVariant v);
int stream_variant_smem_bytes(StreamVariant v);  // dynamic shared memory per CTA

// K slices that keep every SM streaming for `problem` with `variant` (1: none):
// enough CTAs for ~4 waves, at most kMaxStreamKSplits, at least 4 K steps each.
// Only for problems a split can serve (no epilogue); see StreamParams::k_splits.
inline constexpr int kMaxStreamKSplits = 8;
int streaming_k_splits(const GroupedGemmProblem& problem, StreamVariant variant, int sm_count);

// ok, or why the variant cannot serve the problem (N, K granules, dtype, sizes,
// a K split without an f32 partial output).
Support streaming_gemm_supports(const GroupedGemmProblem& problem, StreamVariant variant);

// Groups with more than max_group_rows rows are skipped (left to another kernel).
Status streaming_gemm(const GroupedGemmProblem& problem, const GroupedGemmArgs& args, StreamVariant variant,
                      cudaStream_t stream, int max_group_rows = INT32_MAX);

}  // namespace moekit::cuda::sm90

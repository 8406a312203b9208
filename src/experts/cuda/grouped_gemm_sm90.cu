// The tile table of the Hopper grouped GEMM paths (grouped_gemm_sm90.h).
#include "experts/cuda/grouped_gemm_sm90.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include "experts/cuda/grouped_gemm_cutlass.h"
#include "experts/cuda/instance_names.h"
#include "experts/cuda/streaming_gemm.h"

namespace moekit::cuda {
namespace {

// Rows per expert up to which streaming the weights wins. Measured on the H200
// (bench/NOTES.md, v4 A/B): with the one-warp instances, streaming beats the
// m64_n256 CUTLASS tile at 8 rows per expert (DeepSeek-V3 M=256: 5738 vs 5971 us,
// gpt-oss M=256: 1653 vs 1705 us) and loses at 16 (Qwen3 M=256: 548 vs 380 us,
// Mixtral M=64: 1143 vs 878 us). cuda_sm80's CUTLASS 2.x tile, on an H100
// (bench --variant): streaming wins at 8 rows (Qwen3 M=128, DeepSeek-V3 and
// gpt-oss M=256: the tile 1.06-1.17x slower) and at 2-4 (1.05-1.19x); at 16 it splits
// (Mixtral M=64: tile 0.90x, Qwen3 M=256: 1.07x); at 32 the tile wins by far
// (Mixtral M=128 0.62x; DeepSeek-V3, gpt-oss M=1024: 0.73-0.74x).
constexpr int64_t kStreamingMaxRowsPerGroup = 8;
// Above this mean (up to kStreamingMaxRowsPerGroup), groups larger than the
// streaming instance's token tile go to CUTLASS in a second launch: measured on the
// skewed data (bench --skew 1), DeepSeek-V3 M=256 (8 rows per expert on average,
// the busiest ~134) took 3666 us all-streaming against 2092 us all-CUTLASS. At
// smaller means the second launch (~6 more kernels, mostly empty) is not paid.
constexpr int64_t kSplitGroupsAboveRowsPerGroup = 4;

enum class Forced : uint8_t { kAuto, kReference, kStreaming, kCutlass };

Forced forced_path(const KernelOptions& o) {
  if (o.sm90_gemm == "reference") return Forced::kReference;
  if (o.sm90_gemm == "streaming") return Forced::kStreaming;
  if (o.sm90_gemm == "cutlass") return Forced::kCutlass;
  return Forced::kAuto;
}

std::optional<sm90::StreamVariant> forced_variant(const KernelOptions& o) {
  return o.sm90_stream.empty() ? std::nullopt : sm90::parse_stream_variant(o.sm90_stream);
}

// Rows per expert up to which the 64-row ping-pong tile beats the 128-row
// cooperative one (less row padding in the last tile of each group). Measured in
// one process (bench --variant): m64 wins up to 256 rows by 1.1-1.5x, and still at
// 1024 rows (Mixtral M=4096: m64 0.93x, Qwen3 M=16384: 0.96x; gpt-oss M=16384:
// 1.01x); m128 wins at 4096 rows (Mixtral M=16384: m64 1.02x).
constexpr int64_t kCutlassM64MaxRowsPerGroup = 1024;

// Rows per expert up to which a swapped tile (weights on the 128-wide MMA side,
// token rows on the narrow one) beats the 64-row tile. Measured in one process
// (bench --variant, bench/NOTES.md r8): at 16 rows per expert swap_n32 takes
// 0.91x the m64_n256 time (Mixtral-8x7B M=64) and 0.94x (Qwen3-30B-A3B M=256);
// at 32 rows swap_n64 beats swap_n32 (DeepSeek-V3 M=1024: 0.99x, gpt-oss M=1024:
// 0.94x); at 64 rows m64_n256 wins (Mixtral M=256: swap_n64 1.08x of it,
// Qwen3 M=1024: 1.01x).
constexpr int64_t kSwapN32MaxRowsPerGroup = 16;
constexpr int64_t kSwapN64MaxRowsPerGroup = 48;

// Routed rows per group, rounded up, over the groups that can be non-empty.
int64_t mean_rows_per_group(const GroupedGemmProblem& pr) {
  const int64_t groups = std::max<int64_t>(1, std::min(pr.num_groups, pr.max_rows));
  return (pr.max_rows + groups - 1) / groups;
}

#if MOEKIT_HAVE_CUTLASS
std::optional<CutlassTile> forced_cutlass_tile(const KernelOptions& o) {
  return o.sm90_cutlass.empty() ? std::nullopt : parse_cutlass_tile(o.sm90_cutlass);
}

// cuda_sm80's CUTLASS 2.x tile: the forced one if it is of that family and
// fits, else the one that keeps more warps resident per SM, the 128-row x
// 128-column one on a tie. On an H100 both keep 8 (two CTAs of 4 warps, one of
// 8) and the 128x128 tile was 1-3% faster in 12 of the 14 cases of 16 or more rows per
// group (bench --variant); on an A100 (163 KB) it keeps 4, the 128x256 one 8.
CutlassTile sm80_cutlass_tile_for(const GroupedGemmProblem& pr, const KernelOptions& o) {
  if (const auto forced = forced_cutlass_tile(o);
      forced && is_sm80_cutlass_tile(*forced) && cutlass_tile_supports(pr, *forced).ok) {
    return *forced;
  }
  const bool wide_fits = cutlass_tile_supports(pr, CutlassTile::kSm80M128N256).ok;
  return wide_fits && sm80::cutlass_m128n256_resident_warps() > sm80::cutlass_m128n128_resident_warps()
             ? CutlassTile::kSm80M128N256
             : CutlassTile::kSm80M128N128;
}

// The target's one tile where the table does not pick by rows per group (batch
// invariance, the hot groups of a streamed problem).
CutlassTile general_cutlass_tile(const GroupedGemmProblem& pr, const KernelOptions& o) {
  return pr.target == CudaTarget::kSm90 ? CutlassTile::kM64N256 : sm80_cutlass_tile_for(pr, o);
}

CutlassTile cutlass_tile_for(const GroupedGemmProblem& pr, int64_t rows_per_group, const KernelOptions& o) {
  if (pr.target != CudaTarget::kSm90) return sm80_cutlass_tile_for(pr, o);
  if (const auto forced = forced_cutlass_tile(o); forced && cutlass_tile_supports(pr, *forced).ok) return *forced;
  if (rows_per_group <= kSwapN32MaxRowsPerGroup) return CutlassTile::kSwapN32;
  if (rows_per_group <= kSwapN64MaxRowsPerGroup) return CutlassTile::kSwapN64;
  return rows_per_group <= kCutlassM64MaxRowsPerGroup ? CutlassTile::kM64N256 : CutlassTile::kM128N256;
}
#endif

// Large groups no CUTLASS tile serves (a build without CUTLASS, or a problem none takes). While a
// group's rows fit the 32-token tile, that tile streams each expert's weights
// once with three CTAs per SM; beyond it, the widest token tile first, so each
// slab of weights is streamed once per 128 routed rows.
// Timed on an H100 with cuda_sm80 (bench --variant, one process each):
// 32-token tile vs the 128-row one at ~16 rows per group: Mixtral M = 64
// 1055 vs 1579 us (cuda_sm90 989), Qwen3-30B-A3B M = 256 504 vs 787 us; at
// ~32 rows a tie (Mixtral M = 128: 1735 vs 1747); at ~64 rows the 128-row tile
// wins (Mixtral M = 256: 2402 vs 2953).
Sm90GemmChoice wide_streaming_choice(const GroupedGemmProblem& pr, std::string* why_not) {
  using sm90::StreamVariant;
  const int64_t rows_per_group = mean_rows_per_group(pr);
  const bool fits_32 = rows_per_group <= sm90::stream_variant_tokens(StreamVariant::kRows64K64T32);
  Sm90GemmChoice c;
  for (StreamVariant v : {fits_32 ? StreamVariant::kRows64K64T32 : StreamVariant::kRows128K64,
                          StreamVariant::kRows128K64, StreamVariant::kRows64K64}) {
    const Support s = sm90::streaming_gemm_supports(pr, v);
    if (s.ok) {
      c.path = Sm90GemmPath::kStreaming;
      c.variant = v;
      return c;
    }
    *why_not = s.reason;
  }
  return c;  // kReference
}

Sm90GemmChoice streaming_choice(const GroupedGemmProblem& pr, const KernelOptions& o, std::string* why_not) {
  using sm90::StreamVariant;
  Sm90GemmChoice c;
  c.path = Sm90GemmPath::kStreaming;
  if (const auto forced = forced_variant(o); forced && sm90::streaming_gemm_supports(pr, *forced).ok) {
    c.variant = *forced;
    return c;
  }
  // Measured on the H200 in one process (bench --variant; bench/NOTES.md, v4):
  // one-warp CTAs over 32-row slabs, as many per SM as fit, win. With more than one
  // token, K 128 per stage in 2 stages (nine CTAs per SM) is best where K allows
  // (DeepSeek-V3 M=256: 0.87x the 6-stage K 64 instance with 3 stages, 0.93x that
  // with 2), else K 64 in 4 stages (nine per SM; gpt-oss M=256: 0.94x). One token
  // with a long K likes K 64 x 4 stages too (Mixtral M=1: 0.88x); a short K
  // (Qwen3-30B-A3B, K=2048 and 768) wants K 128 in 4 stages (1.15x slower with
  // the nine-per-SM ones).
  constexpr int64_t kOneTokenMaxRows = 16;
  constexpr int64_t kLongK = 4096;
  const bool one_token = pr.max_rows <= kOneTokenMaxRows;
  const StreamVariant first =
      one_token ? (pr.k >= kLongK ? StreamVariant::kRows32K64T16S4 : StreamVariant::kRows32K128T16)
                : StreamVariant::kRows32K128T16S2;
  const int64_t rows_per_group = mean_rows_per_group(pr);
  const StreamVariant order[] = {first,
                                 rows_per_group <= 16 ? StreamVariant::kRows32K64T16S4 : StreamVariant::kRows64K64T32,
                                 StreamVariant::kRows64K64, StreamVariant::kRows128K64};
  for (StreamVariant v : order) {
    const Support s = sm90::streaming_gemm_supports(pr, v);
    if (s.ok) {
      c.variant = v;
      return c;
    }
    *why_not = s.reason;
  }
  c.path = Sm90GemmPath::kReference;
  return c;
}

}  // namespace

const char* sm90_gemm_path_name(Sm90GemmPath p) {
  switch (p) {
    case Sm90GemmPath::kReference: return "reference";
    case Sm90GemmPath::kStreaming: return "streaming";
    case Sm90GemmPath::kCutlass: return "cutlass";
  }
  return "?";
}

const char* cutlass_tile_name(CutlassTile t) {
  return kSm90CutlassNames[static_cast<size_t>(t)];  // in the enum's order (core/kernel_instances.h)
}

std::optional<CutlassTile> parse_cutlass_tile(std::string_view name) {
  return parse_instance_name(kAllCutlassTiles, &cutlass_tile_name, name);
}

std::string Sm90GemmChoice::to_string() const {
  std::ostringstream os;
  os << "Sm90Gemm{" << sm90_gemm_path_name(path);
  if (path == Sm90GemmPath::kStreaming) os << ", " << sm90::stream_variant_name(variant);
  if (cutlass_above_rows > 0) os << ", >" << cutlass_above_rows << " rows: " << cutlass_tile_name(cutlass_tile);
  if (path == Sm90GemmPath::kCutlass) os << ", " << cutlass_tile_name(cutlass_tile);
  if (!reason.empty()) os << ", " << reason;
  os << "}";
  return os.str();
}

Sm90GemmChoice choose_sm90_gemm(const GroupedGemmProblem& pr) {
  // NOTE: batch invariance: one path for every M and rows per group (no streaming
  // for small groups, no CUTLASS split by group size, no K slices, no overrides).
  // Each output element is then one fixed-order K reduction whatever the batch:
  // the CUTLASS tile (no split-K) or else the reference kernel (one block per element tile).
  if (pr.batch_invariant) {
    Sm90GemmChoice c;
#if MOEKIT_HAVE_CUTLASS
    // Depends on N, K, dtypes and the device, never on M.
    const CutlassTile tile = general_cutlass_tile(pr, {});
    if (cutlass_tile_supports(pr, tile).ok) {
      c.path = Sm90GemmPath::kCutlass;
      c.cutlass_tile = tile;
      c.reason = "batch_invariant: one CUTLASS tile for every M";
      return c;
    }
#endif
    c.reason = "batch_invariant: the reference kernel for every M";
    return c;
  }
  const KernelOptions& options = kernel_options_or_environment(pr.kernel);
  const Forced forced = forced_path(options);
  if (pr.k_splits > 1) {  // only the streaming kernel has K slices (grouped_gemm_k_splits asked for them)
    std::string why;
    Sm90GemmChoice c = streaming_choice(pr, options, &why);
    c.reason = c.path == Sm90GemmPath::kStreaming ? std::to_string(pr.k_splits) + " K slices" : "streaming: " + why;
    return c;
  }
  if (forced == Forced::kReference) {
    Sm90GemmChoice c;
    c.reason = "forced by kernel.sm90_gemm";
    return c;
  }
  const int64_t rows_per_group = mean_rows_per_group(pr);
  std::string why_streaming, why_cutlass = "CUTLASS headers were not found at build time";
  // Streaming's fast instances take K in steps of 128. Where K is not a multiple
  // of 128 it falls back to 64-wide steps, and then the swapped CUTLASS tile is
  // faster from a few tokens on (gpt-oss, K = 2880: 0.98x at M=16, 0.95x at M=256).
  // A lone token or two keep streaming: its K slices give GEMM2 the CTAs a
  // handful of CUTLASS tiles would not. cuda_sm80 has no swapped tile: its
  // 128-row tile is slower there (gpt-oss M = 64-256 on an H100: 1.05-1.06x).
  constexpr int64_t kStreamKStep = 128, kFewTokensMaxRows = 16;
  const bool streaming_fits = pr.k % kStreamKStep == 0 || pr.max_rows <= kFewTokensMaxRows ||
                              pr.target != CudaTarget::kSm90 || !sm90_cutlass_supports(pr).ok;
  const bool want_streaming =
      forced == Forced::kStreaming ||
      (forced == Forced::kAuto && rows_per_group <= kStreamingMaxRowsPerGroup && streaming_fits);
  if (want_streaming) {
    Sm90GemmChoice c = streaming_choice(pr, options, &why_streaming);
    if (c.path == Sm90GemmPath::kStreaming) {
      c.reason = "~" + std::to_string(rows_per_group) + " rows per group";
#if MOEKIT_HAVE_CUTLASS
      const int64_t tile = sm90::stream_variant_tokens(c.variant);
      if (forced == Forced::kAuto && rows_per_group > kSplitGroupsAboveRowsPerGroup && pr.max_rows > tile &&
          cutlass_grouped_gemm_supports(pr).ok) {
        c.cutlass_above_rows = tile;
        c.cutlass_tile = general_cutlass_tile(pr, options);
        c.reason += ", groups over " + std::to_string(tile) + " rows on CUTLASS";
      }
#endif
      return c;
    }
  }
#if MOEKIT_HAVE_CUTLASS
  {
    const Support s = cutlass_grouped_gemm_supports(pr);
    if (s.ok) {
      Sm90GemmChoice c;
      c.path = Sm90GemmPath::kCutlass;
      c.cutlass_tile = cutlass_tile_for(pr, rows_per_group, options);
      c.reason = "~" + std::to_string(rows_per_group) + " rows per group";
      return c;
    }
    why_cutlass = s.reason;
  }
#endif
  if (!want_streaming) {  // a large problem the CUTLASS path could not take: streaming is still faster than reference
    Sm90GemmChoice c = forced_variant(options) ? streaming_choice(pr, options, &why_streaming)
                                               : wide_streaming_choice(pr, &why_streaming);
    if (c.path == Sm90GemmPath::kStreaming) {
      c.reason = "CUTLASS path unavailable (" + why_cutlass + ")";
      return c;
    }
  }
  Sm90GemmChoice c;
  c.reason = "streaming: " + why_streaming + "; cutlass: " + why_cutlass;
  return c;
}

int64_t sm90_gemm_k_splits(const GroupedGemmProblem& pr) {
  if (pr.epilogue != GemmEpilogue::kNone || pr.batch_invariant) return 1;
  GroupedGemmProblem whole = pr;  // as the caller would run it unsplit (its output dtype decides the path)
  whole.k_splits = 1;
  const Sm90GemmChoice c = choose_sm90_gemm(whole);
  if (c.path != Sm90GemmPath::kStreaming || c.cutlass_above_rows > 0) return 1;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
    return 1;
  }
  whole.out_dtype = DType::kF32;
  const int splits = sm90::streaming_k_splits(whole, c.variant, sms);
  whole.k_splits = splits;
  return splits > 1 && sm90::streaming_gemm_supports(whole, c.variant).ok ? splits : 1;
}

Support sm90_cutlass_supports(const GroupedGemmProblem& pr) {
#if MOEKIT_HAVE_CUTLASS
  return cutlass_grouped_gemm_supports(pr);
#else
  (void)pr;
  return Support::no("this build has no CUTLASS path (headers not found or MOEKIT_CUTLASS_KERNELS=OFF)");
#endif
}

size_t sm90_gemm_workspace_size(const GroupedGemmProblem& pr) {
#if MOEKIT_HAVE_CUTLASS
  // Sized for the CUTLASS path whenever it could be chosen at run time.
  if (cutlass_grouped_gemm_supports(pr).ok) return cutlass_grouped_gemm_workspace_size(pr);
#endif
  return 0;
}

Status run_sm90_gemm(const Sm90GemmChoice& choice, const GroupedGemmProblem& pr, const GroupedGemmArgs& args,
                     cudaStream_t stream) {
  switch (choice.path) {
    case Sm90GemmPath::kStreaming:
      if (choice.cutlass_above_rows > 0) {
#if MOEKIT_HAVE_CUTLASS
        const int above = static_cast<int>(choice.cutlass_above_rows);
        MOEKIT_RETURN_IF_ERROR(sm90::streaming_gemm(pr, args, choice.variant, stream, above));
        return cutlass_grouped_gemm(pr, args, choice.cutlass_tile, stream, above + 1);
#else
        return Internal("grouped GEMM: a CUTLASS share in a build without CUTLASS");
#endif
      }
      return sm90::streaming_gemm(pr, args, choice.variant, stream);
    case Sm90GemmPath::kCutlass:
#if MOEKIT_HAVE_CUTLASS
      return cutlass_grouped_gemm(pr, args, choice.cutlass_tile, stream);
#else
      return Unsupported("grouped GEMM: this build has no CUTLASS path");
#endif
    case Sm90GemmPath::kReference:
      return InvalidArgument("run_sm90_gemm: the reference path runs in grouped_gemm()");
  }
  return Internal("run_sm90_gemm: unknown path");
}

}  // namespace moekit::cuda

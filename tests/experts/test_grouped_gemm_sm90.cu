// The Hopper grouped GEMM paths (grouped_gemm_sm90.h) against an fp64 GEMM on
// the host: every instance of the weight-streaming kernel, every CUTLASS tile,
// and whatever the tile table picks through grouped_gemm(), over gather on/off,
// every epilogue, bf16/f32 output, empty groups, skewed and odd group sizes,
// groups larger than one token tile, and rows between groups that must stay
// untouched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "experts/cuda/grouped_gemm.h"
#include "experts/cuda/grouped_gemm_sm90.h"
#include "experts/cuda/streaming_gemm.h"
#include "moekit/dtype.h"
#include "util/test_util.h"

namespace moekit::cuda {
namespace {

bool has_sm90() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  cudaDeviceProp p{};
  return cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major == 9;
}

struct Case {
  int groups, n, k;
  bool gather;
  GemmEpilogue epilogue;
  Activation act;
  DType out;
  int max_group_rows;  // rows per group drawn from [0, max_group_rows]
  bool skewed = false;  // group 0 takes 4 x max_group_rows + 1 rows, the rest as drawn
};

double act_ref(Activation a, double g, double u) {
  switch (a) {
    case Activation::kSiluGated: return g / (1.0 + std::exp(-g)) * u;
    case Activation::kGeluGated: return 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    case Activation::kSwigluOai: {
      const double gc = std::min(g, 7.0), uc = std::max(-7.0, std::min(u, 7.0));
      return gc / (1.0 + std::exp(-1.702 * gc)) * (uc + 1.0);
    }
    case Activation::kRelu2: return g > 0 ? g * g : 0.0;
  }
  return 0.0;
}

// path: 1 + a streaming variant's index; 0 = grouped_gemm() (the table's choice);
// -1 - i = CUTLASS tile kAllCutlassTiles[i]. k_splits > 1 (streaming only, no
// epilogue): C holds f32 partials per K slice, and their sum is what is checked.
// target kSm80: the table's choice as cuda_sm80 makes it.
void run_case(const Case& c, int path, int k_splits = 1, CudaTarget target = CudaTarget::kSm90) {
  std::mt19937_64 rng(testing::seed_from({c.groups, c.n, c.k, c.gather, static_cast<int>(c.epilogue),
                                          static_cast<int>(c.act), static_cast<int>(c.out), c.max_group_rows,
                                          c.skewed, path, k_splits}));
  // Groups with a gap of 2 untouched rows after each.
  std::vector<int32_t> start(c.groups), rows(c.groups);
  std::uniform_int_distribution<int> rows_dist(0, c.max_group_rows);
  int64_t total = 0;
  for (int g = 0; g < c.groups; ++g) {
    rows[g] = (g % 3 == 1) ? 0 : rows_dist(rng);
    if (c.skewed && g == 0) rows[g] = 4 * c.max_group_rows + 1;
    start[g] = static_cast<int32_t>(total);
    total += rows[g] + 2;
  }
  const int64_t max_rows = total;
  const int64_t a_rows = c.gather ? 37 : max_rows;
  std::vector<int32_t> row_index(max_rows);
  std::uniform_int_distribution<int> src_dist(0, static_cast<int>(a_rows) - 1);
  for (auto& r : row_index) r = c.gather ? src_dist(rng) : 0;

  std::vector<double> a_exact, b_exact;
  HostTensor a = testing::random_tensor(rng, DType::kBF16, {a_rows, c.k}, 1.0, &a_exact);
  HostTensor b = testing::random_tensor(rng, DType::kBF16, {c.groups, c.n, c.k}, 1.0 / std::sqrt(c.k), &b_exact);

  GroupedGemmProblem pr;
  pr.num_groups = c.groups;
  pr.max_rows = max_rows;
  pr.a_rows = a_rows;
  pr.n = c.n;
  pr.k = c.k;
  pr.out_dtype = k_splits > 1 ? DType::kF32 : c.out;
  pr.target = target;
  pr.k_splits = k_splits;
  pr.gather_a = c.gather;
  pr.epilogue = c.epilogue;
  pr.activation.kind = c.act;
  const int64_t n_out = pr.n_out();
  const size_t out_elem = dtype_size(pr.out_dtype);
  const int64_t slice = max_rows * n_out;  // elements per K slice

  void *d_a, *d_b, *d_c, *d_ws;
  int32_t *d_start, *d_rows, *d_index;
  const size_t ws_bytes = std::max<size_t>(256, grouped_gemm_workspace_size(pr));
  ASSERT_EQ(cudaMalloc(&d_a, a.nbytes()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_b, b.nbytes()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_c, k_splits * slice * out_elem), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_ws, ws_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_start, c.groups * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_rows, c.groups * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_index, max_rows * 4), cudaSuccess);
  cudaMemcpy(d_a, a.data<uint8_t>(), a.nbytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_b, b.data<uint8_t>(), b.nbytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_start, start.data(), c.groups * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_rows, rows.data(), c.groups * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_index, row_index.data(), max_rows * 4, cudaMemcpyHostToDevice);
  cudaMemset(d_c, 0xff, k_splits * slice * out_elem);  // NaN poison

  GroupedGemmArgs args;
  args.a = static_cast<const uint16_t*>(d_a);
  args.a_row_index = c.gather ? d_index : nullptr;
  args.b = static_cast<const uint16_t*>(d_b);
  args.c = d_c;
  args.group_start = d_start;
  args.group_rows = d_rows;
  args.workspace = d_ws;
  Status st;
  if (path == 0) {
    st = grouped_gemm(pr, args, nullptr);
  } else if (path > 0) {
    st = sm90::streaming_gemm(pr, args, sm90::kAllStreamVariants[path - 1], nullptr);
  } else {
    Sm90GemmChoice choice;
    choice.path = Sm90GemmPath::kCutlass;
    choice.cutlass_tile = kAllCutlassTiles[-1 - path];
    st = run_sm90_gemm(choice, pr, args, nullptr);
  }
  ASSERT_TRUE(st.ok()) << st.to_string() << " for " << pr.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> out(k_splits * slice * out_elem);
  cudaMemcpy(out.data(), d_c, out.size(), cudaMemcpyDeviceToHost);
  for (void* p : {d_a, d_b, d_c, d_ws, static_cast<void*>(d_start), static_cast<void*>(d_rows),
                  static_cast<void*>(d_index)}) {
    cudaFree(p);
  }

  auto value = [&](int64_t i) -> double {
    if (pr.out_dtype == DType::kF32) {
      double sum = 0;
      for (int s = 0; s < k_splits; ++s) {
        float f;
        std::memcpy(&f, out.data() + 4 * (s * slice + i), 4);
        sum += f;
      }
      return sum;
    }
    uint16_t h;
    std::memcpy(&h, out.data() + 2 * i, 2);
    return bf16_bits_to_f32(h);
  };
  std::vector<double> got, want;
  std::vector<char> in_group(max_rows, 0);
  const bool gated = c.epilogue == GemmEpilogue::kActivation && pr.activation.gated();
  for (int g = 0; g < c.groups; ++g) {
    for (int r = start[g]; r < start[g] + rows[g]; ++r) {
      in_group[r] = 1;
      const int64_t src = c.gather ? row_index[r] : r;
      auto dot = [&](int64_t n) {
        double s = 0;
        for (int kk = 0; kk < c.k; ++kk) s += a_exact[src * c.k + kk] * b_exact[(int64_t(g) * c.n + n) * c.k + kk];
        return s;
      };
      for (int64_t col = 0; col < n_out; ++col) {
        double ref;
        if (gated) {
          // NOTE: kGateUpBlock layout (grouped_gemm.h).
          const int64_t pair = col / kGateUpBlock, m = col % kGateUpBlock;
          ref = act_ref(c.act, dot(2 * kGateUpBlock * pair + m), dot(2 * kGateUpBlock * pair + kGateUpBlock + m));
        } else {
          ref = dot(col);
          if (c.epilogue == GemmEpilogue::kActivation) ref = act_ref(c.act, ref, 0.0);
        }
        want.push_back(ref);
        got.push_back(value(r * n_out + col));
      }
    }
  }
  // Outputs are rounded once (bf16: relative 2^-9 per element, ~1e-3 in L2) after an fp32
  // sum of exact bf16 products (relative ~1e-6 for these K), so bf16 must land under 4e-3
  // and f32 under 1e-4; a wrong row, column or group gives O(1), a NaN gives inf.
  // With an activation epilogue the CUTLASS tiles round the pre-activation to bf16
  // too, and the activation scales that error by its relative condition number
  // (2 for relu2's x^2, ~1 for silu(g)*u in each input): sqrt(2^2 + 1) roundings'
  // worth, ~3.6e-3 in L2 (one relu2 case measured 4.01e-3); 6e-3 still flags any
  // wrong element pattern.
  const double bf16_bound = c.epilogue == GemmEpilogue::kActivation ? 6e-3 : 4e-3;
  const double bound = pr.out_dtype == DType::kF32 ? 1e-4 : bf16_bound;
  const double err = testing::rel_l2_error(got, want);
  EXPECT_LE(err, bound) << pr.to_string() << " path " << path;
  // Rows outside every group keep the poison bits.
  int touched = 0;
  for (int s = 0; s < k_splits; ++s) {
    for (int64_t r = 0; r < max_rows; ++r) {
      if (in_group[r]) continue;
      for (int64_t col = 0; col < n_out; ++col) {
        for (size_t byte = 0; byte < out_elem; ++byte) {
          touched += out[(s * slice + r * n_out + col) * out_elem + byte] != 0xff;
        }
      }
    }
  }
  EXPECT_EQ(touched, 0) << "bytes written outside the groups, " << pr.to_string();
}

class GroupedGemmSm90 : public ::testing::TestWithParam<Case> {};

// Every streaming instance: run where its N and K granules fit, else it must refuse.
TEST_P(GroupedGemmSm90, StreamingVariantsMatchFp64) {
  if (!has_sm90()) GTEST_SKIP() << "needs an sm_90 device";
  const Case c = GetParam();
  for (int i = 0; i < static_cast<int>(std::size(sm90::kAllStreamVariants)); ++i) {
    const sm90::StreamVariant v = sm90::kAllStreamVariants[i];
    SCOPED_TRACE(sm90::stream_variant_name(v));
    if (c.n % sm90::stream_variant_rows(v) == 0 && c.k % sm90::stream_variant_block_k(v) == 0) {
      run_case(c, i + 1);
      continue;
    }
    GroupedGemmProblem pr;
    pr.num_groups = c.groups;
    pr.max_rows = 8;
    pr.a_rows = 8;
    pr.n = c.n;
    pr.k = c.k;
    EXPECT_FALSE(sm90::streaming_gemm_supports(pr, v).ok) << pr.to_string();
  }
}

// Every CUTLASS tile, forced: bf16 output runs, f32 output must be refused.
TEST_P(GroupedGemmSm90, CutlassTilesMatchFp64) {
  if (!has_sm90()) GTEST_SKIP() << "needs an sm_90 device";
  const Case c = GetParam();
  GroupedGemmProblem pr;
  pr.num_groups = c.groups;
  pr.max_rows = 8;
  pr.a_rows = 8;
  pr.n = c.n;
  pr.k = c.k;
  pr.out_dtype = c.out;
  const Support s = sm90_cutlass_supports(pr);
  if (!s.ok && s.reason.find("this build has no CUTLASS path") != std::string::npos) GTEST_SKIP() << s.reason;
  if (c.out == DType::kF32) {
    EXPECT_FALSE(s.ok) << pr.to_string();
    return;
  }
  ASSERT_TRUE(s.ok) << s.reason << " for " << pr.to_string();
  for (int i = 0; i < static_cast<int>(std::size(kAllCutlassTiles)); ++i) {
    SCOPED_TRACE(cutlass_tile_name(kAllCutlassTiles[i]));
    run_case(c, -1 - i);
  }
}

TEST_P(GroupedGemmSm90, TableChoiceMatchesFp64) {
  if (!has_sm90()) GTEST_SKIP() << "needs an sm_90 device";
  run_case(GetParam(), 0);
}

// The portable backend's table (streaming, the sm80 CUTLASS tiles, the reference kernel) on the same cases.
TEST_P(GroupedGemmSm90, Sm80TableChoiceMatchesFp64) {
  if (!has_sm90()) GTEST_SKIP() << "needs an sm_90 device";
  run_case(GetParam(), 0, 1, CudaTarget::kSm80);
}

constexpr auto kNone = GemmEpilogue::kNone;
constexpr auto kAct = GemmEpilogue::kActivation;
INSTANTIATE_TEST_SUITE_P(
    Shapes, GroupedGemmSm90,
    ::testing::Values(
        // decode-like: few rows per group, gathered, gated
        Case{8, 256, 128, true, kAct, Activation::kSiluGated, DType::kBF16, 4},
        Case{5, 128, 768, true, kAct, Activation::kSiluGated, DType::kBF16, 70},
        Case{4, 192, 576, false, kNone, Activation::kSiluGated, DType::kBF16, 33},
        Case{16, 128, 192, true, kAct, Activation::kSwigluOai, DType::kBF16, 9},
        Case{6, 384, 256, true, kAct, Activation::kGeluGated, DType::kF32, 20},
        // GEMM2-like: not gathered, no epilogue, N a multiple of 64 only
        Case{8, 320, 128, false, kNone, Activation::kSiluGated, DType::kBF16, 5},
        Case{4, 256, 64, false, kNone, Activation::kSiluGated, DType::kF32, 40},
        // groups larger than one token tile (64 / 128 rows): the slab is streamed again
        Case{3, 256, 128, true, kAct, Activation::kSiluGated, DType::kBF16, 300},
        Case{3, 128, 128, false, kAct, Activation::kRelu2, DType::kBF16, 150},
        // prefill-like rows per group (the table may pick another path)
        Case{4, 256, 256, true, kAct, Activation::kSiluGated, DType::kBF16, 700},
        Case{4, 256, 256, false, kNone, Activation::kSiluGated, DType::kBF16, 700},
        // CUTLASS-size groups: several M and N tiles, partial tiles in N and K, odd row
        // counts, one group far larger than the rest, every activation
        Case{6, 544, 200, true, kAct, Activation::kSiluGated, DType::kBF16, 301, true},
        Case{5, 320, 1032, false, kNone, Activation::kSiluGated, DType::kBF16, 257, true},
        Case{9, 512, 136, true, kAct, Activation::kSwigluOai, DType::kBF16, 133},
        Case{4, 288, 264, true, kAct, Activation::kGeluGated, DType::kBF16, 387},
        Case{3, 264, 128, false, kAct, Activation::kRelu2, DType::kBF16, 515},
        Case{40, 256, 96, true, kAct, Activation::kSiluGated, DType::kBF16, 3, true},
        // ~6 rows per group on average with one group of 41: the table streams the small
        // groups and gives the large one to CUTLASS (Sm90GemmChoice::cutlass_above_rows)
        Case{32, 256, 128, true, kAct, Activation::kSiluGated, DType::kBF16, 10, true},
        Case{32, 256, 128, false, kNone, Activation::kSiluGated, DType::kBF16, 10, true}));

// K slices (GEMM2 at decode sizes, grouped_gemm_k_splits): every streaming
// instance whose granules fit, with 2 and 3 slices (uneven where the K steps do
// not divide), the slices' f32 partials summed on the host.
class GroupedGemmSm90KSlices : public ::testing::TestWithParam<Case> {};

TEST_P(GroupedGemmSm90KSlices, StreamingMatchesFp64) {
  if (!has_sm90()) GTEST_SKIP() << "needs an sm_90 device";
  const Case& c = GetParam();
  int ran = 0;
  for (size_t i = 0; i < std::size(sm90::kAllStreamVariants); ++i) {
    const auto v = sm90::kAllStreamVariants[i];
    if (c.n % sm90::stream_variant_rows(v) != 0 || c.k % sm90::stream_variant_block_k(v) != 0) continue;
    for (int splits : {2, 3}) {
      if (splits > c.k / sm90::stream_variant_block_k(v)) continue;
      SCOPED_TRACE(std::string(sm90::stream_variant_name(v)) + " x" + std::to_string(splits));
      run_case(c, static_cast<int>(i) + 1, splits);
      ++ran;
    }
  }
  EXPECT_GT(ran, 0) << "no streaming instance takes K slices of this case";
}

INSTANTIATE_TEST_SUITE_P(
    Gemm2Shapes, GroupedGemmSm90KSlices,
    ::testing::Values(Case{4, 192, 576, false, kNone, Activation::kSiluGated, DType::kBF16, 33},
                      Case{8, 320, 128, false, kNone, Activation::kSiluGated, DType::kBF16, 5},
                      Case{7, 128, 448, false, kNone, Activation::kSiluGated, DType::kBF16, 6},  // 7 K steps
                      Case{5, 256, 768, false, kNone, Activation::kSiluGated, DType::kBF16, 40, true},
                      Case{3, 256, 1280, false, kNone, Activation::kSiluGated, DType::kBF16, 2}));

// Batch-invariant problems: the path table gives one path (and tile) for every
// M and every rows-per-group, and never K slices. Host-only: no device needed.
TEST(GroupedGemmSm90Table, BatchInvariantIsOnePathForEveryM) {
  for (const bool gemm1 : {true, false}) {
    std::string first;
    for (int64_t m : {1, 2, 5, 16, 64, 128, 256, 1000, 4096, 16384}) {
      GroupedGemmProblem pr;
      pr.num_groups = 64;
      pr.max_rows = m * 8;
      pr.a_rows = gemm1 ? m : pr.max_rows;
      pr.n = gemm1 ? 2 * 768 : 2048;
      pr.k = gemm1 ? 2048 : 768;
      pr.gather_a = gemm1;
      pr.epilogue = gemm1 ? GemmEpilogue::kActivation : GemmEpilogue::kNone;
      pr.batch_invariant = true;
      const Sm90GemmChoice c = choose_sm90_gemm(pr);
      EXPECT_EQ(c.cutlass_above_rows, 0) << m;
      EXPECT_EQ(sm90_gemm_k_splits(pr), 1) << m;
      const std::string path = c.to_string();
      if (first.empty()) first = path;
      EXPECT_EQ(path, first) << "M=" << m;
    }
  }
}

// cuda_sm80's table never picks an sm90 CUTLASS tile (wgmma, TMA), at any M. With
// CUTLASS built it hands groups of more than 8 rows to a CUTLASS 2.x (sm80) tile
// and, batch-invariant, takes that tile for every M; without it, the wide
// streaming tiles and the reference kernel. Host-only.
TEST(GroupedGemmSm90Table, Sm80TargetTakesOnlySm80CutlassTiles) {
  for (const bool invariant : {false, true}) {
    std::string first;
    for (int64_t m : {1, 4, 16, 64, 128, 256, 1024, 4096, 16384}) {
      GroupedGemmProblem pr;
      pr.num_groups = 8;
      pr.max_rows = m * 2;
      pr.a_rows = m;
      pr.n = 2 * 1024;
      pr.k = 4096;
      pr.gather_a = true;
      pr.epilogue = GemmEpilogue::kActivation;
      pr.batch_invariant = invariant;
      GroupedGemmProblem on_sm90 = pr;
      const bool cutlass_built = sm90_cutlass_supports(on_sm90).ok;
      pr.target = CudaTarget::kSm80;
      const Sm90GemmChoice c = choose_sm90_gemm(pr);
      const std::string plan = "M=" + std::to_string(m) + ": " + c.to_string();
      if (c.path == Sm90GemmPath::kCutlass) EXPECT_TRUE(is_sm80_cutlass_tile(c.cutlass_tile)) << plan;
      EXPECT_EQ(c.cutlass_above_rows, 0) << plan;
      EXPECT_EQ(sm90_gemm_workspace_size(pr) > 0, cutlass_built) << plan;
      if (invariant) {
        EXPECT_EQ(c.path, cutlass_built ? Sm90GemmPath::kCutlass : Sm90GemmPath::kReference) << plan;
        if (first.empty()) first = c.to_string();
        EXPECT_EQ(c.to_string(), first) << "M=" << m;
      } else if (std::getenv("MOEKIT_SM90_GEMM") == nullptr && std::getenv("MOEKIT_SM90_CUTLASS") == nullptr) {
        // Up to ~8 rows per group (M <= 16) stream; ~16 rows and more (M >= 64) take the
        // CUTLASS tile, or without it the 32-token streaming tile up to ~32 rows
        // (M = 64, 128) and the widest streaming tile above.
        if (m <= 16) EXPECT_EQ(c.path, Sm90GemmPath::kStreaming) << plan;
        if (m >= 64 && cutlass_built) EXPECT_EQ(c.path, Sm90GemmPath::kCutlass) << plan;
        if ((m == 64 || m == 128) && !cutlass_built) EXPECT_NE(plan.find("rows64_k64_t32"), std::string::npos) << plan;
        if (m >= 256 && !cutlass_built) EXPECT_NE(plan.find("rows128_k64"), std::string::npos) << plan;
      }
    }
  }
}

}  // namespace
}  // namespace moekit::cuda

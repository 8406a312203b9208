// The packed expert GEMMs (packed_bf16_gemm.h), bf16 and f32 weights, against
// an fp64 product of the same values (fp32 A), element by element, on shapes that
// do not fill the packed layout: N not a multiple of the panel width, odd K,
// 1..33 rows per expert, experts without rows, lda > K, ldc > N.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "experts/cpu/packed_bf16_gemm.h"
#include "util/test_util.h"

namespace moekit::cpu {
namespace {

using moekit::testing::random_tensor;
using moekit::testing::seed_from;

// Per element: c is K fp32 FMAs (one rounding each, of product plus sum), so
// by the standard dot-product bound
//   |c - ref| <= gamma_K * sum_k |a_k w_k|,  gamma_K = K u / (1 - K u), u = 2^-24.
// (K + 1) u is above gamma_K for every K here. A layout bug (a wrong weight or
// row) is off by O(|a| |w|), far outside this.
double element_bound(int64_t K, double abs_sum) { return double(K + 1) * 0x1.0p-24 * abs_sum; }

// The weight dtype of a test: bf16 (PackedBf16Weights) or f32 (PackedF32Weights).
template <typename T>
constexpr DType kWeightDtype = std::is_same_v<T, float> ? DType::kF32 : DType::kBF16;

struct Case {
  int64_t N, K;
  std::vector<int32_t> rows;  // rows per expert
};

template <typename T>
void run_case(const Case& cs) {
  const int64_t E = static_cast<int64_t>(cs.rows.size()), N = cs.N, K = cs.K;
  const int64_t lda = K + 2;  // a row's tail [K, lda) must not be read into the product
  const int64_t ldc = N + 3;  // columns [N, ldc) must stay untouched
  std::vector<int32_t> offsets(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + cs.rows[e];
  const int64_t R = offsets[E];
  int64_t rows_key = 0;  // the row counts in order, folded into the seed
  for (int32_t r : cs.rows) rows_key = rows_key * 37 + r;
  std::mt19937_64 rng(seed_from({N, K, E, rows_key, static_cast<int64_t>(kWeightDtype<T>)}));

  std::vector<double> w_exact, a_exact;
  HostTensor w = random_tensor(rng, kWeightDtype<T>, {E, N, K}, 1.0, &w_exact);  // [E, N, K]
  HostTensor a = random_tensor(rng, DType::kF32, {R, lda}, 1.0, &a_exact);   // [R, lda] f32
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t k = K; k < lda; ++k) a.data<float>()[r * lda + k] = std::nanf("");
  }

  PackedWeights<T> packed;
  packed.assign(w.data<T>(), E, N, K);
  ASSERT_EQ(packed.panels(), (N + PackedBf16Layout::kPanelCols - 1) / PackedBf16Layout::kPanelCols);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t p = 0; p < packed.panels(); ++p) {
      ASSERT_EQ(reinterpret_cast<uintptr_t>(packed.panel(e, p)) % 64, 0u) << "panel " << e << ", " << p;
    }
  }

  const float kPoison = std::nanf("");
  std::vector<float> c(static_cast<size_t>(R * ldc), kPoison);  // [R, ldc] f32
  std::vector<int32_t> active(E);
  grouped_gemm_packed(a.data<float>(), lda, offsets.data(), packed, c.data(), ldc, active.data());

  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0.0, abs_sum = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = a_exact[r * lda + k] * w_exact[(e * N + n) * K + k];
          ref += p;
          abs_sum += std::fabs(p);
        }
        const double got = c[r * ldc + n];
        ASSERT_LE(std::fabs(got - ref), element_bound(K, abs_sum))
            << "expert " << e << ", row " << r << ", col " << n << ": got " << got << ", fp64 " << ref;
      }
      for (int64_t n = N; n < ldc; ++n) ASSERT_TRUE(std::isnan(c[r * ldc + n])) << "column " << n << " >= N written";
    }
  }
}

template <typename T>
class PackedGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU has neither AVX-512 nor AVX2 with FMA";
  }
};
using WeightTypes = ::testing::Types<uint16_t, float>;
TYPED_TEST_SUITE(PackedGemm, WeightTypes);

// One expert, every row count 1..33 (every register tile height, and splits
// into two and three tiles), on a shape with a partial panel and odd K.
TYPED_TEST(PackedGemm, EveryRowCount) {
  for (int32_t rows = 1; rows <= 33; ++rows) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    run_case<TypeParam>({45, 37, {rows}});
  }
}

// Several experts (some without rows) over shapes around the panel width and
// its 16-column halves: N in {1, 15, 16, 17, 31, 32, 33, 70}, K in {1, 2, 3, 64, 129}.
TYPED_TEST(PackedGemm, OddShapesAndEmptyExperts) {
  for (int64_t N : {1, 15, 16, 17, 31, 32, 33, 70}) {
    for (int64_t K : {1, 2, 3, 64, 129}) {
      SCOPED_TRACE("N " + std::to_string(N) + ", K " + std::to_string(K));
      run_case<TypeParam>({N, K, {3, 0, 17, 1, 0, 33}});
    }
  }
}

// No rows at all: nothing to do, nothing written.
TYPED_TEST(PackedGemm, NoRows) { run_case<TypeParam>({33, 7, {0, 0, 0}}); }

}  // namespace
}  // namespace moekit::cpu

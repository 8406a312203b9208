// CPU routing (route_cpu) against the fp64 reference over a grid of methods and
// shapes, plus the spec's tie rule on hand-derived cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moekit/routing.h"
#include "reference/reference.h"
#include "routing/routing_test_common.h"
#include "util/reference_params.h"
#include "util/test_util.h"

namespace moekit::routing_test {
namespace {

// Tolerance for weights, fp32 backend vs fp64 reference: |w - ref| <= kAtol + kRtol * |ref|.
// The backend sums up to E = 256 exponentials in fp32 one by one; the recursive
// summation bound is (E - 1) * 2^-24 ~= 1.5e-5 relative, plus a few ulp for exp,
// the argument rounding of (x - max) and the division. Inputs are exact in both
// (bf16 widens exactly). Sigmoid-based weights are within ~4 ulp. The atol only
// covers weights so small that their relative error is meaningless (< 1e-7).
constexpr double kRtol = 2e-5;
constexpr double kAtol = 1e-7;

// Logits spacing of the tie-free rows: 1/32 is exact in bf16 for up to 256
// levels (8 significant bits) and keeps |logit| <= 6, where sigmoid is far
// from saturating in fp32 (so deepseek_v3's fp32 scores stay distinct).
constexpr double kGap = 1.0 / 32.0;

struct GridCase {
  RoutingMethod method;
  int64_t M;
  int64_t E;
  int k;
  DType dtype;
  int groups = 1;
  int topk_groups = 1;
  float scaling = 1.0f;
  bool bias = false;
  bool renormalize = true;  // deepseek_v3 norm_topk_prob

  RoutingConfig config() const {
    RoutingConfig c;
    c.method = method;
    c.top_k = k;
    c.num_groups = groups;
    c.topk_groups = topk_groups;
    c.routed_scaling_factor = scaling;
    c.has_score_bias = bias;
    c.renormalize = renormalize;
    return c;
  }
  std::string name() const {
    std::string n = std::string(routing_method_name(method)) + "_M" + std::to_string(M) + "_E" + std::to_string(E) +
                    "_k" + std::to_string(k) + "_" + dtype_name(dtype);
    if (method == RoutingMethod::kDeepseekV3) {
      n += "_g" + std::to_string(groups) + "tg" + std::to_string(topk_groups) + "s" +
           std::to_string(static_cast<int>(scaling * 10)) + (bias ? "_bias" : "_nobias");
      if (!renormalize) n += "_norenorm";
    }
    return n;
  }
};

std::vector<GridCase> grid_cases() {
  std::vector<GridCase> cases;
  const RoutingMethod plain[] = {RoutingMethod::kSoftmaxTopk, RoutingMethod::kRenormalize,
                                 RoutingMethod::kRenormalizeNaive, RoutingMethod::kTopk,
                                 RoutingMethod::kSigmoid, RoutingMethod::kSigmoidRenorm,
                                 RoutingMethod::kLlama4};
  struct Groups {
    int groups, topk_groups;
    float scaling;
  };
  const Groups ds_groups[] = {{1, 1, 1.0f}, {2, 1, 1.0f}, {4, 2, 2.5f}, {8, 4, 1.5f}};
  for (int64_t M : {1, 7, 64, 513}) {
    for (int64_t E : {8, 64, 256}) {
      for (int k : {1, 2, 8}) {
        for (DType dt : {DType::kF32, DType::kBF16}) {
          for (RoutingMethod m : plain) {
            GridCase c{m, M, E, k, dt};
            if (c.config().validate(static_cast<int>(E)).ok()) cases.push_back(c);
          }
          for (const Groups& g : ds_groups) {
            for (bool bias : {false, true}) {
              GridCase c{RoutingMethod::kDeepseekV3, M, E, k, dt, g.groups, g.topk_groups, g.scaling, bias};
              if (c.config().validate(static_cast<int>(E)).ok()) cases.push_back(c);
            }
          }
          // norm_topk_prob = false: one grouped, biased, scaled setting suffices
          // (the flag only skips the division).
          GridCase plain_w{RoutingMethod::kDeepseekV3, M, E, k, dt, 4, 2, 2.5f, true, false};
          if (plain_w.config().validate(static_cast<int>(E)).ok()) cases.push_back(plain_w);
        }
      }
    }
  }
  return cases;
}

// First mismatch of ids, or "" when equal.
std::string compare_ids(const std::vector<int32_t>& got, const std::vector<int32_t>& want, int k) {
  if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return "ids[" + std::to_string(i / k) + ", " + std::to_string(i % k) + "] = " + std::to_string(got[i]) +
             ", reference " + std::to_string(want[i]);
    }
  }
  return "";
}

std::string compare_weights(const std::vector<float>& got, const std::vector<double>& want, int k) {
  return routing_test::compare_weights(got, want, k, kAtol, kRtol);
}

class RoutingGrid : public ::testing::TestWithParam<GridCase> {};

TEST_P(RoutingGrid, MatchesReference) {
  const GridCase c = GetParam();
  const RoutingConfig cfg = c.config();
  std::mt19937_64 rng(testing::seed_from({static_cast<int64_t>(c.method), c.M, c.E, c.k, static_cast<int64_t>(c.dtype),
                                          c.groups, c.topk_groups, static_cast<int64_t>(c.scaling * 10), c.bias,
                                          c.renormalize ? 0 : 7}));
  std::vector<double> bias;
  HostTensor bias_t;
  if (c.bias) bias_t = testing::random_tensor(rng, DType::kF32, {c.E}, 0.1, &bias);
  std::vector<double> exact;
  HostTensor logits = routing_logits(rng, cfg, c.dtype, c.M, c.E, kGap, bias, &exact);
  const moekit_ref::RoutingParams params = testing::ref_routing(cfg, bias);

  // 1. Selection.
  RouteBuffers buf(std::move(logits), c.k);
  if (c.bias) buf.bias = bias_t;
  ASSERT_TRUE(route_cpu(cfg, buf.args()).ok());
  const moekit_ref::RoutingResult ref = moekit_ref::route(params, exact, c.M, c.E);
  const auto ids = copy_out<int32_t>(buf.ids);
  const auto weights = copy_out<float>(buf.weights);
  EXPECT_EQ(compare_ids(ids, ref.ids, c.k), "");
  EXPECT_EQ(compare_weights(weights, ref.weights, c.k), "");
  EXPECT_EQ(copy_out<int32_t>(buf.counts), ref.counts);
  // Capture rows [0, M) hold the ids; the rows beyond M keep their poison.
  const auto cap = copy_out<int16_t>(buf.replay);
  for (int64_t i = 0; i < c.M * c.k; ++i) ASSERT_EQ(cap[i], ids[i]) << "routing_replay_out element " << i;
  for (size_t i = c.M * c.k; i < cap.size(); ++i) ASSERT_EQ(cap[i], 0x7fff) << "routing_replay_out row past M written";

  // 2. Replaying the selected ids reproduces ids and weights bit for bit.
  RouteBuffers again(buf.logits, c.k);
  if (c.bias) again.bias = bias_t;
  again.forced = HostTensor(DType::kI32, {c.M, c.k});
  std::copy(ids.begin(), ids.end(), again.forced.data<int32_t>());
  ASSERT_TRUE(route_cpu(cfg, again.args()).ok());
  EXPECT_EQ(copy_out<int32_t>(again.ids), ids);
  const auto replayed = copy_out<float>(again.weights);
  EXPECT_EQ(std::memcmp(replayed.data(), weights.data(), weights.size() * sizeof(float)), 0)
      << "replayed weights differ from the original ones";

  // 3. Arbitrary forced ids: the method's weights at those ids.
  RouteBuffers forced(buf.logits, c.k);
  if (c.bias) forced.bias = bias_t;
  forced.forced = HostTensor(DType::kI32, {c.M, c.k});
  const std::vector<int32_t> fids = random_forced_ids(rng, c.M, c.E, c.k);
  std::copy(fids.begin(), fids.end(), forced.forced.data<int32_t>());
  ASSERT_TRUE(route_cpu(cfg, forced.args()).ok());
  const moekit_ref::RoutingResult fref = moekit_ref::route(params, exact, c.M, c.E, fids);
  EXPECT_EQ(copy_out<int32_t>(forced.ids), fids);
  EXPECT_EQ(compare_weights(copy_out<float>(forced.weights), fref.weights, c.k), "");
  EXPECT_EQ(copy_out<int32_t>(forced.counts), fref.counts);
}

INSTANTIATE_TEST_SUITE_P(Cpu, RoutingGrid, ::testing::ValuesIn(grid_cases()),
                         [](const ::testing::TestParamInfo<GridCase>& info) { return info.param.name(); });

// ---- Hand-derived cases: the tie rule, group scores, bias, selection keys.

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route_f32(const RoutingConfig& cfg, const std::vector<float>& row_major, int64_t M, int64_t E,
                 const std::vector<float>& bias = {}) {
  HostTensor logits(DType::kF32, {M, E});
  std::copy(row_major.begin(), row_major.end(), logits.data<float>());
  RouteBuffers buf(std::move(logits), cfg.top_k);
  if (!bias.empty()) {
    buf.bias = HostTensor(DType::kF32, {E});
    std::copy(bias.begin(), bias.end(), buf.bias.data<float>());
  }
  const Status st = route_cpu(cfg, buf.args());
  EXPECT_TRUE(st.ok()) << st.to_string();
  return {copy_out<int32_t>(buf.ids), copy_out<float>(buf.weights)};
}

std::vector<int32_t> ref_ids(const RoutingConfig& cfg, const std::vector<float>& row_major, int64_t M, int64_t E,
                             const std::vector<float>& bias = {}) {
  return moekit_ref::route(testing::ref_routing(cfg, std::vector<double>(bias.begin(), bias.end())),
                           std::vector<double>(row_major.begin(), row_major.end()), M, E)
      .ids;
}

RoutingConfig make_cfg(RoutingMethod m, int k, int groups = 1, int topk_groups = 1, bool bias = false) {
  RoutingConfig c;
  c.method = m;
  c.top_k = k;
  c.num_groups = groups;
  c.topk_groups = topk_groups;
  c.has_score_bias = bias;
  return c;
}

const RoutingMethod kAllMethods[] = {RoutingMethod::kSoftmaxTopk,   RoutingMethod::kRenormalize,
                                     RoutingMethod::kRenormalizeNaive, RoutingMethod::kTopk,
                                     RoutingMethod::kSigmoid,       RoutingMethod::kSigmoidRenorm,
                                     RoutingMethod::kLlama4,        RoutingMethod::kDeepseekV3};

TEST(RoutingTies, AllEqualLogitsPickLowestIndices) {
  // Every score equal: the spec orders by expert index, so ids are 0, 1, 2.
  for (RoutingMethod m : kAllMethods) {
    SCOPED_TRACE(routing_method_name(m));
    const RoutingConfig cfg = make_cfg(m, 3);
    const std::vector<float> logits(2 * 8, 0.75f);
    const Routed got = route_f32(cfg, logits, 2, 8);
    EXPECT_EQ(got.ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
    EXPECT_EQ(got.ids, ref_ids(cfg, logits, 2, 8));
  }
  // Weights of equal scores, by the formulas: softmax over 8 -> 1/8; renormalized -> 1/3.
  EXPECT_FLOAT_EQ(route_f32(make_cfg(RoutingMethod::kSoftmaxTopk, 3), std::vector<float>(8, 0.75f), 1, 8).weights[1],
                  0.125f);
  EXPECT_FLOAT_EQ(route_f32(make_cfg(RoutingMethod::kRenormalize, 3), std::vector<float>(8, 0.75f), 1, 8).weights[2],
                  1.0f / 3.0f);
  // deepseek_v3 with groups: all group scores tie -> groups 0, 1 kept (lower index first).
  const RoutingConfig ds = make_cfg(RoutingMethod::kDeepseekV3, 3, 4, 2);
  EXPECT_EQ(route_f32(ds, std::vector<float>(8, -1.0f), 1, 8).ids, (std::vector<int32_t>{0, 1, 2}));
}

TEST(RoutingTies, EqualPairsOrderedByIndex) {
  // 3 at experts 1, 2, 4; 2 at experts 3, 6.
  const std::vector<float> logits = {1, 3, 3, 2, 3, 0, 2, 1};
  for (RoutingMethod m : kAllMethods) {
    if (m == RoutingMethod::kDeepseekV3) continue;  // grouped cases below
    SCOPED_TRACE(routing_method_name(m));
    const RoutingConfig cfg = make_cfg(m, 5);
    const Routed got = route_f32(cfg, logits, 1, 8);
    EXPECT_EQ(got.ids, (std::vector<int32_t>{1, 2, 4, 3, 6}));
    EXPECT_EQ(got.ids, ref_ids(cfg, logits, 1, 8));
    // Equal logits get bitwise-equal weights.
    EXPECT_EQ(got.weights[0], got.weights[1]);
    EXPECT_EQ(got.weights[3], got.weights[4]);
  }
  // deepseek_v3 without groups: the same order (sigmoid keeps equal values equal).
  const RoutingConfig ds = make_cfg(RoutingMethod::kDeepseekV3, 5);
  EXPECT_EQ(route_f32(ds, logits, 1, 8).ids, (std::vector<int32_t>{1, 2, 4, 3, 6}));
}

TEST(RoutingTies, DeepseekGroupTiesPickLowerGroup) {
  // 4 groups of 2: g0 = {0.5, -1}, g1 = {2, -3}, g2 = g0, g3 = g1.
  // Group scores (sum of both sigmoids): g1 = g3 ~= 0.928 > g0 = g2 ~= 0.891.
  const std::vector<float> logits = {0.5f, -1, 2, -3, 0.5f, -1, 2, -3};
  struct Want {
    int topk_groups, k;
    std::vector<int32_t> ids;
  };
  const Want wants[] = {
      {1, 2, {2, 3}},     // only g1 (g3 ties it and loses on index)
      {2, 2, {2, 6}},     // g1, g3; experts 2 and 6 tie, lower index first
      {3, 3, {2, 6, 0}},  // g1, g3, and g0 wins its tie with g2
      {3, 5, {2, 6, 0, 1, 3}},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE("topk_groups=" + std::to_string(w.topk_groups) + " k=" + std::to_string(w.k));
    const RoutingConfig cfg = make_cfg(RoutingMethod::kDeepseekV3, w.k, 4, w.topk_groups);
    EXPECT_EQ(route_f32(cfg, logits, 1, 8).ids, w.ids);
    EXPECT_EQ(ref_ids(cfg, logits, 1, 8), w.ids);
  }
}

TEST(RoutingTies, DeepseekGroupScoreIsTopTwoSum) {
  // g0 holds the single best expert (logit 3) but g1's top-2 sum is larger:
  // s(3) + s(-5) ~= 0.959 < s(1) + s(1) ~= 1.462. topk_groups = 1 keeps g1.
  const std::vector<float> logits = {3, -5, 1, 1};
  const RoutingConfig cfg = make_cfg(RoutingMethod::kDeepseekV3, 1, 2, 1);
  EXPECT_EQ(route_f32(cfg, logits, 1, 4).ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(ref_ids(cfg, logits, 1, 4), (std::vector<int32_t>{2}));
}

TEST(RoutingSpec, DeepseekBiasSelectsButNeverWeighs) {
  // b = s + bias: b0 = s(1) ~= 0.731, b1 = s(0) + 0.5 = 1.0 -> expert 1.
  // w = s[1] / s[1] * scaling = scaling: the bias is absent from the weight.
  RoutingConfig cfg = make_cfg(RoutingMethod::kDeepseekV3, 1, 1, 1, /*bias=*/true);
  cfg.routed_scaling_factor = 2.5f;
  const std::vector<float> logits = {1, 0, 0, 0};
  const std::vector<float> bias = {0, 0.5f, 0, 0};
  const Routed got = route_f32(cfg, logits, 1, 4, bias);
  EXPECT_EQ(got.ids, (std::vector<int32_t>{1}));
  EXPECT_EQ(got.weights, (std::vector<float>{2.5f}));
  EXPECT_EQ(ref_ids(cfg, logits, 1, 4, bias), (std::vector<int32_t>{1}));
  // k = 2: ids {1, 0}; w = (s(0), s(1)) / (s(0) + s(1)) * 2.5.
  cfg.top_k = 2;
  const Routed two = route_f32(cfg, logits, 1, 4, bias);
  EXPECT_EQ(two.ids, (std::vector<int32_t>{1, 0}));
  const double s0 = 0.5, s1 = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_NEAR(two.weights[0], s0 / (s0 + s1) * 2.5, 1e-6);
  EXPECT_NEAR(two.weights[1], s1 / (s0 + s1) * 2.5, 1e-6);
}

TEST(RoutingSpec, SelectionKeyIsTheLogit) {
  // fp32 sigmoid(20) and sigmoid(25) are both exactly 1.0f, and fp32 softmax
  // underflows exp(-150) and exp(-200) to 0. The spec ranks by the logit, so the
  // larger logit still wins instead of the lower index.
  const std::vector<float> sig = {20, 25, 0, 0};
  for (RoutingMethod m : {RoutingMethod::kSigmoid, RoutingMethod::kSigmoidRenorm, RoutingMethod::kLlama4}) {
    SCOPED_TRACE(routing_method_name(m));
    EXPECT_EQ(route_f32(make_cfg(m, 1), sig, 1, 4).ids, (std::vector<int32_t>{1}));
  }
  const std::vector<float> soft = {0, -200, -150, -300};
  for (RoutingMethod m : {RoutingMethod::kSoftmaxTopk, RoutingMethod::kRenormalizeNaive}) {
    SCOPED_TRACE(routing_method_name(m));
    const RoutingConfig cfg = make_cfg(m, 3);
    EXPECT_EQ(route_f32(cfg, soft, 1, 4).ids, (std::vector<int32_t>{0, 2, 1}));
    EXPECT_EQ(ref_ids(cfg, soft, 1, 4), (std::vector<int32_t>{0, 2, 1}));
  }
}

TEST(RoutingSpec, UnderflowedRenormalizationIsUniform) {
  // Forced experts whose fp32 scores all underflow to 0: the sum is 0, and the
  // spec gives 1/k instead of 0/0 = NaN.
  HostTensor logits(DType::kF32, {1, 4});
  const float row[] = {0.0f, -200.0f, -300.0f, -250.0f};
  std::copy(row, row + 4, logits.data<float>());
  for (RoutingMethod m : {RoutingMethod::kRenormalizeNaive, RoutingMethod::kSigmoidRenorm,
                          RoutingMethod::kDeepseekV3}) {
    SCOPED_TRACE(routing_method_name(m));
    RouteBuffers buf(logits, 2);
    buf.forced = HostTensor(DType::kI32, {1, 2});
    buf.forced.data<int32_t>()[0] = 2;
    buf.forced.data<int32_t>()[1] = 3;
    ASSERT_TRUE(route_cpu(make_cfg(m, 2), buf.args()).ok());
    EXPECT_EQ(copy_out<float>(buf.weights), (std::vector<float>{0.5f, 0.5f}));
  }
}

TEST(RoutingSpec, AllNegativeLogits) {
  // Every logit in [-64, -0.25], bf16-exact (multiples of 1/4 with <= 8 significant bits).
  for (RoutingMethod m : kAllMethods) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(routing_method_name(m)) + " " + dtype_name(dt));
      const int64_t M = 33, E = 64;
      const int k = 4;
      std::mt19937_64 rng(testing::seed_from({static_cast<int64_t>(m), static_cast<int64_t>(dt), 77}));
      RoutingConfig cfg = make_cfg(m, k);
      if (m == RoutingMethod::kDeepseekV3) {
        cfg.num_groups = 8;
        cfg.topk_groups = 2;
      }
      // deepseek_v3 ranks fp32 sigmoids: spacing 1/4 keeps them apart in [-16, -0.25].
      const float step = m == RoutingMethod::kDeepseekV3 ? 0.25f : 1.0f;
      HostTensor logits(dt, {M, E});
      std::vector<int> perm(E);
      std::vector<double> row(E);
      for (int64_t r = 0; r < M; ++r) {
        do {
          std::iota(perm.begin(), perm.end(), 1);
          std::shuffle(perm.begin(), perm.end(), rng);
          for (int64_t e = 0; e < E; ++e) row[e] = -step * perm[e];
        } while (m == RoutingMethod::kDeepseekV3 && !deepseek_row_separated(cfg, E, row.data(), {}));
        for (int64_t e = 0; e < E; ++e) {
          const float v = static_cast<float>(row[e]);
          if (dt == DType::kF32) logits.data<float>()[r * E + e] = v;
          else logits.data<uint16_t>()[r * E + e] = f32_to_bf16_bits(v);
        }
      }
      const std::vector<double> exact = testing::to_double(logits.view());
      RouteBuffers buf(std::move(logits), k);
      ASSERT_TRUE(route_cpu(cfg, buf.args()).ok());
      const moekit_ref::RoutingResult ref = moekit_ref::route(testing::ref_routing(cfg, {}), exact, M, E);
      EXPECT_EQ(compare_ids(copy_out<int32_t>(buf.ids), ref.ids, k), "");
      EXPECT_EQ(compare_weights(copy_out<float>(buf.weights), ref.weights, k), "");
    }
  }
}

TEST(RoutingSpec, ResultDoesNotDependOnBatching) {
  // 513 rows routed at once (several threads) equal the rows routed one by one.
  const RoutingConfig cfg = make_cfg(RoutingMethod::kDeepseekV3, 8, 8, 4, false);
  const int64_t M = 513, E = 256;
  std::mt19937_64 rng(testing::seed_from({513, 256, 8}));
  HostTensor logits = testing::random_tensor(rng, DType::kBF16, {M, E}, 1.0);
  RouteBuffers all(logits, 8);
  ASSERT_TRUE(route_cpu(cfg, all.args()).ok());
  for (int64_t r = 0; r < M; ++r) {
    HostTensor one(DType::kBF16, {1, E});
    std::memcpy(one.data<uint16_t>(), logits.data<uint16_t>() + r * E, E * sizeof(uint16_t));
    RouteBuffers single(std::move(one), 8);
    ASSERT_TRUE(route_cpu(cfg, single.args()).ok());
    ASSERT_EQ(std::memcmp(single.ids.data<int32_t>(), all.ids.data<int32_t>() + r * 8, 8 * sizeof(int32_t)), 0);
    ASSERT_EQ(std::memcmp(single.weights.data<float>(), all.weights.data<float>() + r * 8, 8 * sizeof(float)), 0);
  }
}

TEST(RoutingSpec, CountsAreOverwritten) {
  const RoutingConfig cfg = make_cfg(RoutingMethod::kRenormalize, 2);
  const std::vector<float> logits = {5, 4, 0, 0, /**/ 0, 5, 4, 0, /**/ 0, 0, 4, 5};
  HostTensor t(DType::kF32, {3, 4});
  std::copy(logits.begin(), logits.end(), t.data<float>());
  RouteBuffers buf(std::move(t), 2);
  std::fill_n(buf.counts.data<int32_t>(), 4, 100);  // stale values from an earlier call
  ASSERT_TRUE(route_cpu(cfg, buf.args()).ok());
  EXPECT_EQ(copy_out<int32_t>(buf.counts), (std::vector<int32_t>{1, 2, 2, 1}));
}

TEST(RoutingSpec, ZeroRowsOnlyZeroTheCounts) {
  // M = 0 is a valid call (views need a non-null pointer to count as given).
  float logit_storage = 0.0f;
  int32_t id_storage = 0x7fffffff;
  float weight_storage = std::nanf("");
  std::vector<int32_t> counts(8, 5);
  RoutingArgs args;
  args.logits = TensorView::contiguous(&logit_storage, DType::kF32, {0, 8});
  args.topk_ids = TensorView::contiguous(&id_storage, DType::kI32, {0, 2});
  args.topk_weights = TensorView::contiguous(&weight_storage, DType::kF32, {0, 2});
  args.expert_counts = TensorView::contiguous(counts.data(), DType::kI32, {8});
  ASSERT_TRUE(route_cpu(make_cfg(RoutingMethod::kSoftmaxTopk, 2), args).ok());
  EXPECT_EQ(counts, std::vector<int32_t>(8, 0));
  EXPECT_EQ(id_storage, 0x7fffffff);
  EXPECT_TRUE(std::isnan(weight_storage));
}

}  // namespace
}  // namespace moekit::routing_test

// CPU MoE kernels (CpuModular, CpuMonolithic): bitwise agreement with each
// other, agreement with the fp64 reference over a shape grid, capture/replay,
// and a clear error (with nothing written) for every bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "experts/cpu/cpu_modular.h"
#include "experts/cpu/cpu_monolithic.h"
#include "moekit/routing.h"
#include "reference/reference.h"
#include "util/reference_params.h"
#include "util/test_util.h"

namespace moekit::cpu {
namespace {

using moekit::testing::poison;
using moekit::testing::random_tensor;
using moekit::testing::ref_layer;
using moekit::testing::ref_routing;
using moekit::testing::rel_l2_error;
using moekit::testing::seed_from;
using moekit::testing::tie_free_logits;
using moekit::testing::to_double;

// Tolerance table (normalized error ||out - ref|| / ||ref||), per act dtype.
//
// f32: the kernel sees exactly the values the reference sees and computes in
// fp32 throughout (GEMMs over K = H and K = I, activation, top-k reduce). The
// worst-case relative error of a K-term fp32 dot product is K * u with
// u = 2^-24 ~ 6e-8, i.e. 4.3e-6 for K = H = 72 (typical: sqrt(K) * u ~ 5e-7;
// observed max over the grid ~3e-7). 5e-6 is that worst case.
constexpr double kF32Bound = 5e-6;
// bf16: hidden and weights are exact bf16 values the reference sees too; the
// kernel keeps every intermediate in fp32 and rounds only the output to bf16
// (round to nearest even, relative error <= 2^-8 per element). So
// ||out - ref|| <= 2^-8 ||ref|| plus the fp32 part above.
constexpr double kBf16Bound = 0.00390625 * (1.0 + kF32Bound) + kF32Bound;

double bound_for(DType act) { return act == DType::kF32 ? kF32Bound : kBf16Bound; }

struct Shape {
  int64_t M, E, k, H, I;
};

// One layer's config, weights and inputs, seeded from the case parameters.
struct Layer {
  MoeConfig config;
  HostTensor w13, w2, hidden, logits;
  std::vector<double> w13_exact, w2_exact, hidden_exact, logits_exact;

  Layer(const Shape& s, Activation act, DType dtype, uint64_t seed, RoutingMethod method = RoutingMethod::kRenormalize) {
    config.num_experts = s.E;
    config.hidden = s.H;
    config.intermediate = s.I;
    config.max_num_tokens = s.M;
    config.logits_dtype = dtype;
    config.quant.weight_dtype = dtype;
    config.quant.act_dtype = dtype;
    config.activation.kind = act;
    config.routing.method = method;
    config.routing.top_k = static_cast<int>(s.k);
    std::mt19937_64 rng(seed);
    const int64_t n1 = act == Activation::kRelu2 ? s.I : 2 * s.I;
    // Scales keep every stage O(1): gate/up ~ N(0, 1), expert outputs ~ N(0, 1).
    w13 = random_tensor(rng, dtype, {s.E, n1, s.H}, 1.0 / std::sqrt(double(s.H)), &w13_exact);
    w2 = random_tensor(rng, dtype, {s.E, s.H, s.I}, 1.0 / std::sqrt(double(s.I)), &w2_exact);
    hidden = random_tensor(rng, dtype, {s.M, s.H}, 1.0, &hidden_exact);
    // Distinct logits (gap 1/32, exact in bf16) so the expert choice is unambiguous.
    logits = tie_free_logits(rng, dtype, s.M, s.E, 1.0 / 32.0, &logits_exact);
  }
  MoeWeights weights() const { return {w13.view(), w2.view(), {}}; }
};

struct Workbuf {
  std::vector<unsigned char> bytes;
  explicit Workbuf(size_t n) : bytes(n) {}
  Workspace ws() { return {bytes.data(), bytes.size()}; }
};

bool all_bytes_equal(const HostTensor& a, const HostTensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data<unsigned char>(), b.data<unsigned char>(), a.nbytes()) == 0;
}

// Every element still holds the poison pattern (nothing written).
bool still_poisoned(const HostTensor& t) {
  HostTensor p(t.dtype(), t.shape());
  poison(p);
  return all_bytes_equal(t, p);
}

// ---------------------------------------------------------------------------
// The grid: M x E x k x (H, I) x activation x dtype, renormalize routing.

using GridParam = std::tuple<int64_t /*M*/, int64_t /*E*/, int64_t /*k*/, int /*HI pair*/, Activation, DType>;
constexpr int64_t kHI[2][2] = {{72, 40}, {33, 17}};

class CpuKernelGrid : public ::testing::TestWithParam<GridParam> {};

TEST_P(CpuKernelGrid, ModularEqualsMonolithicAndMatchesReference) {
  const auto [M, E, k, hi, act, dtype] = GetParam();
  const Shape s{M, E, k, kHI[hi][0], kHI[hi][1]};
  Layer layer(s, act, dtype, seed_from({M, E, k, hi, int64_t(act), int64_t(dtype)}));

  CpuMonolithic mono(layer.config);
  CpuModular modular(layer.config);
  ASSERT_TRUE(CpuMonolithic::supports(layer.config, Platform::cpu_only(2)).ok);
  ASSERT_TRUE(CpuModular::supports(layer.config, Platform::cpu_only(2)).ok);
  ASSERT_TRUE(mono.prepare_weights(layer.weights()).ok());
  ASSERT_TRUE(modular.prepare_weights(layer.weights()).ok());

  // Monolithic: routing inside, ids captured, counts out.
  HostTensor out_mono(dtype, {M, s.H}), replay(DType::kI16, {M, k}), counts(DType::kI32, {E});
  poison(out_mono);
  poison(replay);
  poison(counts);
  Workbuf wm(mono.workspace_size(M));
  MoeRunArgs am;
  am.hidden = layer.hidden.view();
  am.out = out_mono.view();
  am.router_logits = layer.logits.view();
  am.routing_replay_out = replay.view();
  am.expert_counts = counts.view();
  const Status sm = mono.run(am, wm.ws(), nullptr);
  ASSERT_TRUE(sm.ok()) << sm.to_string();

  // Modular: the same routing computed outside by route_cpu.
  HostTensor ids(DType::kI32, {M, k}), wts(DType::kF32, {M, k}), out_mod(dtype, {M, s.H});
  RoutingArgs ra;
  ra.logits = layer.logits.view();
  ra.topk_ids = ids.view();
  ra.topk_weights = wts.view();
  ASSERT_TRUE(route_cpu(layer.config.routing, ra).ok());
  poison(out_mod);
  Workbuf wd(modular.workspace_size(M));
  MoeRunArgs ad;
  ad.hidden = layer.hidden.view();
  ad.out = out_mod.view();
  ad.topk_ids = ids.view();
  ad.topk_weights = wts.view();
  const Status sd = modular.run(ad, wd.ws(), nullptr);
  ASSERT_TRUE(sd.ok()) << sd.to_string();

  EXPECT_TRUE(all_bytes_equal(out_mono, out_mod)) << "modular and monolithic outputs differ";

  // Reference: its own routing on the same logits, then the fp64 layer.
  const moekit_ref::RoutingResult rr = moekit_ref::route(ref_routing(layer.config.routing), layer.logits_exact, M, E);
  const std::vector<double> captured = to_double(replay.view());
  const std::vector<double> routed = to_double(ids.view());
  for (int64_t i = 0; i < M * k; ++i) {
    ASSERT_EQ(captured[i], rr.ids[i]) << "routing_replay_out differs at pair " << i;
    ASSERT_EQ(routed[i], rr.ids[i]) << "topk_ids differs at pair " << i;
  }
  for (int64_t e = 0; e < E; ++e) ASSERT_EQ(counts.data<int32_t>()[e], rr.counts[e]) << "expert_counts[" << e << "]";
  const std::vector<double> ref = moekit_ref::moe_layer(ref_layer(layer.config), layer.hidden_exact, M, layer.w13_exact,
                                                        layer.w2_exact, rr.ids, rr.weights, static_cast<int>(k));
  const double err = rel_l2_error(to_double(out_mono.view()), ref);
  char err_text[32];
  std::snprintf(err_text, sizeof err_text, "%.3e", err);
  RecordProperty("rel_l2_error", err_text);
  EXPECT_LE(err, bound_for(dtype)) << "normalized error vs fp64 reference";
}

std::string grid_name(const ::testing::TestParamInfo<GridParam>& info) {
  const auto [M, E, k, hi, act, dtype] = info.param;
  return "M" + std::to_string(M) + "_E" + std::to_string(E) + "_k" + std::to_string(k) + "_H" +
         std::to_string(kHI[hi][0]) + "_I" + std::to_string(kHI[hi][1]) + "_" + activation_name(act) + "_" +
         dtype_name(dtype);
}

INSTANTIATE_TEST_SUITE_P(Grid, CpuKernelGrid,
                         ::testing::Combine(::testing::Values<int64_t>(1, 7, 64, 513),
                                            ::testing::Values<int64_t>(8, 64, 256),
                                            ::testing::Values<int64_t>(1, 2, 8), ::testing::Values(0, 1),
                                            ::testing::Values(Activation::kSiluGated, Activation::kGeluGated,
                                                              Activation::kSwigluOai, Activation::kRelu2),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         grid_name);

// ---------------------------------------------------------------------------
// Routing variants the grid does not pin.

// deepseek_v3 (groups, score bias, scaling) inside the monolithic kernel.
TEST(CpuMonolithic, DeepseekV3WithBiasMatchesReference) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Shape s{37, 64, 8, 72, 40};
    Layer layer(s, Activation::kSiluGated, dtype, seed_from({37, 64, 8, 3, int64_t(dtype)}), RoutingMethod::kDeepseekV3);
    layer.config.routing.num_groups = 8;
    layer.config.routing.topk_groups = 4;
    layer.config.routing.routed_scaling_factor = 2.5f;
    layer.config.routing.has_score_bias = true;
    std::mt19937_64 rng(seed_from({64, 99}));
    std::vector<double> bias_exact;
    HostTensor bias = random_tensor(rng, DType::kF32, {s.E}, 0.01, &bias_exact);

    CpuMonolithic mono(layer.config);
    ASSERT_TRUE(mono.prepare_weights({layer.w13.view(), layer.w2.view(), bias.view()}).ok());
    HostTensor out(dtype, {s.M, s.H}), replay(DType::kI16, {s.M, s.k});
    poison(out);
    poison(replay);
    Workbuf w(mono.workspace_size(s.M));
    MoeRunArgs a;
    a.hidden = layer.hidden.view();
    a.out = out.view();
    a.router_logits = layer.logits.view();
    a.routing_replay_out = replay.view();
    const Status st = mono.run(a, w.ws(), nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();

    moekit_ref::RoutingParams rp = ref_routing(layer.config.routing);
    rp.bias = bias_exact;
    const moekit_ref::RoutingResult rr = moekit_ref::route(rp, layer.logits_exact, s.M, s.E);
    const std::vector<double> captured = to_double(replay.view());
    for (int64_t i = 0; i < s.M * s.k; ++i) ASSERT_EQ(captured[i], rr.ids[i]) << "pair " << i;
    const auto ref = moekit_ref::moe_layer(ref_layer(layer.config), layer.hidden_exact, s.M, layer.w13_exact,
                                           layer.w2_exact, rr.ids, rr.weights, static_cast<int>(s.k));
    EXPECT_LE(rel_l2_error(to_double(out.view()), ref), bound_for(dtype)) << dtype_name(dtype);
  }
}

// Custom routing: arbitrary ids/weights from the caller, modular only.
TEST(CpuModular, CustomRoutingMatchesReference) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Shape s{29, 16, 4, 33, 17};
    Layer layer(s, Activation::kSwigluOai, dtype, seed_from({29, 16, 4, 5, int64_t(dtype)}), RoutingMethod::kCustom);
    ASSERT_FALSE(CpuMonolithic::supports(layer.config, Platform::cpu_only()).ok);
    CpuModular modular(layer.config);
    ASSERT_TRUE(modular.prepare_weights(layer.weights()).ok());
    std::mt19937_64 rng(seed_from({29, 16, 4, 6}));
    HostTensor ids(DType::kI32, {s.M, s.k}), wts(DType::kF32, {s.M, s.k});
    std::vector<int32_t> ref_ids;
    std::vector<double> ref_w;
    std::vector<int32_t> perm(s.E);
    std::uniform_real_distribution<float> wdist(-1.0f, 1.0f);
    for (int64_t t = 0; t < s.M; ++t) {
      for (int64_t e = 0; e < s.E; ++e) perm[e] = static_cast<int32_t>(e);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t j = 0; j < s.k; ++j) {
        ids.data<int32_t>()[t * s.k + j] = perm[j];
        wts.data<float>()[t * s.k + j] = wdist(rng);
        ref_ids.push_back(perm[j]);
        ref_w.push_back(wts.data<float>()[t * s.k + j]);
      }
    }
    HostTensor out(dtype, {s.M, s.H});
    poison(out);
    Workbuf w(modular.workspace_size(s.M));
    MoeRunArgs a;
    a.hidden = layer.hidden.view();
    a.out = out.view();
    a.topk_ids = ids.view();
    a.topk_weights = wts.view();
    ASSERT_TRUE(modular.run(a, w.ws(), nullptr).ok());
    const auto ref = moekit_ref::moe_layer(ref_layer(layer.config), layer.hidden_exact, s.M, layer.w13_exact,
                                           layer.w2_exact, ref_ids, ref_w, static_cast<int>(s.k));
    EXPECT_LE(rel_l2_error(to_double(out.view()), ref), bound_for(dtype)) << dtype_name(dtype);
  }
}

// Capture, then replay the captured ids: the output is reproduced bit for bit,
// and a second run on the same (reused) workspace gives the same bits too.
TEST(CpuMonolithic, ReplayOfCaptureReproducesOutputBitwise) {
  const Shape s{64, 64, 8, 72, 40};
  Layer layer(s, Activation::kSiluGated, DType::kBF16, seed_from({64, 64, 8, 7}));
  layer.config.needs_capture = layer.config.needs_replay = true;
  CpuMonolithic mono(layer.config);
  ASSERT_TRUE(mono.prepare_weights(layer.weights()).ok());
  Workbuf w(mono.workspace_size(s.M));
  HostTensor out1(DType::kBF16, {s.M, s.H}), out2(DType::kBF16, {s.M, s.H}), out3(DType::kBF16, {s.M, s.H});
  HostTensor replay(DType::kI16, {s.M, s.k}), forced(DType::kI32, {s.M, s.k});
  for (HostTensor* t : {&out1, &out2, &out3, &replay}) poison(*t);
  MoeRunArgs a;
  a.hidden = layer.hidden.view();
  a.router_logits = layer.logits.view();
  a.out = out1.view();
  a.routing_replay_out = replay.view();
  ASSERT_TRUE(mono.run(a, w.ws(), nullptr).ok());
  for (int64_t i = 0; i < s.M * s.k; ++i) forced.data<int32_t>()[i] = replay.data<int16_t>()[i];
  a.routing_replay_out = {};
  a.out = out2.view();
  a.forced_ids = forced.view();
  ASSERT_TRUE(mono.run(a, w.ws(), nullptr).ok());
  EXPECT_TRUE(all_bytes_equal(out1, out2)) << "replay did not reproduce the captured run";
  a.forced_ids = {};
  a.out = out3.view();
  ASSERT_TRUE(mono.run(a, w.ws(), nullptr).ok());
  EXPECT_TRUE(all_bytes_equal(out1, out3)) << "a second run on the reused workspace differs";
}

// ---------------------------------------------------------------------------
// The GEMM path each config takes, so the runs above are known to cover it
// (test_cpu_kernels_blas runs this binary again with MOEKIT_CPU_GEMM=blas).
// Both paths compute fp32 products of the same values with fp32
// accumulation, so one tolerance table serves both.

TEST(CpuGemmPath, PerConfigCpuAndEnvironment) {
  MoeConfig c;
  const char* env = std::getenv("MOEKIT_CPU_GEMM");
  const bool packed = packed_gemm_supported() && !(env != nullptr && std::string(env) == "blas");
  const CpuGemmPath bf16_path = packed ? CpuGemmPath::kPackedBf16 : CpuGemmPath::kBlasF32;
  const CpuGemmPath f32_path = packed ? CpuGemmPath::kPackedF32 : CpuGemmPath::kBlasF32;
  c.quant.weight_dtype = c.quant.act_dtype = DType::kBF16;
  EXPECT_EQ(cpu_gemm_path(c), bf16_path);
  RecordProperty("bf16_gemm_path", cpu_gemm_path_name(cpu_gemm_path(c)));
  c.quant.act_dtype = DType::kF32;  // bf16 weights, f32 activations: A stays fp32 on both paths
  EXPECT_EQ(cpu_gemm_path(c), bf16_path);
  c.quant.weight_dtype = DType::kF32;
  EXPECT_EQ(cpu_gemm_path(c), f32_path);
  RecordProperty("f32_gemm_path", cpu_gemm_path_name(cpu_gemm_path(c)));
  c.quant.method = QuantMethod::kFp8Block128;  // fp8 and 4-bit weights are dequantized to f32 once
  c.quant.weight_dtype = DType::kF8E4M3;
  EXPECT_EQ(cpu_gemm_path(c), f32_path);
}

// ---------------------------------------------------------------------------
// supports(): reasons, in docs/design.md §2.2 order.

TEST(CpuKernelSupports, Reasons) {
  MoeConfig c;
  c.num_experts = 8;
  c.hidden = 16;
  c.intermediate = 8;
  c.max_num_tokens = 4;
  c.routing.top_k = 2;
  for (Activation a : {Activation::kSiluGated, Activation::kGeluGated, Activation::kSwigluOai, Activation::kRelu2}) {
    c.activation.kind = a;
    EXPECT_TRUE(CpuModular::supports(c, Platform::cpu_only()).ok);
    EXPECT_TRUE(CpuMonolithic::supports(c, Platform::cpu_only()).ok);
  }
  MoeConfig f16 = c;
  f16.quant.weight_dtype = DType::kF16;
  EXPECT_NE(CpuModular::supports(f16, Platform::cpu_only()).reason.find("weight dtype f16"), std::string::npos);

  MoeConfig custom = c;
  custom.routing.method = RoutingMethod::kCustom;
  EXPECT_TRUE(CpuModular::supports(custom, Platform::cpu_only()).ok);
  EXPECT_EQ(CpuMonolithic::supports(custom, Platform::cpu_only()).reason, "custom routing needs a modular kernel");

  MoeConfig ep = c;
  ep.parallel.dp_size = ep.parallel.ep_size = 2;
  ep.parallel.all2all = All2AllBackend::kNccl;
  EXPECT_TRUE(CpuModular::supports(ep, Platform::cpu_only()).ok);
  EXPECT_EQ(CpuMonolithic::supports(ep, Platform::cpu_only()).reason,
            "monolithic kernels cannot dispatch tokens across ranks (all-to-all)");
  // Routing comes before parallel config: custom + all-to-all reports routing.
  custom.parallel = ep.parallel;
  EXPECT_EQ(CpuMonolithic::supports(custom, Platform::cpu_only()).reason, "custom routing needs a modular kernel");

  MoeConfig eplb = c;
  eplb.parallel.enable_eplb = true;
  EXPECT_FALSE(CpuMonolithic::supports(eplb, Platform::cpu_only()).ok);
  EXPECT_TRUE(CpuModular::supports(eplb, Platform::cpu_only()).ok);

  MoeConfig cap = c;
  cap.needs_capture = cap.needs_replay = true;
  EXPECT_TRUE(CpuModular::supports(cap, Platform::cpu_only()).ok);
  EXPECT_TRUE(CpuMonolithic::supports(cap, Platform::cpu_only()).ok);
  EXPECT_TRUE(CpuMonolithic(cap).supports_routing_replay_capture());
  EXPECT_FALSE(CpuModular(cap).supports_routing_replay_capture());
}

TEST(CpuKernelProblemSize, GatedAndRelu2) {
  const Shape s{5, 8, 2, 33, 17};
  for (Activation act : {Activation::kSiluGated, Activation::kRelu2}) {
    Layer layer(s, act, DType::kF32, 1);
    CpuModular modular(layer.config);
    HostTensor ids(DType::kI32, {s.M, s.k});
    auto p = modular.problem_size(layer.hidden.view(), layer.w13.view(), layer.w2.view(), ids.view());
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ(p->num_experts, 8);
    EXPECT_EQ(p->num_tokens, 5);
    EXPECT_EQ(p->n, act == Activation::kRelu2 ? 17 : 34);
    EXPECT_EQ(p->k, 33);
    EXPECT_EQ(p->top_k, 2);
    // w2 that does not fit w13 is named.
    auto bad = modular.problem_size(layer.hidden.view(), layer.w13.view(), layer.w13.view(), ids.view());
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("w2"), std::string::npos);
  }
}

// ---------------------------------------------------------------------------
// Bad input: a clear error naming the problem, and nothing written.

class CpuKernelBadInput : public ::testing::Test {
 protected:
  static constexpr Shape kS{6, 8, 2, 33, 17};
  CpuKernelBadInput()
      : layer(kS, Activation::kSiluGated, DType::kBF16, 11),
        out(DType::kBF16, {kS.M, kS.H}),
        replay(DType::kI16, {kS.M, kS.k}),
        ids(DType::kI32, {kS.M, kS.k}),
        wts(DType::kF32, {kS.M, kS.k}),
        mono(layer.config),
        modular(layer.config),
        work(mono.workspace_size(kS.M) + modular.workspace_size(kS.M)) {
    poison(out);
    poison(replay);
    for (int64_t t = 0; t < kS.M; ++t) {
      ids.data<int32_t>()[t * 2] = 1;
      ids.data<int32_t>()[t * 2 + 1] = 5;
      wts.data<float>()[t * 2] = wts.data<float>()[t * 2 + 1] = 0.5f;
    }
    mono_args.hidden = mod_args.hidden = layer.hidden.view();
    mono_args.out = mod_args.out = out.view();
    mono_args.router_logits = layer.logits.view();
    mono_args.routing_replay_out = replay.view();
    mod_args.topk_ids = ids.view();
    mod_args.topk_weights = wts.view();
  }
  void SetUp() override {
    ASSERT_TRUE(mono.prepare_weights(layer.weights()).ok());
    ASSERT_TRUE(modular.prepare_weights(layer.weights()).ok());
  }
  // The run fails, its message names `what`, and out/replay are untouched.
  void expect_rejected(const Status& st, const std::string& what) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(what), std::string::npos) << "message: " << st.to_string();
    EXPECT_TRUE(still_poisoned(out)) << "out was written despite the error";
    EXPECT_TRUE(still_poisoned(replay)) << "routing_replay_out was written despite the error";
  }
  Status run_mono(MoeRunArgs a) { return mono.run(a, work.ws(), nullptr); }
  Status run_mod(MoeRunArgs a) { return modular.run(a, work.ws(), nullptr); }

  Layer layer;
  HostTensor out, replay, ids, wts;
  CpuMonolithic mono;
  CpuModular modular;
  Workbuf work;
  MoeRunArgs mono_args, mod_args;
};

TEST_F(CpuKernelBadInput, ValidArgumentsRun) {
  // The fixture itself is valid: both kernels run (so the failures below are
  // caused by the one thing each test breaks).
  HostTensor o2(DType::kBF16, {kS.M, kS.H});
  MoeRunArgs a = mono_args;
  a.out = o2.view();
  a.routing_replay_out = {};
  EXPECT_TRUE(run_mono(a).ok());
  MoeRunArgs b = mod_args;
  b.out = o2.view();
  EXPECT_TRUE(run_mod(b).ok());
}

TEST_F(CpuKernelBadInput, Hidden) {
  HostTensor f32(DType::kF32, {kS.M, kS.H}), wide(DType::kBF16, {kS.M, kS.H + 1}), r3(DType::kBF16, {1, kS.M, kS.H});
  for (const HostTensor* h : {&f32, &wide, &r3}) {
    MoeRunArgs a = mono_args;
    a.hidden = h->view();
    expect_rejected(run_mono(a), "hidden");
    MoeRunArgs b = mod_args;
    b.hidden = h->view();
    expect_rejected(run_mod(b), "hidden");
  }
  MoeRunArgs a = mono_args;
  a.hidden = {};
  expect_rejected(run_mono(a), "hidden");
}

TEST_F(CpuKernelBadInput, Out) {
  HostTensor f32(DType::kF32, {kS.M, kS.H}), short_rows(DType::kBF16, {kS.M - 1, kS.H}), r1(DType::kBF16, {kS.M * kS.H});
  for (HostTensor* o : {&f32, &short_rows, &r1}) {
    poison(*o);
    MoeRunArgs a = mono_args;
    a.out = o->view();
    expect_rejected(run_mono(a), "out");
    MoeRunArgs b = mod_args;
    b.out = o->view();
    expect_rejected(run_mod(b), "out");
    EXPECT_TRUE(still_poisoned(*o));
  }
}

TEST_F(CpuKernelBadInput, RouterLogits) {
  HostTensor f32(DType::kF32, {kS.M, kS.E}), narrow(DType::kBF16, {kS.M, kS.E - 1}), r1(DType::kBF16, {kS.M * kS.E});
  for (const HostTensor* l : {&f32, &narrow, &r1}) {
    MoeRunArgs a = mono_args;
    a.router_logits = l->view();
    expect_rejected(run_mono(a), "router_logits");
  }
  MoeRunArgs a = mono_args;
  a.router_logits = {};
  expect_rejected(run_mono(a), "router_logits");
  // Non-finite logits follow the routing spec's rule: rejected.
  HostTensor nan_logits(DType::kBF16, {kS.M, kS.E});
  std::memcpy(nan_logits.data<uint16_t>(), layer.logits.data<uint16_t>(), layer.logits.nbytes());
  nan_logits.data<uint16_t>()[3 * kS.E + 2] = 0x7fc0;
  a.router_logits = nan_logits.view();
  expect_rejected(run_mono(a), "NaN");
}

TEST_F(CpuKernelBadInput, TopkIdsAndWeights) {
  HostTensor i16(DType::kI16, {kS.M, kS.k}), wide(DType::kI32, {kS.M, kS.k + 1}), r1(DType::kI32, {kS.M * kS.k});
  for (const HostTensor* t : {&i16, &wide, &r1}) {
    MoeRunArgs b = mod_args;
    b.topk_ids = t->view();
    expect_rejected(run_mod(b), "topk_ids");
  }
  HostTensor w16(DType::kBF16, {kS.M, kS.k}), wshort(DType::kF32, {kS.M - 1, kS.k});
  for (const HostTensor* t : {&w16, &wshort}) {
    MoeRunArgs b = mod_args;
    b.topk_weights = t->view();
    expect_rejected(run_mod(b), "topk_weights");
  }
  MoeRunArgs b = mod_args;
  b.topk_ids = {};
  expect_rejected(run_mod(b), "topk_ids");
}

TEST_F(CpuKernelBadInput, IdsOutOfRangeOrDuplicated) {
  for (int32_t bad : {-1, 8, 1000}) {
    HostTensor bad_ids(DType::kI32, {kS.M, kS.k});
    std::memcpy(bad_ids.data<int32_t>(), ids.data<int32_t>(), ids.nbytes());
    bad_ids.data<int32_t>()[4 * kS.k + 1] = bad;
    MoeRunArgs b = mod_args;
    b.topk_ids = bad_ids.view();
    const Status st = run_mod(b);
    expect_rejected(st, "topk_ids[4, 1]");
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  }
  HostTensor dup(DType::kI32, {kS.M, kS.k});
  std::memcpy(dup.data<int32_t>(), ids.data<int32_t>(), ids.nbytes());
  dup.data<int32_t>()[5 * kS.k + 1] = dup.data<int32_t>()[5 * kS.k];
  MoeRunArgs b = mod_args;
  b.topk_ids = dup.view();
  expect_rejected(run_mod(b), "topk_ids[5, 1]");
  // Forced ids (replay) in the monolithic kernel get the same checks.
  MoeRunArgs a = mono_args;
  a.forced_ids = dup.view();
  expect_rejected(run_mono(a), "forced_ids");
}

TEST_F(CpuKernelBadInput, ReplayOut) {
  HostTensor short_rows(DType::kI16, {kS.M - 1, kS.k}), i32(DType::kI32, {kS.M, kS.k}), wide(DType::kI16, {kS.M, kS.k + 1});
  for (HostTensor* r : {&short_rows, &i32, &wide}) {
    poison(*r);
    MoeRunArgs a = mono_args;
    a.routing_replay_out = r->view();
    expect_rejected(run_mono(a), "routing_replay_out");
    EXPECT_TRUE(still_poisoned(*r));
  }
}

TEST_F(CpuKernelBadInput, WorkspaceTooSmall) {
  std::vector<unsigned char> small(mono.workspace_size(kS.M) - 1);
  MoeRunArgs a = mono_args;
  expect_rejected(mono.run(a, {small.data(), small.size()}, nullptr), "workspace");
  expect_rejected(modular.run(mod_args, {small.data(), modular.workspace_size(kS.M) - 1}, nullptr), "workspace");
  expect_rejected(mono.run(a, {nullptr, 0}, nullptr), "workspace");
}

TEST_F(CpuKernelBadInput, MoreTokensThanMaxNumTokens) {
  Layer big(Shape{kS.M + 1, kS.E, kS.k, kS.H, kS.I}, Activation::kSiluGated, DType::kBF16, 12);
  HostTensor big_out(DType::kBF16, {kS.M + 1, kS.H}), big_ids(DType::kI32, {kS.M + 1, kS.k}),
      big_w(DType::kF32, {kS.M + 1, kS.k});
  poison(big_out);
  std::vector<unsigned char> ws(mono.workspace_size(kS.M + 1) + modular.workspace_size(kS.M + 1));
  MoeRunArgs a = mono_args;
  a.hidden = big.hidden.view();
  a.out = big_out.view();
  a.router_logits = big.logits.view();
  expect_rejected(mono.run(a, {ws.data(), ws.size()}, nullptr), "max_num_tokens");
  MoeRunArgs b = mod_args;
  b.hidden = big.hidden.view();
  b.out = big_out.view();
  b.topk_ids = big_ids.view();
  b.topk_weights = big_w.view();
  expect_rejected(modular.run(b, {ws.data(), ws.size()}, nullptr), "max_num_tokens");
  EXPECT_TRUE(still_poisoned(big_out));
}

TEST_F(CpuKernelBadInput, RunBeforePrepareWeights) {
  CpuMonolithic fresh_mono(layer.config);
  CpuModular fresh_mod(layer.config);
  Status st = fresh_mono.run(mono_args, work.ws(), nullptr);
  expect_rejected(st, "prepare_weights");
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  st = fresh_mod.run(mod_args, work.ws(), nullptr);
  expect_rejected(st, "prepare_weights");
}

TEST_F(CpuKernelBadInput, Weights) {
  const int64_t E = kS.E, H = kS.H, I = kS.I;
  HostTensor w13_f32(DType::kF32, {E, 2 * I, H}), w13_relu_shape(DType::kBF16, {E, I, H}),
      w13_r2(DType::kBF16, {E * 2 * I, H}), w13_fewer_experts(DType::kBF16, {E - 1, 2 * I, H});
  for (const HostTensor* w : {&w13_f32, &w13_relu_shape, &w13_r2, &w13_fewer_experts}) {
    CpuMonolithic m(layer.config);
    CpuModular d(layer.config);
    Status st = m.prepare_weights({w->view(), layer.w2.view(), {}});
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("w13"), std::string::npos) << st.to_string();
    st = d.prepare_weights({w->view(), layer.w2.view(), {}});
    EXPECT_NE(st.message().find("w13"), std::string::npos) << st.to_string();
    // Still unprepared: run refuses.
    EXPECT_EQ(m.run(mono_args, work.ws(), nullptr).code(), StatusCode::kFailedPrecondition);
  }
  HostTensor w2_f32(DType::kF32, {E, H, I}), w2_t(DType::kBF16, {E, I, H}), w2_missing;
  for (const HostTensor* w : {&w2_f32, &w2_t}) {
    CpuModular d(layer.config);
    const Status st = d.prepare_weights({layer.w13.view(), w->view(), {}});
    EXPECT_NE(st.message().find("w2"), std::string::npos) << st.to_string();
  }
  CpuModular d(layer.config);
  EXPECT_NE(d.prepare_weights({layer.w13.view(), {}, {}}).message().find("w2"), std::string::npos);
  // relu2 wants [E, I, H]; a gated [E, 2I, H] w13 is rejected.
  MoeConfig relu = layer.config;
  relu.activation.kind = Activation::kRelu2;
  CpuModular r(relu);
  EXPECT_NE(r.prepare_weights(layer.weights()).message().find("w13"), std::string::npos);
}

TEST_F(CpuKernelBadInput, ScoreBias) {
  MoeConfig ds = layer.config;
  ds.routing.method = RoutingMethod::kDeepseekV3;
  ds.routing.num_groups = 2;
  ds.routing.topk_groups = 1;
  ds.routing.has_score_bias = true;
  CpuMonolithic m(ds);
  Status st = m.prepare_weights(layer.weights());  // bias missing
  EXPECT_NE(st.message().find("score_bias"), std::string::npos) << st.to_string();
  HostTensor b16(DType::kBF16, {kS.E});
  st = m.prepare_weights({layer.w13.view(), layer.w2.view(), b16.view()});
  EXPECT_NE(st.message().find("score_bias"), std::string::npos) << st.to_string();
  // A config this kernel cannot serve is refused at prepare time with the reason.
  MoeConfig custom = layer.config;
  custom.routing.method = RoutingMethod::kCustom;
  CpuMonolithic c(custom);
  st = c.prepare_weights(layer.weights());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("custom routing needs a modular kernel"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace moekit::cpu

// The whole layer on the H200 (Sm90Modular routed by route_cuda, and
// Sm90Monolithic) against the fp64 reference over a shape grid that covers
// M in {1, 3, 64, 1000, 4096}, E in {8, 64, 128, 256}, k in {1, 2, 4, 8} and the
// four activations; modular and monolithic agree bit for bit; outputs are
// poisoned before each run; workspace reuse; supports() reasons.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_model_util.h"
#include "cuda/cuda_test_util.h"
#include "experts/cuda/moe_pipeline.h"
#include "experts/cuda/sm90_kernels.h"
#include "moekit/kernel.h"
#include "moekit/layer.h"
#include "moekit/oracle.h"
#include "moekit/routing.h"
#include "reference/reference.h"
#include "routing/cuda/route_cuda.h"
#include "util/reference_params.h"
#include "util/test_util.h"

namespace moekit {
namespace {

using cuda_test::DeviceBytes;
using cuda_test::DeviceTensor;

// ‖out − ref‖/‖ref‖ bound for bf16 layers. Inputs and weights are bf16 and the
// reference sees exactly those values, so the only error is rounding inside the
// layer: the activated intermediate, each expert's output and the final output
// are each rounded to bf16 (relative 2^-9 at most, about 1.1e-3 rms each), with
// fp32 accumulation negligible next to them; together about 2e-3 rms. 1e-2
// leaves a 5x margin yet catches any wrong row, column, expert or weight (those
// give errors of order 1).
constexpr double kLayerBound = 1e-2;

struct LayerCase {
  int64_t M, E;
  int k;
  Activation act;
  RoutingMethod method;
  int64_t H, I;
  DType logits_dtype;

  std::string name() const {
    return "M" + std::to_string(M) + "_E" + std::to_string(E) + "_k" + std::to_string(k) + "_" +
           activation_name(act) + "_" + routing_method_name(method) + "_H" + std::to_string(H) + "_I" +
           std::to_string(I) + "_" + dtype_name(logits_dtype);
  }
  MoeConfig config() const {
    MoeConfig c;
    c.num_experts = E;
    c.hidden = H;
    c.intermediate = I;
    c.max_num_tokens = M;
    c.logits_dtype = logits_dtype;
    c.activation.kind = act;
    c.routing.method = method;
    c.routing.top_k = k;
    if (method == RoutingMethod::kDeepseekV3) c.routing.routed_scaling_factor = 2.5f;
    c.needs_capture = true;
    c.needs_replay = true;
    return c;
  }
};

// Each value of M, E, k and activation appears at least once; I = 80 and
// relu2's N = 80 leave partial 64-wide tiles; H = 1024 runs many K tiles.
std::vector<LayerCase> layer_cases() {
  using A = Activation;
  using R = RoutingMethod;
  return {
      {1, 8, 2, A::kSiluGated, R::kRenormalize, 128, 64, DType::kF32},
      {3, 64, 4, A::kGeluGated, R::kSoftmaxTopk, 256, 128, DType::kBF16},
      {64, 128, 8, A::kSwigluOai, R::kSigmoidRenorm, 128, 80, DType::kF32},
      {1000, 256, 8, A::kRelu2, R::kDeepseekV3, 192, 80, DType::kF32},
      {4096, 8, 1, A::kSiluGated, R::kLlama4, 128, 64, DType::kBF16},
      {64, 8, 2, A::kGeluGated, R::kRenormalizeNaive, 1024, 512, DType::kF32},
      {1000, 64, 2, A::kSwigluOai, R::kRenormalize, 256, 128, DType::kBF16},
      {4096, 128, 4, A::kRelu2, R::kSoftmaxTopk, 128, 64, DType::kF32},
      {4096, 256, 8, A::kSiluGated, R::kRenormalize, 64, 32, DType::kF32},
      {3, 256, 1, A::kGeluGated, R::kSigmoid, 128, 48, DType::kF32},
      {1, 128, 4, A::kSwigluOai, R::kTopk, 64, 16, DType::kF32},
  };
}

// Host inputs and the reference of one case.
struct LayerData {
  HostTensor hidden, logits, w13, w2;
  std::vector<double> hidden_d, logits_d, w13_d, w2_d;
};

LayerData draw(const LayerCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  LayerData d;
  const int64_t n1 = c.act == Activation::kRelu2 ? c.I : 2 * c.I;
  d.hidden = testing::random_tensor(rng, DType::kBF16, {c.M, c.H}, 1.0, &d.hidden_d);
  d.logits = testing::tie_free_logits(rng, c.logits_dtype, c.M, c.E, 1.0 / 32.0, &d.logits_d);
  d.w13 = testing::random_tensor(rng, DType::kBF16, {c.E, n1, c.H}, 1.0 / std::sqrt(double(c.H)), &d.w13_d);
  d.w2 = testing::random_tensor(rng, DType::kBF16, {c.E, c.H, c.I}, 1.0 / std::sqrt(double(c.I)), &d.w2_d);
  return d;
}

std::unique_ptr<MoeKernel> make_kernel(const LayerCase& c, const std::string& cls, const LayerData& d) {
  const KernelClass k = cuda_test::gpu_kernel_class(cls);
  auto kernel = k.create(c.config(), Platform::probe());
  EXPECT_TRUE(kernel.ok()) << kernel.status().to_string();
  if (!kernel.ok()) return nullptr;
  const Status st = (*kernel)->prepare_weights(MoeWeights{d.w13.view(), d.w2.view(), {}});
  EXPECT_TRUE(st.ok()) << st.to_string();
  return std::move(kernel).value();
}

class CudaLayerGrid : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CudaLayerGrid, ModularAndMonolithicMatchReference) {
  MOEKIT_REQUIRE_SM90();
  const LayerCase c = GetParam();
  const LayerData d = draw(c, testing::seed_from({c.M, c.E, c.k, static_cast<int64_t>(c.act),
                                                  static_cast<int64_t>(c.method), c.H, c.I, 4}));
  // Reference routing and layer (fp64), from the exact inputs.
  const MoeConfig cfg = c.config();
  const moekit_ref::RoutingResult rr = moekit_ref::route(testing::ref_routing(cfg.routing), d.logits_d, c.M, c.E);
  const std::vector<double> ref =
      moekit_ref::moe_layer(testing::ref_layer(cfg), d.hidden_d, c.M, d.w13_d, d.w2_d, rr.ids, rr.weights, c.k);

  DeviceTensor hidden(d.hidden), logits(d.logits);

  // Modular: route_cuda, then the kernel.
  auto modular = make_kernel(c, "Sm90Modular", d);
  ASSERT_TRUE(modular);
  DeviceTensor ids(DType::kI32, {c.M, c.k}), weights(DType::kF32, {c.M, c.k}), counts(DType::kI32, {c.E});
  DeviceTensor out_mod(DType::kBF16, {c.M, c.H});
  ids.poison();
  weights.poison();
  out_mod.poison();
  RoutingArgs ra;
  ra.logits = logits.view();
  ra.topk_ids = ids.view();
  ra.topk_weights = weights.view();
  Status st = cuda::route_cuda(c.config().routing, ra, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  DeviceBytes ws_mod(modular->workspace_size(c.M));
  MoeRunArgs ma;
  ma.hidden = hidden.view();
  ma.out = out_mod.view();
  ma.topk_ids = ids.view();
  ma.topk_weights = weights.view();
  ma.expert_counts = counts.view();
  counts.poison();
  st = modular->run(ma, Workspace{ws_mod.data(), ws_mod.bytes()}, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor mod_ids = ids.download();
  EXPECT_EQ(testing::to_double(mod_ids.view()), std::vector<double>(rr.ids.begin(), rr.ids.end()))
      << "router ids differ from the reference";
  EXPECT_EQ(testing::to_double(counts.download().view()), std::vector<double>(rr.counts.begin(), rr.counts.end()));
  const HostTensor mod_out = out_mod.download();
  const double err_mod = testing::rel_l2_error(testing::to_double(mod_out.view()), ref);
  EXPECT_LE(err_mod, kLayerBound) << "Sm90Modular ‖out−ref‖/‖ref‖ (NaN or an unwritten element gives inf)";

  // Monolithic: logits in, capture out.
  auto mono = make_kernel(c, "Sm90Monolithic", d);
  ASSERT_TRUE(mono);
  DeviceTensor out_mono(DType::kBF16, {c.M, c.H}), capture(DType::kI16, {c.M + 2, c.k});
  out_mono.poison();
  capture.poison();
  DeviceBytes ws_mono(mono->workspace_size(c.M));
  MoeRunArgs oa;
  oa.hidden = hidden.view();
  oa.out = out_mono.view();
  oa.router_logits = logits.view();
  oa.routing_replay_out = capture.view();
  st = mono->run(oa, Workspace{ws_mono.data(), ws_mono.bytes()}, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor mono_out = out_mono.download();
  const double err_mono = testing::rel_l2_error(testing::to_double(mono_out.view()), ref);
  EXPECT_LE(err_mono, kLayerBound) << "Sm90Monolithic";
  // Same ids (captured rows), rows past M untouched; same math -> same bits.
  const std::vector<double> cap = testing::to_double(capture.download().view());
  const std::vector<double> want = testing::to_double(mod_ids.view());
  EXPECT_EQ(std::vector<double>(cap.begin(), cap.begin() + c.M * c.k), want);
  for (size_t i = c.M * c.k; i < cap.size(); ++i) EXPECT_EQ(cap[i], 0x7fff) << "capture row past M written";
  EXPECT_EQ(cuda_test::first_difference(mono_out, mod_out), "") << "monolithic and modular outputs differ";
  RecordProperty("rel_l2_error", std::to_string(err_mod));
  std::printf("[ layer    ] %-60s rel_l2 %.2e (bound %.0e)\n", c.name().c_str(), err_mod, kLayerBound);
}

INSTANTIATE_TEST_SUITE_P(Sm90, CudaLayerGrid, ::testing::ValuesIn(layer_cases()),
                         [](const ::testing::TestParamInfo<LayerCase>& info) { return info.param.name(); });

TEST(CudaLayer, WorkspaceReuseAcrossTokenCounts) {
  MOEKIT_REQUIRE_SM90();
  // One workspace sized for max_num_tokens serves every smaller M, and a
  // smaller M after a larger one gives the same bits as on a fresh workspace.
  LayerCase c{256, 64, 4, Activation::kSiluGated, RoutingMethod::kRenormalize, 128, 64, DType::kF32};
  const LayerData d = draw(c, testing::seed_from({77}));
  auto mono = make_kernel(c, "Sm90Monolithic", d);
  ASSERT_TRUE(mono);
  DeviceTensor hidden(d.hidden), logits(d.logits);
  DeviceBytes shared(mono->workspace_size(c.M));
  auto run_rows = [&](int64_t m, const DeviceBytes& ws) {
    DeviceTensor out(DType::kBF16, {m, c.H});
    out.poison();
    MoeRunArgs a;
    a.hidden = TensorView::contiguous(hidden.data(), DType::kBF16, {m, c.H}, hidden.view().device);
    a.router_logits = TensorView::contiguous(logits.data(), DType::kF32, {m, c.E}, logits.view().device);
    a.out = out.view();
    const Status st = mono->run(a, Workspace{ws.data(), ws.bytes()}, nullptr);
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return out.download();
  };
  const HostTensor big = run_rows(256, shared);
  const HostTensor small_shared = run_rows(3, shared);
  DeviceBytes fresh(mono->workspace_size(3));
  const HostTensor small_fresh = run_rows(3, fresh);
  EXPECT_EQ(cuda_test::first_difference(small_shared, small_fresh), "");
  // And a larger M after a smaller one on the same workspace repeats its bits.
  const HostTensor big_again = run_rows(256, shared);
  EXPECT_EQ(cuda_test::first_difference(big_again, big), "");
  // Rows are independent, though not bit-identical across M: the tile table
  // picks the GEMM path by rows per expert (weight streaming at M = 3, CUTLASS
  // at M = 256), and the paths sum K in different orders before the bf16
  // roundings of the intermediate and the output. By the triangle inequality
  // the two differ by at most the sum of their errors against fp64 (each
  // <= 3.3e-3 on the layer grid): bound 1e-2. A wrong expert or a stale
  // workspace row is an O(1) error.
  HostTensor head(DType::kBF16, {3, c.H});
  std::memcpy(head.data<void>(), big.data<void>(), head.nbytes());
  EXPECT_LE(testing::rel_l2_error(testing::to_double(head.view()), testing::to_double(small_fresh.view())), 1e-2);
  // Too small a workspace is an error, not a crash.
  MoeRunArgs a;
  DeviceTensor out(DType::kBF16, {256, c.H});
  a.hidden = hidden.view();
  a.router_logits = logits.view();
  a.out = out.view();
  EXPECT_EQ(mono->run(a, Workspace{fresh.data(), fresh.bytes()}, nullptr).code(), StatusCode::kInvalidArgument);
}

// NaN or Inf expert weights are refused at prepare time, naming the tensor and
// the first bad element, whether the caller's tensor is on the host or already
// on the device (scanned there).
TEST(CudaLayer, NonFiniteWeightsAreRefusedOnHostAndDevice) {
  MOEKIT_REQUIRE_SM90();
  const LayerCase c{4, 8, 2, Activation::kSiluGated, RoutingMethod::kRenormalize, 256, 128, DType::kF32};
  const KernelClass k = cuda_test::gpu_kernel_class("Sm90Modular");
  struct Bad {
    const char* tensor;
    uint16_t code;
    const char* what;
  };
  for (const Bad bad : {Bad{"w13", 0x7fc1, "NaN"}, Bad{"w2", 0xff80, "infinite"}, Bad{"w13", 0xff81, "NaN"}}) {
    for (const bool on_device : {false, true}) {
      SCOPED_TRACE(std::string(bad.tensor) + " " + bad.what + (on_device ? " on the device" : " on the host"));
      LayerData d = draw(c, 11);
      HostTensor& t = std::string(bad.tensor) == "w13" ? d.w13 : d.w2;
      // element [1, 3, 5] and a later one: the first is named
      const int64_t first = (1 * t.shape()[1] + 3) * t.shape()[2] + 5;
      t.data<uint16_t>()[first] = bad.code;
      t.data<uint16_t>()[first + 77] = 0x7fc0;
      DeviceTensor w13(d.w13), w2(d.w2);
      const MoeWeights w{on_device ? w13.view() : d.w13.view(), on_device ? w2.view() : d.w2.view(), {}};
      auto kernel = k.create(c.config(), Platform::probe());
      ASSERT_TRUE(kernel.ok()) << kernel.status().to_string();
      const Status st = (*kernel)->prepare_weights(w);
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
      const std::string want = std::string(bad.tensor) + ": element [1, 3, 5] (flat index " + std::to_string(first) +
                               ") is " + bad.what + "; weights must be finite";
      EXPECT_NE(st.message().find(want), std::string::npos) << st.message() << "\nwanted: " << want;
    }
  }
  // Finite device weights pass the scan.
  const LayerData ok = draw(c, 12);
  DeviceTensor w13(ok.w13), w2(ok.w2);
  auto kernel = k.create(c.config(), Platform::probe());
  ASSERT_TRUE(kernel.ok());
  EXPECT_TRUE((*kernel)->prepare_weights(MoeWeights{w13.view(), w2.view(), {}}).ok());
}

TEST(CudaLayer, InvalidIdsGiveNaNRowsNotCrashes) {
  MOEKIT_REQUIRE_SM90();
  // Device ids cannot be checked without a sync: an id outside [0, E) (or the
  // router's -1 for a bad row) makes that token's output NaN; others are fine.
  LayerCase c{4, 8, 2, Activation::kSiluGated, RoutingMethod::kRenormalize, 64, 32, DType::kF32};
  const LayerData d = draw(c, testing::seed_from({78}));
  auto mod = make_kernel(c, "Sm90Modular", d);
  ASSERT_TRUE(mod);
  HostTensor ids(DType::kI32, {4, 2}), w(DType::kF32, {4, 2});
  const int32_t id_values[] = {0, 1, 2, 99, -1, 3, 4, 5};
  std::copy(std::begin(id_values), std::end(id_values), ids.data<int32_t>());
  std::fill_n(w.data<float>(), 8, 0.5f);
  DeviceTensor hidden(d.hidden), dids(ids), dw(w), out(DType::kBF16, {4, c.H});
  out.poison();
  DeviceBytes ws(mod->workspace_size(4));
  MoeRunArgs a;
  a.hidden = hidden.view();
  a.out = out.view();
  a.topk_ids = dids.view();
  a.topk_weights = dw.view();
  ASSERT_TRUE(mod->run(a, Workspace{ws.data(), ws.bytes()}, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> o = testing::to_double(out.download().view());
  for (int t = 0; t < 4; ++t) {
    const bool bad = t == 1 || t == 2;
    for (int64_t h = 0; h < c.H; ++h) {
      ASSERT_EQ(std::isnan(o[t * c.H + h]), bad) << "token " << t << " column " << h;
    }
  }
}

TEST(CudaLayer, WorkspaceIsBoundedByThePermutedRows) {
  // No device needed. (M·k + E·tile_m) rows of 2I and of H bf16 elements plus
  // O(E) metadata is the bound; the layout needs M·k rows of I and of H,
  // plus, at decode sizes, GEMM2's f32 K-slice partials: at most 8 slices of
  // min(M·k, 128) rows of H (moe_pipeline.cpp), a constant at most ~8 MB here.
  for (int64_t M : {1, 64, 4096}) {
    for (int64_t E : {8, 256}) {
      cuda::ExpertsShape s;
      s.num_experts = E;
      s.hidden = 2048;
      s.intermediate = 768;
      s.top_k = 8;
      const size_t got = cuda::experts_workspace_layout(s, M).total;
      const size_t rows = static_cast<size_t>(M * s.top_k + E * 64);
      const size_t partials = static_cast<size_t>(8 * std::min<int64_t>(M * s.top_k, 128) * s.hidden) * 4;
      const size_t bound =
          rows * static_cast<size_t>(2 * s.intermediate + s.hidden) * 2 + 1024 * E + 64 * 1024 + partials;
      EXPECT_LE(got, bound) << "M=" << M << " E=" << E;
    }
  }
}

TEST(CudaLayer, SupportsNamesWhatItCannotDo) {
  // A faked platform: no device needed.
  Platform p;
  p.cuda_built = true;
  p.sm90a_built = true;
  p.cuda_devices.push_back(CudaDeviceInfo{0, "H200", 9, 0, 132});
  MoeConfig c;
  c.num_experts = 64;
  c.hidden = 2048;
  c.intermediate = 768;
  c.max_num_tokens = 1024;
  c.routing.method = RoutingMethod::kRenormalize;
  c.routing.top_k = 8;
  ASSERT_TRUE(c.validate().ok());
  EXPECT_TRUE(cuda::sm90_monolithic_supports(c, p).ok);
  EXPECT_TRUE(cuda::sm90_modular_supports(c, p).ok);

  auto reason = [&](MoeConfig m, bool mono, const Platform& pl) {
    const Support s = mono ? cuda::sm90_monolithic_supports(m, pl) : cuda::sm90_modular_supports(m, pl);
    EXPECT_FALSE(s.ok);
    return s.reason;
  };
  Platform ampere = p;
  ampere.cuda_devices[0].cc_major = 8;
  EXPECT_NE(reason(c, true, ampere).find("9.0"), std::string::npos);
  EXPECT_NE(reason(c, false, Platform::cpu_only()).find("CUDA"), std::string::npos);
  MoeConfig f32 = c;
  f32.quant.weight_dtype = DType::kF32;
  EXPECT_NE(reason(f32, true, p).find("bf16"), std::string::npos);
  MoeConfig custom = c;
  custom.routing.method = RoutingMethod::kCustom;
  EXPECT_NE(reason(custom, true, p).find("custom"), std::string::npos);
  EXPECT_TRUE(cuda::sm90_modular_supports(custom, p).ok) << "modular takes caller ids";
  MoeConfig a2a = c;
  a2a.parallel.dp_size = 2;
  a2a.parallel.ep_size = 2;
  a2a.parallel.all2all = All2AllBackend::kNccl;
  EXPECT_NE(reason(a2a, true, p).find("all-to-all"), std::string::npos);
  MoeConfig odd = c;
  odd.intermediate = 100;
  EXPECT_NE(reason(odd, true, p).find("intermediate"), std::string::npos);
  MoeConfig oddh = c;
  oddh.hidden = 1000;
  EXPECT_NE(reason(oddh, false, p).find("hidden"), std::string::npos);
}

// Custom routing on the GPU goes through the same routing stage as on the CPU:
// the caller's ids are counted into expert_counts and captured (ids and
// weights) as given; the output is the modular kernel's own, bit for bit.
TEST(CudaLayer, CustomRoutingCountsAndCapturesTheCallersIds) {
  MOEKIT_REQUIRE_SM90();
  LayerCase c{37, 16, 4, Activation::kSiluGated, RoutingMethod::kCustom, 128, 64, DType::kF32};
  const LayerData d = draw(c, testing::seed_from({79}));
  std::mt19937_64 rng(testing::seed_from({80}));
  std::vector<int32_t> expected;
  const HostTensor ids = testing::random_distinct_ids(rng, c.M, c.E, c.k, &expected);
  HostTensor w(DType::kF32, {c.M, c.k});
  for (int64_t i = 0; i < c.M * c.k; ++i) w.data<float>()[i] = 0.125f * static_cast<float>(i % c.k + 1);
  MoeConfig cfg = c.config();
  cfg.needs_capture = false;  // the oracle's capture rule concerns monolithic classes only
  cfg.needs_replay = false;
  if (cuda_test::testing_portable_backend()) cfg.backend = cuda::kSm80BackendName;  // the kernel it is compared with
  auto layer = MoeLayer::create(cfg, MoeWeights{d.w13.view(), d.w2.view(), {}}, Device::cuda(0));
  ASSERT_TRUE(layer.ok()) << layer.status().to_string();
  DeviceTensor hidden(d.hidden), dids(ids), dw(w), out(DType::kBF16, {c.M, c.H}), counts(DType::kI32, {c.E}),
      captured(DType::kI16, {c.M, c.k}), captured_w(DType::kF32, {c.M, c.k}), direct(DType::kBF16, {c.M, c.H});
  out.poison();
  counts.poison();
  captured.poison();
  captured_w.poison();
  ASSERT_TRUE((*layer)->set_capture_target(captured.view(), captured_w.view()).ok());
  LayerForwardArgs a;
  a.hidden = hidden.view();
  a.topk_ids = dids.view();
  a.topk_weights = dw.view();
  a.out = out.view();
  a.expert_counts = counts.view();
  ASSERT_TRUE((*layer)->forward(a).ok());

  auto mod = make_kernel(c, "Sm90Modular", d);
  ASSERT_TRUE(mod);
  DeviceBytes ws(mod->workspace_size(c.M));
  MoeRunArgs ra;
  ra.hidden = hidden.view();
  ra.out = direct.view();
  ra.topk_ids = dids.view();
  ra.topk_weights = dw.view();
  ASSERT_TRUE(mod->run(ra, Workspace{ws.data(), ws.bytes()}, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const HostTensor got_counts = counts.download(), got_ids = captured.download(), got_w = captured_w.download();
  for (int64_t e = 0; e < c.E; ++e) EXPECT_EQ(got_counts.data<int32_t>()[e], expected[e]) << "expert " << e;
  for (int64_t i = 0; i < c.M * c.k; ++i) {
    ASSERT_EQ(got_ids.data<int16_t>()[i], ids.data<int32_t>()[i]) << i;
    ASSERT_EQ(got_w.data<float>()[i], w.data<float>()[i]) << i;
  }
  const HostTensor o = out.download(), r = direct.download();
  EXPECT_EQ(std::memcmp(o.data<void>(), r.data<void>(), o.nbytes()), 0) << "layer output != the kernel's own";
}

TEST(CudaLayer, TheOracleChoosesTheGpuWhenPresent) {
  MOEKIT_REQUIRE_SM90();
  MoeConfig c;
  c.num_experts = 64;
  c.hidden = 2048;
  c.intermediate = 768;
  c.max_num_tokens = 1024;
  c.routing.method = RoutingMethod::kRenormalize;
  c.routing.top_k = 8;
  c.needs_capture = true;
  auto r = select_backend(c, Platform::probe());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->backend, "cuda_sm90");
  EXPECT_EQ(r->kernel.name, "Sm90Monolithic");
  c.routing.method = RoutingMethod::kCustom;
  c.needs_capture = false;
  r = select_backend(c, Platform::probe());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kernel.name, "Sm90Modular") << "custom routing falls back to the modular class";
}

}  // namespace
}  // namespace moekit

// 4-bit expert weights on the H200 (mxfp4, int4_g32, int4_g128; the 4-bit
// pipeline, moe_pipeline_weight4.h): modular == monolithic bit for bit, every
// streaming instance; both against the cpu backend's exact emulation on the same
// ids and weights, and against the fp64 reference on the reference decoder's
// weights; captured ids exact; replay and a CUDA graph bit for bit; batch
// invariance; the oracle picks the cuda kernels; bad scales refused by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_model_util.h"
#include "cuda/cuda_test_util.h"
#include "cuda/kernel_runs.h"
#include "experts/cuda/weight4_streaming_gemm.h"
#include "moekit/kernel.h"
#include "moekit/oracle.h"
#include "moekit/routing.h"
#include "reference/reference.h"
#include "util/reference_params.h"
#include "util/test_util.h"
#include "util/weight4_test_layer.h"

namespace moekit {
namespace {

using cuda_test::DeviceBytes;
using cuda_test::DeviceTensor;
using testing::Weight4Layer;
using testing::Weight4Shape;

// The dequant path (large M) also rounds each int4 weight (value * f32 scale) to
// bf16 once (mxfp4 weights are exact in bf16): a fourth rounding of at most 2^-9,
// inside the margin of counting each of the three below as 2^-8.
// Bound (relative L2) against the cpu emulation, which keeps f32 from the
// decoded weights to the output. The GPU multiplies the exact bf16 weight
// values on tensor cores with f32 accumulation and scales each group's f32
// partial once (mxfp4 exactly, int4 one f32 rounding), so the products are the
// cpu's; what differs is (a) the f32 accumulation order (K <= 384 terms:
// K u < 2.3e-5 relative) and (b) three bf16 roundings the cpu does not make or
// makes elsewhere: GEMM2's input (the activation output), each expert's output
// before the weighted sum, and the layer's output (both round it, but nearly
// equal f32 values may land one bf16 step apart). Each is at most 2^-9 of an
// element, 2^-8 with margin for its share of the L2 norm: 3 * 2^-8 + 2.3e-5.
constexpr double kVsCpuBound = 3 * 0.00390625 + 2.3e-5;
// Against the fp64 layer on the reference decoder's weights: the cpu's own
// bf16 bound (test_cpu_weight4.cpp, one output rounding, folded into the
// three above) plus the same terms.
constexpr double kVsReferenceBound = kVsCpuBound + 2e-5;
// The mixed-input path (int4_g128, large M) takes the scales as bf16: an f32
// scale that is not a bf16 value is rounded once more (at most 2^-9 relative,
// the same for every weight of its group), counted as one more 2^-8.
constexpr double kBf16ScaleTerm = 0.00390625;

constexpr QuantMethod kMethods[] = {QuantMethod::kMxfp4, QuantMethod::kInt4G32, QuantMethod::kInt4G128};

struct W4Case {
  QuantMethod method;
  Activation act;
  Weight4Shape shape;
  std::string variant;  // kernel.sm90_w4_stream; "" = the pipeline's choice
  // mxfp4: some E8M0 codes above kMxfp4FoldMaxCode, so the kernel scales f32
  // partials instead of folding the scale into the bf16 weights.
  bool large_codes = false;
  std::string path;  // kernel.sm90_w4_gemm; "" = the pipeline's choice
  std::string plan_has;  // the GEMM plan must name this ("" = anything)
  std::string name() const {
    return std::string(quant_method_name(method)) + "_" + activation_name(act) + "_M" + std::to_string(shape.M) +
           "_E" + std::to_string(shape.E) + "_k" + std::to_string(shape.k) + "_H" + std::to_string(shape.H) + "_I" +
           std::to_string(shape.I) + (variant.empty() ? "" : "_" + variant) + (large_codes ? "_large_codes" : "") +
           (path.empty() ? "" : "_" + path);
  }
};

std::vector<W4Case> w4_cases() {
  using A = Activation;
  std::vector<W4Case> cases;
  for (QuantMethod m : kMethods) {
    // K tails: H = 288 is 2 stages of 128 and a 32-column remainder (groups of 32 only).
    const bool g128 = m == QuantMethod::kInt4G128;
    const Weight4Shape tail = g128 ? Weight4Shape{37, 16, 4, 384, 256} : Weight4Shape{37, 16, 4, 288, 160};
    for (A act : {A::kSiluGated, A::kSwigluOai, A::kRelu2}) {
      cases.push_back({m, act, {1, 8, 2, 256, 128}, ""});   // one token: GEMM2 in K slices
      cases.push_back({m, act, tail, ""});
      // ~75 rows per expert: several token tiles (int4_g128 would take the mixed-input path)
      cases.push_back({m, act, {300, 8, 2, 256, 128}, "", false, g128 ? "streaming" : ""});
    }
    for (cuda::W4StreamVariant v : cuda::kAllW4StreamVariants) {
      cases.push_back({m, A::kSiluGated, tail, cuda::w4_stream_variant_name(v)});
    }
  }
  for (const Weight4Shape& shape : {Weight4Shape{1, 8, 2, 256, 128}, Weight4Shape{37, 16, 4, 288, 160}}) {
    cases.push_back({QuantMethod::kMxfp4, A::kSwigluOai, shape, "", true});
  }
  // GEMM2 long enough (I = 1024) for the decode path to cut it into K slices.
  for (QuantMethod m : kMethods) {
    cases.push_back({m, A::kSiluGated, {1, 8, 2, 256, 1024}, ""});
    cases.push_back({m, A::kSwigluOai, {3, 8, 2, 256, 1024}, ""});
  }
  // The dequant path (bf16 tensor-core GEMMs on dequantized chunks of experts), forced at every size.
  for (QuantMethod m : kMethods) {
    const bool g128 = m == QuantMethod::kInt4G128;
    for (A act : {A::kSiluGated, A::kSwigluOai, A::kRelu2}) {
      for (const Weight4Shape& shape : {Weight4Shape{5, 8, 2, 256, 128},
                                        g128 ? Weight4Shape{300, 16, 4, 384, 256} : Weight4Shape{300, 16, 4, 288, 160}}) {
        cases.push_back({m, act, shape, "", false, "dequant"});
      }
    }
  }
  // The mixed-input path (CUTLASS, int4 converted in registers), forced at every size, and
  // chosen on its own: 75 rows per expert (300 tokens x 2 / 8 experts) on 128-token
  // tiles, 275 on 256-token tiles.
  for (A act : {A::kSiluGated, A::kSwigluOai, A::kRelu2}) {
    for (const Weight4Shape& shape : {Weight4Shape{5, 8, 2, 256, 128}, Weight4Shape{300, 16, 4, 384, 256}}) {
      cases.push_back({QuantMethod::kInt4G128, act, shape, "", false, "mixed", "mixed-input"});
    }
    cases.push_back({QuantMethod::kInt4G128, act, {300, 8, 2, 256, 128}, "", false, "", "128x128x64"});
    cases.push_back({QuantMethod::kInt4G128, act, {1100, 8, 2, 384, 256}, "", false, "", "128x256x64"});
  }
  // Above 128 rows per expert, the schemes in groups of 32 take the dequant path.
  cases.push_back({QuantMethod::kMxfp4, A::kSwigluOai, {600, 8, 2, 256, 128}, "", false, "", "dequantized"});
  cases.push_back({QuantMethod::kInt4G32, A::kSiluGated, {600, 8, 2, 256, 128}, "", false, "", "dequantized"});
  return cases;
}

MoeWeights device_weights(const Weight4Layer& l, std::vector<DeviceTensor>& keep) {
  keep.reserve(6);
  const auto up = [&](const HostTensor& t) {
    keep.emplace_back(t);
    return keep.back().view();
  };
  MoeWeights w;
  w.w13 = up(l.w13.bytes);
  w.w2 = up(l.w2.bytes);
  w.w13_scale = up(l.w13.scales);
  w.w2_scale = up(l.w2.scales);
  if (l.config.has_expert_bias) {
    w.w13_bias = up(l.w13_bias);
    w.w2_bias = up(l.w2_bias);
  }
  return w;
}

// The layer's kernel of class `name` with prepared weights.
std::unique_ptr<MoeKernel> prepared_kernel(const char* name, const MoeConfig& cfg, const MoeWeights& w) {
  auto k = cuda_test::gpu_kernel_class(name).create(cfg, Platform::probe());
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  if (!k.ok()) return nullptr;
  const Status st = (*k)->prepare_weights(w);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return st.ok() ? std::move(*k) : nullptr;
}

// A monolithic forward that must succeed (cuda_test::monolithic_run).
HostTensor monolithic_forward(MoeKernel& mono, const DeviceTensor& hidden, const DeviceTensor& logits, int64_t M,
                              int64_t H, const TensorView& capture = {}, const TensorView& forced = {}) {
  StatusOr<HostTensor> out = cuda_test::monolithic_run(mono, hidden, logits, M, H, capture, forced);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? std::move(*out) : HostTensor(DType::kBF16, {M, H});
}

class CudaWeight4Grid : public ::testing::TestWithParam<W4Case> {};

TEST_P(CudaWeight4Grid, ModularMonolithicCpuAndReferenceAgree) {
  MOEKIT_REQUIRE_SM90();
  const W4Case c = GetParam();
  const Weight4Shape s = c.shape;
  const bool biases = c.act == Activation::kSwigluOai;  // gpt-oss's layer has them
  Weight4Layer layer(s, c.method, c.act, biases, DType::kBF16,
                     testing::seed_from({int64_t(c.method), int64_t(c.act), s.M, s.H, 7}));
  if (c.large_codes) {  // a few groups with scales 2^3..2^5, weights still of a layer's size elsewhere
    for (int64_t i = 0; i < layer.w13.scales.numel(); i += 17) layer.w13.scales.data<uint8_t>()[i] = 130 + i % 3;
    for (int64_t i = 0; i < layer.w2.scales.numel(); i += 29) layer.w2.scales.data<uint8_t>()[i] = 130 + i % 3;
    layer.w13_exact = testing::weight_values(c.method, layer.w13);
    layer.w2_exact = testing::weight_values(c.method, layer.w2);
  }
  layer.config.needs_capture = layer.config.needs_replay = true;
  layer.config.kernel.sm90_w4_stream = c.variant;
  layer.config.kernel.sm90_w4_gemm = c.path;
  const MoeConfig& cfg = layer.config;
  ASSERT_TRUE(cfg.validate().ok()) << cfg.validate().to_string();

  // The cpu emulation on the spec's ids; modular on the device's routing (device
  // weights), monolithic (host weights).
  const StatusOr<cuda_test::CpuRun> cpu = cuda_test::cpu_modular_run(cfg, layer.weights(), layer.hidden, layer.logits);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  const HostTensor& ids = cpu->ids;
  std::vector<DeviceTensor> keep;
  const MoeWeights dw = device_weights(layer, keep);
  DeviceTensor hidden(layer.hidden), logits(layer.logits);
  const StatusOr<cuda_test::DeviceRoute> route = cuda_test::device_route(cfg, logits, s.M);
  ASSERT_TRUE(route.ok()) << route.status().to_string();
  EXPECT_EQ(cuda_test::first_difference(route->ids.download(), ids), "") << "device ids differ from route_cpu's";

  const auto modular = prepared_kernel("Sm90Modular", cfg, dw);
  ASSERT_NE(modular, nullptr);
  const StatusOr<HostTensor> mod = cuda_test::modular_run(*modular, hidden, *route, s.M, s.H);
  if (cuda_test::testing_portable_backend() && c.plan_has == "mixed-input") {  // a CUTLASS sm90 path, forced
    ASSERT_FALSE(mod.ok()) << "the portable backend ran the forced sm90 mixed-input GEMM";
    EXPECT_NE(mod.status().message().find("needs wgmma and TMA"), std::string::npos) << mod.status().to_string();
    return;
  }
  ASSERT_TRUE(mod.ok()) << mod.status().to_string();
  const HostTensor& mod_out = *mod;

  const auto mono = prepared_kernel("Sm90Monolithic", cfg, layer.weights());
  ASSERT_NE(mono, nullptr);
  DeviceTensor capture(DType::kI16, {s.M, s.k}), forced(DType::kI32, {s.M, s.k});
  capture.poison();
  const HostTensor mono_out = monolithic_forward(*mono, hidden, logits, s.M, s.H, capture.view());
  const std::vector<double> cap = testing::to_double(capture.download().view());
  EXPECT_EQ(cap, testing::to_double(ids.view())) << "captured ids differ from the spec's";
  EXPECT_EQ(cuda_test::first_difference(mono_out, mod_out), "") << "monolithic and modular outputs differ";

  HostTensor forced_host(DType::kI32, {s.M, s.k});
  for (int64_t i = 0; i < s.M * s.k; ++i) forced_host.data<int32_t>()[i] = static_cast<int32_t>(cap[i]);
  forced.upload(forced_host);
  EXPECT_EQ(cuda_test::first_difference(monolithic_forward(*mono, hidden, logits, s.M, s.H, {}, forced.view()), mono_out),
            "")
      << "replay differs";

  const std::vector<double> gpu = testing::to_double(mod_out.view());
  const double err_cpu = testing::rel_l2_error(gpu, testing::to_double(cpu->out.view()));
  const moekit_ref::RoutingResult rr =
      moekit_ref::route(testing::ref_routing(cfg.routing), layer.logits_exact, s.M, s.E);
  moekit_ref::LayerExtras extras;
  extras.b13 = layer.b13_exact;
  extras.b2 = layer.b2_exact;
  const std::vector<double> ref = moekit_ref::moe_layer(testing::ref_layer(cfg), layer.hidden_exact, s.M,
                                                        layer.w13_exact, layer.w2_exact, rr.ids, rr.weights,
                                                        static_cast<int>(s.k), extras);
  const double err_ref = testing::rel_l2_error(gpu, ref);
  const std::string plan = modular->gemm_plan(s.M);
  const double scale_term = plan.find("mixed-input") != std::string::npos ? kBf16ScaleTerm : 0.0;
  EXPECT_LE(err_cpu, kVsCpuBound + scale_term) << "vs the cpu backend's emulation";
  EXPECT_LE(err_ref, kVsReferenceBound + scale_term) << "vs the fp64 reference";
  // The named plans are cuda_sm90's; the portable backend's differ by design (its numbers are checked above).
  if (!c.plan_has.empty() && !cuda_test::testing_portable_backend()) EXPECT_NE(plan.find(c.plan_has), std::string::npos) << plan;
  if (s.I == 1024) EXPECT_EQ(plan.find("in 1 K slice"), std::string::npos) << "the K-slice case ran unsliced: " << plan;
  std::printf("[ weight4  ] %-50s vs cpu %.2e, vs fp64 %.2e  (%s)\n", c.name().c_str(), err_cpu, err_ref, plan.c_str());
}

INSTANTIATE_TEST_SUITE_P(Sm90, CudaWeight4Grid, ::testing::ValuesIn(w4_cases()),
                         [](const ::testing::TestParamInfo<W4Case>& info) { return info.param.name(); });

// The mixed-input GEMM takes one scale per K tile of 64: forced on a scheme in
// groups of 32, the forward fails and says why, and the plan says so too.
TEST(CudaWeight4, MixedPathForcedOnGroupsOf32IsRefusedByName) {
  MOEKIT_REQUIRE_SM90();
  for (QuantMethod m : {QuantMethod::kMxfp4, QuantMethod::kInt4G32}) {
    const Weight4Shape s{64, 8, 2, 256, 128};
    Weight4Layer layer(s, m, Activation::kSiluGated, false, DType::kBF16, testing::seed_from({64, int64_t(m), 9}));
    layer.config.kernel.sm90_w4_gemm = "mixed";
    const auto mono = prepared_kernel("Sm90Monolithic", layer.config, layer.weights());
    ASSERT_NE(mono, nullptr);
    EXPECT_NE(mono->gemm_plan(s.M).find("unavailable"), std::string::npos) << mono->gemm_plan(s.M);
    DeviceTensor hidden(layer.hidden), logits(layer.logits);
    const StatusOr<HostTensor> out = cuda_test::monolithic_run(*mono, hidden, logits, s.M, s.H);
    ASSERT_FALSE(out.ok()) << quant_method_name(m);
    EXPECT_NE(out.status().message().find("int4_g128 only"), std::string::npos) << out.status().to_string();
  }
}

// run() allocates nothing and never waits on the host: a CUDA graph of it
// replays the eager output bit for bit.
TEST(CudaWeight4, GraphReplayEqualsEager) {
  MOEKIT_REQUIRE_SM90();
  // Every scheme on the streaming path; int4_g128 on both mixed-input tiles too (75 and 275 rows per expert).
  const std::pair<QuantMethod, Weight4Shape> runs[] = {{QuantMethod::kMxfp4, {48, 16, 4, 256, 128}},
                                                       {QuantMethod::kInt4G32, {48, 16, 4, 256, 128}},
                                                       {QuantMethod::kInt4G128, {48, 16, 4, 256, 128}},
                                                       {QuantMethod::kInt4G128, {300, 8, 2, 256, 128}},
                                                       {QuantMethod::kInt4G128, {1100, 8, 2, 256, 128}}};
  for (const auto& [m, s] : runs) {
    const Weight4Layer layer(s, m, Activation::kSiluGated, false, DType::kBF16,
                             testing::seed_from({s.M, int64_t(m), 8}));
    const auto mono = prepared_kernel("Sm90Monolithic", layer.config, layer.weights());
    ASSERT_NE(mono, nullptr);
    DeviceTensor hidden(layer.hidden), logits(layer.logits), out_graph(DType::kBF16, {s.M, s.H});
    const HostTensor eager = monolithic_forward(*mono, hidden, logits, s.M, s.H);
    DeviceBytes ws(mono->workspace_size(s.M));
    cudaStream_t stream = nullptr;
    ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    out_graph.poison();
    MoeRunArgs a;
    a.hidden = hidden.view();
    a.router_logits = logits.view();
    a.out = out_graph.view();
    ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status st = mono->run(a, Workspace{ws.data(), ws.bytes()}, stream);
    cudaGraph_t graph = nullptr;
    ASSERT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(st.ok()) << st.to_string();
    cudaGraphExec_t exec = nullptr;
    ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(cuda_test::first_difference(out_graph.download(), eager), "") << quant_method_name(m);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// batch_invariant: a token's output does not depend on the batch around it
// (no K slices; every token tile sums the same scale groups in the same order).
TEST(CudaWeight4, BatchInvariantRowsDoNotDependOnTheBatch) {
  MOEKIT_REQUIRE_SM90();
  for (QuantMethod m : kMethods) {
    const Weight4Shape s{96, 8, 2, 256, 128};
    Weight4Layer layer(s, m, Activation::kSiluGated, false, DType::kBF16, testing::seed_from({96, int64_t(m), 9}));
    layer.config.batch_invariant = true;
    const auto mono = prepared_kernel("Sm90Monolithic", layer.config, layer.weights());
    ASSERT_NE(mono, nullptr);
    DeviceTensor hidden(layer.hidden), logits(layer.logits);
    const HostTensor all = monolithic_forward(*mono, hidden, logits, s.M, s.H);
    const HostTensor one = monolithic_forward(*mono, hidden, logits, 1, s.H);
    EXPECT_EQ(std::memcmp(all.data<uint16_t>(), one.data<uint16_t>(), s.H * 2), 0)
        << quant_method_name(m) << ": token 0 alone differs from token 0 among " << s.M;
  }
}

TEST(CudaWeight4, OracleSelectsTheCudaKernels) {
  MOEKIT_REQUIRE_SM90();
  for (QuantMethod m : kMethods) {
    const Weight4Layer layer({4, 8, 2, 256, 128}, m, Activation::kSiluGated, false, DType::kBF16, 3);
    const StatusOr<Resolution> r = select_backend(layer.config, Platform::probe());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->backend, "cuda_sm90") << r->report_string();
  }
}

// Bad scales and shapes are refused by name, on host and device weights alike,
// and leave the kernel unprepared.
TEST(CudaWeight4, BadScalesAndShapesAreRefusedByName) {
  MOEKIT_REQUIRE_SM90();
  const Weight4Shape s{4, 8, 2, 256, 128};
  Weight4Layer layer(s, QuantMethod::kMxfp4, Activation::kSiluGated, false, DType::kBF16, 11);
  layer.w2.scales.data<uint8_t>()[5] = kE8M0Nan;
  for (bool on_device : {false, true}) {
    std::vector<DeviceTensor> keep;
    const MoeWeights w = on_device ? device_weights(layer, keep) : layer.weights();
    auto k = cuda_test::gpu_kernel_class("Sm90Modular").create(layer.config, Platform::probe());
    ASSERT_TRUE(k.ok());
    const Status st = (*k)->prepare_weights(w);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("w2_scale"), std::string::npos) << st.to_string();
    DeviceTensor hidden(layer.hidden), out(DType::kBF16, {s.M, s.H}), ids(DType::kI32, {s.M, s.k}),
        wts(DType::kF32, {s.M, s.k});
    MoeRunArgs a;
    a.hidden = hidden.view();
    a.out = out.view();
    a.topk_ids = ids.view();
    a.topk_weights = wts.view();
    DeviceBytes ws((*k)->workspace_size(s.M));
    EXPECT_FALSE((*k)->run(a, Workspace{ws.data(), ws.bytes()}, nullptr).ok()) << "ran on refused weights";
  }
  MoeWeights w = layer.weights();
  w.w13.shape[2] = s.H / 4;  // a packed row too short for H
  auto k = cuda_test::gpu_kernel_class("Sm90Modular").create(layer.config, Platform::probe());
  ASSERT_TRUE(k.ok());
  const Status st = (*k)->prepare_weights(w);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("w13"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace moekit

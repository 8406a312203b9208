// The fp8 schemes on the H200 (Sm90Modular and Sm90Monolithic, docs/fp8.md):
// modular == monolithic bit for bit; both against the cpu backend's emulation
// of the same scheme on the same ids and weights, and against the fp64
// reference's fp8 emulation; captured ids exact; replay bit for bit; the
// oracle picks the cuda kernels for fp8 configs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_model_util.h"
#include "cuda/cuda_test_util.h"
#include "cuda/kernel_runs.h"
#include "experts/cuda/fp8_gemm_cutlass_sm90.h"
#include "experts/cuda/fp8_mma_gemm.h"
#include "experts/cuda/moe_pipeline_fp8.h"
#include "moekit/kernel.h"
#include "moekit/oracle.h"
#include "moekit/routing.h"
#include "reference/reference.h"
#include "util/fp8_test_layer.h"
#include "util/reference_params.h"
#include "util/test_util.h"

namespace moekit {
namespace {

using cuda_test::DeviceBytes;
using cuda_test::DeviceTensor;
using testing::Fp8Layer;
using testing::Fp8Scheme;
using testing::Fp8Shape;

// Against the cpu emulation (same rounding of every GEMM input, same weights):
// the two differ in fp32 accumulation order (K <= 384 terms: K u <= 2.3e-5
// relative) and in the activation's exp (a few ulp); a GEMM2 input within ~1e-6
// of an e4m3 rounding midpoint may then round one step apart (allowance 1e-3,
// as in test_cpu_fp8.cpp); each side rounds its output to bf16 once, so a
// nearly equal pair of fp32 values may round one bf16 step apart (<= 2^-8 of
// the element). Bound: 2^-8 + 2.3e-5 + 1e-3. It holds for the mma.sync GEMM on
// f16 operands: exact products, summed in fp32.
constexpr double kVsCpuBound = 0.00390625 + 2.3e-5 + 1e-3;
// Against the fp64 reference's fp8 emulation: the bf16 bound of test_cpu_fp8.cpp.
constexpr double kVsReferenceBound = 0.00390625 * (1.0 + 2.3e-5 + 1e-3) + 2.3e-5 + 1e-3;
// The e4m3 tensor-core instructions (CUTLASS's wgmma, mma.sync e4m3 of the
// streaming and mma.sync GEMMs) sum each K block's e4m3 products inside the
// tensor core before promoting it to fp32, at less than fp32 precision (about
// 2^-13 relative, the DeepSeek-V3 report's measurement of Hopper's fp8
// accumulation). GEMM1's outputs then differ from the cpu's by ~1e-4 relative,
// and a GEMM2 input that close to an e4m3 rounding midpoint rounds one e4m3
// step apart (2^-3 of the element at most). Allowing up to 1.5% of the GEMM2
// inputs to flip gives 2^-3 * sqrt(0.015) = 1.5e-2 relative L2, plus the bf16
// output rounding. Measured on the H200: 6e-4 to 5.3e-3.
constexpr double kTensorCoreBound = 0.015 + 0.00390625;

// The GEMM path each case is forced onto (config.kernel.sm90_fp8_gemm, and
// sm80_fp8_mma for "mma_sync_f16"), so every path meets every shape whatever
// the table picks. Where CUTLASS does not serve (cuda_sm80), "cutlass" runs the
// table's grouped GEMM (mma.sync).
constexpr const char* kPaths[] = {"streaming", "cutlass", "mma_sync", "mma_sync_f16"};

struct Fp8Case {
  Fp8Scheme scheme;
  Activation act;
  Fp8Shape shape;
  const char* path = "streaming";
  std::string name() const {
    return std::string(path) + "_" + testing::fp8_scheme_name(scheme) + "_" + activation_name(act) + "_M" +
           std::to_string(shape.M) + "_E" + std::to_string(shape.E) + "_k" + std::to_string(shape.k) + "_H" +
           std::to_string(shape.H) + "_I" + std::to_string(shape.I);
  }
  // Every path but the f16 one sums e4m3 products inside the tensor core.
  bool e4m3_accumulation() const { return std::string(path) != "mma_sync_f16"; }
  void force_path(KernelOptions* k) const {
    const bool f16 = !e4m3_accumulation();
    k->sm90_fp8_gemm = f16 ? "mma_sync" : path;
    if (f16) k->sm80_fp8_mma = "f16";
  }
};

std::vector<Fp8Case> fp8_cases() {
  using A = Activation;
  using S = Fp8Scheme;
  // Shapes: H, I not multiples of 128 (partial K blocks, rows past N), one to
  // ~150 rows per expert, every activation layout (halves, interleaved, plain).
  const std::vector<Fp8Case> shapes = {
      {S::kBlock128, A::kSiluGated, {1, 8, 2, 256, 128}},    {S::kBlock128, A::kSiluGated, {37, 64, 8, 512, 256}},
      {S::kBlock128, A::kRelu2, {300, 16, 4, 192, 80}},      {S::kBlock128, A::kSiluGated, {40, 16, 4, 384, 144}},
      {S::kBlock128, A::kSwigluOai, {24, 16, 4, 272, 144}},  {S::kTensorDynamic, A::kSiluGated, {5, 8, 2, 256, 128}},
      {S::kTensorDynamic, A::kRelu2, {300, 16, 4, 192, 80}}, {S::kTensorStatic, A::kSiluGated, {64, 32, 4, 256, 144}},
      // ~150 rows per expert: groups over several 128-row tiles.
      {S::kBlock128, A::kSiluGated, {300, 4, 2, 192, 144}},
  };
  std::vector<Fp8Case> cases;
  for (const char* path : kPaths) {
    for (Fp8Case c : shapes) {
      c.path = path;
      cases.push_back(c);
    }
  }
  return cases;
}

MoeWeights device_weights(const Fp8Layer& l, std::vector<DeviceTensor>& keep) {
  MoeWeights w;
  const auto up = [&](const HostTensor& t) {
    keep.emplace_back(t);
    return keep.back().view();
  };
  keep.reserve(8);
  w.w13 = up(l.w13);
  w.w2 = up(l.w2);
  w.w13_scale = up(l.w13_scale);
  w.w2_scale = up(l.w2_scale);
  const MoeWeights host = l.weights();
  if (host.a13_scale.defined()) {
    w.a13_scale = up(l.a13_scale);
    w.a2_scale = up(l.a2_scale);
  }
  return w;
}

class CudaFp8Grid : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(CudaFp8Grid, ModularMonolithicCpuAndReferenceAgree) {
  MOEKIT_REQUIRE_SM90();
  const Fp8Case c = GetParam();
  const Fp8Shape s = c.shape;
  Fp8Layer layer(s, c.scheme, c.act, DType::kBF16, testing::seed_from({int64_t(c.scheme), int64_t(c.act), s.M, s.E, 5}));
  layer.config.needs_capture = layer.config.needs_replay = true;
  c.force_path(&layer.config.kernel);
  const MoeConfig& cfg = layer.config;
  ASSERT_TRUE(cuda_test::gpu_kernel_class("Sm90Modular").supports(cfg, Platform::probe()).ok);

  // Routing on the host (the spec's ids), the cpu emulation on those ids.
  const StatusOr<cuda_test::CpuRun> cpu = cuda_test::cpu_modular_run(cfg, layer.weights(), layer.hidden, layer.logits);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  const HostTensor& ids = cpu->ids;

  std::vector<DeviceTensor> keep;
  const MoeWeights dw = device_weights(layer, keep);
  // The modular kernel gets the device's routing, as the monolithic one computes
  // it: device and host softmax weights may differ in the last bit (routing
  // tests bound that), and the two kernels are compared bit for bit.
  DeviceTensor hidden(layer.hidden), logits(layer.logits);
  const StatusOr<cuda_test::DeviceRoute> route = cuda_test::device_route(cfg, logits, s.M);
  ASSERT_TRUE(route.ok()) << route.status().to_string();
  EXPECT_EQ(cuda_test::first_difference(route->ids.download(), ids), "") << "device ids differ from route_cpu's";

  auto modular = cuda_test::gpu_kernel_class("Sm90Modular").create(cfg, Platform::probe());
  ASSERT_TRUE(modular.ok()) << modular.status().to_string();
  Status st = (*modular)->prepare_weights(dw);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const StatusOr<HostTensor> mod = cuda_test::modular_run(**modular, hidden, *route, s.M, s.H);
  ASSERT_TRUE(mod.ok()) << mod.status().to_string();
  const HostTensor& mod_out = *mod;

  auto mono = cuda_test::gpu_kernel_class("Sm90Monolithic").create(cfg, Platform::probe());
  ASSERT_TRUE(mono.ok()) << mono.status().to_string();
  ASSERT_TRUE((*mono)->prepare_weights(layer.weights()).ok());  // host weights: copied to the device
  DeviceTensor capture(DType::kI16, {s.M, s.k}), forced(DType::kI32, {s.M, s.k});
  capture.poison();
  const StatusOr<HostTensor> mono_run = cuda_test::monolithic_run(**mono, hidden, logits, s.M, s.H, capture.view());
  ASSERT_TRUE(mono_run.ok()) << mono_run.status().to_string();
  const HostTensor& mono_out = *mono_run;
  const std::vector<double> cap = testing::to_double(capture.download().view());
  EXPECT_EQ(cap, testing::to_double(ids.view())) << "captured ids differ from the spec's";
  EXPECT_EQ(cuda_test::first_difference(mono_out, mod_out), "") << "monolithic and modular outputs differ";

  // Replay of the capture: the same bits.
  HostTensor forced_host(DType::kI32, {s.M, s.k});
  for (int64_t i = 0; i < s.M * s.k; ++i) forced_host.data<int32_t>()[i] = static_cast<int32_t>(cap[i]);
  forced.upload(forced_host);
  const StatusOr<HostTensor> replay = cuda_test::monolithic_run(**mono, hidden, logits, s.M, s.H, {}, forced.view());
  ASSERT_TRUE(replay.ok()) << replay.status().to_string();
  EXPECT_EQ(cuda_test::first_difference(*replay, mono_out), "") << "replay differs";

  const std::vector<double> gpu = testing::to_double(mod_out.view());
  const double err_cpu = testing::rel_l2_error(gpu, testing::to_double(cpu->out.view()));
  const moekit_ref::RoutingResult rr = moekit_ref::route(testing::ref_routing(cfg.routing), layer.logits_exact, s.M, s.E);
  const std::vector<double> ref = moekit_ref::moe_layer_fp8(
      testing::ref_layer(cfg), layer.ref_params(), layer.hidden_exact, s.M, layer.bytes(layer.w13),
      testing::to_double(layer.w13_scale.view()), layer.bytes(layer.w2), testing::to_double(layer.w2_scale.view()),
      rr.ids, rr.weights, static_cast<int>(s.k));
  const double err_ref = testing::rel_l2_error(gpu, ref);
  const bool tc = c.e4m3_accumulation();
  EXPECT_LE(err_cpu, tc ? kTensorCoreBound : kVsCpuBound) << "vs the cpu backend's emulation";
  EXPECT_LE(err_ref, tc ? kTensorCoreBound : kVsReferenceBound) << "vs the fp64 reference's fp8 emulation";
  std::printf("[ fp8      ] %-60s vs cpu %.2e, vs fp64 fp8 %.2e\n", c.name().c_str(), err_cpu, err_ref);
}

INSTANTIATE_TEST_SUITE_P(Sm90, CudaFp8Grid, ::testing::ValuesIn(fp8_cases()),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) { return info.param.name(); });

// run() of the fp8 pipeline allocates nothing and never waits on the host: one
// CUDA graph of it replays the eager output bit for bit, for both schemes.
TEST(CudaFp8, GraphReplayEqualsEager) {
  MOEKIT_REQUIRE_SM90();
  for (Fp8Scheme scheme : {Fp8Scheme::kBlock128, Fp8Scheme::kTensorDynamic}) {
    const Fp8Shape s{48, 16, 4, 256, 128};
    Fp8Layer layer(s, scheme, Activation::kSiluGated, DType::kBF16, testing::seed_from({48, int64_t(scheme), 6}));
    auto mono = cuda_test::gpu_kernel_class("Sm90Monolithic").create(layer.config, Platform::probe());
    ASSERT_TRUE(mono.ok()) << mono.status().to_string();
    ASSERT_TRUE((*mono)->prepare_weights(layer.weights()).ok());
    DeviceTensor hidden(layer.hidden), logits(layer.logits), out_eager(DType::kBF16, {s.M, s.H}),
        out_graph(DType::kBF16, {s.M, s.H});
    DeviceBytes ws((*mono)->workspace_size(s.M));
    cudaStream_t stream = nullptr;
    ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    MoeRunArgs a;
    a.hidden = hidden.view();
    a.router_logits = logits.view();
    a.out = out_eager.view();
    ASSERT_TRUE((*mono)->run(a, Workspace{ws.data(), ws.bytes()}, stream).ok());
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
    out_graph.poison();
    a.out = out_graph.view();
    ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status st = (*mono)->run(a, Workspace{ws.data(), ws.bytes()}, stream);
    cudaGraph_t graph = nullptr;
    ASSERT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(st.ok()) << st.to_string();
    cudaGraphExec_t exec = nullptr;
    ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(cuda_test::first_difference(out_graph.download(), out_eager.download()), "")
        << testing::fp8_scheme_name(scheme);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// batch_invariant: a token's output does not depend on the batch around it
// (no streaming kernel, no K slices: the one tensor-core tile for every M),
// for the schemes whose activation scales are per token or fixed.
TEST(CudaFp8, BatchInvariantRowsDoNotDependOnTheBatch) {
  MOEKIT_REQUIRE_SM90();
  for (Fp8Scheme scheme : {Fp8Scheme::kBlock128, Fp8Scheme::kTensorStatic}) {
    const Fp8Shape s{200, 8, 2, 256, 144};
    Fp8Layer layer(s, scheme, Activation::kSiluGated, DType::kBF16, testing::seed_from({200, int64_t(scheme), 7}));
    layer.config.batch_invariant = true;
    auto mono = cuda_test::gpu_kernel_class("Sm90Monolithic").create(layer.config, Platform::probe());
    ASSERT_TRUE(mono.ok()) << mono.status().to_string();
    ASSERT_TRUE((*mono)->prepare_weights(layer.weights()).ok());
    DeviceTensor hidden(layer.hidden), logits(layer.logits);
    const StatusOr<HostTensor> all = cuda_test::monolithic_run(**mono, hidden, logits, s.M, s.H);
    const StatusOr<HostTensor> one = cuda_test::monolithic_run(**mono, hidden, logits, 1, s.H);
    ASSERT_TRUE(all.ok() && one.ok());
    EXPECT_EQ(std::memcmp(all->data<uint16_t>(), one->data<uint16_t>(), s.H * 2), 0)
        << testing::fp8_scheme_name(scheme) << ": token 0 alone differs from token 0 among " << s.M;
  }
}

// The path table on the host (no device): streaming only where e4m3 mma.sync
// exists, CUTLASS only on Hopper, the mma.sync GEMM elsewhere and when
// forced, on f16 operands before sm_89; the workspace holds its tile list.
TEST(CudaFp8Table, PathsByTargetAndOverride) {
  using cuda::CudaTarget;
  const auto shape = [](CudaTarget t, int64_t top_k) {
    cuda::ExpertsShape s;
    s.num_experts = 64;
    s.hidden = 256;
    s.intermediate = 128;
    s.top_k = top_k;
    s.target = t;
    return s;
  };
  const auto path = [&](CudaTarget t, int64_t M, KernelOptions k = {}, bool invariant = false) {
    cuda::ExpertsShape s = shape(t, 2);
    s.batch_invariant = invariant;
    s.kernel = &k;
    return std::string(cuda::fp8_gemm_path_name(s, M));
  };
  const std::string grouped_sm90 = cuda::fp8_cutlass_gemm_built() ? "cutlass" : "mma_sync e4m3";
  EXPECT_EQ(path(CudaTarget::kSm90, 1), "streaming");
  EXPECT_EQ(path(CudaTarget::kSm90, 64), grouped_sm90);
  EXPECT_EQ(path(CudaTarget::kSm90, 1, {}, true), grouped_sm90) << "batch-invariant mode never streams";
  EXPECT_EQ(path(CudaTarget::kSm89, 1), "streaming");
  EXPECT_EQ(path(CudaTarget::kSm89, 64), "mma_sync e4m3");
  EXPECT_EQ(path(CudaTarget::kSm80, 1), "mma_sync f16") << "no e4m3 mma.sync before sm_89";
  KernelOptions mma;
  mma.sm90_fp8_gemm = "mma_sync";
  EXPECT_EQ(path(CudaTarget::kSm90, 1, mma), "mma_sync e4m3");
  EXPECT_EQ(path(CudaTarget::kSm89, 4096, mma), "mma_sync e4m3");
  EXPECT_EQ(path(CudaTarget::kSm80, 4096, mma), "mma_sync f16");
  KernelOptions f16 = mma;
  f16.sm80_fp8_mma = "f16";
  EXPECT_EQ(path(CudaTarget::kSm90, 64, f16), "mma_sync f16");
  KernelOptions e4m3 = mma;
  e4m3.sm80_fp8_mma = "e4m3";
  EXPECT_EQ(path(CudaTarget::kSm80, 64, e4m3), "mma_sync f16") << "e4m3 operands where the device has none";
  KernelOptions bad = mma;
  bad.sm80_fp8_mma = "bf16";
  EXPECT_FALSE(bad.validate().ok());
  KernelOptions gone;
  gone.sm90_fp8_gemm = "cuda_core";
  EXPECT_FALSE(gone.validate().ok()) << "the CUDA-core GEMMs are gone";

  for (CudaTarget t : {CudaTarget::kSm80, CudaTarget::kSm90}) {
    for (int64_t M : {1, 37, 4096}) {
      const cuda::ExpertsShape s = shape(t, 8);
      const cuda::Fp8WorkspaceLayout l = cuda::fp8_workspace_layout(s, M);
      EXPECT_GE(l.x_tokens - l.gemm_tables, cuda::fp8_mma_gemm_workspace_size(s.num_experts, M * s.top_k))
          << "M=" << M;
    }
  }
}

// The workspace layout on the host: buffers that are live at the same time
// never share bytes; only the pairs whose lives the stage order separates do
// (GEMM1's input and GEMM2's, GEMM1's output and GEMM2's), and every buffer
// ends within the total.
TEST(CudaFp8Table, WorkspaceSharesOnlyBuffersThatAreNotLiveTogether) {
  struct Buffer {
    const char* name;
    size_t offset, bytes;
    int region;  // buffers of one nonzero region may overlap ...
    int stage;   // ... when they belong to different stages (1: GEMM1, 2: GEMM2)
  };
  const auto blocks = [](int64_t cols) { return static_cast<size_t>((cols + 127) / 128); };
  for (cuda::CudaTarget t : {cuda::CudaTarget::kSm80, cuda::CudaTarget::kSm90}) {
    for (const Fp8Shape& sh : {Fp8Shape{1, 8, 2, 4096, 14336}, Fp8Shape{37, 128, 8, 2048, 768},
                               Fp8Shape{4096, 256, 8, 7168, 2048}, Fp8Shape{300, 4, 2, 192, 144}}) {
      cuda::ExpertsShape s;
      s.num_experts = sh.E;
      s.hidden = sh.H;
      s.intermediate = sh.I;
      s.top_k = sh.k;
      s.target = t;
      const cuda::Fp8WorkspaceLayout l = cuda::fp8_workspace_layout(s, sh.M);
      const size_t P = static_cast<size_t>(sh.M * sh.k), H = sh.H, I = sh.I, n1 = 2 * I;
      const std::vector<Buffer> b = {
          {"amax", l.amax, 8, 0, 0},
          {"x_q8", l.x_q8, P * H, 1, 1},
          {"act_q8", l.act_q8, P * I, 1, 2},
          {"x_scale", l.x_scale, P * blocks(sh.H) * 4, 1, 1},
          {"act_scale", l.act_scale, P * blocks(sh.I) * 4, 1, 2},
          {"gemm1_out", l.gemm1_out, P * n1 * 4, 2, 1},
          {"expert_out", l.expert_out, P * H * 4, 2, 2},
          {"gemm_tables", l.gemm_tables, cuda::fp8_mma_gemm_workspace_size(s.num_experts, P), 0, 0},
          {"x_tokens", l.x_tokens, static_cast<size_t>(sh.M) * H, 0, 0},
          {"x_token_scale", l.x_token_scale, static_cast<size_t>(sh.M) * blocks(sh.H) * 4, 0, 0},
      };
      for (size_t i = 0; i < b.size(); ++i) {
        EXPECT_LE(b[i].offset + b[i].bytes, l.total) << b[i].name << " M=" << sh.M;
        EXPECT_GE(b[i].offset, l.row_token + P * 4) << b[i].name << " overlaps the pair buffers";
        for (size_t j = 0; j < i; ++j) {
          const bool overlap = b[i].offset < b[j].offset + b[j].bytes && b[j].offset < b[i].offset + b[i].bytes;
          if (b[i].region != 0 && b[i].region == b[j].region && b[i].stage != b[j].stage) continue;
          EXPECT_FALSE(overlap) << b[i].name << " and " << b[j].name << " overlap, M=" << sh.M;
        }
      }
    }
  }
}

TEST(CudaFp8, OracleSelectsTheCudaKernelsForFp8) {
  MOEKIT_REQUIRE_SM90();
  Fp8Layer layer({4, 8, 2, 256, 128}, Fp8Scheme::kBlock128, Activation::kSiluGated, DType::kBF16, 3);
  const StatusOr<Resolution> r = select_backend(layer.config, Platform::probe());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->backend, "cuda_sm90") << r->report_string();
}

}  // namespace
}  // namespace moekit

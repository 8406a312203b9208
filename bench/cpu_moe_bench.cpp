// CPU backend benchmark: the whole MoE layer through the public MoeLayer on
// the "cpu" backend (the oracle picks its kernel; bf16 weights and
// activations) on the Qwen3-30B-A3B layer shape of bench/shapes/moe_layers.json,
// at M = 1, 64, 256, 1024 tokens, next to this machine's OpenBLAS sgemm rate
// measured in the same run.
//
// Counters: GFLOP/s of the layer counting only the expert GEMMs,
// 2 * M * k * (H * n1 + I * H), and pct_of_sgemm = that rate / the sgemm rate.
// MOEKIT_BENCH_SHAPE=<name> picks another shape of the file.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "moekit/config.h"
#include "moekit/layer.h"
#include "moekit/parallel_for.h"
#include "shape_file.h"

namespace {

using moekit::DType;

constexpr int64_t kMaxTokens = 1024;
// The reference sgemm: a 1024 x 1536 x 2048 product, the shape of the layer's
// GEMM1 at 1024 rows, row-major A . B^T as the expert GEMMs call it.
constexpr int kSgemmM = 1024, kSgemmN = 1536, kSgemmK = 2048;
double g_sgemm_gflops = 0.0;  // measured by BM_OpenblasSgemm, which runs first

// Deterministic fill without std::normal_distribution (a 1.2 GB checkpoint).
uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
void fill_bf16(uint16_t* p, int64_t n, float scale, uint64_t seed) {
  moekit::parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const double u = static_cast<double>(splitmix(seed + i) >> 11) * 0x1.0p-53;  // [0, 1)
      p[i] = moekit::f32_to_bf16_bits(static_cast<float>((2.0 * u - 1.0) * scale));
    }
  });
}

// The shape of MOEKIT_BENCH_SHAPE, qwen3-30b-a3b by default.
moekit::bench::LayerShape load_shape() {
  const char* want = std::getenv("MOEKIT_BENCH_SHAPE");
  return moekit::bench::load_layer_shape(MOEKIT_BENCH_SHAPES_FILE, want ? want : "qwen3-30b-a3b");
}

// The layer, prepared once and shared by every M.
struct Layer {
  moekit::bench::LayerShape shape;
  std::unique_ptr<moekit::MoeLayer> layer;
  std::vector<uint16_t> hidden, out;  // [kMaxTokens, H] bf16
  std::vector<float> logits;          // [kMaxTokens, E] f32

  Layer() : shape(load_shape()) {
    const int64_t E = shape.E, H = shape.H, I = shape.I;
    moekit::MoeConfig c;
    c.num_experts = E;
    c.hidden = H;
    c.intermediate = I;
    c.max_num_tokens = kMaxTokens;
    c.logits_dtype = DType::kF32;
    c.quant.weight_dtype = DType::kBF16;
    c.quant.act_dtype = DType::kBF16;
    c.activation.kind = moekit::Activation::kSiluGated;
    c.routing.method = moekit::RoutingMethod::kRenormalize;
    c.routing.top_k = static_cast<int>(shape.k);
    c.backend = "cpu";
    std::vector<uint16_t> w13(static_cast<size_t>(E * 2 * I * H)), w2(static_cast<size_t>(E * H * I));
    fill_bf16(w13.data(), w13.size(), 1.7f / std::sqrt(float(H)), 1);  // uniform, stddev ~ 1/sqrt(H)
    fill_bf16(w2.data(), w2.size(), 1.7f / std::sqrt(float(I)), 2);
    moekit::MoeWeights w;
    w.w13 = moekit::TensorView::contiguous(w13.data(), DType::kBF16, {E, 2 * I, H});
    w.w2 = moekit::TensorView::contiguous(w2.data(), DType::kBF16, {E, H, I});
    auto made = moekit::MoeLayer::create(c, w, moekit::Device::cpu());
    if (!made.ok()) {
      std::fprintf(stderr, "MoeLayer::create: %s\n", made.status().to_string().c_str());
      std::exit(1);
    }
    layer = std::move(made).value();
    hidden.resize(kMaxTokens * H);
    out.resize(kMaxTokens * H);
    fill_bf16(hidden.data(), hidden.size(), 1.7f, 3);
    logits.resize(kMaxTokens * E);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(splitmix(4 + i) >> 40) * 0x1.0p-22f;
  }
  double gemm_flops(int64_t M) const {
    return 2.0 * M * shape.k * (shape.H * 2.0 * shape.I + shape.I * shape.H);
  }
  moekit::Status run(int64_t M) {
    moekit::LayerForwardArgs a;
    a.hidden = moekit::TensorView::contiguous(hidden.data(), DType::kBF16, {M, shape.H});
    a.out = moekit::TensorView::contiguous(out.data(), DType::kBF16, {M, shape.H});
    a.router_logits = moekit::TensorView::contiguous(logits.data(), DType::kF32, {M, shape.E});
    return layer->forward(a);
  }
};

Layer& layer() {
  static Layer l;
  return l;
}

void BM_OpenblasSgemm(benchmark::State& state) {
  std::vector<float> a(size_t(kSgemmM) * kSgemmK), b(size_t(kSgemmN) * kSgemmK), c(size_t(kSgemmM) * kSgemmN);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(splitmix(i) >> 40) * 0x1.0p-24f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(splitmix(~i) >> 40) * 0x1.0p-24f;
  const double flops = 2.0 * kSgemmM * kSgemmN * kSgemmK;
  double seconds = 0.0;
  int64_t iters = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kSgemmM, kSgemmN, kSgemmK, 1.0f, a.data(), kSgemmK, b.data(),
                kSgemmK, 0.0f, c.data(), kSgemmN);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++iters;
    benchmark::DoNotOptimize(c.data());
  }
  g_sgemm_gflops = flops * iters / seconds * 1e-9;
  state.counters["GFLOP/s"] = g_sgemm_gflops;
}
BENCHMARK(BM_OpenblasSgemm)->Name("openblas_sgemm/1024x1536x2048")->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_CpuMoeLayer(benchmark::State& state) {
  Layer& l = layer();
  const int64_t M = state.range(0);
  double seconds = 0.0;
  int64_t iters = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const moekit::Status st = l.run(M);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++iters;
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      return;
    }
  }
  const double gflops = l.gemm_flops(M) * iters / seconds * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  if (g_sgemm_gflops > 0) state.counters["pct_of_sgemm"] = 100.0 * gflops / g_sgemm_gflops;
  state.SetLabel(l.shape.name + " bf16, " + std::string(l.layer->kernel().name()) + ", " +
                 std::to_string(moekit::parallel_num_threads()) + " threads");
}
BENCHMARK(BM_CpuMoeLayer)->Name("cpu_moe_layer")->ArgName("M")->Arg(1)->Arg(64)->Arg(256)->Arg(1024)
    ->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

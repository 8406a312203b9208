// What routed-expert capture and replay cost on the CPU backend: one MoE layer
// (chosen by the oracle, or MOEKIT_BENCH_KERNEL=CpuModular|CpuMonolithic) of the
// Qwen3-30B-A3B shape from bench/shapes/moe_layers.json, at M = 1 and 256.
//
//   CaptureOff  forward() with no capture target: the baseline
//   CaptureOn   begin_step (sentinel fill) + forward() writing the ids +
//               end_step (check every row, append to the request)
//   Replay      forward() with forced ids (validated, weights computed for them)
//
// BM_Paired runs the three back to back per iteration and reports the medians
// of the per-iteration ratios (capture_pct, replay_pct; targets: capture <= 1%,
// replay <= 2%). BM_CaptureBookkeeping and BM_ForcedIdCheck time the added work
// alone, which is what the ratios measure through the noise of a shared machine.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/capture.h"
#include "moekit/layer.h"
#include "moekit/routing.h"
#include "shape_file.h"

namespace {

using moekit::DType;
using moekit::HostTensor;

constexpr int64_t kMaxTokens = 256;
constexpr int64_t kRowsPerRequest = 1 << 16;  // a request is finished and re-added after this many rows

void fill(HostTensor& t, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = u(rng);
    if (t.dtype() == DType::kBF16) {
      t.data<uint16_t>()[i] = moekit::f32_to_bf16_bits(v);
    } else {
      t.data<float>()[i] = v;
    }
  }
}

void die(const moekit::Status& st) {
  std::fprintf(stderr, "capture_overhead_bench: %s\n", st.to_string().c_str());
  std::exit(1);
}

// One layer with its inputs, a bound capturer, and forced ids equal to what
// routing selects (so replay does the same expert work).
struct Bench {
  moekit::bench::LayerShape shape = moekit::bench::load_layer_shape(MOEKIT_BENCH_SHAPES_FILE, "qwen3-30b-a3b");
  moekit::Model model;
  std::unique_ptr<moekit::RoutedExpertsCapturer> capturer;
  HostTensor hidden, logits, out;  // [256, H] bf16, [256, E] f32, [256, H] bf16
  HostTensor forced;               // [256, k] i32
  int64_t rows_in_request = 0;
  int request = 0;

  Bench() {
    moekit::MoeConfig c;
    c.num_experts = shape.E;
    c.hidden = shape.H;
    c.intermediate = shape.I;
    c.max_num_tokens = kMaxTokens;
    c.routing.method = moekit::RoutingMethod::kRenormalize;
    c.routing.top_k = static_cast<int>(shape.k);
    c.needs_capture = c.needs_replay = true;
    HostTensor w13(DType::kBF16, {shape.E, 2 * shape.I, shape.H}), w2(DType::kBF16, {shape.E, shape.H, shape.I});
    fill(w13, 1, 0.02f);
    fill(w2, 2, 0.02f);
    const moekit::MoeWeights w{w13.view(), w2.view(), {}};
    const char* kernel = std::getenv("MOEKIT_BENCH_KERNEL");
    auto layer = [&]() -> moekit::StatusOr<std::unique_ptr<moekit::MoeLayer>> {
      if (kernel == nullptr) return moekit::MoeLayer::create(c, w, moekit::Platform::cpu_only());
      const std::vector<moekit::Backend> registry = moekit::backend_registry(moekit::Platform::cpu_only());
      for (const auto& k : registry.back().candidates) {
        if (k.name == kernel) return moekit::MoeLayer::create_with(c, w, k, moekit::Platform::cpu_only());
      }
      return moekit::NotFound(std::string("no CPU kernel ") + kernel);
    }();
    if (!layer.ok()) die(layer.status());
    std::printf("layer: %s E=%lld k=%lld H=%lld I=%lld, kernel %s\n", shape.name.c_str(),
                static_cast<long long>(shape.E), static_cast<long long>(shape.k), static_cast<long long>(shape.H),
                static_cast<long long>(shape.I), (*layer)->kernel().name());
    if (auto st = model.add_layer(std::move(layer).value(), 0); !st.ok()) die(st);
    auto cap = moekit::RoutedExpertsCapturer::create(1, kMaxTokens, static_cast<int>(shape.k));
    if (!cap.ok()) die(cap.status());
    capturer = std::move(cap).value();
    hidden = HostTensor(DType::kBF16, {kMaxTokens, shape.H});
    logits = HostTensor(DType::kF32, {kMaxTokens, shape.E});
    out = HostTensor(DType::kBF16, {kMaxTokens, shape.H});
    fill(hidden, 3, 1.0f);
    fill(logits, 4, 2.0f);
    forced = HostTensor(DType::kI32, {kMaxTokens, shape.k});
    HostTensor weights(DType::kF32, {kMaxTokens, shape.k});
    moekit::RoutingArgs r;
    r.logits = logits.view();
    r.topk_ids = forced.view();
    r.topk_weights = weights.view();
    if (auto st = moekit::route_cpu(c.routing, r); !st.ok()) die(st);
  }

  moekit::LayerForwardArgs args(int64_t m, bool replay) const {
    moekit::LayerForwardArgs a;
    a.hidden = moekit::TensorView::contiguous(hidden.view().data, DType::kBF16, {m, shape.H});
    a.router_logits = moekit::TensorView::contiguous(logits.view().data, DType::kF32, {m, shape.E});
    a.out = moekit::TensorView::contiguous(out.view().data, DType::kBF16, {m, shape.H});
    if (replay) a.forced_ids = moekit::TensorView::contiguous(forced.view().data, DType::kI32, {m, shape.k});
    return a;
  }

  void set_capture(bool on) {
    if (on) {
      if (auto st = moekit::bind(model, *capturer); !st.ok()) die(st);
    } else if (auto st = model.layer(0).set_capture_target({}); !st.ok()) {
      die(st);
    }
  }

  // A fresh request when the current one has grown long (an engine finishes requests).
  void next_request(int64_t m, benchmark::State& state) {
    if (rows_in_request + m <= kRowsPerRequest && request > 0) return;
    state.PauseTiming();
    if (request > 0) (void)capturer->finish_request("r" + std::to_string(request));
    ++request;
    rows_in_request = 0;
    if (auto st = capturer->add_request("r" + std::to_string(request)); !st.ok()) die(st);
    state.ResumeTiming();
  }
};

Bench& bench() {
  static Bench b;
  return b;
}

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// One timed forward in each variant.
double time_off(Bench& b, int64_t m) {
  b.set_capture(false);
  const auto a = b.args(m, false);
  const auto t0 = Clock::now();
  if (auto st = b.model.layer(0).forward(a); !st.ok()) die(st);
  return ms_since(t0);
}
double time_capture(Bench& b, int64_t m, benchmark::State& state) {
  b.set_capture(true);
  b.next_request(m, state);
  const auto a = b.args(m, false);
  const moekit::StepLayout step{{{"r" + std::to_string(b.request), m}}};
  const auto t0 = Clock::now();
  if (auto st = b.capturer->begin_step(step); !st.ok()) die(st);
  if (auto st = b.model.layer(0).forward(a); !st.ok()) die(st);
  if (auto st = b.capturer->end_step(); !st.ok()) die(st);
  const double ms = ms_since(t0);
  b.rows_in_request += m;
  return ms;
}
double time_replay(Bench& b, int64_t m) {
  b.set_capture(false);
  const auto a = b.args(m, true);
  const auto t0 = Clock::now();
  if (auto st = b.model.layer(0).forward(a); !st.ok()) die(st);
  return ms_since(t0);
}

// The three variants back to back in every iteration (order rotating), so a
// machine that speeds up or slows down affects all three alike; the overheads
// are medians of the per-iteration ratios against CaptureOff.
void BM_Paired(benchmark::State& state) {
  Bench& b = bench();
  const int64_t m = state.range(0);
  std::vector<double> off, cap, rep, cap_ratio, rep_ratio;
  int64_t it = 0;
  for (auto _ : state) {
    double t[3] = {0, 0, 0};
    for (int j = 0; j < 3; ++j) {
      switch ((it + j) % 3) {
        case 0: t[0] = time_off(b, m); break;
        case 1: t[1] = time_capture(b, m, state); break;
        case 2: t[2] = time_replay(b, m); break;
      }
    }
    ++it;
    off.push_back(t[0]);
    cap.push_back(t[1]);
    rep.push_back(t[2]);
    cap_ratio.push_back(t[1] / t[0]);
    rep_ratio.push_back(t[2] / t[0]);
    state.SetIterationTime((t[0] + t[1] + t[2]) * 1e-3);
  }
  state.counters["off_ms"] = median(off);
  state.counters["capture_ms"] = median(cap);
  state.counters["replay_ms"] = median(rep);
  state.counters["capture_pct"] = (median(cap_ratio) - 1.0) * 100.0;
  state.counters["replay_pct"] = (median(rep_ratio) - 1.0) * 100.0;
}

// The capture work alone, without the layer: sentinel fill, the ids written as
// a kernel writes them, the check and the per-request append.
void BM_CaptureBookkeeping(benchmark::State& state) {
  Bench& b = bench();
  const int64_t m = state.range(0), k = b.shape.k;
  b.set_capture(true);
  const moekit::TensorView target = b.model.layer(0).capture_target();
  for (auto _ : state) {
    b.next_request(m, state);
    const moekit::StepLayout step{{{"r" + std::to_string(b.request), m}}};
    if (auto st = b.capturer->begin_step(step); !st.ok()) die(st);
    int16_t* ids = target.ptr<int16_t>();
    for (int64_t i = 0; i < m * k; ++i) ids[i] = static_cast<int16_t>(b.forced.data<int32_t>()[i]);
    if (auto st = b.capturer->end_step(); !st.ok()) die(st);
    b.rows_in_request += m;
  }
}

// Forced-id validation alone (what replay adds in front of routing).
void BM_ForcedIdCheck(benchmark::State& state) {
  Bench& b = bench();
  const int64_t m = state.range(0);
  const auto a = b.args(m, true);
  for (auto _ : state) {
    if (auto st = moekit::check_forced_ids(a.forced_ids, b.shape.E); !st.ok()) die(st);
  }
}

BENCHMARK(BM_Paired)->Arg(1)->Arg(256)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(20.0);
BENCHMARK(BM_CaptureBookkeeping)->Arg(1)->Arg(256)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ForcedIdCheck)->Arg(1)->Arg(256)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  (void)bench();  // build the layer before any timing
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

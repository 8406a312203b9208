#include "ep_layer_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu_fill.h"
#include "moekit/comm.h"
#include "moekit/device_buffer.h"
#include "moekit/ep_layer.h"
#include "moekit/layer.h"
#include "moekit/tensor.h"

namespace moekit::bench {
namespace {

#define EPL_CUDA(stmt)                                                                      \
  do {                                                                                      \
    const cudaError_t e_ = (stmt);                                                          \
    if (e_ != cudaSuccess) return Internal(std::string(#stmt) + ": " + cudaGetErrorString(e_)); \
  } while (0)

constexpr uint32_t kSeed = 20261130u;
constexpr int kLogitsScaleLog2 = 2;  // logits in [-4, 4)
constexpr int kBiasScaleLog2 = -12;  // present, far too small to pin the selection: balanced load

// As gpu_moe_bench.cu: weights scaled so every pre-activation is O(1) on [-1, 1) inputs.
int weight_scale_log2(int64_t reduction) {
  return static_cast<int>(std::floor(std::log2(2.0 / std::sqrt(static_cast<double>(reduction)))));
}

MoeConfig deepseek_v3(const EpCommBenchOptions& o, int64_t max_tokens) {
  MoeConfig c;
  c.num_experts = o.experts;
  c.hidden = o.hidden;
  c.intermediate = o.intermediate;
  c.max_num_tokens = max_tokens;
  c.logits_dtype = DType::kF32;
  c.quant.weight_dtype = c.quant.act_dtype = DType::kBF16;
  if (o.scheme == "fp8-block") {
    c.quant.method = QuantMethod::kFp8Block128;
    c.quant.weight_dtype = DType::kF8E4M3;
  }
  c.routing.method = RoutingMethod::kDeepseekV3;
  c.routing.top_k = o.top_k;
  c.routing.num_groups = 8;
  c.routing.topk_groups = 4;
  c.routing.routed_scaling_factor = 2.5f;
  c.routing.has_score_bias = true;
  return c;
}

// The full logical weights on the host. Every expert holds the same seeded
// values (timing does not depend on them): one is generated, then copied.
// fp8: e4m3 bytes in [-256, 256) with block scales 2^scale_log2 / 256, so the
// weights span the bf16 ones' range (as gpu_moe_bench.cu).
struct HostWeights {
  HostTensor w13, w2, bias, w13_scale, w2_scale;
  MoeWeights view() const {
    MoeWeights w{w13.view(), w2.view(), bias.view()};
    if (w13.dtype() == DType::kF8E4M3) {
      w.w13_scale = w13_scale.view();
      w.w2_scale = w2_scale.view();
    }
    return w;
  }
};

Status fill_host(HostTensor* t, int64_t per_expert, int scale_log2, uint32_t seed) {
  const size_t bytes = static_cast<size_t>(per_expert) * dtype_size(t->dtype());
  void* d = nullptr;
  EPL_CUDA(cudaMalloc(&d, bytes));
  cudaError_t e = t->dtype() == DType::kF8E4M3
                      ? fill_uniform_e4m3(static_cast<uint8_t*>(d), per_expert, seed, nullptr)
                      : fill_uniform_bf16(static_cast<uint16_t*>(d), per_expert, seed, scale_log2, nullptr);
  if (e == cudaSuccess) e = cudaMemcpy(t->data<char>(), d, bytes, cudaMemcpyDeviceToHost);
  cudaFree(d);
  EPL_CUDA(e);
  const int64_t experts = t->numel() / per_expert;
  for (int64_t x = 1; x < experts; ++x) std::memcpy(t->data<char>() + x * bytes, t->data<char>(), bytes);
  return Status::Ok();
}

StatusOr<HostWeights> make_weights(const EpCommBenchOptions& o) {
  const int64_t E = o.experts, H = o.hidden, I = o.intermediate;
  const bool fp8 = o.scheme == "fp8-block";
  const DType wt = fp8 ? DType::kF8E4M3 : DType::kBF16;
  EPL_CUDA(cudaSetDevice(0));
  HostWeights w{HostTensor(wt, {E, 2 * I, H}), HostTensor(wt, {E, H, I}), HostTensor(DType::kF32, {E})};
  MOEKIT_RETURN_IF_ERROR(fill_host(&w.w13, 2 * I * H, weight_scale_log2(H), kSeed));
  MOEKIT_RETURN_IF_ERROR(fill_host(&w.w2, H * I, weight_scale_log2(I), kSeed + 1));
  if (fp8) {
    const auto blocks = [](int64_t n) { return (n + 127) / 128; };
    w.w13_scale = HostTensor(DType::kF32, {E, 2 * blocks(I), blocks(H)});
    w.w2_scale = HostTensor(DType::kF32, {E, blocks(H), blocks(I)});
    std::fill_n(w.w13_scale.data<float>(), w.w13_scale.numel(), std::ldexp(1.0f, weight_scale_log2(H) - 8));
    std::fill_n(w.w2_scale.data<float>(), w.w2_scale.numel(), std::ldexp(1.0f, weight_scale_log2(I) - 8));
  }
  void* d = nullptr;
  EPL_CUDA(cudaMalloc(&d, E * 4));
  cudaError_t e = fill_uniform_f32(static_cast<float*>(d), E, kSeed + 2, kBiasScaleLog2, nullptr);
  if (e == cudaSuccess) e = cudaMemcpy(w.bias.data<float>(), d, E * 4, cudaMemcpyDeviceToHost);
  cudaFree(d);
  EPL_CUDA(e);
  return w;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One layer's inputs and output for m tokens on the current device, seeded by (rank, m).
struct Tokens {
  DeviceBuffer hidden, logits, out;
  LayerForwardArgs args;
};

StatusOr<Tokens> make_tokens(Device dev, int64_t m, int64_t H, int64_t E, uint32_t seed) {
  Tokens t;
  MOEKIT_ASSIGN_OR_RETURN(t.hidden, DeviceBuffer::allocate(dev, m * H * 2));
  MOEKIT_ASSIGN_OR_RETURN(t.logits, DeviceBuffer::allocate(dev, m * E * 4));
  MOEKIT_ASSIGN_OR_RETURN(t.out, DeviceBuffer::allocate(dev, m * H * 2));
  EPL_CUDA(fill_uniform_bf16(static_cast<uint16_t*>(t.hidden.data()), m * H, seed, 0, nullptr));
  EPL_CUDA(fill_uniform_f32(static_cast<float*>(t.logits.data()), m * E, seed + 1, kLogitsScaleLog2, nullptr));
  EPL_CUDA(cudaDeviceSynchronize());
  t.args.hidden = TensorView::contiguous(t.hidden.data(), DType::kBF16, {m, H}, dev);
  t.args.router_logits = TensorView::contiguous(t.logits.data(), DType::kF32, {m, E}, dev);
  t.args.out = TensorView::contiguous(t.out.data(), DType::kBF16, {m, H}, dev);
  return t;
}

// Median microseconds of `reps` launches of a graph of `forward` on s. With a
// communicator, every launch starts after a barrier, so the ranks start together.
template <typename Forward>
StatusOr<double> time_in_graph(Forward forward, cudaStream_t s, int reps, Communicator* comm) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EPL_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Status captured = forward();
  EPL_CUDA(cudaStreamEndCapture(s, &graph));
  MOEKIT_RETURN_IF_ERROR(captured);
  EPL_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a = nullptr, b = nullptr;
  EPL_CUDA(cudaEventCreate(&a));
  EPL_CUDA(cudaEventCreate(&b));
  std::vector<double> us;
  Status st = Status::Ok();
  for (int i = 0; i < reps + 2 && st.ok(); ++i) {  // 2 warm-up launches
    if (comm != nullptr) st = comm->barrier(s);
    if (!st.ok()) break;
    cudaEventRecord(a, s);
    cudaGraphLaunch(exec, s);
    cudaEventRecord(b, s);
    if (cudaEventSynchronize(b) != cudaSuccess) st = Internal("the graph launch did not complete");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (i >= 2) us.push_back(1000.0 * ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  MOEKIT_RETURN_IF_ERROR(st);
  return median(us);
}

// One rank's numbers for one M.
struct EpCase {
  double layer_us = 0, dispatch_us = 0, experts_us = 0, combine_us = 0, raw_us = 0;
};

Status ep_rank(const EpCommBenchOptions& o, const HostWeights& w, const CommUniqueId& id, int r,
               std::vector<EpCase>* cases) {
  const int n = o.ranks;
  MOEKIT_ASSIGN_OR_RETURN(auto comm, create_nccl_communicator(id, n, r, Device::cuda(r)));
  cudaStream_t s = nullptr;
  EPL_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Status st = Status::Ok();
  for (size_t i = 0; i < o.m_list.size() && st.ok(); ++i) {
    st = [&]() -> Status {
      const int64_t m = o.m_list[i];
      MoeConfig c = deepseek_v3(o, m);
      c.parallel.ep_size = c.parallel.dp_size = n;
      c.parallel.ep_rank = c.parallel.dp_rank = r;
      c.parallel.all2all = All2AllBackend::kNccl;
      MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(c, w.view(), *comm));
      MOEKIT_ASSIGN_OR_RETURN(Tokens t, make_tokens(Device::cuda(r), m, o.hidden, o.experts,
                                                    kSeed + 7919u * static_cast<uint32_t>(m) + 101u * r));
      EpCase& out = (*cases)[i];
      // Phases, eager.
      MOEKIT_RETURN_IF_ERROR(layer->set_phase_timing(true));
      std::vector<double> disp, exp, comb;
      for (int rep = 0; rep < o.reps + 2; ++rep) {
        MOEKIT_RETURN_IF_ERROR(comm->barrier(s));
        MOEKIT_RETURN_IF_ERROR(layer->forward(t.args, s));
        MOEKIT_ASSIGN_OR_RETURN(ExpertParallelLayer::PhaseTimes p, layer->last_phase_times());
        if (rep < 2) continue;
        disp.push_back(p.dispatch_us);
        exp.push_back(p.experts_us);
        comb.push_back(p.combine_us);
      }
      MOEKIT_RETURN_IF_ERROR(layer->set_phase_timing(false));
      out.dispatch_us = median(disp);
      out.experts_us = median(exp);
      out.combine_us = median(comb);
      // The whole forward, in a graph.
      MOEKIT_ASSIGN_OR_RETURN(out.layer_us, time_in_graph([&] { return layer->forward(t.args, s); }, s, o.reps,
                                                          comm.get()));
      // Two raw all-to-alls of the same bytes as dispatch and combine (EpDeviceShape's rows).
      const size_t header = (8 * static_cast<size_t>(o.top_k) + 15) / 16 * 16;
      MOEKIT_ASSIGN_OR_RETURN(double raw_d, time_all_to_all_us(*comm, s, m, header + 2 * o.hidden, o.reps));
      MOEKIT_ASSIGN_OR_RETURN(double raw_c, time_all_to_all_us(*comm, s, m, 2 * o.hidden, o.reps));
      out.raw_us = raw_d + raw_c;
      return Status::Ok();
    }();
  }
  cudaStreamDestroy(s);
  return st;
}

StatusOr<std::vector<double>> single_gpu(const EpCommBenchOptions& o, const HostWeights& w) {
  EPL_CUDA(cudaSetDevice(0));
  const int64_t max_m = *std::max_element(o.m_list.begin(), o.m_list.end());
  MOEKIT_ASSIGN_OR_RETURN(auto layer, MoeLayer::create(deepseek_v3(o, o.ranks * max_m), w.view(), Device::cuda(0)));
  cudaStream_t s = nullptr;
  EPL_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<double> us;
  Status st = Status::Ok();
  for (int64_t m : o.m_list) {
    StatusOr<Tokens> t = make_tokens(Device::cuda(0), o.ranks * m, o.hidden, o.experts, kSeed + 31u * static_cast<uint32_t>(m));
    StatusOr<double> time = t.ok() ? time_in_graph([&] { return layer->forward(t->args, s); }, s, o.reps, nullptr)
                                   : StatusOr<double>(t.status());
    if (!time.ok()) {
      st = time.status();
      break;
    }
    us.push_back(*time);
  }
  cudaStreamDestroy(s);
  MOEKIT_RETURN_IF_ERROR(st);
  return us;
}

}  // namespace

Status run_ep_layer_bench(const EpCommBenchOptions& o, std::ostream& log) {
  if (o.m_list.empty()) return InvalidArgument("bench --ep: no token counts");
  const int n = o.ranks;
  if (o.scheme != "bf16" && o.scheme != "fp8-block") {
    return InvalidArgument("bench --ep: --scheme " + o.scheme + " is not timed on EP ranks (bf16 or fp8-block)");
  }
  const int64_t weight_bytes = o.scheme == "bf16" ? 2 : 1;
  log << "bench --ep " << n << ", layer: building DeepSeek-V3 " << o.scheme << " weights on the host ("
      << (o.experts * 3 * o.hidden * o.intermediate * weight_bytes) / (1 << 30) << " GiB)...\n";
  MOEKIT_ASSIGN_OR_RETURN(HostWeights w, make_weights(o));
  MOEKIT_ASSIGN_OR_RETURN(CommUniqueId id, nccl_unique_id());
  std::vector<std::vector<EpCase>> cases(n, std::vector<EpCase>(o.m_list.size()));
  std::vector<Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { status[r] = ep_rank(o, w, id, r, &cases[r]); });
  for (auto& t : threads) t.join();
  for (const Status& s : status) MOEKIT_RETURN_IF_ERROR(s);
  MOEKIT_ASSIGN_OR_RETURN(std::vector<double> single, single_gpu(o, w));

  char line[320];
  std::snprintf(line, sizeof line,
                "bench --ep %d, layer: DeepSeek-V3 (E=%lld, k=%d, H=%lld, I=%lld) %s, balanced; median us, "
                "slowest rank; single GPU on %d x M tokens\n",
                n, static_cast<long long>(o.experts), o.top_k, static_cast<long long>(o.hidden),
                static_cast<long long>(o.intermediate), o.scheme.c_str(), n);
  log << line;
  log << "  tokens/rank    EP layer   1 GPU (NxM)  speedup    dispatch     experts     combine   2 raw a2a  "
         "(disp+comb)/raw\n";
  for (size_t i = 0; i < o.m_list.size(); ++i) {
    EpCase worst;
    for (int r = 0; r < n; ++r) {
      const EpCase& c = cases[r][i];
      worst.layer_us = std::max(worst.layer_us, c.layer_us);
      worst.dispatch_us = std::max(worst.dispatch_us, c.dispatch_us);
      worst.experts_us = std::max(worst.experts_us, c.experts_us);
      worst.combine_us = std::max(worst.combine_us, c.combine_us);
      worst.raw_us = std::max(worst.raw_us, c.raw_us);
    }
    std::snprintf(line, sizeof line, "  %11lld  %10.1f  %12.1f  %7.2fx  %10.1f  %10.1f  %10.1f  %10.1f  %8.2f\n",
                  static_cast<long long>(o.m_list[i]), worst.layer_us, single[i], single[i] / worst.layer_us,
                  worst.dispatch_us, worst.experts_us, worst.combine_us, worst.raw_us,
                  (worst.dispatch_us + worst.combine_us) / worst.raw_us);
    log << line;
  }
  log << "  targets (2 GPUs): speedup >= 1.7x at 4096 tokens/rank, >= 1.5x at 256; dispatch + combine <= 100 us "
         "at 128; fp8-block EP layer >= 1.5x faster than bf16 at 256 (two runs, --scheme)\n";
  return Status::Ok();
}

}  // namespace moekit::bench

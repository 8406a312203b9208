// The GPU MoE layer benchmark (see gpu_moe_bench.h).
//
// Per case (shape, M): num_sets input sets (hidden, logits) drawn on the device
// from recorded seeds (gpu_fill.h), one CUDA graph per set holding one whole
// MoeLayer::forward (routing included); the graphs are launched round-robin and
// every launch is timed between two events. The case time is the median launch.
//
// Floor of a case = max(bytes / read bandwidth, flops / matmul rate), with
//   bytes = distinct experts touched (mean over the sets, from the CPU routing of
//           the same logits) x weight bytes per expert + hidden in + out,
//   flops = 2 * M * k * (rows of W13 + rows of W2) * ... = 2·M·k·(N13·H + H·I).
#include "gpu_moe_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "gpu_ceilings.h"
#include "gpu_fill.h"
#include "moekit/capture.h"
#include "moekit/config.h"
#include "moekit/dtype.h"
#include "moekit/layer.h"
#include "moekit/routing.h"

namespace moekit::bench {
namespace {

using nlohmann::json;

#define BENCH_CUDA_RETURN(expr)                                                                        \
  do {                                                                                                 \
    cudaError_t e_ = (expr);                                                                           \
    if (e_ != cudaSuccess) return Internal(std::string(#expr) + ": " + cudaGetErrorString(e_));        \
  } while (0)

// Tensor kinds in the seed recipe (NOTE: peer_torch.py reads the seeds from the JSON).
enum class TensorKind : uint32_t { kW13 = 1, kW2 = 2, kBias = 3, kHidden = 4, kLogits = 5, kExpertBias = 6, kShared = 7 };

struct ShapeSpec {
  std::string name;
  MoeConfig config;  // max_num_tokens set per run
};

// A device allocation freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  Status allocate(size_t n) {
    bytes = n;
    const cudaError_t e = cudaMalloc(&ptr, n == 0 ? 16 : n);
    if (e != cudaSuccess) {
      ptr = nullptr;
      return ResourceExhausted("cudaMalloc of " + std::to_string(n) + " bytes: " + cudaGetErrorString(e));
    }
    return Status::Ok();
  }
};

uint32_t seed_of(uint32_t base, int shape_index, TensorKind kind, int set, int64_t m) {
  return base + 1000003u * static_cast<uint32_t>(shape_index) + 10007u * static_cast<uint32_t>(kind) +
         101u * static_cast<uint32_t>(set) + 7919u * static_cast<uint32_t>(m);
}

// Weights scaled so that every pre-activation is O(1) on uniform [-1, 1) inputs.
int weight_scale_log2(int64_t reduction) {
  return static_cast<int>(std::floor(std::log2(2.0 / std::sqrt(static_cast<double>(reduction)))));
}
constexpr int kHiddenScaleLog2 = 0;   // hidden in [-1, 1)
constexpr int kLogitsScaleLog2 = 2;   // logits in [-4, 4)
// Score bias in [-2^-12, 2^-12): present (the bias path runs) but far too small
// to pin the selection, so with i.i.d. logits every expert is equally likely, as
// in a served model whose bias has balanced the load.
constexpr int kBiasScaleLog2 = -12;

// The skewed variant (--skew ALPHA > 0): expert e's logits get the offset
// -ALPHA * ln(1 + e), computed in double and rounded to f32 once, so expert
// popularity falls off like a Zipf law of exponent ~ALPHA. The offsets go into
// the JSON so the peers add the same f32 values.
std::vector<float> logit_offsets(int64_t num_experts, double skew) {
  std::vector<float> off(static_cast<size_t>(num_experts), 0.0f);
  if (skew > 0) {
    for (int64_t e = 0; e < num_experts; ++e) off[e] = static_cast<float>(-skew * std::log1p(static_cast<double>(e)));
  }
  return off;
}

__global__ void add_expert_offsets_kernel(float* logits, int64_t m, int64_t e, const float* off) {
  const int64_t n = m * e;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    logits[i] += off[i % e];
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

StatusOr<std::vector<ShapeSpec>> load_shapes(const std::string& path, std::vector<int64_t>* m_list) {
  std::ifstream in(path);
  if (!in) return NotFound("shape list " + path + ": cannot open");
  json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    return InvalidArgument("shape list " + path + ": " + e.what());
  }
  std::vector<ShapeSpec> shapes;
  try {
    if (m_list->empty()) *m_list = j.at("m").get<std::vector<int64_t>>();
    for (const json& s : j.at("shapes")) {
      ShapeSpec spec;
      spec.name = s.at("name").get<std::string>();
      MoeConfig& c = spec.config;
      c.num_experts = s.at("experts").get<int64_t>();
      c.hidden = s.at("hidden").get<int64_t>();
      c.intermediate = s.at("intermediate").get<int64_t>();
      c.routing.top_k = s.at("top_k").get<int>();
      const auto method = parse_routing_method(s.at("routing").get<std::string>());
      if (!method) return InvalidArgument("shape " + spec.name + ": unknown routing " + s.at("routing").dump());
      c.routing.method = *method;
      c.routing.num_groups = s.value("num_groups", 1);
      c.routing.topk_groups = s.value("topk_groups", 1);
      c.routing.routed_scaling_factor = s.value("routed_scaling_factor", 1.0f);
      c.routing.has_score_bias = s.value("score_bias", false);
      c.has_expert_bias = s.value("expert_bias", false);
      c.shared_intermediate = s.value("shared_intermediate", int64_t{0});
      c.has_shared_gate = s.value("shared_gate", false);
      const auto act = parse_activation(s.value("activation", std::string("silu")));
      if (!act) return InvalidArgument("shape " + spec.name + ": unknown activation " + s.at("activation").dump());
      c.activation.kind = *act;
      c.logits_dtype = DType::kF32;
      c.quant.weight_dtype = DType::kBF16;
      c.quant.act_dtype = DType::kBF16;
      shapes.push_back(std::move(spec));
    }
  } catch (const std::exception& e) {
    return InvalidArgument("shape list " + path + ": " + e.what());
  }
  if (m_list->empty()) return InvalidArgument("shape list " + path + ": no M values");
  return shapes;
}

struct CaseResult {
  std::string shape;
  int64_t m = 0;
  std::string backend, kernel;
  double time_s = 0, time_min_s = 0, time_max_s = 0;
  double touched_experts = 0;  // mean over the sets
  double max_over_mean = 0;    // busiest expert's tokens / (M·k / E), mean over the sets
  double weight_bytes = 0, act_bytes = 0, flops = 0;
  double floor_s = 0;
  bool floor_is_memory = true;
  size_t workspace_bytes = 0;
  int launches = 0;
  double enqueue_s = 0;  // host time of one eager forward (no graph), median over batches
  std::vector<uint32_t> hidden_seeds, logits_seeds;
  std::string dump_file;  // empty when not dumped
  std::vector<double> variant_time_s;    // median per --variant, in order
  std::vector<double> variant_rel_diff;  // set-0 output vs the default's, relative L2
};

// A --variant: environment overrides (e.g. MOEKIT_SM90_STREAM=rows32_k64_t16)
// under which a second set of graphs is captured and timed beside the default.
// What a variant's forward does beside the layer itself (--capture-modes).
enum class VariantMode {
  kPlain,    // the forward alone
  kCapture,  // as an engine records: the forward writing the ids into a bound RoutedExpertsCapturer, whose
            // begin_step / end_step_async (rows moved to pinned host memory) wrap each launch
  kReplay,   // the forward with forced ids (the ids this layer selected for the set, from pinned host memory)
};

struct Variant {
  std::string name;
  std::vector<std::pair<std::string, std::string>> env;
  VariantMode mode = VariantMode::kPlain;
  bool shared_overlap = false;  // on the second layer, built with MoeConfig::shared_expert_overlap (--shared-overlap both)
};

// Pinned host memory freed on scope exit (a graph's host copies need pinned memory).
struct PinnedHost {
  void* ptr = nullptr;
  PinnedHost() = default;
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  ~PinnedHost() {
    if (ptr) cudaFreeHost(ptr);
  }
};

// "NAME:VAR=VALUE,VAR=VALUE" -> Variant.
StatusOr<Variant> parse_variant(const std::string& spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string::npos || colon == 0) return InvalidArgument("--variant " + spec + ": expected NAME:VAR=VALUE,...");
  Variant v;
  v.name = spec.substr(0, colon);
  std::stringstream rest(spec.substr(colon + 1));
  std::string item;
  while (std::getline(rest, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) return InvalidArgument("--variant " + spec + ": '" + item + "' is not VAR=VALUE");
    v.env.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  if (v.env.empty()) return InvalidArgument("--variant " + spec + ": no VAR=VALUE");
  return v;
}

// Sets a variant's variables for its scope, then restores what was there; the
// kernel options (config.h) are re-read from the environment both times, so
// the same layer takes the variant's paths.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::vector<std::pair<std::string, std::string>>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_.push_back({name, old != nullptr, old != nullptr ? old : ""});
      setenv(name.c_str(), value.c_str(), 1);
    }
    reload_kernel_options_environment();
  }
  ~ScopedEnv() {
    for (const Saved& s : saved_) {
      if (s.had) {
        setenv(s.name.c_str(), s.value.c_str(), 1);
      } else {
        unsetenv(s.name.c_str());
      }
    }
    reload_kernel_options_environment();
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  struct Saved {
    std::string name;
    bool had;
    std::string value;
  };
  std::vector<Saved> saved_;
};

// ||a - b|| / ||b|| of two bf16 vectors (inf when a has a non-finite value).
double rel_l2_bf16(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = bf16_bits_to_f32(a[i]), y = bf16_bits_to_f32(b[i]);
    if (!std::isfinite(x)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

Status write_npy_u16(const std::string& path, const std::vector<uint16_t>& data, int64_t rows, int64_t cols) {
  std::ostringstream header;
  header << "{'descr': '<u2', 'fortran_order': False, 'shape': (" << rows << ", " << cols << "), }";
  std::string h = header.str();
  const size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) return IoError(path + ": cannot open for writing");
  const char magic[] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(magic, 8);
  const uint16_t hlen = static_cast<uint16_t>(h.size());
  out.write(reinterpret_cast<const char*>(&hlen), 2);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * 2));
  if (!out) return IoError(path + ": write failed");
  return Status::Ok();
}

struct ExpertLoad {
  int64_t touched = 0;    // experts with at least one token
  int64_t max_tokens = 0; // tokens of the busiest expert
};

// Expert load of the CPU routing of `logits` (host [M, E] f32).
StatusOr<ExpertLoad> expert_load(const RoutingConfig& routing, int64_t num_experts, const std::vector<float>& logits,
                                  const std::vector<float>& bias, int64_t m) {
  HostTensor ids(DType::kI32, {m, routing.top_k});
  HostTensor weights(DType::kF32, {m, routing.top_k});
  HostTensor counts(DType::kI32, {num_experts});
  RoutingArgs args;
  args.logits = TensorView::contiguous(const_cast<float*>(logits.data()), DType::kF32, {m, num_experts});
  if (routing.has_score_bias) {
    args.score_bias = TensorView::contiguous(const_cast<float*>(bias.data()), DType::kF32, {num_experts});
  }
  args.topk_ids = ids.view();
  args.topk_weights = weights.view();
  args.expert_counts = counts.view();
  MOEKIT_RETURN_IF_ERROR(route_cpu(routing, args));
  ExpertLoad load;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t n = counts.data<int32_t>()[e];
    load.touched += n > 0 ? 1 : 0;
    load.max_tokens = std::max(load.max_tokens, n);
  }
  return load;
}

class ShapeRunner {
 public:
  ShapeRunner(const GpuBenchOptions& opt, const Ceilings& ceil, int shape_index, const ShapeSpec& spec,
              int64_t max_m, const std::vector<Variant>& variants, std::ostream& log)
      : opt_(opt),
        ceil_(ceil),
        shape_index_(shape_index),
        spec_(spec),
        max_m_(max_m),
        variants_(variants),
        log_(log) {}

  Status setup() {
    MoeConfig& c = config_;
    c = spec_.config;
    c.max_num_tokens = max_m_;
    c.backend = opt_.backend;
    c.batch_invariant = opt_.batch_invariant;
    c.shared_expert_overlap = opt_.shared_overlap == "on" && c.shared_intermediate > 0;
    const int64_t E = c.num_experts, H = c.hidden, I = c.intermediate;
    n13_ = c.activation.gated() ? 2 * I : I;
    if (opt_.scheme == "fp8-block" || opt_.scheme == "fp8-tensor") {
      c.quant.method = opt_.scheme == "fp8-block" ? QuantMethod::kFp8Block128 : QuantMethod::kFp8PerTensor;
      c.quant.weight_dtype = DType::kF8E4M3;
    } else if (opt_.scheme != "bf16") {
      c.quant.method = *parse_quant_method(opt_.scheme);  // the flag's check admits only method names
      c.quant.weight_dtype = DType::kU8;
    }
    MOEKIT_RETURN_IF_ERROR(c.validate());
    offsets_ = logit_offsets(E, opt_.skew);
    // Weights exist only until the layer has prepared its own copy.
    DeviceBuffer w13, w2, bias;
    MOEKIT_RETURN_IF_ERROR(w13.allocate(static_cast<size_t>(E * n13_ * H) * 2));  // [E, N13, H] bf16
    MOEKIT_RETURN_IF_ERROR(w2.allocate(static_cast<size_t>(E * H * I) * 2));      // [E, H, I] bf16
    BENCH_CUDA_RETURN(fill_uniform_bf16(static_cast<uint16_t*>(w13.ptr), E * n13_ * H,
                                        seed_of(opt_.seed, shape_index_, TensorKind::kW13, 0, 0),
                                        weight_scale_log2(H), nullptr));
    BENCH_CUDA_RETURN(fill_uniform_bf16(static_cast<uint16_t*>(w2.ptr), E * H * I,
                                        seed_of(opt_.seed, shape_index_, TensorKind::kW2, 0, 0),
                                        weight_scale_log2(I), nullptr));
    MoeWeights weights;
    weights.w13 = TensorView::contiguous(w13.ptr, DType::kBF16, {E, n13_, H}, Device::cuda(0));
    weights.w2 = TensorView::contiguous(w2.ptr, DType::kBF16, {E, H, I}, Device::cuda(0));
    // fp8: e4m3 bytes in [-256, 256) with scales 2^weight_scale_log2 / 256, so the
    // real weights span the bf16 ones' range; data values do not change the time.
    HostTensor w13_scale, w2_scale;
    DeviceBuffer d_w13_scale, d_w2_scale;  // the scales live where the weights do
    if (c.quant.is_fp8()) {
      const bool block = c.quant.method == QuantMethod::kFp8Block128;
      const int64_t P = c.activation.gated() ? 2 : 1, bh = (H + 127) / 128, bi = (I + 127) / 128;
      BENCH_CUDA_RETURN(fill_uniform_e4m3(static_cast<uint8_t*>(w13.ptr), E * n13_ * H,
                                          seed_of(opt_.seed, shape_index_, TensorKind::kW13, 0, 0), nullptr));
      BENCH_CUDA_RETURN(fill_uniform_e4m3(static_cast<uint8_t*>(w2.ptr), E * H * I,
                                          seed_of(opt_.seed, shape_index_, TensorKind::kW2, 0, 0), nullptr));
      weights.w13 = TensorView::contiguous(w13.ptr, DType::kF8E4M3, {E, n13_, H}, Device::cuda(0));
      weights.w2 = TensorView::contiguous(w2.ptr, DType::kF8E4M3, {E, H, I}, Device::cuda(0));
      w13_scale = block ? HostTensor(DType::kF32, {E, P * bi, bh}) : HostTensor(DType::kF32, {E, P});
      w2_scale = block ? HostTensor(DType::kF32, {E, bh, bi}) : HostTensor(DType::kF32, {E});
      std::fill_n(w13_scale.data<float>(), w13_scale.numel(), std::ldexp(1.0f, weight_scale_log2(H) - 8));
      std::fill_n(w2_scale.data<float>(), w2_scale.numel(), std::ldexp(1.0f, weight_scale_log2(I) - 8));
      MOEKIT_RETURN_IF_ERROR(d_w13_scale.allocate(w13_scale.numel() * 4));
      MOEKIT_RETURN_IF_ERROR(d_w2_scale.allocate(w2_scale.numel() * 4));
      BENCH_CUDA_RETURN(cudaMemcpy(d_w13_scale.ptr, w13_scale.data<float>(), w13_scale.numel() * 4, cudaMemcpyHostToDevice));
      BENCH_CUDA_RETURN(cudaMemcpy(d_w2_scale.ptr, w2_scale.data<float>(), w2_scale.numel() * 4, cudaMemcpyHostToDevice));
      weights.w13_scale = TensorView::contiguous(d_w13_scale.ptr, DType::kF32, w13_scale.shape(), Device::cuda(0));
      weights.w2_scale = TensorView::contiguous(d_w2_scale.ptr, DType::kF32, w2_scale.shape(), Device::cuda(0));
    }
    // 4-bit: random bytes (every code is a value) in the bf16 buffers, and scales
    // that put the weights in the bf16 ones' range (mxfp4 2^(code - 127) with
    // values up to 6; int4 up to 8 units).
    if (c.quant.is_weight4()) {
      const int64_t g = weight4_group(c.quant.method);
      const bool mx = c.quant.method == QuantMethod::kMxfp4;
      BENCH_CUDA_RETURN(fill_uniform_e4m3(static_cast<uint8_t*>(w13.ptr), E * n13_ * H / 2,
                                          seed_of(opt_.seed, shape_index_, TensorKind::kW13, 0, 0), nullptr));
      BENCH_CUDA_RETURN(fill_uniform_e4m3(static_cast<uint8_t*>(w2.ptr), E * H * I / 2,
                                          seed_of(opt_.seed, shape_index_, TensorKind::kW2, 0, 0), nullptr));
      weights.w13 = TensorView::contiguous(w13.ptr, DType::kU8, {E, n13_, H / 2}, Device::cuda(0));
      weights.w2 = TensorView::contiguous(w2.ptr, DType::kU8, {E, H, I / 2}, Device::cuda(0));
      const DType sd = mx ? DType::kU8 : DType::kF32;  // E8M0 codes or f32 scales
      w13_scale = HostTensor(sd, {E, n13_, H / g});
      w2_scale = HostTensor(sd, {E, H, I / g});
      for (auto [t, fan_in] : {std::pair{&w13_scale, H}, std::pair{&w2_scale, I}}) {
        const int e = weight_scale_log2(fan_in);
        for (int64_t i = 0; i < t->numel(); ++i) {
          if (mx) {
            t->data<uint8_t>()[i] = static_cast<uint8_t>(127 + e - 2);
          } else {
            t->data<float>()[i] = std::ldexp(1.0f, e - 3);
          }
        }
      }
      MOEKIT_RETURN_IF_ERROR(d_w13_scale.allocate(w13_scale.nbytes()));
      MOEKIT_RETURN_IF_ERROR(d_w2_scale.allocate(w2_scale.nbytes()));
      BENCH_CUDA_RETURN(cudaMemcpy(d_w13_scale.ptr, w13_scale.data<uint8_t>(), w13_scale.nbytes(), cudaMemcpyHostToDevice));
      BENCH_CUDA_RETURN(cudaMemcpy(d_w2_scale.ptr, w2_scale.data<uint8_t>(), w2_scale.nbytes(), cudaMemcpyHostToDevice));
      weights.w13_scale = TensorView::contiguous(d_w13_scale.ptr, sd, w13_scale.shape(), Device::cuda(0));
      weights.w2_scale = TensorView::contiguous(d_w2_scale.ptr, sd, w2_scale.shape(), Device::cuda(0));
    }
    if (c.routing.has_score_bias) {
      MOEKIT_RETURN_IF_ERROR(bias.allocate(static_cast<size_t>(E) * 4));  // [E] f32
      BENCH_CUDA_RETURN(fill_uniform_f32(static_cast<float*>(bias.ptr), E,
                                         seed_of(opt_.seed, shape_index_, TensorKind::kBias, 0, 0), kBiasScaleLog2,
                                         nullptr));
      weights.score_bias = TensorView::contiguous(bias.ptr, DType::kF32, {E}, Device::cuda(0));
      host_bias_.resize(E);
      BENCH_CUDA_RETURN(cudaMemcpy(host_bias_.data(), bias.ptr, E * 4, cudaMemcpyDeviceToHost));
    }
    // The extras (config.h), small uniform values: their cost is what is measured.
    DeviceBuffer b13, b2, sw13, sw2, sgate;
    if (c.has_expert_bias) {
      MOEKIT_RETURN_IF_ERROR(b13.allocate(static_cast<size_t>(E * n13_) * 4));  // [E, N13] f32
      MOEKIT_RETURN_IF_ERROR(b2.allocate(static_cast<size_t>(E * H) * 4));      // [E, H] f32
      const uint32_t seed = seed_of(opt_.seed, shape_index_, TensorKind::kExpertBias, 0, 0);
      BENCH_CUDA_RETURN(fill_uniform_f32(static_cast<float*>(b13.ptr), E * n13_, seed, -4, nullptr));
      BENCH_CUDA_RETURN(fill_uniform_f32(static_cast<float*>(b2.ptr), E * H, seed + 1, -4, nullptr));
      weights.w13_bias = TensorView::contiguous(b13.ptr, DType::kF32, {E, n13_}, Device::cuda(0));
      weights.w2_bias = TensorView::contiguous(b2.ptr, DType::kF32, {E, H}, Device::cuda(0));
    }
    if (c.shared_intermediate > 0) {
      const int64_t Is = c.shared_intermediate, n1s = c.activation.gated() ? 2 * Is : Is;
      MOEKIT_RETURN_IF_ERROR(sw13.allocate(static_cast<size_t>(n1s * H) * 2));  // [N1s, H] bf16
      MOEKIT_RETURN_IF_ERROR(sw2.allocate(static_cast<size_t>(H * Is) * 2));    // [H, Is] bf16
      const uint32_t seed = seed_of(opt_.seed, shape_index_, TensorKind::kShared, 0, 0);
      BENCH_CUDA_RETURN(fill_uniform_bf16(static_cast<uint16_t*>(sw13.ptr), n1s * H, seed, weight_scale_log2(H), nullptr));
      BENCH_CUDA_RETURN(fill_uniform_bf16(static_cast<uint16_t*>(sw2.ptr), H * Is, seed + 1, weight_scale_log2(Is), nullptr));
      weights.shared_w13 = TensorView::contiguous(sw13.ptr, DType::kBF16, {n1s, H}, Device::cuda(0));
      weights.shared_w2 = TensorView::contiguous(sw2.ptr, DType::kBF16, {H, Is}, Device::cuda(0));
      if (c.has_shared_gate) {
        MOEKIT_RETURN_IF_ERROR(sgate.allocate(static_cast<size_t>(H) * 4));  // [H] f32
        BENCH_CUDA_RETURN(fill_uniform_f32(static_cast<float*>(sgate.ptr), H, seed + 2, weight_scale_log2(H), nullptr));
        weights.shared_gate = TensorView::contiguous(sgate.ptr, DType::kF32, {H}, Device::cuda(0));
      }
    }
    BENCH_CUDA_RETURN(cudaDeviceSynchronize());
    auto layer = MoeLayer::create(c, weights);
    if (!layer.ok()) return layer.status();
    layer_ = std::move(*layer);
    if (opt_.capture_modes) {
      // One capturer for the capture variant, bound once; its graphs are captured
      // with the target set, every other variant's without (capture_and_time).
      MOEKIT_RETURN_IF_ERROR(model_.add_layer(layer_, 0));
      auto cap = RoutedExpertsCapturer::create(1, max_m_, c.top_k(), Device::cuda(0));
      if (!cap.ok()) return cap.status();
      capturer_ = std::move(*cap);
      MOEKIT_RETURN_IF_ERROR(bind(model_, *capturer_));
      MOEKIT_RETURN_IF_ERROR(layer_->set_capture_target({}));
    }
    if (opt_.shared_overlap == "both" && c.shared_intermediate > 0) {
      // The same weights, the shared expert on the side stream: the "overlap" variant's layer.
      MoeConfig overlap = c;
      overlap.shared_expert_overlap = true;
      auto second = MoeLayer::create(overlap, weights);
      if (!second.ok()) return second.status();
      overlap_layer_ = std::move(*second);
    }
    BENCH_CUDA_RETURN(cudaDeviceSynchronize());
    log_ << "  " << spec_.name << ": backend " << layer_->backend() << ", kernel " << layer_->kernel().name()
         << ", workspace " << layer_->workspace_bytes() / (1024.0 * 1024.0) << " MiB at M=" << max_m_ << "\n";
    return Status::Ok();
  }

  StatusOr<CaseResult> run_case(int64_t m) {
    const MoeConfig& c = config_;
    const int64_t E = c.num_experts, H = c.hidden, I = c.intermediate, k = c.top_k();
    const int sets = std::max(1, opt_.num_sets);
    CaseResult r;
    r.shape = spec_.name;
    r.m = m;
    r.backend = layer_->backend();
    r.kernel = layer_->kernel().name();
    r.workspace_bytes = layer_->workspace_bytes();

    std::vector<DeviceBuffer> hidden(sets), logits(sets), out(sets);
    double touched_sum = 0, imbalance_sum = 0;
    DeviceBuffer offsets;
    const bool skewed = opt_.skew > 0;
    if (skewed) {
      MOEKIT_RETURN_IF_ERROR(offsets.allocate(static_cast<size_t>(E) * 4));
      BENCH_CUDA_RETURN(cudaMemcpy(offsets.ptr, offsets_.data(), E * 4, cudaMemcpyHostToDevice));
    }
    for (int s = 0; s < sets; ++s) {
      MOEKIT_RETURN_IF_ERROR(hidden[s].allocate(static_cast<size_t>(m * H) * 2));  // [M, H] bf16
      MOEKIT_RETURN_IF_ERROR(logits[s].allocate(static_cast<size_t>(m * E) * 4));  // [M, E] f32
      MOEKIT_RETURN_IF_ERROR(out[s].allocate(static_cast<size_t>(m * H) * 2));     // [M, H] bf16
      const uint32_t hs = seed_of(opt_.seed, shape_index_, TensorKind::kHidden, s, m);
      const uint32_t ls = seed_of(opt_.seed, shape_index_, TensorKind::kLogits, s, m);
      r.hidden_seeds.push_back(hs);
      r.logits_seeds.push_back(ls);
      BENCH_CUDA_RETURN(fill_uniform_bf16(static_cast<uint16_t*>(hidden[s].ptr), m * H, hs, kHiddenScaleLog2, nullptr));
      BENCH_CUDA_RETURN(fill_uniform_f32(static_cast<float*>(logits[s].ptr), m * E, ls, kLogitsScaleLog2, nullptr));
      if (skewed) {
        add_expert_offsets_kernel<<<256, 256>>>(static_cast<float*>(logits[s].ptr), m, E,
                                                static_cast<const float*>(offsets.ptr));
        BENCH_CUDA_RETURN(cudaGetLastError());
      }
      std::vector<float> host_logits(static_cast<size_t>(m * E));
      BENCH_CUDA_RETURN(cudaMemcpy(host_logits.data(), logits[s].ptr, m * E * 4, cudaMemcpyDeviceToHost));
      auto load = expert_load(c.routing, E, host_logits, host_bias_, m);
      if (!load.ok()) return load.status();
      touched_sum += static_cast<double>(load->touched);
      imbalance_sum += static_cast<double>(load->max_tokens) * static_cast<double>(E) / static_cast<double>(m * k);
    }
    r.touched_experts = touched_sum / sets;
    r.max_over_mean = imbalance_sum / sets;
    // fp8: 1-byte weights plus their f32 scales; FLOPs at the fp8 matmul rate.
    // 4-bit: half a byte per weight plus the scales (u8 or f32 per group); FLOPs at the bf16 rate.
    const bool fp8 = c.quant.is_fp8();
    const double weight_scale_bytes =
        c.quant.is_weight4() ? (c.quant.method == QuantMethod::kMxfp4 ? 1.0 : 4.0) /
                                   static_cast<double>(weight4_group(c.quant.method))
                             : 0.0;
    const double bytes_per_weight = c.quant.is_weight4() ? 0.5 + weight_scale_bytes : fp8 ? 1.0 : 2.0;
    const double scales_per_expert =
        !fp8 ? 0.0
             : c.quant.method == QuantMethod::kFp8PerTensor
                   ? 3.0
                   : static_cast<double>((n13_ / (c.activation.gated() ? 2 : 1) + 127) / 128 *
                                             (c.activation.gated() ? 2 : 1) * ((H + 127) / 128) +
                                         ((H + 127) / 128) * ((I + 127) / 128));
    r.weight_bytes = r.touched_experts * (static_cast<double>(n13_ * H + H * I) * bytes_per_weight +
                                          scales_per_expert * 4.0);
    r.act_bytes = 2.0 * static_cast<double>(m * H) * 2.0;
    r.flops = 2.0 * static_cast<double>(m * k) * static_cast<double>(n13_ * H + H * I);
    const double t_mem = (r.weight_bytes + r.act_bytes) / ceil_.read_bytes_per_s;
    const double t_math = r.flops / (fp8 ? ceil_.fp8_matmul_flops_per_s : ceil_.matmul_flops_per_s);
    r.floor_s = std::max(t_mem, t_math);
    r.floor_is_memory = t_mem >= t_math;

    cudaStream_t stream;
    BENCH_CUDA_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::vector<cudaGraphExec_t> graphs(sets, nullptr);
    Status status = capture_and_time(m, sets, hidden, logits, out, stream, &graphs, &r);
    for (cudaGraphExec_t g : graphs) {
      if (g) cudaGraphExecDestroy(g);
    }
    cudaStreamDestroy(stream);
    MOEKIT_RETURN_IF_ERROR(status);
    return r;
  }

 private:
  // One graph per (variant, input set); variant 0 is the default configuration,
  // the others set their environment overrides while their graphs are captured.
  Status capture_and_time(int64_t m, int sets, std::vector<DeviceBuffer>& hidden, std::vector<DeviceBuffer>& logits,
                          std::vector<DeviceBuffer>& out, cudaStream_t stream, std::vector<cudaGraphExec_t>* graphs,
                          CaseResult* r) {
    const int64_t E = config_.num_experts, H = config_.hidden, k = config_.top_k();
    const size_t ids_bytes = static_cast<size_t>(m * k) * sizeof(int16_t);
    const int nv = static_cast<int>(variants_.size());
    graphs->assign(static_cast<size_t>(nv) * sets, nullptr);
    // Replay resources per input set (allocated by the replay variant).
    std::vector<DeviceBuffer> ids_dev(sets);  // [M, k] i16: where the selected ids are written once
    std::vector<PinnedHost> ids_host(sets);   // [M, k] i16: their host copy
    std::vector<PinnedHost> forced(sets);     // [M, k] i32: forced ids (host, pinned)
    for (int v = 0; v < nv; ++v) {
      ScopedEnv env(variants_[v].env);
      const VariantMode mode = variants_[v].mode;
      // Shapes without a shared expert time the default layer under the overlap variant too.
      MoeLayer& layer = variants_[v].shared_overlap && overlap_layer_ ? *overlap_layer_ : *layer_;
      for (int s = 0; s < sets; ++s) {
        LayerForwardArgs args;
        args.hidden = TensorView::contiguous(hidden[s].ptr, DType::kBF16, {m, H}, Device::cuda(0));
        args.router_logits = TensorView::contiguous(logits[s].ptr, DType::kF32, {m, E}, Device::cuda(0));
        args.out = TensorView::contiguous(out[s].ptr, DType::kBF16, {m, H}, Device::cuda(0));
        if (mode == VariantMode::kReplay && ids_dev[s].ptr == nullptr) {
          MOEKIT_RETURN_IF_ERROR(ids_dev[s].allocate(ids_bytes));
          BENCH_CUDA_RETURN(cudaMallocHost(&ids_host[s].ptr, ids_bytes));
        }
        if (mode == VariantMode::kReplay) {
          // The ids this layer selects for the set, forced back: the output must equal the default's bit for bit.
          LayerForwardArgs select = args;
          select.routing_replay_out = TensorView::contiguous(ids_dev[s].ptr, DType::kI16, {m, k}, Device::cuda(0));
          MOEKIT_RETURN_IF_ERROR(layer_->forward(select, stream));
          BENCH_CUDA_RETURN(cudaMemcpyAsync(ids_host[s].ptr, ids_dev[s].ptr, ids_bytes, cudaMemcpyDeviceToHost, stream));
          BENCH_CUDA_RETURN(cudaStreamSynchronize(stream));
          if (forced[s].ptr == nullptr) BENCH_CUDA_RETURN(cudaMallocHost(&forced[s].ptr, static_cast<size_t>(m * k) * 4));
          const auto* from = static_cast<const int16_t*>(ids_host[s].ptr);
          auto* to = static_cast<int32_t*>(forced[s].ptr);
          for (int64_t i = 0; i < m * k; ++i) to[i] = from[i];
          args.forced_ids = TensorView::contiguous(forced[s].ptr, DType::kI32, {m, k});
        }
        // The graph holds the forward only; the capture variant's is captured with the
        // capturer's target bound, and launch_graph wraps it in the capturer's step.
        if (mode == VariantMode::kCapture) MOEKIT_RETURN_IF_ERROR(layer.set_capture_target(capturer_->layer_target(0)));
        auto step = [&]() -> Status {
          if (mode == VariantMode::kCapture) MOEKIT_RETURN_IF_ERROR(begin_capture_step(m, stream));
          MOEKIT_RETURN_IF_ERROR(layer.forward(args, stream));
          if (mode == VariantMode::kCapture) MOEKIT_RETURN_IF_ERROR(capturer_->end_step(stream));
          return Status::Ok();
        };
        // One eager forward first: errors surface outside capture, and lazy setup happens here.
        MOEKIT_RETURN_IF_ERROR(step());
        BENCH_CUDA_RETURN(cudaStreamSynchronize(stream));
        if (v == 0 && s == 0) MOEKIT_RETURN_IF_ERROR(time_enqueue(step, stream, &r->enqueue_s));
        cudaGraph_t graph;
        BENCH_CUDA_RETURN(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        const Status fwd = layer.forward(args, stream);
        const cudaError_t end = cudaStreamEndCapture(stream, &graph);
        if (mode == VariantMode::kCapture) MOEKIT_RETURN_IF_ERROR(layer.set_capture_target({}));
        MOEKIT_RETURN_IF_ERROR(fwd);
        BENCH_CUDA_RETURN(end);
        BENCH_CUDA_RETURN(cudaGraphInstantiate(&(*graphs)[v * sets + s], graph, 0));
        cudaGraphDestroy(graph);
      }
    }
    const int n_graphs = nv * sets;
    // Warm-up, and a first estimate of one launch to size the timed loop.
    cudaEvent_t t0, t1;
    BENCH_CUDA_RETURN(cudaEventCreate(&t0));
    BENCH_CUDA_RETURN(cudaEventCreate(&t1));
    BENCH_CUDA_RETURN(cudaEventRecord(t0, stream));
    for (int w = 0; w < 2; ++w) {
      for (int g = 0; g < n_graphs; ++g) MOEKIT_RETURN_IF_ERROR(launch_graph(*graphs, g, sets, m, stream));
    }
    BENCH_CUDA_RETURN(cudaEventRecord(t1, stream));
    BENCH_CUDA_RETURN(cudaEventSynchronize(t1));
    float warm_ms = 0;
    BENCH_CUDA_RETURN(cudaEventElapsedTime(&warm_ms, t0, t1));
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    const double est = std::max(1e-6, warm_ms * 1e-3 / (2.0 * n_graphs));
    const int reps = std::clamp(static_cast<int>(opt_.seconds_per_case / (est * sets)), opt_.min_reps, 500);

    // Timed: events between consecutive launches, graphs round-robin over variants and sets,
    // so slow drifts of the machine touch every variant alike.
    const int launches = reps * n_graphs;
    std::vector<cudaEvent_t> ev(launches + 1);
    for (auto& e : ev) BENCH_CUDA_RETURN(cudaEventCreate(&e));
    BENCH_CUDA_RETURN(cudaEventRecord(ev[0], stream));
    for (int i = 0; i < launches; ++i) {
      MOEKIT_RETURN_IF_ERROR(launch_graph(*graphs, i % n_graphs, sets, m, stream));
      BENCH_CUDA_RETURN(cudaEventRecord(ev[i + 1], stream));
    }
    BENCH_CUDA_RETURN(cudaStreamSynchronize(stream));
    std::vector<std::vector<double>> secs(nv);
    for (int i = 0; i < launches; ++i) {
      float ms = 0;
      BENCH_CUDA_RETURN(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
      secs[(i % n_graphs) / sets].push_back(ms * 1e-3);
    }
    for (auto& e : ev) cudaEventDestroy(e);
    r->time_s = median(secs[0]);
    r->time_min_s = *std::min_element(secs[0].begin(), secs[0].end());
    r->time_max_s = *std::max_element(secs[0].begin(), secs[0].end());
    r->launches = static_cast<int>(secs[0].size());
    for (int v = 1; v < nv; ++v) r->variant_time_s.push_back(median(secs[v]));

    // Output of set 0 per variant: the default's is dumped for the peers' check, the
    // others are compared with it (a variant that is fast but wrong must show).
    std::vector<uint16_t> host_default;
    for (int v = 0; v < nv; ++v) {
      BENCH_CUDA_RETURN(cudaMemset(out[0].ptr, 0xff, out[0].bytes));  // NaN poison: unwritten rows show
      MOEKIT_RETURN_IF_ERROR(launch_graph(*graphs, v * sets, sets, m, stream));
      BENCH_CUDA_RETURN(cudaStreamSynchronize(stream));
      std::vector<uint16_t> host(static_cast<size_t>(m * H));
      BENCH_CUDA_RETURN(cudaMemcpy(host.data(), out[0].ptr, host.size() * 2, cudaMemcpyDeviceToHost));
      if (v == 0) {
        host_default = std::move(host);
        continue;
      }
      r->variant_rel_diff.push_back(rel_l2_bf16(host, host_default));
    }
    if (capturer_) MOEKIT_RETURN_IF_ERROR(capturer_->collect());  // the last capture step's rows, checked
    if (!opt_.dump_dir.empty() && std::find(opt_.dump_m.begin(), opt_.dump_m.end(), m) != opt_.dump_m.end()) {
      r->dump_file = spec_.name + "_m" + std::to_string(m) + "_set0.npy";
      MOEKIT_RETURN_IF_ERROR(write_npy_u16(opt_.dump_dir + "/" + r->dump_file, host_default, m, H));
    }
    return Status::Ok();
  }

  // What an eager caller pays on the host per forward: batches of forwards enqueued
  // back to back (few enough that the launch queue never fills), median per call.
  template <class Step>
  static Status time_enqueue(Step& step, cudaStream_t stream, double* per_call_s) {
    constexpr int kBatches = 7, kCalls = 8;
    std::vector<double> per_call;
    for (int b = 0; b < kBatches; ++b) {
      BENCH_CUDA_RETURN(cudaStreamSynchronize(stream));
      const auto t0 = std::chrono::steady_clock::now();
      for (int c = 0; c < kCalls; ++c) MOEKIT_RETURN_IF_ERROR(step());
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      per_call.push_back(dt.count() / kCalls);
    }
    BENCH_CUDA_RETURN(cudaStreamSynchronize(stream));
    *per_call_s = median(per_call);
    return Status::Ok();
  }

  // A capture step of M rows: a fresh request once the current one has grown long
  // (an engine finishes requests; this bounds the host memory of the appended ids).
  Status begin_capture_step(int64_t m, cudaStream_t stream) {
    constexpr int64_t kRowsPerRequest = int64_t{1} << 20;
    if (request_rows_ + m > kRowsPerRequest || request_ == 0) {
      if (request_ > 0) {
        auto done = capturer_->finish_request("r" + std::to_string(request_));
        if (!done.ok()) return done.status();
      }
      ++request_;
      request_rows_ = 0;
      MOEKIT_RETURN_IF_ERROR(capturer_->add_request("r" + std::to_string(request_)));
    }
    request_rows_ += m;
    return capturer_->begin_step(StepLayout{{{"r" + std::to_string(request_), m}}}, stream);
  }

  // Launches graph g (variant g / sets); the capture variant's inside the capturer's
  // step, ended without waiting (end_step_async checks the previous step's rows).
  Status launch_graph(const std::vector<cudaGraphExec_t>& graphs, int g, int sets, int64_t m, cudaStream_t stream) {
    const bool capture = variants_[g / sets].mode == VariantMode::kCapture;
    if (capture) MOEKIT_RETURN_IF_ERROR(begin_capture_step(m, stream));
    BENCH_CUDA_RETURN(cudaGraphLaunch(graphs[g], stream));
    if (capture) MOEKIT_RETURN_IF_ERROR(capturer_->end_step_async(stream));
    return Status::Ok();
  }

  const GpuBenchOptions& opt_;
  const Ceilings& ceil_;
  int shape_index_;
  const ShapeSpec& spec_;
  int64_t max_m_;
  const std::vector<Variant>& variants_;  // [0] is the default configuration
  std::ostream& log_;
  MoeConfig config_;
  int64_t n13_ = 0;
  std::vector<float> host_bias_;  // [E] f32 (deepseek_v3 only)
  std::vector<float> offsets_;    // [E] f32 logit offsets (all zero unless --skew)
  std::shared_ptr<MoeLayer> layer_;
  std::unique_ptr<MoeLayer> overlap_layer_;
  Model model_;  // layer_ alone, bound to capturer_ (--capture-modes)
  std::unique_ptr<RoutedExpertsCapturer> capturer_;
  int request_ = 0;            // capturer_'s current request "r<request_>"
  int64_t request_rows_ = 0;   // rows it holds  // --shared-overlap both, shapes with a shared expert only
};

json shape_json(const ShapeSpec& s, int shape_index, uint32_t base_seed, double skew) {
  const MoeConfig& c = s.config;
  json j = {{"name", s.name},
            {"experts", c.num_experts},
            {"top_k", c.top_k()},
            {"hidden", c.hidden},
            {"intermediate", c.intermediate},
            {"routing", routing_method_name(c.routing.method)},
            {"num_groups", c.routing.num_groups},
            {"topk_groups", c.routing.topk_groups},
            {"routed_scaling_factor", c.routing.routed_scaling_factor},
            {"score_bias", c.routing.has_score_bias},
            {"activation", activation_name(c.activation.kind)},
            {"expert_bias", c.has_expert_bias},
            {"shared_intermediate", c.shared_intermediate},
            {"shared_gate", c.has_shared_gate},
            {"swiglu_limit", c.activation.swiglu_limit},
            {"swiglu_alpha", c.activation.swiglu_alpha},
            {"w13_seed", seed_of(base_seed, shape_index, TensorKind::kW13, 0, 0)},
            {"w13_scale_log2", weight_scale_log2(c.hidden)},
            {"w2_seed", seed_of(base_seed, shape_index, TensorKind::kW2, 0, 0)},
            {"w2_scale_log2", weight_scale_log2(c.intermediate)}};
  if (c.routing.has_score_bias) {
    j["bias_seed"] = seed_of(base_seed, shape_index, TensorKind::kBias, 0, 0);
    j["bias_scale_log2"] = kBiasScaleLog2;
  }
  if (skew > 0) j["logit_offsets"] = logit_offsets(c.num_experts, skew);
  return j;
}

json case_json(const CaseResult& r) {
  return {{"shape", r.shape},
          {"m", r.m},
          {"backend", r.backend},
          {"kernel", r.kernel},
          {"time_us", r.time_s * 1e6},
          {"time_us_min", r.time_min_s * 1e6},
          {"time_us_max", r.time_max_s * 1e6},
          {"launches", r.launches},
          {"enqueue_us", r.enqueue_s * 1e6},
          {"tflops", r.flops / r.time_s * 1e-12},
          {"weight_gbps", r.weight_bytes / r.time_s * 1e-9},
          {"touched_experts", r.touched_experts},
          {"max_over_mean_tokens", r.max_over_mean},
          {"weight_bytes", r.weight_bytes},
          {"act_bytes", r.act_bytes},
          {"flops", r.flops},
          {"floor_us", r.floor_s * 1e6},
          {"floor_bound", r.floor_is_memory ? "memory" : "math"},
          {"frac_floor", r.floor_s / r.time_s},
          {"workspace_bytes", r.workspace_bytes},
          {"hidden_seeds", r.hidden_seeds},
          {"logits_seeds", r.logits_seeds},
          {"hidden_scale_log2", kHiddenScaleLog2},
          {"logits_scale_log2", kLogitsScaleLog2},
          {"dump", r.dump_file.empty() ? json(nullptr) : json(r.dump_file)},
          {"variant_time_us", [&] {
             json t = json::array();
             for (double v : r.variant_time_s) t.push_back(v * 1e6);
             return t;
           }()},
          {"variant_rel_diff", r.variant_rel_diff}};
}

void print_table(const Ceilings& ceil, const std::vector<CaseResult>& results, const std::vector<Variant>& variants,
                 std::ostream& os) {
  char line[256];
  std::snprintf(line, sizeof(line), "ceilings on %s: HBM read %.0f GB/s (%.1f GiB), bf16 matmul %.0f TFLOP/s (n=%d)\n",
                ceil.device_name.c_str(), ceil.read_bytes_per_s * 1e-9, ceil.read_gib, ceil.matmul_flops_per_s * 1e-12,
                ceil.matmul_n);
  os << line;
  if (ceil.fp8_matmul_flops_per_s > 0) {
    std::snprintf(line, sizeof(line), "fp8 (e4m3, cuBLASLt) matmul %.0f TFLOP/s (n=%d): the floor of fp8 cases\n",
                  ceil.fp8_matmul_flops_per_s * 1e-12, ceil.matmul_n);
    os << line;
  }
  std::snprintf(line, sizeof(line), "%-18s %6s %10s %8s %8s %6s %7s %10s %4s %7s %8s %7s", "shape", "M", "time_us",
                "TFLOP/s", "wGB/s", "exp", "max/mu", "floor_us", "bnd", "%floor", "ws_MiB", "host_us");
  os << line;
  // Variants: their time over the default's (< 1: faster), and their output's distance from it.
  for (size_t v = 1; v < variants.size(); ++v) os << "  " << variants[v].name << "(x, diff)";
  os << "\n";
  for (const CaseResult& r : results) {
    std::snprintf(line, sizeof(line), "%-18s %6lld %10.1f %8.1f %8.0f %6.1f %7.2f %10.1f %4s %6.1f%% %8.1f %7.1f",
                  r.shape.c_str(), static_cast<long long>(r.m), r.time_s * 1e6, r.flops / r.time_s * 1e-12,
                  r.weight_bytes / r.time_s * 1e-9, r.touched_experts, r.max_over_mean, r.floor_s * 1e6,
                  r.floor_is_memory ? "mem" : "mma", 100.0 * r.floor_s / r.time_s, r.workspace_bytes / 1048576.0,
                  r.enqueue_s * 1e6);
    os << line;
    for (size_t v = 0; v < r.variant_time_s.size(); ++v) {
      std::snprintf(line, sizeof(line), "  %6.3f %7.1e", r.variant_time_s[v] / r.time_s, r.variant_rel_diff[v]);
      os << line;
    }
    os << "\n";
  }
}

}  // namespace

Status run_gpu_moe_bench(const GpuBenchOptions& opt, std::ostream& log) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return Unsupported("gpu bench: no CUDA device is visible");
  }
  if (opt.scheme != "bf16" && !opt.dump_dir.empty()) {
    return InvalidArgument("gpu bench: --dump-dir feeds the bf16 peer check; it does not apply to --scheme " +
                           opt.scheme);
  }
  std::vector<int64_t> m_list = opt.m_list;
  auto shapes_or = load_shapes(opt.shapes_path, &m_list);
  if (!shapes_or.ok()) return shapes_or.status();
  std::vector<ShapeSpec> shapes = std::move(*shapes_or);
  for (ShapeSpec& spec : shapes) {  // the extras' flags apply to every shape
    MoeConfig& c = spec.config;
    c.has_expert_bias = c.has_expert_bias || opt.expert_bias;
    if (opt.shared_intermediate > 0) c.shared_intermediate = opt.shared_intermediate;
    c.has_shared_gate = c.has_shared_gate || opt.shared_gate;
  }
  std::vector<Variant> variants = {Variant{"default", {}}};
  for (const std::string& spec : opt.variants) {
    auto v = parse_variant(spec);
    if (!v.ok()) return v.status();
    variants.push_back(std::move(*v));
  }
  if (opt.shared_overlap == "both") variants.push_back(Variant{"overlap", {}, VariantMode::kPlain, true});
  if (opt.capture_modes) {  // every case also timed with capture on and with replay (forced ids)
    variants.push_back(Variant{"capture", {}, VariantMode::kCapture});
    variants.push_back(Variant{"replay", {}, VariantMode::kReplay});
  }
  const int64_t max_m = *std::max_element(m_list.begin(), m_list.end());

  Ceilings ceil;
  std::string error;
  if (!measure_ceilings(opt.read_gib, opt.matmul_n, opt.ceiling_repeats, &ceil, &error)) {
    return Internal("gpu bench: ceilings: " + error);
  }
  log << std::fixed << std::setprecision(1) << "ceilings: HBM read " << ceil.read_bytes_per_s * 1e-9
      << " GB/s, bf16 matmul " << ceil.matmul_flops_per_s * 1e-12 << " TFLOP/s\n";
  if (opt.scheme == "fp8-block" || opt.scheme == "fp8-tensor") {
    // The fp8 floor: the same process measures the e4m3 matmul rate (docs/fp8.md).
    if (!measure_fp8_matmul(opt.matmul_n, opt.ceiling_repeats, &ceil, &error)) {
      return Internal("gpu bench: fp8 matmul ceiling: " + error);
    }
    log << "ceilings: fp8 matmul " << ceil.fp8_matmul_flops_per_s * 1e-12 << " TFLOP/s (scheme " << opt.scheme
        << ")\n";
  }

  json j_shapes = json::array(), j_cases = json::array();
  std::vector<CaseResult> results;
  std::vector<std::string> failures;
  for (int si = 0; si < static_cast<int>(shapes.size()); ++si) {
    const ShapeSpec& spec = shapes[si];
    if (!opt.only.empty() && std::find(opt.only.begin(), opt.only.end(), spec.name) == opt.only.end()) continue;
    j_shapes.push_back(shape_json(spec, si, opt.seed, opt.skew));
    ShapeRunner runner(opt, ceil, si, spec, max_m, variants, log);
    Status st = runner.setup();
    if (!st.ok()) {
      failures.push_back(spec.name + ": " + st.to_string());
      log << "  " << failures.back() << "\n";
      continue;
    }
    for (int64_t m : m_list) {
      auto r = runner.run_case(m);
      if (!r.ok()) {
        failures.push_back(spec.name + " M=" + std::to_string(m) + ": " + r.status().to_string());
        log << "  " << failures.back() << "\n";
        continue;
      }
      log << "  " << spec.name << " M=" << m << ": " << r->time_s * 1e6 << " us, "
          << 100.0 * r->floor_s / r->time_s << "% of floor\n";
      j_cases.push_back(case_json(*r));
      results.push_back(std::move(*r));
    }
  }

  if (!opt.json_path.empty()) {
    json j = {{"device", ceil.device_name},
              {"ceilings",
               {{"read_bytes_per_s", ceil.read_bytes_per_s},
                {"read_gib", ceil.read_gib},
                {"matmul_flops_per_s", ceil.matmul_flops_per_s},
                {"fp8_matmul_flops_per_s", ceil.fp8_matmul_flops_per_s},
                {"matmul_n", ceil.matmul_n}}},
              {"scheme", opt.scheme},
              {"generator", "gpu_fill.h: h=mix32(lo^mix32(hi^mix32(seed))); v=(2*(h>>8)/2^24-1)*2^scale_log2"},
              {"num_sets", opt.num_sets},
              {"skew", opt.skew},
              {"batch_invariant", opt.batch_invariant},
              {"shared_overlap", opt.shared_overlap},
              {"variants", [&] {
                 json vs = json::array();
                 for (size_t v = 1; v < variants.size(); ++v) {
                   vs.push_back(v - 1 < opt.variants.size() ? opt.variants[v - 1] : variants[v].name);
                 }
                 return vs;
               }()},
              {"shapes", j_shapes},
              {"cases", j_cases},
              {"failures", failures}};
    std::ofstream out(opt.json_path);
    if (!out) return IoError(opt.json_path + ": cannot open for writing");
    out << j.dump(1) << "\n";
  }
  print_table(ceil, results, variants, log);
  if (!failures.empty()) {
    std::string msg = "gpu bench: " + std::to_string(failures.size()) + " case(s) failed:";
    for (const auto& f : failures) msg += "\n  " + f;
    return Internal(msg);
  }
  return Status::Ok();
}

}  // namespace moekit::bench

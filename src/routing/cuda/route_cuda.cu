// Device routing kernels for every method of docs/routing.md: one warp routes
// one token row. The row's selection keys sit in shared memory; top-k runs as k
// rounds of a warp-wide arg-max, each round taking the best key strictly after
// the previous winner in the spec's total order (higher key first, equal keys:
// lower index first), so ids and their order equal route_cpu's for the same
// fp32 keys. Weights are computed by one lane in slot order, as on the CPU.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/cuda_check.h"
#include "routing/cuda/route_cuda.h"

namespace moekit::cuda {

namespace {

constexpr int kWarpSize = 32;
constexpr int kMaxWarpsPerBlock = 8;
constexpr int kSmemFloatsPerBlock = 48 * 1024 / 4;  // stay under the default 48 KiB dynamic limit

// Per-warp shared memory, in 4-byte words:
//   key   [E]           selection keys (logits, or deepseek_v3 biased scores)
//   gkey  [G]           deepseek_v3 group keys
//   kept  [G]           deepseek_v3 kept-group flags (as int)
//   sel   [kMaxDeviceTopk]  selected ids
//   selk  [kMaxDeviceTopk]  selected keys
__host__ __device__ inline int64_t warp_words(int64_t num_experts, int num_groups) {
  return num_experts + 2 * static_cast<int64_t>(num_groups) + 2 * kMaxDeviceTopk;
}

struct KernelParams {
  RoutingMethod method;
  int top_k;
  int num_groups;
  int topk_groups;
  float scaling;
  bool renormalize;  // deepseek_v3: divide by the sum before scaling
  int num_experts;
  int num_tokens;
  const void* logits;  // [M, E]
  bool logits_bf16;
  const float* score_bias;   // [E] or null
  const int32_t* forced;     // [M, k] or null
  int32_t* topk_ids;         // [M, k]
  float* topk_weights;       // [M, k]
  int16_t* routing_replay_out;       // [>= M, k] or null
  int32_t* expert_counts;    // [E] or null (zeroed before the launch)
};

__device__ inline bool better(float ka, int ia, float kb, int ib) { return ka > kb || (ka == kb && ia < ib); }

__device__ inline float load_logit(const void* logits, bool bf16, int64_t i) {
  if (bf16) return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(logits)[i]) << 16);
  return static_cast<const float*>(logits)[i];
}

// Spec: sigmoid(x) = 1 / (1 + exp(-x)) in fp32.
__device__ inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// A NaN key sorts below every number so the warp's order stays total; the
// row is marked bad anyway (docs/routing.md §7) and gets no ids.
__device__ inline float order_key(float v) { return isnan(v) ? -INFINITY : v; }

// k rounds of warp arg-max over key[0, n) (optionally only where kept[i / per_group]).
// Lane 0 writes sel[r] / selk[r]; every lane returns after __syncwarp.
__device__ void warp_topk(const float* key, int n, int k, const int* kept, int per_group, int* sel, float* selk) {
  const int lane = threadIdx.x % kWarpSize;
  float prev_k = 0.0f;
  int prev_i = -1;
  for (int r = 0; r < k; ++r) {
    float bk = -INFINITY;
    int bi = INT_MAX;
    bool have = false;
    for (int e = lane; e < n; e += kWarpSize) {
      if (kept != nullptr && kept[e / per_group] == 0) continue;
      const float v = key[e];
      if (prev_i >= 0 && !better(prev_k, prev_i, v, e)) continue;  // at or before the previous winner
      if (!have || better(v, e, bk, bi)) {
        bk = v;
        bi = e;
        have = true;
      }
    }
    for (int off = kWarpSize / 2; off > 0; off /= 2) {
      const float ok = __shfl_xor_sync(0xffffffffu, bk, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      const bool ohave = __shfl_xor_sync(0xffffffffu, have ? 1 : 0, off) != 0;
      if (ohave && (!have || better(ok, oi, bk, bi))) {
        bk = ok;
        bi = oi;
        have = true;
      }
    }
    // A strict total order: every lane holds the same winner.
    if (lane == 0) {
      sel[r] = bi;
      selk[r] = bk;
    }
    prev_k = bk;
    prev_i = bi;
  }
  __syncwarp();
}

__device__ inline float warp_sum(float v) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int off = kWarpSize / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Divides w[0, k) by its sum, summed in slot order; a zero sum gives 1/k (as route_cpu).
__device__ inline void renormalize(float* w, int k) {
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += w[j];
  for (int j = 0; j < k; ++j) w[j] = sum > 0.0f ? w[j] / sum : 1.0f / static_cast<float>(k);
}

__global__ void routing_kernel(KernelParams p) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * warps + warp;
  if (row >= p.num_tokens) return;  // whole warp leaves together

  const int E = p.num_experts;
  const int G = p.method == RoutingMethod::kDeepseekV3 ? p.num_groups : 0;
  const int k = p.top_k;
  float* key = smem + warp * warp_words(E, p.num_groups);  // [E]
  float* gkey = key + E;                                    // [G]
  int* kept = reinterpret_cast<int*>(gkey + p.num_groups);  // [G]
  int* sel = kept + p.num_groups;                           // [kMaxDeviceTopk]
  float* selk = reinterpret_cast<float*>(sel + kMaxDeviceTopk);  // [kMaxDeviceTopk]

  // Load the row: keys, finiteness, max (softmax methods).
  const bool deepseek = p.method == RoutingMethod::kDeepseekV3;
  bool bad = false;
  float m = -INFINITY;
  for (int e = lane; e < E; e += kWarpSize) {
    const float x = load_logit(p.logits, p.logits_bf16, row * E + e);
    bad |= !isfinite(x);
    float kv;
    if (deepseek) {
      const float s = sigmoid_f(x);
      kv = p.score_bias != nullptr ? s + p.score_bias[e] : s;
      bad |= !isfinite(kv);
    } else {
      kv = x;
      m = fmaxf(m, x);
    }
    key[e] = order_key(kv);
  }
  bad = __any_sync(0xffffffffu, bad);
  m = warp_max(m);
  __syncwarp();

  // Selection (or forced ids).
  if (p.forced != nullptr) {
    int id = lane < k ? p.forced[row * k + lane] : -1;
    bool invalid = lane < k && (id < 0 || id >= E);
    for (int j = 0; j < k; ++j) {
      const int other = __shfl_sync(0xffffffffu, id, j);
      invalid |= lane < k && j < lane && other == id;  // repeated within the row
    }
    bad |= __any_sync(0xffffffffu, invalid);
    if (lane < k) sel[lane] = id;
    __syncwarp();
  } else if (deepseek && p.topk_groups < p.num_groups) {
    const int per_group = E / G;
    for (int g = lane; g < G; g += kWarpSize) {
      // top-2 of the group, as select_topk(k = 2) on the CPU: best first.
      float b0 = -INFINITY, b1 = -INFINITY;
      int i0 = INT_MAX, i1 = INT_MAX;
      bool h0 = false, h1 = false;
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
        const float v = key[e];
        if (!h0 || better(v, e, b0, i0)) {
          b1 = b0, i1 = i0, h1 = h0;
          b0 = v, i0 = e, h0 = true;
        } else if (!h1 || better(v, e, b1, i1)) {
          b1 = v, i1 = e, h1 = true;
        }
      }
      gkey[g] = order_key(b0 + b1);
      kept[g] = 0;
    }
    __syncwarp();
    warp_topk(gkey, G, p.topk_groups, nullptr, 1, sel, selk);
    if (lane < p.topk_groups) kept[sel[lane]] = 1;
    __syncwarp();
    warp_topk(key, E, k, kept, per_group, sel, selk);
  } else {
    warp_topk(key, E, k, nullptr, 1, sel, selk);
  }

  // Softmax denominator over all experts (softmax_topk, renormalize_naive).
  float denom = 0.0f;
  if (p.method == RoutingMethod::kSoftmaxTopk || p.method == RoutingMethod::kRenormalizeNaive) {
    float part = 0.0f;
    for (int e = lane; e < E; e += kWarpSize) part += expf(key[e] - m);
    denom = warp_sum(part);
  }

  // x of each selected id, the logit (re-read: deepseek_v3 keys are biased
  // scores), loaded by lane j for slot j at once: lane 0 reading them one by one
  // was a chain of k dependent global loads (~10 us of a one-token layer).
  auto safe = [&](int id) { return id >= 0 && id < E; };
  if (lane < k) {
    const int id = sel[lane];
    selk[lane] = safe(id) ? load_logit(p.logits, p.logits_bf16, row * E + id) : NAN;  // keys are no longer needed
  }
  __syncwarp();
  if (lane == 0) {
    float w[kMaxDeviceTopk];
    auto logit_of_slot = [&](int j) { return selk[j]; };
    switch (p.method) {
      case RoutingMethod::kSoftmaxTopk:
      case RoutingMethod::kRenormalizeNaive:
        for (int j = 0; j < k; ++j) w[j] = expf(logit_of_slot(j) - m) / denom;
        if (p.method == RoutingMethod::kRenormalizeNaive) renormalize(w, k);
        break;
      case RoutingMethod::kRenormalize: {
        float mk = logit_of_slot(0);
        for (int j = 1; j < k; ++j) mk = fmaxf(mk, logit_of_slot(j));
        float d = 0.0f;
        for (int j = 0; j < k; ++j) {
          w[j] = expf(logit_of_slot(j) - mk);
          d += w[j];
        }
        for (int j = 0; j < k; ++j) w[j] /= d;
        break;
      }
      case RoutingMethod::kTopk:
        for (int j = 0; j < k; ++j) w[j] = logit_of_slot(j);
        break;
      case RoutingMethod::kSigmoid:
      case RoutingMethod::kSigmoidRenorm:
      case RoutingMethod::kLlama4:
        for (int j = 0; j < k; ++j) w[j] = sigmoid_f(logit_of_slot(j));
        if (p.method == RoutingMethod::kSigmoidRenorm) renormalize(w, k);
        break;
      case RoutingMethod::kDeepseekV3:
        for (int j = 0; j < k; ++j) w[j] = sigmoid_f(logit_of_slot(j));  // unbiased
        if (p.renormalize) renormalize(w, k);
        for (int j = 0; j < k; ++j) w[j] *= p.scaling;
        break;
      case RoutingMethod::kCustom:
        break;  // rejected on the host
    }
    // NOTE: the device rule of docs/routing.md §7: a bad row gets id -1 and a
    // NaN weight in every slot, so its output is NaN and its capture the sentinel.
    for (int j = 0; j < k; ++j) {
      p.topk_ids[row * k + j] = bad ? -1 : sel[j];
      p.topk_weights[row * k + j] = bad ? NAN : w[j];
    }
  }
  if (lane < k) {
    const int id = bad ? -1 : sel[lane];
    if (p.routing_replay_out != nullptr) p.routing_replay_out[row * k + lane] = static_cast<int16_t>(id);
    if (p.expert_counts != nullptr && id >= 0) atomicAdd(&p.expert_counts[id], 1);  // integer: order-free
  }
}

}  // namespace

Status routing_supported(const RoutingConfig& config, int64_t num_experts) {
  if (config.method == RoutingMethod::kCustom) {
    return Unsupported("routing.method custom has no device router (the caller supplies ids and weights)");
  }
  if (config.top_k > kMaxDeviceTopk) {
    return Unsupported("routing.top_k " + std::to_string(config.top_k) + " exceeds the device router's maximum " +
                       std::to_string(kMaxDeviceTopk));
  }
  const int groups = config.method == RoutingMethod::kDeepseekV3 ? config.num_groups : 0;
  if (warp_words(num_experts, groups) > kSmemFloatsPerBlock) {
    return Unsupported("num_experts " + std::to_string(num_experts) + " does not fit the device router's shared memory");
  }
  if (config.method == RoutingMethod::kDeepseekV3 && config.num_groups > 1 &&
      config.topk_groups < config.num_groups && config.topk_groups > kMaxDeviceTopk) {
    return Unsupported("routing.topk_groups exceeds " + std::to_string(kMaxDeviceTopk));
  }
  return Status::Ok();
}

Status launch_routing(const RoutingLaunch& launch, cudaStream_t stream) {
  MOEKIT_RETURN_IF_ERROR(routing_supported(launch.config, launch.num_experts));
  if (launch.expert_counts != nullptr) {
    MOEKIT_CUDA_CHECK(cudaMemsetAsync(launch.expert_counts, 0, sizeof(int32_t) * launch.num_experts, stream));
  }
  if (launch.num_tokens == 0) return Status::Ok();
  const RoutingConfig& c = launch.config;
  KernelParams p{};
  p.method = c.method;
  p.top_k = c.top_k;
  p.num_groups = c.method == RoutingMethod::kDeepseekV3 ? c.num_groups : 0;
  p.topk_groups = c.topk_groups;
  p.scaling = c.routed_scaling_factor;
  p.renormalize = c.renormalize;
  p.num_experts = static_cast<int>(launch.num_experts);
  p.num_tokens = static_cast<int>(launch.num_tokens);
  p.logits = launch.logits;
  p.logits_bf16 = launch.logits_bf16;
  p.score_bias = launch.score_bias;
  p.forced = launch.forced_ids;
  p.topk_ids = launch.topk_ids;
  p.topk_weights = launch.topk_weights;
  p.routing_replay_out = launch.routing_replay_out;
  p.expert_counts = launch.expert_counts;

  const int64_t words = warp_words(launch.num_experts, p.num_groups);
  int warps = static_cast<int>(kSmemFloatsPerBlock / words);
  warps = warps < 1 ? 1 : (warps > kMaxWarpsPerBlock ? kMaxWarpsPerBlock : warps);
  const int64_t blocks = (launch.num_tokens + warps - 1) / warps;
  const size_t smem = sizeof(float) * static_cast<size_t>(words * warps);
  routing_kernel<<<static_cast<unsigned>(blocks), warps * kWarpSize, smem, stream>>>(p);
  MOEKIT_CUDA_CHECK_LAUNCH("routing_kernel");
  return Status::Ok();
}

}  // namespace moekit::cuda

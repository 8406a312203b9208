// The routing spec (docs/routing.md) on the CPU: fp32 scores, exact top-k with
// the spec's tie rule, weights per method, forced ids for replay.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moekit/parallel_for.h"
#include "moekit/dtype.h"
#include "moekit/routing.h"
#include "routing/cpu/routing_cpu_impl.h"

namespace moekit::cpu {

namespace {

// Spec: sigmoid(x) = 1 / (1 + exp(-x)) in fp32 (0 for x < ~-88.7, never NaN).
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Top-k of key[0, n) where allowed(i), best first. Ties: lower index first.
// Insertion into a sorted list while scanning i upwards: an equal key never
// displaces an earlier (lower) index, so `>` alone realizes the tie rule.
template <typename Allowed>
void select_topk(const float* key, int64_t n, int k, int32_t* out_idx, float* out_key, Allowed allowed) {
  int count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!allowed(i)) continue;
    const float v = key[i];
    if (count == k && !(v > out_key[k - 1])) continue;
    int pos = count < k ? count++ : k - 1;
    while (pos > 0 && v > out_key[pos - 1]) {
      out_key[pos] = out_key[pos - 1];
      out_idx[pos] = out_idx[pos - 1];
      --pos;
    }
    out_key[pos] = v;
    out_idx[pos] = static_cast<int32_t>(i);
  }
}

void select_topk(const float* key, int64_t n, int k, int32_t* out_idx, float* out_key) {
  select_topk(key, n, k, out_idx, out_key, [](int64_t) { return true; });
}

// Divides w[0, k) by its sum (summed in slot order). A zero sum (every
// selected score underflowed to 0 in fp32) gives the uniform 1/k.
void renormalize_in_place(float* w, int k) {
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += w[j];
  for (int j = 0; j < k; ++j) w[j] = sum > 0.0f ? w[j] / sum : 1.0f / static_cast<float>(k);
}

// Per-thread scratch for one row.
struct RowScratch {
  std::vector<float> x;          // [E] logits widened to fp32
  std::vector<float> s;          // [E] deepseek_v3: sigmoid scores
  std::vector<float> b;          // [E] deepseek_v3: biased scores (selection only)
  std::vector<float> group_key;  // [G] deepseek_v3: sum of the top-2 biased scores
  std::vector<uint8_t> kept;     // [G] deepseek_v3: group kept
  std::vector<float> key;        // [max(k, 2, G)] scratch of select_topk
  std::vector<int32_t> idx;      // [max(k, 2, G)]
};

void load_row(const TensorView& logits, int64_t r, float* x) {
  const int64_t E = logits.shape[1];
  switch (logits.dtype) {
    case DType::kF32: std::memcpy(x, logits.ptr<const float>() + r * E, sizeof(float) * E); return;
    case DType::kBF16: {
      const uint16_t* src = logits.ptr<const uint16_t>() + r * E;
      for (int64_t e = 0; e < E; ++e) x[e] = bf16_bits_to_f32(src[e]);  // exact widening
      return;
    }
    case DType::kF16:
    case DType::kF8E4M3:
    case DType::kI32:
    case DType::kI16:
    case DType::kU8: return;  // rejected by validate_routing_args
  }
}

// deepseek_v3 selection: groups by the sum of their top-2 biased scores, then
// the top-k biased scores inside the kept groups.
void select_deepseek_v3(const RoutingConfig& cfg, int64_t E, RowScratch& sc, int32_t* ids) {
  const int k = cfg.top_k;
  const int G = cfg.num_groups;
  if (cfg.topk_groups >= G) {  // every group kept: group scores cannot matter
    select_topk(sc.b.data(), E, k, ids, sc.key.data());
    return;
  }
  const int64_t per_group = E / G;
  for (int g = 0; g < G; ++g) {
    select_topk(sc.b.data() + g * per_group, per_group, 2, sc.idx.data(), sc.key.data());
    sc.group_key[g] = sc.key[0] + sc.key[1];
  }
  select_topk(sc.group_key.data(), G, cfg.topk_groups, sc.idx.data(), sc.key.data());
  std::fill(sc.kept.begin(), sc.kept.end(), uint8_t{0});
  for (int j = 0; j < cfg.topk_groups; ++j) sc.kept[sc.idx[j]] = 1;
  select_topk(sc.b.data(), E, k, ids, sc.key.data(), [&](int64_t e) { return sc.kept[e / per_group] != 0; });
}

void route_row(const RoutingConfig& cfg, const RoutingArgs& args, int64_t r, RowScratch& sc) {
  const int64_t E = args.logits.shape[1];
  const int k = cfg.top_k;
  int32_t* ids = args.topk_ids.ptr<int32_t>() + r * k;
  float* w = args.topk_weights.ptr<float>() + r * k;
  const int32_t* forced = args.forced_ids.defined() ? args.forced_ids.ptr<const int32_t>() + r * k : nullptr;
  float* x = sc.x.data();
  load_row(args.logits, r, x);

  // Selection key for every method but deepseek_v3 is the logit itself: each
  // score is a strictly increasing function of it (docs/routing.md, "Selection").
  auto select_on_logits = [&] {
    if (forced) {
      std::copy_n(forced, k, ids);
    } else {
      select_topk(x, E, k, ids, sc.key.data());
    }
  };

  switch (cfg.method) {
    case RoutingMethod::kSoftmaxTopk:
    case RoutingMethod::kRenormalizeNaive: {
      select_on_logits();
      float m = x[0];
      for (int64_t e = 1; e < E; ++e) m = std::max(m, x[e]);
      float denom = 0.0f;
      for (int64_t e = 0; e < E; ++e) denom += std::exp(x[e] - m);
      for (int j = 0; j < k; ++j) w[j] = std::exp(x[ids[j]] - m) / denom;  // p[ids[j]]
      if (cfg.method == RoutingMethod::kRenormalizeNaive) renormalize_in_place(w, k);
      break;
    }
    case RoutingMethod::kRenormalize: {
      select_on_logits();
      float m = x[ids[0]];
      for (int j = 1; j < k; ++j) m = std::max(m, x[ids[j]]);
      float denom = 0.0f;
      for (int j = 0; j < k; ++j) {
        w[j] = std::exp(x[ids[j]] - m);
        denom += w[j];
      }
      for (int j = 0; j < k; ++j) w[j] /= denom;  // denom >= 1: the max term is exp(0)
      break;
    }
    case RoutingMethod::kTopk:
      select_on_logits();
      for (int j = 0; j < k; ++j) w[j] = x[ids[j]];
      break;
    case RoutingMethod::kSigmoid:
    case RoutingMethod::kSigmoidRenorm:
    case RoutingMethod::kLlama4:
      select_on_logits();
      for (int j = 0; j < k; ++j) w[j] = sigmoid(x[ids[j]]);
      if (cfg.method == RoutingMethod::kSigmoidRenorm) renormalize_in_place(w, k);
      break;
    case RoutingMethod::kDeepseekV3: {
      const float* bias = cfg.has_score_bias ? args.score_bias.ptr<const float>() : nullptr;
      for (int64_t e = 0; e < E; ++e) {
        sc.s[e] = sigmoid(x[e]);
        sc.b[e] = bias ? sc.s[e] + bias[e] : sc.s[e];
      }
      if (forced) {
        std::copy_n(forced, k, ids);
      } else {
        select_deepseek_v3(cfg, E, sc, ids);
      }
      for (int j = 0; j < k; ++j) w[j] = sc.s[ids[j]];  // unbiased
      if (cfg.renormalize) renormalize_in_place(w, k);
      for (int j = 0; j < k; ++j) w[j] *= cfg.routed_scaling_factor;
      break;
    }
    case RoutingMethod::kCustom:
      return;  // rejected by validate_routing_args
  }

  if (args.routing_replay_out.defined()) {
    int16_t* cap = args.routing_replay_out.ptr<int16_t>() + r * args.routing_replay_out.strides[0];
    for (int j = 0; j < k; ++j) cap[j] = static_cast<int16_t>(ids[j]);  // E <= 32767, validated
  }
}

}  // namespace

void route_rows(const RoutingConfig& cfg, const RoutingArgs& args, int64_t begin, int64_t end) {
  const int64_t E = args.logits.shape[1];
  const size_t scratch = static_cast<size_t>(std::max<int64_t>({cfg.top_k, 2, cfg.num_groups}));
  RowScratch sc;
  sc.x.resize(E);
  if (cfg.method == RoutingMethod::kDeepseekV3) {
    sc.s.resize(E);
    sc.b.resize(E);
    sc.group_key.resize(cfg.num_groups);
    sc.kept.resize(cfg.num_groups);
  }
  sc.key.resize(scratch);
  sc.idx.resize(scratch);
  for (int64_t r = begin; r < end; ++r) route_row(cfg, args, r, sc);
}

void count_experts(const RoutingArgs& args) {
  int32_t* counts = args.expert_counts.ptr<int32_t>();  // [E]
  std::fill_n(counts, args.expert_counts.shape[0], 0);
  const int32_t* ids = args.topk_ids.ptr<const int32_t>();  // [M, k]
  const int64_t n = args.topk_ids.numel();
  for (int64_t i = 0; i < n; ++i) ++counts[ids[i]];
}

}  // namespace moekit::cpu

namespace moekit {

Status route_cpu(const RoutingConfig& cfg, const RoutingArgs& args) {
  // Everything (shapes, forced ids, finite logits) is checked before the first write.
  MOEKIT_RETURN_IF_ERROR(validate_routing_args(cfg, args, Device::cpu()));
  const int64_t M = args.logits.shape[0];
  const int64_t E = args.logits.shape[1];
  // Rows are independent and each is computed the same way on any thread, so
  // the result does not depend on the thread count.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(E, 1));
  parallel_for(M, grain, [&](int64_t begin, int64_t end) { cpu::route_rows(cfg, args, begin, end); });
  if (args.expert_counts.defined()) cpu::count_experts(args);
  return Status::Ok();
}

}  // namespace moekit

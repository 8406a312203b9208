#include "synthetic_model.h"

#include <cmath>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "moekit/checkpoint.h"
#include "moekit/parallel_for.h"
#include "moekit/dtype.h"

namespace moekit::tools {
namespace {

// Counter-based random numbers: value i of stream (seed, layer, tensor) does
// not depend on how the work is split across threads.
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t stream_key(uint64_t seed, uint64_t a, uint64_t b) {
  return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b);
}
// Uniform in [-1, 1) scaled to standard deviation `stddev`.
float uniform_sym(uint64_t key, uint64_t i, float stddev) {
  const uint64_t r = splitmix64(key ^ (i * 0xd1b54a32d192ed03ull));
  const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return (2.0f * u - 1.0f) * stddev * 1.7320508f;                      // var of U(-a, a) is a^2 / 3
}

enum Tensor : uint64_t { kGate = 1, kW13 = 2, kW2 = 3, kBias = 4, kEmbed = 5 };

void fill_bf16(HostTensor& t, uint64_t key, float stddev) {
  uint16_t* p = t.data<uint16_t>();
  parallel_for(t.numel(), 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = f32_to_bf16_bits(uniform_sym(key, static_cast<uint64_t>(i), stddev));
  });
}

}  // namespace

MoeConfig synthetic_config(const SyntheticModelSpec& spec, const std::string& backend) {
  MoeConfig c;
  c.num_experts = spec.num_experts;
  c.hidden = spec.hidden;
  c.intermediate = spec.intermediate;
  c.max_num_tokens = spec.max_num_tokens;
  c.logits_dtype = DType::kF32;
  c.quant.weight_dtype = DType::kBF16;
  c.quant.act_dtype = DType::kBF16;
  c.activation.kind = Activation::kSiluGated;
  c.routing.method = RoutingMethod::kDeepseekV3;
  c.routing.top_k = spec.top_k;
  c.routing.num_groups = spec.num_groups;
  c.routing.topk_groups = spec.topk_groups;
  c.routing.routed_scaling_factor = spec.routed_scaling_factor;
  c.routing.has_score_bias = true;
  c.backend = backend;
  return c;
}

SyntheticLayer build_synthetic_layer(const SyntheticModelSpec& spec, int layer) {
  const int64_t E = spec.num_experts, H = spec.hidden, I = spec.intermediate;
  const uint64_t l = static_cast<uint64_t>(layer);
  SyntheticLayer s{HostTensor(DType::kF32, {E, H}), HostTensor(DType::kBF16, {E, 2 * I, H}),
                   HostTensor(DType::kBF16, {E, H, I}), HostTensor(DType::kF32, {E})};
  // Scales keep every stage near unit variance: x has unit RMS, so a row of
  // W13 with stddev 1/sqrt(H) gives O(1) gate/up values, W2 likewise.
  fill_bf16(s.w13, stream_key(spec.seed, l, kW13), 1.0f / std::sqrt(static_cast<float>(H)));
  fill_bf16(s.w2, stream_key(spec.seed, l, kW2), 1.0f / std::sqrt(static_cast<float>(I)));
  const uint64_t gate_key = stream_key(spec.seed, l, kGate);
  for (int64_t i = 0; i < E * H; ++i) {
    s.gate.data<float>()[i] = uniform_sym(gate_key, static_cast<uint64_t>(i), 1.0f / std::sqrt(static_cast<float>(H)));
  }
  // A bias of the size of the spread of sigmoid scores, so it visibly shifts
  // the selection (as the trained correction bias of DeepSeek-V3 does).
  const uint64_t bias_key = stream_key(spec.seed, l, kBias);
  for (int64_t e = 0; e < E; ++e) s.score_bias.data<float>()[e] = uniform_sym(bias_key, static_cast<uint64_t>(e), 0.05f);
  return s;
}

StatusOr<SyntheticModel> build_synthetic_model(const SyntheticModelSpec& spec, const MoeConfig& config,
                                               const Platform& platform) {
  SyntheticModel m;
  for (int l = 0; l < spec.num_layers; ++l) {
    SyntheticLayer w = build_synthetic_layer(spec, l);
    MOEKIT_ASSIGN_OR_RETURN(std::unique_ptr<MoeLayer> layer, MoeLayer::create(config, w.weights(), platform));
    MOEKIT_RETURN_IF_ERROR(m.model.add_layer(std::move(layer), 2 * l + 1));
    m.gates.push_back(std::move(w.gate));
  }
  return m;
}

Status spec_of_model_folder(const std::string& dir, SyntheticModelSpec* spec, std::vector<int>* moe_layers) {
  std::ifstream in(dir + "/config.json", std::ios::binary);
  if (!in) return NotFound(dir + "/config.json: cannot be opened (--model takes a model folder)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  moe_layers->clear();
  for (int layer = 0;; ++layer) {
    StatusOr<MoeConfig> c = checkpoint_layer_config(text, layer);
    if (c.status().code() == StatusCode::kFailedPrecondition) continue;  // a dense layer
    if (c.status().code() == StatusCode::kOutOfRange && layer > 0) break;  // past num_hidden_layers
    if (!c.ok()) return c.status();
    if (moe_layers->empty()) {
      spec->num_experts = c->num_experts;
      spec->top_k = c->top_k();
      spec->hidden = c->hidden;
      spec->intermediate = c->intermediate;
    } else if (c->num_experts != spec->num_experts || c->hidden != spec->hidden) {
      return Unsupported(dir + ": MoE layer " + std::to_string(layer) + " has E = " + std::to_string(c->num_experts) +
                         ", H = " + std::to_string(c->hidden) + " where the first has E = " +
                         std::to_string(spec->num_experts) + ", H = " + std::to_string(spec->hidden) +
                         " (moekit run takes one E and H for the whole model)");
    }
    moe_layers->push_back(layer);
  }
  if (moe_layers->empty()) return FailedPrecondition(dir + ": config.json describes no MoE layer");
  spec->num_layers = static_cast<int>(moe_layers->size());
  return Status::Ok();
}

StatusOr<SyntheticModel> build_checkpoint_model(const std::string& dir, const std::vector<int>& moe_layers,
                                                const MoeConfig& run_config, const Platform& platform,
                                                MoeConfig* config) {
  SyntheticModel m;
  for (size_t i = 0; i < moe_layers.size(); ++i) {
    MOEKIT_ASSIGN_OR_RETURN(CheckpointLayer ck, load_checkpoint_layer(dir, moe_layers[i]));
    if (ck.router_weight.shape().empty()) {
      return FailedPrecondition(ck.prefix + ": the checkpoint has no router weight; moekit run needs it to route");
    }
    MoeConfig c = ck.config;
    c.max_num_tokens = run_config.max_num_tokens;
    c.backend = run_config.backend;
    c.needs_capture = run_config.needs_capture;
    c.needs_replay = run_config.needs_replay;
    c.quant.act_dtype = DType::kBF16;  // the run's layer inputs and outputs are bf16 rows
    MOEKIT_ASSIGN_OR_RETURN(std::unique_ptr<MoeLayer> layer, MoeLayer::create(c, ck.weights(), platform));
    MOEKIT_RETURN_IF_ERROR(m.model.add_layer(std::move(layer), moe_layers[i]));
    m.gates.push_back(std::move(ck.router_weight));
    m.router_biases.push_back(std::move(ck.router_bias));
    if (i == 0) *config = c;
  }
  return m;
}

void embed_token(const SyntheticModelSpec& spec, int request, int64_t position, float* dst) {
  const uint64_t key = stream_key(spec.seed, kEmbed, (static_cast<uint64_t>(request) << 32) ^ static_cast<uint64_t>(position));
  for (int64_t h = 0; h < spec.hidden; ++h) dst[h] = uniform_sym(key, static_cast<uint64_t>(h), 1.0f);
}

void rmsnorm_to_bf16(const float* h, int64_t M, int64_t H, uint16_t* x) {
  parallel_for(M, 4, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* row = h + r * H;
      double ss = 0.0;
      for (int64_t i = 0; i < H; ++i) ss += static_cast<double>(row[i]) * row[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(H) + 1e-6));
      for (int64_t i = 0; i < H; ++i) x[r * H + i] = f32_to_bf16_bits(row[i] * inv);
    }
  });
}

void router_logits(const uint16_t* x, const float* gate, int64_t M, int64_t E, int64_t H, float* logits) {
  parallel_for(M, 4, [&](int64_t b, int64_t e) {
    std::vector<float> xf(static_cast<size_t>(H));  // [H] f32 row of x
    for (int64_t r = b; r < e; ++r) {
      for (int64_t i = 0; i < H; ++i) xf[i] = bf16_bits_to_f32(x[r * H + i]);
      for (int64_t ex = 0; ex < E; ++ex) {
        const float* g = gate + ex * H;
        // Eight partial sums: a fixed order (deterministic) the compiler can vectorize.
        float acc[8] = {};
        int64_t i = 0;
        for (; i + 8 <= H; i += 8) {
          for (int j = 0; j < 8; ++j) acc[j] += xf[i + j] * g[i + j];
        }
        for (; i < H; ++i) acc[0] += xf[i] * g[i];
        logits[r * E + ex] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      }
    }
  });
}

}  // namespace moekit::tools

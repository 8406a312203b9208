// One MoE layer of a model folder (config.json + safetensors shards, as
// transformers saves them) run on random hidden states, with the experts every
// token went to captured, then forced again: the replay gives the same output
// bit for bit. Links only moekit's installed package (find_package(moekit)).
//
//   layer_capture_replay MODEL_DIR LAYER [TOKENS]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "moekit/checkpoint.h"
#include "moekit/dtype.h"
#include "moekit/layer.h"

namespace {

int fail(const moekit::Status& s) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR LAYER [TOKENS]\n", argv[0]);
    return 2;
  }
  const int layer_index = std::atoi(argv[2]);
  const int64_t M = argc > 3 ? std::atoll(argv[3]) : 16;

  // The layer's config, weights and router as the checkpoint describes them.
  auto ckpt = moekit::load_checkpoint_layer(argv[1], layer_index);
  if (!ckpt.ok()) return fail(ckpt.status());
  std::puts(ckpt->summary().c_str());
  moekit::MoeConfig config = ckpt->config;
  config.max_num_tokens = M;
  config.quant.act_dtype = moekit::DType::kF32;  // f32 hidden states, whatever the weights' dtype
  auto layer = moekit::MoeLayer::create(config, ckpt->weights());
  if (!layer.ok()) return fail(layer.status());
  std::printf("kernel: %s\n", (*layer)->producer().c_str());

  // Random hidden states and the router's logits for them (f32, hidden . router^T).
  const int64_t H = config.hidden, E = config.num_experts, k = config.top_k();
  moekit::HostTensor hidden(moekit::DType::kF32, {M, H}), logits(moekit::DType::kF32, {M, E});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < M * H; ++i) hidden.data<float>()[i] = normal(rng);
  const float* router = ckpt->router_weight.data<float>();
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      double dot = 0.0;
      for (int64_t c = 0; c < H; ++c) dot += double(hidden.data<float>()[t * H + c]) * router[e * H + c];
      logits.data<float>()[t * E + e] = static_cast<float>(dot);
    }
  }

  // The forward, capturing the selected experts (logical ids, the routing spec's order).
  moekit::HostTensor out(moekit::DType::kF32, {M, H}), ids(moekit::DType::kI16, {M, k});
  moekit::LayerForwardArgs run;
  run.hidden = hidden.view();
  run.router_logits = logits.view();
  run.out = out.view();
  run.routing_replay_out = ids.view();
  if (auto s = (*layer)->forward(run); !s.ok()) return fail(s);
  std::printf("token 0 went to experts");
  for (int64_t j = 0; j < k; ++j) std::printf(" %d", ids.data<int16_t>()[j]);
  std::printf("\n");

  // Replay: the captured experts forced; the routing method weighs them from the same logits.
  moekit::HostTensor forced(moekit::DType::kI32, {M, k}), again(moekit::DType::kF32, {M, H});
  for (int64_t i = 0; i < M * k; ++i) forced.data<int32_t>()[i] = ids.data<int16_t>()[i];
  moekit::LayerForwardArgs replay = run;
  replay.forced_ids = forced.view();
  replay.routing_replay_out = {};
  replay.out = again.view();
  if (auto s = (*layer)->forward(replay); !s.ok()) return fail(s);
  const bool same = std::memcmp(out.data<float>(), again.data<float>(), out.nbytes()) == 0;
  std::printf("replay of %lld tokens: %s\n", static_cast<long long>(M), same ? "bit for bit" : "DIFFERENT");
  return same ? 0 : 1;
}

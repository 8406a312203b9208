// Routed-expert capture the way an engine does it: every MoE layer of a model
// folder in one moekit::Model, a capturer bound to it, two requests served in
// mixed steps (prefill chunks, then one decode token each), the capture written
// to a file; then the file read back and replayed step by step through the same
// steps: every layer's output matches the captured run bit for bit.
// docs/capture.md quotes this file. Links only the installed package.
//
//   capture_requests MODEL_DIR [CAPTURE_FILE]   (default capture.safetensors)
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/capture.h"
#include "moekit/checkpoint.h"
#include "moekit/dtype.h"
#include "moekit/layer.h"

namespace {

using moekit::HostTensor;
using moekit::StepLayout;

// Per MoE layer: the router of the checkpoint layer, for logits of hidden states.
struct Router {
  HostTensor weight;  // [E, H] f32
};

// One step's inputs and outputs for every layer: random hidden states and
// their router logits (hidden . router^T), seeded by the step.
struct StepTensors {
  std::vector<HostTensor> hidden, logits, out;
};

StepTensors make_step(const std::vector<Router>& routers, int64_t M, int64_t H, uint32_t seed) {
  StepTensors s;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (const Router& r : routers) {
    const int64_t E = r.weight.shape()[0];
    HostTensor hidden(moekit::DType::kF32, {M, H}), logits(moekit::DType::kF32, {M, E});
    for (int64_t i = 0; i < M * H; ++i) hidden.data<float>()[i] = normal(rng);
    for (int64_t t = 0; t < M; ++t) {
      for (int64_t e = 0; e < E; ++e) {
        double dot = 0.0;
        for (int64_t c = 0; c < H; ++c) dot += double(hidden.data<float>()[t * H + c]) * r.weight.data<float>()[e * H + c];
        logits.data<float>()[t * E + e] = static_cast<float>(dot);
      }
    }
    s.hidden.push_back(std::move(hidden));
    s.logits.push_back(std::move(logits));
    s.out.emplace_back(moekit::DType::kF32, std::vector<int64_t>{M, H});
  }
  return s;
}

moekit::LayerForwardArgs forward_args(StepTensors& s, int l) {
  moekit::LayerForwardArgs args;
  args.hidden = s.hidden[l].view();
  args.router_logits = s.logits[l].view();
  args.out = s.out[l].view();
  return args;
}

moekit::Status run(const std::string& model_dir, const std::string& path) {
  // Every layer of the folder into one Model (a dense layer is an error here).
  const int64_t max_num_tokens = 32;
  moekit::Model model;
  std::vector<Router> routers;
  MOEKIT_ASSIGN_OR_RETURN(auto first, moekit::load_checkpoint_layer(model_dir, 0));
  for (int l = 0; l < first.num_layers; ++l) {
    MOEKIT_ASSIGN_OR_RETURN(auto ckpt, moekit::load_checkpoint_layer(model_dir, l));
    moekit::MoeConfig config = ckpt.config;
    config.max_num_tokens = max_num_tokens;
    config.quant.act_dtype = moekit::DType::kF32;
    MOEKIT_ASSIGN_OR_RETURN(auto layer, moekit::MoeLayer::create(config, ckpt.weights()));
    MOEKIT_RETURN_IF_ERROR(model.add_layer(std::move(layer), l));
    routers.push_back({std::move(ckpt.router_weight)});
  }
  const int64_t H = first.config.hidden;
  const int top_k = first.config.top_k();
  const std::vector<StepLayout> steps = {
      {{{"req-7", 12}, {"req-3", 4}}},  // both prompts, one chunk each
      {{{"req-7", 1}, {"req-3", 1}}},   // one decode token each
  };

  // Record.
  auto cap = moekit::RoutedExpertsCapturer::create(model.num_layers(), max_num_tokens, top_k);
  MOEKIT_RETURN_IF_ERROR(cap.status());
  MOEKIT_RETURN_IF_ERROR(bind(model, **cap));  // every layer gets buffer[layer] as its capture target
  MOEKIT_RETURN_IF_ERROR((*cap)->add_request("req-7", /*skip_prompt_tokens=*/0, /*prompt_tokens=*/12));
  MOEKIT_RETURN_IF_ERROR((*cap)->add_request("req-3", /*skip_prompt_tokens=*/0, /*prompt_tokens=*/4));
  std::vector<StepTensors> recorded;
  for (size_t s = 0; s < steps.size(); ++s) {
    recorded.push_back(make_step(routers, steps[s].num_rows(), H, 100 + s));
    MOEKIT_RETURN_IF_ERROR((*cap)->begin_step(steps[s]));
    for (int l = 0; l < model.num_layers(); ++l) MOEKIT_RETURN_IF_ERROR(model.layer(l).forward(forward_args(recorded[s], l)));
    MOEKIT_RETURN_IF_ERROR((*cap)->end_step());  // copies rows, checks them, appends per request
  }
  MOEKIT_ASSIGN_OR_RETURN(HostTensor ids, (*cap)->routed_experts("req-7"));  // i16 [13, num_moe_layers, top_k]
  std::printf("req-7: %lld tokens x %d MoE layers x top-%d, token 0 of layer 0 went to experts",
              static_cast<long long>(ids.shape()[0]), model.num_layers(), top_k);
  for (int j = 0; j < top_k; ++j) std::printf(" %d", ids.data<int16_t>()[j]);
  std::printf("\n");
  MOEKIT_ASSIGN_OR_RETURN(moekit::CaptureSet captures, (*cap)->snapshot());
  MOEKIT_RETURN_IF_ERROR(moekit::write_capture_file(path, captures));

  // Replay from the file: the same steps, each layer's ids forced (the capturer
  // stays bound and records the replay too, as a trainer checking it would).
  MOEKIT_ASSIGN_OR_RETURN(moekit::CaptureSet from_file, moekit::read_capture_file(path));
  MOEKIT_ASSIGN_OR_RETURN(auto rp, moekit::RoutedExpertsReplayer::create(std::move(from_file), model));
  int64_t differing = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    StepTensors again = make_step(routers, steps[s].num_rows(), H, 100 + s);  // the same inputs
    MOEKIT_RETURN_IF_ERROR(rp->begin_step(steps[s]));  // validates everything, then builds the forced ids
    for (int l = 0; l < model.num_layers(); ++l) {
      moekit::LayerForwardArgs args = forward_args(again, l);
      args.forced_ids = rp->forced_ids(l);  // i32 [M, k] for layer l
      MOEKIT_RETURN_IF_ERROR(model.layer(l).forward(args));
      if (std::memcmp(again.out[l].data<float>(), recorded[s].out[l].data<float>(), again.out[l].nbytes()) != 0)
        ++differing;
    }
  }
  std::printf("replay of %zu steps from %s: %s\n", steps.size(), path.c_str(),
              differing == 0 ? "bit for bit" : "DIFFERENT");
  return differing == 0 ? moekit::Status::Ok() : moekit::Internal("replayed outputs differ from the captured run");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [CAPTURE_FILE]\n", argv[0]);
    return 2;
  }
  const moekit::Status s = run(argv[1], argc > 2 ? argv[2] : "capture.safetensors");
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    return 1;
  }
  return 0;
}

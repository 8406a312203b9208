// Shared by the capture tests: small CPU models with seeded random weights,
// per-step random inputs, and kernel classes looked up by name.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moekit/capture.h"
#include "moekit/layer.h"
#include "moekit/oracle.h"
#include "util/test_util.h"

namespace moekit::testing {

struct ModelShape {
  RoutingMethod method = RoutingMethod::kRenormalize;
  int64_t E = 16, k = 4, H = 64, I = 32, max_tokens = 32;
  DType act = DType::kBF16;
  DType logits = DType::kF32;
  int num_layers = 2;
  bool needs_capture = true;
  bool needs_replay = true;
};

inline MoeConfig config_for(const ModelShape& s) {
  MoeConfig c;
  c.num_experts = s.E;
  c.hidden = s.H;
  c.intermediate = s.I;
  c.max_num_tokens = s.max_tokens;
  c.logits_dtype = s.logits;
  c.quant.act_dtype = s.act;
  c.quant.weight_dtype = s.act;
  c.routing.method = s.method;
  c.routing.top_k = static_cast<int>(s.k);
  if (s.method == RoutingMethod::kDeepseekV3) {
    c.routing.num_groups = 4;
    c.routing.topk_groups = 2;
    c.routing.routed_scaling_factor = 2.5f;
    c.routing.has_score_bias = true;
  }
  c.needs_capture = s.needs_capture;
  c.needs_replay = s.needs_replay && s.method != RoutingMethod::kCustom;
  return c;
}

// Every built-in routing method (all but custom): what monolithic kernels serve.
inline constexpr RoutingMethod kBuiltInMethods[] = {
    RoutingMethod::kSoftmaxTopk, RoutingMethod::kRenormalize, RoutingMethod::kRenormalizeNaive,
    RoutingMethod::kTopk,        RoutingMethod::kSigmoid,     RoutingMethod::kSigmoidRenorm,
    RoutingMethod::kLlama4,      RoutingMethod::kDeepseekV3};

// The model of the capture/replay round-trip tests: three layers, top-4 (top-1
// for llama4).
inline ModelShape replay_shape(RoutingMethod m) {
  ModelShape s;
  s.method = m;
  s.k = m == RoutingMethod::kLlama4 ? 1 : 4;
  s.num_layers = 3;
  return s;
}

// Three engine steps over requests "p" and "q": prefill chunks, then decodes.
inline const std::vector<StepLayout>& two_request_schedule() {
  static const std::vector<StepLayout> steps = {
      StepLayout{{{"p", 7}, {"q", 4}}},
      StepLayout{{{"q", 1}, {"p", 3}}},
      StepLayout{{{"p", 1}, {"q", 1}}},
  };
  return steps;
}

// The CPU kernel class called `name` ("CpuMonolithic" | "CpuModular").
inline KernelClass cpu_kernel_class(const std::string& name) {
  const std::vector<Backend> registry = backend_registry(Platform::cpu_only());
  for (const KernelClass& k : registry.back().candidates) {
    if (k.name == name) return k;
  }
  ADD_FAILURE() << "no CPU kernel class " << name;
  return {};
}

// The weights of one layer, kept so a test can hand them to the fp64 reference.
struct LayerWeights {
  HostTensor w13, w2, bias;           // [E, 2I, H], [E, H, I], [E] f32 (deepseek_v3)
  std::vector<double> w13d, w2d, biasd;
};

// One layer with weights drawn from `rng`, built with `kernel` ("" = let the
// oracle choose).
inline std::unique_ptr<MoeLayer> make_layer(const ModelShape& s, const std::string& kernel, std::mt19937_64& rng,
                                            LayerWeights* keep = nullptr) {
  const MoeConfig cfg = config_for(s);
  LayerWeights w;
  w.w13 = random_tensor(rng, s.act, {s.E, 2 * s.I, s.H}, 0.1, &w.w13d);
  w.w2 = random_tensor(rng, s.act, {s.E, s.H, s.I}, 0.1, &w.w2d);
  MoeWeights mw{w.w13.view(), w.w2.view(), {}};
  if (cfg.routing.has_score_bias) {
    w.bias = random_tensor(rng, DType::kF32, {s.E}, 0.5, &w.biasd);
    mw.score_bias = w.bias.view();
  }
  auto layer = kernel.empty() ? MoeLayer::create(cfg, mw, Platform::cpu_only())
                              : MoeLayer::create_with(cfg, mw, cpu_kernel_class(kernel), Platform::cpu_only());
  EXPECT_TRUE(layer.ok()) << layer.status().to_string();
  if (!layer.ok()) return nullptr;
  if (keep) *keep = std::move(w);
  return std::move(layer).value();
}

// A model of s.num_layers layers at model-layer indices 1, 3, 5, ... (dense
// layers in between), every layer with its own seeded weights.
inline std::unique_ptr<Model> make_model(const ModelShape& s, const std::string& kernel, uint64_t seed,
                                         std::vector<LayerWeights>* weights_out = nullptr) {
  std::mt19937_64 rng(seed);
  auto model = std::make_unique<Model>();
  for (int l = 0; l < s.num_layers; ++l) {
    LayerWeights w;
    auto layer = make_layer(s, kernel, rng, &w);
    if (!layer) return nullptr;
    EXPECT_TRUE(model->add_layer(std::move(layer), 2 * l + 1).ok());
    if (weights_out) weights_out->push_back(std::move(w));
  }
  return model;
}

// The inputs and outputs of one layer in one step.
struct LayerStep {
  HostTensor hidden;  // [M, H] act dtype
  HostTensor logits;  // [M, E] logits dtype, tie-free
  HostTensor out;     // [M, H] act dtype, poisoned before each forward
  std::vector<double> logits_d;
};

inline std::vector<LayerStep> make_step_inputs(const ModelShape& s, int64_t m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<LayerStep> steps(static_cast<size_t>(s.num_layers));
  for (LayerStep& st : steps) {
    st.hidden = random_tensor(rng, s.act, {m, s.H}, 1.0);
    // Gap 2^-6: distinct after bf16 rounding too, so ids are exact.
    st.logits = tie_free_logits(rng, s.logits, m, s.E, 1.0 / 64.0, &st.logits_d);
    st.out = HostTensor(s.act, {m, s.H});
    poison(st.out);
  }
  return steps;
}

// Runs every layer once on its step inputs, with optional forced ids per layer.
inline Status run_layers(Model& model, std::vector<LayerStep>& steps,
                         const RoutedExpertsReplayer* replayer = nullptr) {
  for (int l = 0; l < model.num_layers(); ++l) {
    LayerForwardArgs a;
    a.hidden = steps[l].hidden.view();
    a.router_logits = steps[l].logits.view();
    a.out = steps[l].out.view();
    if (replayer) a.forced_ids = replayer->forced_ids(l);
    MOEKIT_RETURN_IF_ERROR(model.layer(l).forward(a));
  }
  return Status::Ok();
}

}  // namespace moekit::testing

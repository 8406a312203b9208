// GPU twins of the capture tests' CPU models: the same seeded weights built
// into a CPU model and a cuda_sm90 model, and device copies of step inputs.
#pragma once

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "capture/capture_test_util.h"
#include "cuda/cuda_test_util.h"
#include "experts/cuda/sm90_kernels.h"
#include "moekit/layer.h"

namespace moekit::cuda_test {

// MOEKIT_TEST_CUDA_BACKEND=cuda_sm80: the gpu tests run their kernels on the
// portable backend (scripts/gpu_check.sh runs the grid once that way).
inline bool testing_portable_backend() {
  const char* e = std::getenv("MOEKIT_TEST_CUDA_BACKEND");
  return e != nullptr && std::string(e) == cuda::kSm80BackendName;
}

// The class the tests name "Sm90<Monolithic|Modular>", of cuda_sm90 or, under
// MOEKIT_TEST_CUDA_BACKEND=cuda_sm80, its Sm80 twin.
inline KernelClass gpu_kernel_class(const std::string& name) {
  const bool portable = testing_portable_backend() && name.rfind("Sm90", 0) == 0;
  const std::string want = portable ? "Sm80" + name.substr(4) : name;
  for (const KernelClass& k : (portable ? cuda::sm80_backend() : cuda::sm90_backend()).candidates) {
    if (k.name == want) return k;
  }
  ADD_FAILURE() << "no CUDA kernel class " << want;
  return {};
}

// One model on the CPU (CpuMonolithic) and one on the GPU (`gpu_kernel`) with the same weights.
struct ModelPair {
  std::unique_ptr<Model> cpu, gpu;
};

inline ModelPair make_model_pair(const testing::ModelShape& s, const std::string& gpu_kernel, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ModelPair p{std::make_unique<Model>(), std::make_unique<Model>()};
  const MoeConfig cfg = testing::config_for(s);
  for (int l = 0; l < s.num_layers; ++l) {
    HostTensor w13 = testing::random_tensor(rng, s.act, {s.E, 2 * s.I, s.H}, 0.1);
    HostTensor w2 = testing::random_tensor(rng, s.act, {s.E, s.H, s.I}, 0.1);
    HostTensor bias;
    MoeWeights mw{w13.view(), w2.view(), {}};
    if (cfg.routing.has_score_bias) {
      bias = testing::random_tensor(rng, DType::kF32, {s.E}, 0.5);
      mw.score_bias = bias.view();
    }
    auto c = MoeLayer::create_with(cfg, mw, testing::cpu_kernel_class("CpuMonolithic"), Platform::cpu_only());
    auto g = MoeLayer::create_with(cfg, mw, gpu_kernel_class(gpu_kernel), Platform::probe());
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    if (!c.ok() || !g.ok()) return {};
    EXPECT_TRUE(p.cpu->add_layer(std::move(c).value(), 2 * l + 1).ok());
    EXPECT_TRUE(p.gpu->add_layer(std::move(g).value(), 2 * l + 1).ok());
  }
  return p;
}

// Device copies of one step's inputs, output poisoned.
struct DeviceStep {
  DeviceTensor hidden, logits, out;
  explicit DeviceStep(const testing::LayerStep& h) : hidden(h.hidden), logits(h.logits), out(h.out) {}
};

// Every layer of the GPU model once on device copies of `steps`; outputs come back into steps[l].out.
inline Status run_gpu_layers(Model& model, std::vector<testing::LayerStep>& steps,
                             const RoutedExpertsReplayer* replayer = nullptr) {
  for (int l = 0; l < model.num_layers(); ++l) {
    DeviceStep d(steps[l]);
    d.out.poison();
    LayerForwardArgs a;
    a.hidden = d.hidden.view();
    a.router_logits = d.logits.view();
    a.out = d.out.view();
    if (replayer) a.forced_ids = replayer->forced_ids(l);
    MOEKIT_RETURN_IF_ERROR(model.layer(l).forward(a));
    if (cudaDeviceSynchronize() != cudaSuccess) return Internal("device error in layer " + std::to_string(l));
    steps[l].out = d.out.download();
  }
  return Status::Ok();
}

}  // namespace moekit::cuda_test

// What Sm90Modular (sm90_modular.cpp) and Sm90Monolithic (sm90_monolithic.cpp)
// share: the device, the prepared weights, the argument checks of run(), the
// expert stages after routing on the pipeline of the config's scheme, and the
// shared expert's side stream. The same classes serve cuda_sm80 (named
// Sm80Modular and Sm80Monolithic there): only their CudaTarget differs.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "experts/cuda/moe_pipeline.h"
#include "experts/cuda/sm90_support.h"
#include "experts/cuda/sm90_weights.h"
#include "moekit/kernel.h"
#include "moekit/config.h"
#include "moekit/oracle.h"
#include "moekit/platform.h"

namespace moekit::cuda {

// The shared expert's side stream and its fork/join events
// (shared_expert_overlap): created once with the kernel, destroyed with it.
class OwnedSideStream {
 public:
  OwnedSideStream() = default;
  ~OwnedSideStream();
  OwnedSideStream(const OwnedSideStream&) = delete;
  OwnedSideStream& operator=(const OwnedSideStream&) = delete;
  Status create();
  // nullptr until create() succeeded.
  const SharedExpertSide* get() const { return side_.join != nullptr ? &side_ : nullptr; }

 private:
  SharedExpertSide side_;
};

class Sm90Kernel : public MoeKernel {
 public:
  Sm90Kernel(MoeConfig config, int device_index, CudaTarget target);

  Device device() const override { return Device::cuda(device_index_); }
  StatusOr<ProblemSize> problem_size(const TensorView& hidden, const TensorView& w13, const TensorView& w2,
                                     const TensorView& topk_ids) const override;
  size_t workspace_size(int64_t num_tokens) const override;
  Status prepare_weights(const MoeWeights& w) override;
  std::string gemm_plan(int64_t num_tokens) const override;

  // Once, at creation, on the kernel's device: the side stream when the config asks for it.
  Status create_side_stream() { return shape_.shared_overlap ? side_.create() : Status::Ok(); }

 protected:
  // Checks both classes share; returns M through `num_tokens`.
  Status check_common(const MoeRunArgs& a, const Workspace& ws, int64_t* num_tokens) const;
  // The first launch of a forward: with shared_expert_overlap, the shared
  // expert forked onto the side stream, so it overlaps routing and the routed experts.
  Status fork_shared(const MoeRunArgs& a, const Workspace& ws, int64_t M, cudaStream_t stream) const;
  // The expert stages after routing; both classes end here.
  Status run_pipeline(const MoeRunArgs& a, const Workspace& ws, int64_t M, const int32_t* ids, const float* weights,
                      cudaStream_t stream) const;

  // The kernel options in effect, re-read when the environment was reloaded
  // (kernel_options_environment_generation); shape_.kernel points here.
  void refresh_kernel_options();

  // "Sm90<suffix>" on cuda_sm90, "Sm80<suffix>" on cuda_sm80.
  const char* class_name(const char* sm90_name, const char* sm80_name) const {
    return shape_.target == CudaTarget::kSm90 ? sm90_name : sm80_name;
  }

  int device_index_;
  KernelOptions options_;
  uint64_t options_generation_ = 0;
  ExpertsShape shape_;
  Sm90Pipeline pipeline_;
  Sm90Weights weights_;

 private:
  ExpertsRun experts_run(const MoeRunArgs& a, const Workspace& ws, int64_t M) const;

  OwnedSideStream side_;  // iff shape_.shared_overlap
};

// A kernel of class K on the current device, if the config is supported there.
template <typename K>
StatusOr<std::unique_ptr<MoeKernel>> create_cuda_kernel(const MoeConfig& config, const Platform& platform,
                                                       bool monolithic, CudaBackend backend) {
  const Support s = cuda_supports(config, platform, monolithic, backend);
  if (!s.ok) return Unsupported(s.reason);
  CudaTarget target = CudaTarget::kSm90;
  MOEKIT_ASSIGN_OR_RETURN(const int current, current_cuda_device(platform, backend, &target));
  auto kernel = std::make_unique<K>(config, current, target);
  MOEKIT_RETURN_IF_ERROR(kernel->create_side_stream());
  return std::unique_ptr<MoeKernel>(std::move(kernel));
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

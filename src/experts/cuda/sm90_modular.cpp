// Sm90Modular (sm90_kernels.h): the expert stages on the caller's ids and
// weights (any routing, custom included; the experts stage of expert parallelism).
#include "experts/cuda/sm90_kernels.h"

#ifdef MOEKIT_WITH_CUDA

#include <string>

#include "experts/cuda/sm90_kernel.h"

namespace moekit::cuda {

namespace {

class Sm90Modular final : public Sm90Kernel {
 public:
  using Sm90Kernel::Sm90Kernel;
  const char* name() const override { return class_name("Sm90Modular", "Sm80Modular"); }
  bool is_monolithic() const override { return false; }

  Status run(const MoeRunArgs& a, Workspace ws, Stream stream) override {
    refresh_kernel_options();
    int64_t M = 0;
    MOEKIT_RETURN_IF_ERROR(check_common(a, ws, &M));
    const Device dev = device();
    const int64_t k = shape_.top_k;
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.topk_ids, "topk_ids", {DType::kI32}, {M, k}, dev));
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.topk_weights, "topk_weights", {DType::kF32}, {M, k}, dev));
    if (a.forced_ids.defined() || a.routing_replay_out.defined()) {
      return InvalidArgument(std::string(name()) +
                             ": forced_ids/routing_replay_out belong to the router of a modular kernel, not to run()");
    }
    const auto s = static_cast<cudaStream_t>(stream);
    MOEKIT_RETURN_IF_ERROR(fork_shared(a, ws, M, s));
    return run_pipeline(a, ws, M, a.topk_ids.ptr<const int32_t>(), a.topk_weights.ptr<const float>(), s);
  }
};

}  // namespace

StatusOr<std::unique_ptr<MoeKernel>> create_sm90_modular(const MoeConfig& config, const Platform& platform) {
  return create_cuda_kernel<Sm90Modular>(config, platform, /*monolithic=*/false, CudaBackend::kSm90);
}
StatusOr<std::unique_ptr<MoeKernel>> create_sm80_modular(const MoeConfig& config, const Platform& platform) {
  return create_cuda_kernel<Sm90Modular>(config, platform, /*monolithic=*/false, CudaBackend::kPortable);
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

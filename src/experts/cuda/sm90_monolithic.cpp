// Sm90Monolithic (sm90_kernels.h): router logits -> out in one call. It routes
// inside (every built-in method, forced ids replayed), writes the selected ids
// (routing_replay_out) and their weights (router_weights_out) when asked, then
// runs the same expert stages as Sm90Modular.
#include "experts/cuda/sm90_kernels.h"

#ifdef MOEKIT_WITH_CUDA

#include <string>

#include "core/cuda_check.h"
#include "experts/cuda/sm90_kernel.h"
#include "routing/cuda/route_cuda.h"

namespace moekit::cuda {

namespace {

// ok, or why `t` ([>= M, k] of `dtype`, optional) cannot take M rows.
Status check_rows_out(const TensorView& t, const char* name, DType dtype, int64_t M, int64_t k, Device dev) {
  if (!t.defined()) return Status::Ok();
  MOEKIT_RETURN_IF_ERROR(check_tensor(t, name, {dtype}, {-1, k}, dev));
  if (t.shape[0] < M) {
    return InvalidArgument(std::string(name) + ": needs at least M = " + std::to_string(M) + " rows, got " +
                           t.shape_string());
  }
  return Status::Ok();
}

class Sm90Monolithic final : public Sm90Kernel {
 public:
  using Sm90Kernel::Sm90Kernel;
  const char* name() const override { return class_name("Sm90Monolithic", "Sm80Monolithic"); }
  bool is_monolithic() const override { return true; }
  bool supports_routing_replay_capture() const override { return true; }
  bool supports_router_weights_capture() const override { return true; }

  Status run(const MoeRunArgs& a, Workspace ws, Stream stream) override {
    refresh_kernel_options();
    int64_t M = 0;
    MOEKIT_RETURN_IF_ERROR(check_common(a, ws, &M));
    const Device dev = device();
    const int64_t k = shape_.top_k, E = shape_.num_experts;
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.router_logits, "router_logits", {config_.logits_dtype}, {M, E}, dev));
    if (a.forced_ids.defined()) {
      MOEKIT_RETURN_IF_ERROR(check_tensor(a.forced_ids, "forced_ids", {DType::kI32}, {M, k}, dev));
    }
    MOEKIT_RETURN_IF_ERROR(check_rows_out(a.routing_replay_out, "routing_replay_out", DType::kI16, M, k, dev));
    if (a.topk_ids.defined() || a.topk_weights.defined()) {
      return InvalidArgument(std::string(name()) + ": routes inside; topk_ids/topk_weights must not be given");
    }
    MOEKIT_RETURN_IF_ERROR(check_rows_out(a.router_weights_out, "router_weights_out", DType::kF32, M, k, dev));
    if (a.skip_negative_ids) {
      return InvalidArgument(std::string(name()) +
                             ": skip_negative_ids belongs to a modular kernel fed by an EP dispatch");
    }
    // NOTE: ids and weights lie at these offsets in the fp8 layout too (moe_pipeline_fp8.h).
    const ExpertsWorkspaceLayout l = experts_workspace_layout(shape_, M);
    char* base = static_cast<char*>(ws.data);
    auto* ids = reinterpret_cast<int32_t*>(base + l.topk_ids);         // [M, k] i32
    auto* weights = reinterpret_cast<float*>(base + l.topk_weights);  // [M, k] f32
    const auto s = static_cast<cudaStream_t>(stream);
    MOEKIT_RETURN_IF_ERROR(fork_shared(a, ws, M, s));

    // expert_counts: counted by the align stage.
    const float* score_bias = config_.routing.has_score_bias ? device_ptr<const float>(weights_.score_bias) : nullptr;
    MOEKIT_RETURN_IF_ERROR(launch_routing(make_routing_launch(config_.routing, a.router_logits, score_bias,
                                                              a.forced_ids, ids, weights, a.routing_replay_out,
                                                              /*expert_counts=*/nullptr),
                                          s));
    if (a.router_weights_out.defined()) {  // capture of router weights: the routing's own output, copied
      MOEKIT_CUDA_CHECK(cudaMemcpyAsync(a.router_weights_out.data, weights, static_cast<size_t>(M * k) * sizeof(float),
                                        cudaMemcpyDeviceToDevice, s));
    }
    return run_pipeline(a, ws, M, ids, weights, s);
  }
};

}  // namespace

StatusOr<std::unique_ptr<MoeKernel>> create_sm90_monolithic(const MoeConfig& config, const Platform& platform) {
  return create_cuda_kernel<Sm90Monolithic>(config, platform, /*monolithic=*/true, CudaBackend::kSm90);
}
StatusOr<std::unique_ptr<MoeKernel>> create_sm80_monolithic(const MoeConfig& config, const Platform& platform) {
  return create_cuda_kernel<Sm90Monolithic>(config, platform, /*monolithic=*/true, CudaBackend::kPortable);
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

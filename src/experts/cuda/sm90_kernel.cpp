// Sm90Kernel (sm90_kernel.h): the part both cuda_sm90 kernel classes share.
#include "experts/cuda/sm90_kernel.h"

#ifdef MOEKIT_WITH_CUDA

#include <string>
#include <utility>

#include "core/cuda_check.h"
#include "experts/cuda/moe_pipeline_fp8.h"
#include "experts/cuda/moe_pipeline_weight4.h"

namespace moekit::cuda {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

OwnedSideStream::~OwnedSideStream() {
  if (side_.join != nullptr) (void)cudaEventDestroy(side_.join);
  if (side_.fork != nullptr) (void)cudaEventDestroy(side_.fork);
  if (side_.stream != nullptr) (void)cudaStreamDestroy(side_.stream);  // pending work still completes
}

Status OwnedSideStream::create() {
  // Non-blocking: the side stream never waits on the legacy default stream
  // behind the caller's back; the fork event is its only dependency.
  MOEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&side_.stream, cudaStreamNonBlocking));
  MOEKIT_CUDA_CHECK(cudaEventCreateWithFlags(&side_.fork, cudaEventDisableTiming));
  MOEKIT_CUDA_CHECK(cudaEventCreateWithFlags(&side_.join, cudaEventDisableTiming));
  return Status::Ok();
}

Sm90Kernel::Sm90Kernel(MoeConfig config, int device_index, CudaTarget target)
    : MoeKernel(std::move(config)),
      device_index_(device_index),
      options_generation_(kernel_options_environment_generation()),
      shape_(sm90_shape_of(config_)),
      pipeline_(sm90_pipeline_of(config_.quant.method)) {
  options_ = kernel_options_in_effect(config_.kernel);
  shape_.kernel = &options_;
  shape_.target = target;
}

void Sm90Kernel::refresh_kernel_options() {
  const uint64_t generation = kernel_options_environment_generation();
  if (generation == options_generation_) return;
  options_ = kernel_options_in_effect(config_.kernel);
  options_generation_ = generation;
}

StatusOr<ProblemSize> Sm90Kernel::problem_size(const TensorView& hidden, const TensorView& w13, const TensorView& w2,
                                               const TensorView& topk_ids) const {
  // Prepared W13 keeps the checkpoint's [E, N1, H] shape (rows permuted only).
  if (hidden.rank != 2) return InvalidArgument("hidden: expected [M, H], got " + hidden.shape_string());
  if (w13.rank != 3) return InvalidArgument("w13: expected [E, N1, H], got " + w13.shape_string());
  if (w2.rank != 3) return InvalidArgument("w2: expected [E, H, I], got " + w2.shape_string());
  if (topk_ids.rank != 2) return InvalidArgument("topk_ids: expected [M, k], got " + topk_ids.shape_string());
  ProblemSize p;
  p.num_experts = w13.shape[0];
  p.num_tokens = hidden.shape[0];
  p.n = w13.shape[1];
  p.k = hidden.shape[1];
  p.top_k = topk_ids.shape[1];
  // 4-bit weights hold two values a byte (stored_cols).
  if (w13.shape[2] != config_.quant.stored_cols(p.k) || w2.shape[0] != p.num_experts || w2.shape[1] != p.k ||
      topk_ids.shape[0] != p.num_tokens) {
    return InvalidArgument("problem_size: inconsistent shapes hidden " + hidden.shape_string() + ", w13 " +
                           w13.shape_string() + ", w2 " + w2.shape_string() + ", topk_ids " + topk_ids.shape_string());
  }
  return p;
}

size_t Sm90Kernel::workspace_size(int64_t num_tokens) const {
  switch (pipeline_) {
    case Sm90Pipeline::kBf16: return experts_workspace_layout(shape_, num_tokens).total;
    case Sm90Pipeline::kFp8: return fp8_workspace_layout(shape_, num_tokens).total;
    case Sm90Pipeline::kWeight4: return weight4_workspace_layout(shape_, config_.quant.method, num_tokens).total;
  }
  return 0;
}

std::string Sm90Kernel::gemm_plan(int64_t num_tokens) const {
  switch (pipeline_) {
    case Sm90Pipeline::kBf16: return experts_gemm_plan(shape_, num_tokens);
    case Sm90Pipeline::kFp8:
      return std::string("fp8 GEMMs ") + fp8_gemm_path_name(shape_, num_tokens);
    case Sm90Pipeline::kWeight4: return weight4_gemm_plan(shape_, config_.quant.method, num_tokens);
  }
  return {};
}

Status Sm90Kernel::prepare_weights(const MoeWeights& w) {
  return prepare_sm90_weights(config_, shape_, pipeline_, device_index_, name(), w, &weights_);
}

Status Sm90Kernel::check_common(const MoeRunArgs& a, const Workspace& ws, int64_t* num_tokens) const {
  if (!weights_.prepared) return FailedPrecondition(std::string(name()) + ": run() before prepare_weights()");
  const Device dev = device();
  const int64_t H = shape_.hidden, E = shape_.num_experts;
  MOEKIT_RETURN_IF_ERROR(check_tensor(a.hidden, "hidden", {DType::kBF16}, {-1, H}, dev));
  const int64_t M = a.hidden.shape[0];
  if (M > config_.max_num_tokens) {
    return InvalidArgument("hidden: M = " + str(M) + " exceeds max_num_tokens = " + str(config_.max_num_tokens));
  }
  MOEKIT_RETURN_IF_ERROR(check_tensor(a.out, "out", {DType::kBF16}, {M, H}, dev));
  if (a.expert_counts.defined()) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.expert_counts, "expert_counts", {DType::kI32}, {E}, dev));
  }
  const size_t need = workspace_size(M);
  if (ws.bytes < need || (need > 0 && ws.data == nullptr)) {
    return InvalidArgument(std::string(name()) + ": workspace of " + str(static_cast<int64_t>(ws.bytes)) +
                           " bytes, needs " + str(static_cast<int64_t>(need)) + " for M = " + str(M));
  }
  if (reinterpret_cast<uintptr_t>(ws.data) % 256 != 0) {
    return InvalidArgument(std::string(name()) + ": workspace must be 256-byte aligned");
  }
  MOEKIT_RETURN_IF_ERROR(require_current_device(device_index_, name()));
  *num_tokens = M;
  return Status::Ok();
}

Status Sm90Kernel::run_pipeline(const MoeRunArgs& a, const Workspace& ws, int64_t M, const int32_t* ids,
                                const float* weights, cudaStream_t stream) const {
  switch (pipeline_) {
    case Sm90Pipeline::kBf16: {
      ExpertsRun r = experts_run(a, ws, M);
      r.topk_ids = ids;
      r.topk_weights = weights;
      r.skip_negative_ids = a.skip_negative_ids;
      return run_experts(shape_, r, stream);
    }
    case Sm90Pipeline::kFp8: {
      Fp8ExpertsRun r;
      r.num_tokens = M;
      r.hidden = a.hidden.ptr<const uint16_t>();
      r.topk_ids = ids;
      r.topk_weights = weights;
      r.out = a.out.ptr<uint16_t>();
      r.expert_counts = a.expert_counts.defined() ? a.expert_counts.ptr<int32_t>() : nullptr;
      r.workspace = static_cast<char*>(ws.data);
      r.skip_negative_ids = a.skip_negative_ids;
      return run_experts_fp8(shape_, weights_.fp8(config_.quant), r, stream);
    }
    case Sm90Pipeline::kWeight4: {
      ExpertsRun r = experts_run(a, ws, M);
      r.topk_ids = ids;
      r.topk_weights = weights;
      r.skip_negative_ids = a.skip_negative_ids;
      return run_experts_weight4(shape_, weights_.weight4(config_.quant.method), r, stream);
    }
  }
  return Unsupported(std::string(name()) + ": quant " + quant_method_name(config_.quant.method) + " is not served");
}

Status Sm90Kernel::fork_shared(const MoeRunArgs& a, const Workspace& ws, int64_t M, cudaStream_t stream) const {
  // fp8 configs have no shared expert (MoeConfig::validate).
  if (!shape_.shared_overlap || pipeline_ != Sm90Pipeline::kBf16) return Status::Ok();
  return fork_shared_expert(shape_, experts_run(a, ws, M), stream);
}

ExpertsRun Sm90Kernel::experts_run(const MoeRunArgs& a, const Workspace& ws, int64_t M) const {
  ExpertsRun r;
  r.num_tokens = M;
  r.hidden = a.hidden.ptr<const uint16_t>();
  r.w13 = device_ptr<const uint16_t>(weights_.w13);
  r.w2 = device_ptr<const uint16_t>(weights_.w2);
  r.out = a.out.ptr<uint16_t>();
  r.expert_counts = a.expert_counts.defined() ? a.expert_counts.ptr<int32_t>() : nullptr;
  r.workspace = static_cast<char*>(ws.data);
  r.w13_bias = device_ptr<const float>(weights_.w13_bias);
  r.w2_bias = device_ptr<const float>(weights_.w2_bias);
  r.shared_w13 = device_ptr<const uint16_t>(weights_.shared_w13);
  r.shared_w2 = device_ptr<const uint16_t>(weights_.shared_w2);
  r.shared_gate = device_ptr<const float>(weights_.shared_gate);
  r.shared_side = side_.get();
  return r;
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

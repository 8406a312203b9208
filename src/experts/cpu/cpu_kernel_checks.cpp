#include "experts/cpu/cpu_kernel_checks.h"

#include <string>
#include <vector>

#include "experts/cpu/activations.h"

namespace moekit::cpu {
namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

Support supports_common(const MoeConfig& config, const Platform& platform) {
  // Device/arch: any CPU runs these kernels.
  // Dtypes/quant: every scheme is emulated exactly (fp8_emulation.h, partial
  // 128-blocks included; 4-bit weights dequantized exactly, core/weight4.h).
  const QuantScheme& q = config.quant;
  if (q.act_dtype != DType::kF32 && q.act_dtype != DType::kBF16) {
    return Support::no(std::string("cpu: activation dtype ") + dtype_name(q.act_dtype) + " not supported (f32 or bf16)");
  }
  switch (q.method) {
    case QuantMethod::kNone:
      if (q.weight_dtype != DType::kF32 && q.weight_dtype != DType::kBF16) {
        return Support::no(std::string("cpu: weight dtype ") + dtype_name(q.weight_dtype) +
                           " not supported unquantized (f32 or bf16)");
      }
      break;
    case QuantMethod::kFp8Block128:
    case QuantMethod::kFp8PerTensor:
    case QuantMethod::kMxfp4:
    case QuantMethod::kInt4G32:
    case QuantMethod::kInt4G128: {
      const DType want = q.is_fp8() ? DType::kF8E4M3 : DType::kU8;
      if (q.weight_dtype != want) {
        return Support::no(std::string("cpu: ") + quant_method_name(q.method) + " needs " + dtype_name(want) +
                           " weights, got " + dtype_name(q.weight_dtype));
      }
      break;
    }
  }
  // Activation: every one is implemented (apply_activation's switch is exhaustive).
  return Support::yes();
}

Status check_hidden_and_out(const MoeConfig& config, const MoeRunArgs& args, int64_t* num_tokens) {
  const DType act = config.quant.act_dtype;
  MOEKIT_RETURN_IF_ERROR(check_tensor(args.hidden, "hidden", {act}, {-1, config.hidden}, Device::cpu()));
  const int64_t M = args.hidden.dim(0);
  if (M > config.max_num_tokens) {
    return InvalidArgument("hidden: " + str(M) + " tokens exceed max_num_tokens (" + str(config.max_num_tokens) +
                           ")");
  }
  MOEKIT_RETURN_IF_ERROR(check_tensor(args.out, "out", {act}, {M, config.hidden}, Device::cpu()));
  *num_tokens = M;
  return Status::Ok();
}

Status check_topk(const MoeConfig& config, const MoeRunArgs& args, int64_t num_tokens) {
  const int64_t k = config.top_k(), E = config.num_experts;
  MOEKIT_RETURN_IF_ERROR(check_tensor(args.topk_ids, "topk_ids", {DType::kI32}, {num_tokens, k}, Device::cpu()));
  MOEKIT_RETURN_IF_ERROR(
      check_tensor(args.topk_weights, "topk_weights", {DType::kF32}, {num_tokens, k}, Device::cpu()));
  const int32_t* ids = args.topk_ids.ptr<const int32_t>();
  std::vector<int64_t> seen(static_cast<size_t>(E), -1);  // row that last used each expert
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      const std::string at = "topk_ids[" + str(t) + ", " + str(j) + "]";
      if (e < 0 || e >= E) return OutOfRange(at + " = " + str(e) + " is outside [0, " + str(E) + ")");
      if (seen[e] == t) return InvalidArgument(at + " = " + str(e) + " repeats an expert already in row " + str(t));
      seen[e] = t;
    }
  }
  return Status::Ok();
}

Status check_workspace(const Workspace& workspace, size_t needed) {
  if (workspace.bytes < needed) {
    return InvalidArgument("workspace: " + std::to_string(workspace.bytes) + " bytes given, " +
                           std::to_string(needed) + " needed (workspace_size)");
  }
  if (workspace.data == nullptr) return InvalidArgument("workspace: data is null");
  return Status::Ok();
}

StatusOr<ProblemSize> cpu_problem_size(const MoeConfig& config, const TensorView& hidden, const TensorView& w13,
                                       const TensorView& w2, const TensorView& topk_ids) {
  if (hidden.rank != 2) return InvalidArgument("hidden: expected rank 2 [M, H], got " + hidden.shape_string());
  if (w13.rank != 3) return InvalidArgument("w13: expected rank 3 [E, N, H], got " + w13.shape_string());
  if (w2.rank != 3) return InvalidArgument("w2: expected rank 3 [E, H, I], got " + w2.shape_string());
  ProblemSize p;
  p.num_experts = w13.dim(0);
  p.num_tokens = hidden.dim(0);
  p.n = w13.dim(1);
  p.k = hidden.dim(1);
  // 4-bit weights hold two values a byte (stored_cols).
  if (w13.dim(2) != config.quant.stored_cols(p.k)) {
    return InvalidArgument("hidden: " + str(hidden.dim(1)) + " columns, w13 " + w13.shape_string() +
                           " does not store H = " + str(p.k));
  }
  const int64_t I = config.quant.is_weight4() ? 2 * w2.dim(2) : w2.dim(2);
  if (w2.dim(0) != p.num_experts || w2.dim(1) != p.k || p.n != gemm1_width(config.activation.kind, I)) {
    return InvalidArgument("w2: shape " + w2.shape_string() + " does not match w13 " + w13.shape_string() +
                           " for activation " + activation_name(config.activation.kind));
  }
  if (topk_ids.defined()) {
    if (topk_ids.rank != 2 || topk_ids.dim(0) != p.num_tokens) {
      return InvalidArgument("topk_ids: expected [" + str(p.num_tokens) + ", k], got " + topk_ids.shape_string());
    }
    p.top_k = topk_ids.dim(1);
  } else {
    p.top_k = config.top_k();
  }
  return p;
}

}  // namespace moekit::cpu

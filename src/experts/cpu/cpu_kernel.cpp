#include "experts/cpu/cpu_kernel.h"

#include <string>

#include "dispatch/local_prepare_finalize.h"
#include "experts/cpu/cpu_gemm.h"
#include "experts/cpu/cpu_kernel_checks.h"
#include "experts/cpu/packed_bf16_gemm.h"

namespace moekit::cpu {

StatusOr<ProblemSize> CpuKernel::problem_size(const TensorView& hidden, const TensorView& w13, const TensorView& w2,
                                              const TensorView& topk_ids) const {
  return cpu_problem_size(config_, hidden, w13, w2, topk_ids);
}

CpuKernel::StageBuffers CpuKernel::take_stage_buffers(const MoeConfig& c, int64_t M, ScratchLayout& layout) {
  const int64_t act_rows = c.quant.act_dtype == DType::kF32 ? 0 : M;
  StageBuffers b;
  b.x = layout.take<float>(act_rows * c.hidden);
  b.y = layout.take<float>(act_rows * c.hidden);
  b.experts = CpuExperts::take_buffers(c, M, layout);
  return b;
}

Status CpuKernel::check_servable(const Support& support) const {
  MOEKIT_RETURN_IF_ERROR(config_.validate());
  if (!support.ok) return Unsupported(std::string(name()) + ": " + support.reason);
  return Status::Ok();
}

Status CpuKernel::check_run_inputs(const MoeRunArgs& args, int64_t* num_tokens) const {
  if (!experts_.prepared()) return FailedPrecondition(std::string(name()) + ": run() before prepare_weights()");
  if (args.skip_negative_ids) {
    // The host EP path hands the CPU kernels (token, slot) pairs, every id valid.
    return InvalidArgument(std::string(name()) + ": skip_negative_ids is served by the cuda_sm90 modular kernel only");
  }
  return check_hidden_and_out(config_, args, num_tokens);
}

void CpuKernel::run_stages(const MoeRunArgs& args, const int32_t* topk_ids, const float* topk_weights,
                           int64_t num_tokens, const StageBuffers& b) const {
  const float* x = dispatch::local_prepare(args.hidden, b.x);
  float* y = dispatch::local_output_buffer(args.out, b.y);
  experts_.apply(x, topk_ids, topk_weights, num_tokens, y, b.experts);
  dispatch::local_finalize(y, args.out);
}

std::string CpuKernel::gemm_plan(int64_t /*num_tokens*/) const {
  const CpuGemmPath path = cpu_gemm_path(config_);
  // What the weights are, then why this path serves them.
  const std::string weights = config_.quant.method != QuantMethod::kNone
                                  ? std::string(quant_method_name(config_.quant.method)) +
                                        " weights, dequantized to f32 once"
                                  : std::string(dtype_name(config_.quant.weight_dtype)) + " weights";
  std::string why;
  if (path != CpuGemmPath::kBlasF32) {
    why = weights + ", this CPU's " + packed_gemm_isa() + " kernel";
  } else if (kernel_option_in_effect(config_.kernel, &KernelOptions::cpu_gemm) == "blas") {
    why = weights + ", forced by kernel.cpu_gemm";
  } else {
    why = weights + ", this CPU has no packed kernel (AVX-512, or AVX2 with FMA)";
  }
  return std::string("gemm ") + cpu_gemm_path_name(path) + " (" + why + "), every M";
}

}  // namespace moekit::cpu

// CpuKernel: what the two CPU kernel classes (CpuModular, CpuMonolithic) share.
// Both run one experts stage between a local prepare and a local finalize on
// the CPU; they differ only in where topk_ids/topk_weights come from (the
// caller, or route_cpu inside run()). Keeping that common path here is what
// keeps their outputs bitwise equal for the same routing.
#pragma once

#include <cstdint>
#include <string>

#include "experts/cpu/cpu_experts.h"
#include "experts/cpu/scratch_layout.h"
#include "moekit/kernel.h"

namespace moekit::cpu {

class CpuKernel : public MoeKernel {
 public:
  Device device() const final { return Device::cpu(); }
  // hidden [M, H], w13 [E, n1, H], w2 [E, H, I], topk_ids [M, k] or absent.
  StatusOr<ProblemSize> problem_size(const TensorView& hidden, const TensorView& w13, const TensorView& w2,
                                     const TensorView& topk_ids) const final;
  // One GEMM path for every M (cpu_gemm_path) and why.
  std::string gemm_plan(int64_t num_tokens) const final;

 protected:
  using MoeKernel::MoeKernel;

  // The workspace both kernels take first, for M tokens.
  struct StageBuffers {
    float* x = nullptr;  // [M, H] f32, prepared activations (only when acts are bf16)
    float* y = nullptr;  // [M, H] f32, layer output before finalize (only when acts are bf16)
    CpuExperts::Buffers experts;
  };
  static StageBuffers take_stage_buffers(const MoeConfig& config, int64_t num_tokens, ScratchLayout& layout);

  // The start of prepare_weights(): the config is valid and `support` (the
  // class's own supports() on this CPU) says yes; else Unsupported, naming the
  // kernel and the reason.
  Status check_servable(const Support& support) const;

  // The start of run(): weights prepared, hidden/out valid (sets *num_tokens).
  Status check_run_inputs(const MoeRunArgs& args, int64_t* num_tokens) const;

  // hidden -> local prepare -> experts stage (ids [M, k] i32 validated,
  // weights [M, k] f32) -> local finalize -> out.
  void run_stages(const MoeRunArgs& args, const int32_t* topk_ids, const float* topk_weights, int64_t num_tokens,
                  const StageBuffers& buffers) const;

  CpuExperts experts_;
};

}  // namespace moekit::cpu

#include "experts/cpu/cpu_experts.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "dispatch/topk_reduce.h"
#include "moekit/parallel_for.h"
#include "experts/cpu/activations.h"
#include "experts/cpu/fp8_emulation.h"
#include "experts/quant_weights.h"
#include "experts/cpu/permute.h"

namespace moekit::cpu {

namespace {

// An optional tensor of the config: required (and checked) when `wanted`,
// refused when given without it.
Status check_optional(const TensorView& t, const char* name, bool wanted, const char* flag,
                      std::initializer_list<DType> dtypes, std::initializer_list<int64_t> shape) {
  if (wanted) return check_tensor(t, name, dtypes, shape, Device::cpu());
  if (t.defined()) return InvalidArgument(std::string(name) + ": given, but " + flag + " is off in the config");
  return Status::Ok();
}

void assign_or_clear(ExpertWeightsF32& dst, const TensorView& src) {
  if (src.defined()) {
    dst.assign(src);
  } else {
    dst = {};
  }
}

}  // namespace

Status CpuExperts::prepare(const MoeConfig& config, const MoeWeights& weights) {
  MOEKIT_RETURN_IF_ERROR(check_num_threads_env());  // the pool would fall back to every hardware thread
  const TensorView& w13 = weights.w13;
  const TensorView& w2 = weights.w2;
  const int64_t E = config.num_experts, H = config.hidden, I = config.intermediate;
  const int64_t n1 = gemm1_width(config.activation.kind, I);
  const DType wt = config.quant.weight_dtype;
  MOEKIT_RETURN_IF_ERROR(check_tensor(w13, "w13", {wt}, {E, n1, config.quant.stored_cols(H)}, Device::cpu()));
  MOEKIT_RETURN_IF_ERROR(check_tensor(w2, "w2", {wt}, {E, H, config.quant.stored_cols(I)}, Device::cpu()));
  MOEKIT_RETURN_IF_ERROR(check_quant_scales(config, weights, Device::cpu()));
  const bool bias = config.has_expert_bias;
  const DType bias_dtype = config.quant.is_weight4() ? DType::kBF16 : wt;  // 4-bit layers: f32 or bf16 biases
  MOEKIT_RETURN_IF_ERROR(
      check_optional(weights.w13_bias, "w13_bias", bias, "has_expert_bias", {DType::kF32, bias_dtype}, {E, n1}));
  MOEKIT_RETURN_IF_ERROR(
      check_optional(weights.w2_bias, "w2_bias", bias, "has_expert_bias", {DType::kF32, bias_dtype}, {E, H}));
  // NaN or Inf weights would run and return NaN rows: refused, as NaN logits are.
  const std::pair<const TensorView*, const char*> values[] = {
      {&w13, "w13"}, {&w2, "w2"}, {&weights.w13_bias, "w13_bias"}, {&weights.w2_bias, "w2_bias"}};
  for (const auto& [t, name] : values) MOEKIT_RETURN_IF_ERROR(check_weight_values(*t, name));
  MOEKIT_RETURN_IF_ERROR(shared_.prepare(config, weights));  // checks its tensors before it keeps any
  num_experts_ = E;
  hidden_ = H;
  intermediate_ = I;
  top_k_ = config.top_k();
  activation_ = config.activation;
  quant_ = config.quant;
  const auto host_vector = [](const TensorView& t) {
    const float* p = t.defined() ? t.ptr<const float>() : nullptr;
    return p ? std::vector<float>(p, p + t.numel()) : std::vector<float>();
  };
  a13_scale_ = host_vector(weights.a13_scale);
  a2_scale_ = host_vector(weights.a2_scale);
  path_ = cpu_gemm_path(config);
  batch_invariant_ = config.batch_invariant;
  // The weights as fp32 (the BLAS path's operands; the packed f32 path packs them).
  ExpertWeightsF32 w13_f32, w2_f32;
  if (path_ != CpuGemmPath::kPackedBf16) {
    if (quant_.is_fp8()) {
      w13_f32.assign_fp8(quant_.method, w13, weights.w13_scale, w13_parts(activation_));
      w2_f32.assign_fp8(quant_.method, w2, weights.w2_scale, 1);
    } else if (quant_.is_weight4()) {
      w13_f32.assign_weight4(quant_.method, w13, weights.w13_scale);
      w2_f32.assign_weight4(quant_.method, w2, weights.w2_scale);
    } else {
      w13_f32.assign(w13);
      w2_f32.assign(w2);
    }
  }
  if (path_ == CpuGemmPath::kPackedBf16) {
    w13_.assign_bf16(w13.ptr<const uint16_t>(), E, n1, H);
    w2_.assign_bf16(w2.ptr<const uint16_t>(), E, H, I);
  } else {
    w13_.assign_f32(path_, std::move(w13_f32), E, n1, H);
    w2_.assign_f32(path_, std::move(w2_f32), E, H, I);
  }
  assign_or_clear(w13_bias_, weights.w13_bias);
  assign_or_clear(w2_bias_, weights.w2_bias);
  return Status::Ok();
}

CpuExperts::Buffers CpuExperts::take_buffers(const MoeConfig& config, int64_t num_tokens, ScratchLayout& layout) {
  const int64_t pairs = num_tokens * config.top_k();
  const int64_t n1 = gemm1_width(config.activation.kind, config.intermediate);
  Buffers b;
  b.expert_offsets = layout.take<int32_t>(config.num_experts + 1);
  b.row_to_pair = layout.take<int32_t>(pairs);
  b.pair_to_row = layout.take<int32_t>(pairs);
  b.x_perm = layout.take<float>(pairs * config.hidden);
  b.h = layout.take<float>(pairs * n1);
  b.y_perm = layout.take<float>(pairs * config.hidden);
  b.active = layout.take<int32_t>(cpu_gemm_path(config) != CpuGemmPath::kBlasF32 ? config.num_experts : 0);
  const int64_t shared_rows = config.shared_intermediate > 0 ? num_tokens : 0;
  b.shared_h = layout.take<float>(shared_rows * gemm1_width(config.activation.kind, config.shared_intermediate));
  b.shared_y = layout.take<float>(shared_rows * config.hidden);
  return b;
}

void CpuExperts::apply(const float* x, const int32_t* ids, const float* topk_weights, int64_t num_tokens, float* y,
                       const Buffers& b) const {
  const int64_t E = num_experts_, H = hidden_, I = intermediate_, k = top_k_;
  const int64_t n1 = gemm1_width(activation_.kind, I);
  const int64_t pairs = num_tokens * k;
  if (pairs == 0) return;
  // Adds bias[e] (row length n) to every permuted row of expert e.
  auto add_expert_bias = [&](float* rows, const ExpertWeightsF32& bias, int64_t n) {
    parallel_for(E, 1, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e) {
        const float* be = bias.data() + e * n;
        for (int64_t r = b.expert_offsets[e]; r < b.expert_offsets[e + 1]; ++r) {
          float* row = rows + r * n;
          for (int64_t c = 0; c < n; ++c) row[c] += be[c];
        }
      }
    });
  };

  build_permutation(ids, num_tokens, k, E, {b.expert_offsets, b.row_to_pair, b.pair_to_row});

  // Gather each pair's token row into its expert's block.
  parallel_for(pairs, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* src = x + (b.row_to_pair[r] / k) * H;
      float* dst = b.x_perm + r * H;
      for (int64_t c = 0; c < H; ++c) dst[c] = src[c];
    }
  });

  // NOTE: fp8 schemes round each GEMM's input through e4m3 right before the
  // GEMM (docs/fp8.md); the GPU kernels quantize at these same two points.
  quantize_gemm_input(b.x_perm, pairs, H, H, a13_scale_, b);
  w13_.gemm(b.x_perm, H, b.expert_offsets, b.h, n1, b.active, batch_invariant_);
  if (!w13_bias_.empty()) add_expert_bias(b.h, w13_bias_, n1);
  apply_activation(activation_, b.h, pairs, I);
  quantize_gemm_input(b.h, pairs, I, n1, a2_scale_, b);
  w2_.gemm(b.h, n1, b.expert_offsets, b.y_perm, H, b.active, batch_invariant_);
  if (!w2_bias_.empty()) add_expert_bias(b.y_perm, w2_bias_, H);

  // Weighted top-k reduce in a fixed order: slots j = 0..k-1, fp32.
  dispatch::weighted_topk_reduce(b.y_perm, b.pair_to_row, topk_weights, num_tokens, k, H, y);
  shared_.add_to(x, num_tokens, y, b.shared_h, b.shared_y);
}

void CpuExperts::quantize_gemm_input(float* a, int64_t rows, int64_t cols, int64_t ld,
                                     const std::vector<float>& static_scale, const Buffers& b) const {
  switch (quant_.method) {
    case QuantMethod::kNone:
    case QuantMethod::kMxfp4:  // weight-only: activations stay as they are
    case QuantMethod::kInt4G32:
    case QuantMethod::kInt4G128: return;
    case QuantMethod::kFp8Block128: fp8_fake_quant_groups(a, rows, cols, ld); return;
    case QuantMethod::kFp8PerTensor:
      switch (quant_.act_scale) {
        case ActScale::kDynamic:
          // One scale for the whole GEMM input: every (token, slot) row.
          fp8_fake_quant_scaled(a, rows, cols, ld, fp8_act_scale(fp8_amax(a, rows, cols, ld)));
          return;
        case ActScale::kStatic:
          for (int64_t e = 0; e < num_experts_; ++e) {
            const int64_t r0 = b.expert_offsets[e], n = b.expert_offsets[e + 1] - r0;
            if (n > 0) fp8_fake_quant_scaled(a + r0 * ld, n, cols, ld, static_scale[e]);
          }
          return;
      }
      return;
  }
}

}  // namespace moekit::cpu

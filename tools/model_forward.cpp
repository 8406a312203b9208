#include "model_forward.h"

#include <chrono>

namespace moekit::tools {

StepBuffers::StepBuffers(const MoeConfig& c)
    : h(static_cast<size_t>(c.max_num_tokens * c.hidden)),
      x(DType::kBF16, {c.max_num_tokens, c.hidden}),
      logits(DType::kF32, {c.max_num_tokens, c.num_experts}),
      out(DType::kBF16, {c.max_num_tokens, c.hidden}),
      counts(DType::kI32, {c.num_experts}) {}

Status forward_step(const SyntheticModelSpec& spec, SyntheticModel& m, const Step& step, StepBuffers& b,
                    std::vector<LayerStats>& stats, const RoutedExpertsReplayer* replayer) {
  const int64_t M = step.num_tokens, H = spec.hidden, E = spec.num_experts;
  int64_t row = 0;
  for (const StepSlice& s : step.slices) {
    for (int64_t t = 0; t < s.num_tokens; ++t, ++row) embed_token(spec, s.request, s.first_position + t, &b.h[row * H]);
  }
  LayerForwardArgs args;
  args.hidden = TensorView::contiguous(b.x.data<uint16_t>(), DType::kBF16, {M, H});
  args.router_logits = TensorView::contiguous(b.logits.data<float>(), DType::kF32, {M, E});
  args.out = TensorView::contiguous(b.out.data<uint16_t>(), DType::kBF16, {M, H});
  args.expert_counts = b.counts.view();
  for (int l = 0; l < m.model.num_layers(); ++l) {
    rmsnorm_to_bf16(b.h.data(), M, H, b.x.data<uint16_t>());
    router_logits(b.x.data<uint16_t>(), m.gates[l].data<float>(), M, E, H, b.logits.data<float>());
    if (replayer) args.forced_ids = replayer->forced_ids(l);
    const auto t0 = std::chrono::steady_clock::now();
    MOEKIT_RETURN_IF_ERROR(m.model.layer(l).forward(args));
    stats[l].seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int64_t e = 0; e < E; ++e) stats[l].expert_tokens[e] += b.counts.data<int32_t>()[e];
    const uint16_t* out = b.out.data<uint16_t>();  // [M, H] bf16
    for (int64_t i = 0; i < M * H; ++i) b.h[i] += bf16_bits_to_f32(out[i]);
  }
  return Status::Ok();
}

}  // namespace moekit::tools

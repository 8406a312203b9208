#include "model_forward.h"

#include <chrono>

namespace moekit::tools {

StatusOr<StepBuffers> StepBuffers::create(const MoeConfig& c, Device layer_device) {
  StepBuffers b;
  b.h.resize(static_cast<size_t>(c.max_num_tokens * c.hidden));
  b.x = HostTensor(DType::kBF16, {c.max_num_tokens, c.hidden});
  b.logits = HostTensor(DType::kF32, {c.max_num_tokens, c.num_experts});
  b.out = HostTensor(DType::kBF16, {c.max_num_tokens, c.hidden});
  b.counts = HostTensor(DType::kI32, {c.num_experts});
  b.device = layer_device;
  if (layer_device.type == DeviceType::kCuda) {
    MOEKIT_ASSIGN_OR_RETURN(b.d_x, DeviceBuffer::allocate(layer_device, b.x.nbytes()));
    MOEKIT_ASSIGN_OR_RETURN(b.d_logits, DeviceBuffer::allocate(layer_device, b.logits.nbytes()));
    MOEKIT_ASSIGN_OR_RETURN(b.d_out, DeviceBuffer::allocate(layer_device, b.out.nbytes()));
    MOEKIT_ASSIGN_OR_RETURN(b.d_counts, DeviceBuffer::allocate(layer_device, b.counts.nbytes()));
  }
  return b;
}

namespace {
// The layer-side view of a host buffer: itself on the CPU, its mirror on a device.
TensorView layer_view(const StepBuffers& b, const HostTensor& host, const DeviceBuffer& mirror,
                      std::vector<int64_t> shape) {
  void* data = b.device.type == DeviceType::kCpu ? const_cast<void*>(static_cast<const void*>(host.data<unsigned char>()))
                                                 : mirror.data();
  return TensorView::contiguous(data, host.dtype(), shape, b.device);
}
Status to_layer(const StepBuffers& b, const HostTensor& host, const DeviceBuffer& mirror, size_t bytes) {
  if (b.device.type == DeviceType::kCpu) return Status::Ok();
  return DeviceBuffer::copy_bytes(mirror.data(), b.device, host.data<unsigned char>(), Device::cpu(), bytes);
}
Status from_layer(const StepBuffers& b, HostTensor& host, const DeviceBuffer& mirror, size_t bytes) {
  if (b.device.type == DeviceType::kCpu) return Status::Ok();
  return DeviceBuffer::copy_bytes(host.data<unsigned char>(), Device::cpu(), mirror.data(), b.device, bytes);
}
}  // namespace

Status forward_step(const SyntheticModelSpec& spec, SyntheticModel& m, const Step& step, StepBuffers& b,
                    std::vector<LayerStats>& stats, const RoutedExpertsReplayer* replayer) {
  const int64_t M = step.num_tokens, H = spec.hidden, E = spec.num_experts;
  int64_t row = 0;
  for (const StepSlice& s : step.slices) {
    for (int64_t t = 0; t < s.num_tokens; ++t, ++row) embed_token(spec, s.request, s.first_position + t, &b.h[row * H]);
  }
  LayerForwardArgs args;
  args.hidden = layer_view(b, b.x, b.d_x, {M, H});
  args.router_logits = layer_view(b, b.logits, b.d_logits, {M, E});
  args.out = layer_view(b, b.out, b.d_out, {M, H});
  args.expert_counts = layer_view(b, b.counts, b.d_counts, {E});
  const size_t x_bytes = static_cast<size_t>(M * H) * 2, logit_bytes = static_cast<size_t>(M * E) * 4;
  for (int l = 0; l < m.model.num_layers(); ++l) {
    rmsnorm_to_bf16(b.h.data(), M, H, b.x.data<uint16_t>());
    router_logits(b.x.data<uint16_t>(), m.gates[l].data<float>(), M, E, H, b.logits.data<float>());
    if (static_cast<size_t>(l) < m.router_biases.size() && !m.router_biases[l].shape().empty()) {
      const float* bias = m.router_biases[l].data<float>();  // [E] (gpt-oss's router has one)
      for (int64_t i = 0; i < M * E; ++i) b.logits.data<float>()[i] += bias[i % E];
    }
    if (replayer) args.forced_ids = replayer->forced_ids(l);
    // Timed: the layer forward, with the copies to and from its device (synchronous).
    const auto t0 = std::chrono::steady_clock::now();
    MOEKIT_RETURN_IF_ERROR(to_layer(b, b.x, b.d_x, x_bytes));
    MOEKIT_RETURN_IF_ERROR(to_layer(b, b.logits, b.d_logits, logit_bytes));
    MOEKIT_RETURN_IF_ERROR(m.model.layer(l).forward(args));
    MOEKIT_RETURN_IF_ERROR(from_layer(b, b.out, b.d_out, x_bytes));
    MOEKIT_RETURN_IF_ERROR(from_layer(b, b.counts, b.d_counts, b.counts.nbytes()));
    stats[l].seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int64_t e = 0; e < E; ++e) stats[l].expert_tokens[e] += b.counts.data<int32_t>()[e];
    const uint16_t* out = b.out.data<uint16_t>();  // [M, H] bf16
    for (int64_t i = 0; i < M * H; ++i) b.h[i] += bf16_bits_to_f32(out[i]);
  }
  return Status::Ok();
}

}  // namespace moekit::tools

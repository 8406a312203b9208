// prepare_sm90_weights(): the checks and device copies of sm90_weights.h.
#include "experts/cuda/sm90_weights.h"

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "core/weight4.h"
#include "experts/cuda/fp8_experts.h"
#include "experts/cuda/fp8_gemm_cutlass_sm90.h"
#include "experts/cuda/moe_pipeline_fp8.h"
#include "experts/cuda/weight_layout.h"
#include "experts/cuda/weight_values.h"
#include "experts/cuda/weight4_streaming_gemm.h"
#include "experts/quant_weights.h"

namespace moekit::cuda {

namespace {

// The device where a weight may be given: the kernel's device, or the host.
Device weight_device(const TensorView& t, Device dev) {
  return t.device.type == DeviceType::kCuda ? dev : Device::cpu();
}

// A host copy of an optional f32|bf16 tensor (host or device) widened to f32.
StatusOr<std::vector<float>> widened_f32(const TensorView& t) {
  std::vector<unsigned char> bytes(t.nbytes());
  if (!bytes.empty()) MOEKIT_CUDA_CHECK(cudaMemcpy(bytes.data(), t.data, bytes.size(), cudaMemcpyDefault));
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == DType::kF32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t b = 0;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      out[i] = bf16_bits_to_f32(b);
    }
  }
  return out;
}

// `bytes` of device memory on `dev` into *dst (nothing for 0 bytes); a buffer
// of that size already there is kept (prepare_sm90_weights: re-preparing).
Status allocate(DeviceBuffer* dst, Device dev, size_t bytes) {
  if (bytes > 0 && dst->bytes() == bytes && dst->device() == dev) return Status::Ok();
  MOEKIT_ASSIGN_OR_RETURN(*dst, DeviceBuffer::allocate(dev, bytes));
  return Status::Ok();
}

// A device copy of `src` (host or device, `bytes` of it) on `dev`.
Status copy_to(DeviceBuffer* dst, Device dev, const void* src, size_t bytes) {
  MOEKIT_RETURN_IF_ERROR(allocate(dst, dev, bytes));
  if (bytes > 0) MOEKIT_CUDA_CHECK(cudaMemcpy(dst->data(), src, bytes, cudaMemcpyDefault));
  return Status::Ok();
}

// cudaMemcpy returns before a pageable host source's DMA (or a device-to-device
// copy) has landed, and the forwards run on the caller's streams, which need not
// wait for the default stream: the weights are complete before prepare returns.
Status copies_landed() {
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return Status::Ok();
}

Status upload(DeviceBuffer* dst, Device dev, const std::vector<float>& src) {
  return copy_to(dst, dev, src.data(), src.size() * sizeof(float));
}

// An optional weight: checked when the config asks for it (`wanted`), refused when given without.
Status check_optional(const TensorView& t, const char* name, bool wanted, const char* flag,
                      std::initializer_list<DType> dtypes, std::initializer_list<int64_t> dims, Device dev) {
  if (wanted) return check_tensor(t, name, dtypes, dims, weight_device(t, dev));
  if (t.defined()) return InvalidArgument(std::string(name) + ": given, but " + flag + " is off in the config");
  return Status::Ok();
}

Status check_shared_expert(const ExpertsShape& shape, Device dev, const MoeWeights& w) {
  const int64_t H = shape.hidden, Is = shape.shared_intermediate, N1s = shape.shared_n1();
  const bool shared = Is > 0;
  MOEKIT_RETURN_IF_ERROR(
      check_optional(w.shared_w13, "shared_w13", shared, "shared_intermediate", {DType::kBF16}, {N1s, H}, dev));
  MOEKIT_RETURN_IF_ERROR(
      check_optional(w.shared_w2, "shared_w2", shared, "shared_intermediate", {DType::kBF16}, {H, Is}, dev));
  return check_optional(w.shared_gate, "shared_gate", shape.shared_gate, "has_shared_gate",
                        {DType::kF32, DType::kBF16}, {H}, dev);
}

// Each extra tensor (kernel.h) required with its config flag, refused without it.
Status check_extras(const ExpertsShape& shape, Device dev, const MoeWeights& w) {
  const int64_t E = shape.num_experts, H = shape.hidden, N1 = shape.n1();
  const bool bias = shape.expert_bias;
  MOEKIT_RETURN_IF_ERROR(
      check_optional(w.w13_bias, "w13_bias", bias, "has_expert_bias", {DType::kF32, DType::kBF16}, {E, N1}, dev));
  MOEKIT_RETURN_IF_ERROR(
      check_optional(w.w2_bias, "w2_bias", bias, "has_expert_bias", {DType::kF32, DType::kBF16}, {E, H}, dev));
  return check_shared_expert(shape, dev, w);
}

// NaN or Inf weights would run and return NaN rows: refused, as the cpu
// backend refuses them, on the host or on the device where they are.
Status check_finite(std::initializer_list<std::pair<const TensorView*, const char*>> tensors, int device_index,
                    const char* kernel_name) {
  const Device dev = Device::cuda(device_index);
  for (const auto& [t, name] : tensors) {
    MOEKIT_RETURN_IF_ERROR(check_weight_values(*t, name));
    if (t->defined() && t->device == dev) {  // on another device: check_tensor refuses it
      MOEKIT_RETURN_IF_ERROR(require_current_device(device_index, kernel_name));
      MOEKIT_RETURN_IF_ERROR(check_device_weight_values(*t, name));
    }
  }
  return Status::Ok();
}

// Shared W13 re-laid-out like W13, shared W2 as given, the gate widened to f32.
Status prepare_shared(const ExpertsShape& shape, Activation kind, Device dev, const MoeWeights& w, Sm90Weights* out) {
  if (shape.shared_intermediate == 0) return Status::Ok();
  const int64_t H = shape.hidden, Is = shape.shared_intermediate, N1s = shape.shared_n1();
  MOEKIT_RETURN_IF_ERROR(allocate(&out->shared_w13, dev, w.shared_w13.nbytes()));
  DeviceBuffer staging;  // [N1s, H] bf16 as given
  MOEKIT_RETURN_IF_ERROR(copy_to(&staging, dev, w.shared_w13.data, w.shared_w13.nbytes()));
  MOEKIT_RETURN_IF_ERROR(relayout_w13(device_ptr<const uint16_t>(staging), device_ptr<uint16_t>(out->shared_w13), 1,
                                      N1s, H, kind, Is, nullptr));
  MOEKIT_RETURN_IF_ERROR(copy_to(&out->shared_w2, dev, w.shared_w2.data, w.shared_w2.nbytes()));
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // staging is freed on return
  if (shape.shared_gate) {
    MOEKIT_ASSIGN_OR_RETURN(std::vector<float> g, widened_f32(w.shared_gate));
    MOEKIT_RETURN_IF_ERROR(upload(&out->shared_gate, dev, g));
  }
  return Status::Ok();
}

// Device copies of the extras: biases widened to f32, the gate/up bias in the
// prepared column order of W13; the shared expert (prepare_shared).
Status prepare_extras(const ExpertsShape& shape, Activation kind, Device dev, const MoeWeights& w, Sm90Weights* out) {
  const int64_t E = shape.num_experts, N1 = shape.n1(), I = shape.intermediate;
  if (shape.expert_bias) {
    MOEKIT_ASSIGN_OR_RETURN(std::vector<float> b13, widened_f32(w.w13_bias));
    std::vector<float> prepared(b13.size());
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < N1; ++r) prepared[e * N1 + r] = b13[e * N1 + w13_source_row(kind, I, r)];
    }
    MOEKIT_ASSIGN_OR_RETURN(std::vector<float> b2, widened_f32(w.w2_bias));
    MOEKIT_RETURN_IF_ERROR(upload(&out->w13_bias, dev, prepared));
    MOEKIT_RETURN_IF_ERROR(upload(&out->w2_bias, dev, b2));
  }
  return prepare_shared(shape, kind, dev, w, out);
}

Status prepare_bf16(const MoeConfig& config, const ExpertsShape& shape, Device dev, const MoeWeights& w,
                    Sm90Weights* out) {
  const int64_t E = shape.num_experts, H = shape.hidden, I = shape.intermediate, N1 = shape.n1();
  MOEKIT_RETURN_IF_ERROR(check_tensor(w.w13, "w13", {DType::kBF16}, {E, N1, H}, weight_device(w.w13, dev)));
  MOEKIT_RETURN_IF_ERROR(check_tensor(w.w2, "w2", {DType::kBF16}, {E, H, I}, weight_device(w.w2, dev)));
  MOEKIT_RETURN_IF_ERROR(check_extras(shape, dev, w));
  MOEKIT_RETURN_IF_ERROR(allocate(&out->w13, dev, w.w13.nbytes()));
  const uint16_t* w13_src = w.w13.ptr<const uint16_t>();
  DeviceBuffer staging;  // [E, N1, H] bf16: a host W13 on its way to the re-layout
  if (w.w13.device.type == DeviceType::kCpu) {
    MOEKIT_RETURN_IF_ERROR(copy_to(&staging, dev, w.w13.data, w.w13.nbytes()));
    w13_src = device_ptr<const uint16_t>(staging);
  }
  MOEKIT_RETURN_IF_ERROR(
      relayout_w13(w13_src, device_ptr<uint16_t>(out->w13), E, N1, H, config.activation.kind, I, nullptr));
  MOEKIT_RETURN_IF_ERROR(copy_to(&out->w2, dev, w.w2.data, w.w2.nbytes()));
  MOEKIT_RETURN_IF_ERROR(prepare_extras(shape, config.activation.kind, dev, w, out));
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // the re-layout is done before staging is freed
  return Status::Ok();
}

// fp8: weights kept in the checkpoint layout (1 byte each), scales beside them.
Status prepare_fp8(const MoeConfig& config, const ExpertsShape& shape, Device dev, const MoeWeights& w,
                   Sm90Weights* out) {
  const int64_t E = shape.num_experts, H = shape.hidden, I = shape.intermediate, N1 = shape.n1();
  const Device w_dev = weight_device(w.w13, dev);
  MOEKIT_RETURN_IF_ERROR(check_tensor(w.w13, "w13", {DType::kF8E4M3}, {E, N1, H}, w_dev));
  MOEKIT_RETURN_IF_ERROR(check_tensor(w.w2, "w2", {DType::kF8E4M3}, {E, H, I}, w_dev));
  // Scales on the weights' side; device scales are checked on a host copy.
  MOEKIT_RETURN_IF_ERROR(check_quant_scales(config, w, w_dev));
  const std::pair<const TensorView*, const char*> scales[] = {
      {&w.w13_scale, "w13_scale"}, {&w.w2_scale, "w2_scale"}, {&w.a13_scale, "a13_scale"}, {&w.a2_scale, "a2_scale"}};
  if (w_dev.type == DeviceType::kCuda) {
    for (const auto& [t, name] : scales) {
      if (!t->defined()) continue;
      HostTensor host(DType::kF32, std::vector<int64_t>(t->shape.begin(), t->shape.begin() + t->rank));
      MOEKIT_CUDA_CHECK(cudaMemcpy(host.data<float>(), t->data, t->nbytes(), cudaMemcpyDeviceToHost));
      MOEKIT_RETURN_IF_ERROR(check_scale_values(host.view(), name));
    }
  }
  DeviceBuffer* dst[] = {&out->w13_scale, &out->w2_scale, &out->a13_scale, &out->a2_scale};
  for (int i = 0; i < 4; ++i) {
    const TensorView& t = *scales[i].first;
    MOEKIT_RETURN_IF_ERROR(copy_to(dst[i], dev, t.data, t.defined() ? t.nbytes() : 0));
  }
  MOEKIT_RETURN_IF_ERROR(copy_to(&out->w13, dev, w.w13.data, w.w13.nbytes()));
  MOEKIT_RETURN_IF_ERROR(copy_to(&out->w2, dev, w.w2.data, w.w2.nbytes()));
  const QuantMethod method = config.quant.method;
  const int64_t parts = shape.activation.gated() ? 2 : 1, part_count = fp8_w13_gemm_scale_count(shape) / parts;
  const auto blocks = [](int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; };
  MOEKIT_RETURN_IF_ERROR(allocate(&out->w13_gemm_scale, dev, sizeof(float) * parts * part_count));
  MOEKIT_RETURN_IF_ERROR(allocate(&out->w2_gemm_scale, dev, sizeof(float) * E * blocks(I) * blocks(H)));
  const auto* w13_scale = device_ptr<const float>(out->w13_scale);
  auto* w13_gemm_scale = device_ptr<float>(out->w13_gemm_scale);
  if (fp8_gemm1_single_launch(shape)) {
    MOEKIT_RETURN_IF_ERROR(
        fp8_expand_weight_scales(method, w13_scale, E, N1, H, parts, -1, w13_gemm_scale, nullptr));
  } else {
    for (int64_t p = 0; p < parts; ++p) {
      MOEKIT_RETURN_IF_ERROR(fp8_expand_weight_scales(method, w13_scale, E, N1, H, parts, p,
                                                      w13_gemm_scale + p * part_count, nullptr));
    }
  }
  MOEKIT_RETURN_IF_ERROR(fp8_expand_weight_scales(method, device_ptr<const float>(out->w2_scale), E, H, I, 1, 0,
                                                  device_ptr<float>(out->w2_gemm_scale), nullptr));
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return Status::Ok();
}

// A host copy of `t`'s bytes (host or device).
StatusOr<std::vector<uint8_t>> host_bytes(const TensorView& t) {
  std::vector<uint8_t> bytes(t.nbytes());
  if (!bytes.empty()) MOEKIT_CUDA_CHECK(cudaMemcpy(bytes.data(), t.data, bytes.size(), cudaMemcpyDefault));
  return bytes;
}

// [E, rows, groups] scales of `elem` bytes -> [E, groups, rows]: row r of the
// kernel's order (taken from source row source_row(r)) at weight4_scale_position(r).
template <typename SourceRow>
std::vector<uint8_t> transpose_scales(const std::vector<uint8_t>& src, int64_t E, int64_t rows, int64_t groups,
                                      int64_t elem, SourceRow source_row) {
  std::vector<uint8_t> dst(src.size());
  for (int64_t e = 0; e < E; ++e) {
    const uint8_t* se = src.data() + e * rows * groups * elem;
    uint8_t* de = dst.data() + e * rows * groups * elem;
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* srow = se + source_row(r) * groups * elem;
      const int64_t at = weight4_scale_position(r);
      for (int64_t q = 0; q < groups; ++q) std::memcpy(de + (q * rows + at) * elem, srow + q * elem, elem);
    }
  }
  return dst;
}

// 4-bit: the packed bytes with W13's rows re-ordered, the scales transposed (sm90_weights.h).
Status prepare_weight4(const MoeConfig& config, const ExpertsShape& shape, Device dev, const MoeWeights& w,
                       Sm90Weights* out) {
  const int64_t E = shape.num_experts, H = shape.hidden, I = shape.intermediate, N1 = shape.n1();
  const QuantMethod method = config.quant.method;
  const int64_t group = weight4_group(method), elem = dtype_size(weight4_scale_dtype(method));
  const Device w_dev = weight_device(w.w13, dev);
  MOEKIT_RETURN_IF_ERROR(check_tensor(w.w13, "w13", {DType::kU8}, {E, N1, H / 2}, w_dev));
  MOEKIT_RETURN_IF_ERROR(check_tensor(w.w2, "w2", {DType::kU8}, {E, H, I / 2}, w_dev));
  MOEKIT_RETURN_IF_ERROR(check_quant_scales(config, w, w_dev));  // dtypes and shapes; host values
  MOEKIT_RETURN_IF_ERROR(check_extras(shape, dev, w));
  MOEKIT_ASSIGN_OR_RETURN(std::vector<uint8_t> w13, host_bytes(w.w13));
  MOEKIT_ASSIGN_OR_RETURN(std::vector<uint8_t> w2, host_bytes(w.w2));
  MOEKIT_ASSIGN_OR_RETURN(std::vector<uint8_t> s13, host_bytes(w.w13_scale));
  MOEKIT_ASSIGN_OR_RETURN(std::vector<uint8_t> s2, host_bytes(w.w2_scale));
  if (w_dev.type == DeviceType::kCuda) {  // device scales: their values checked on the host copies
    const auto view = [](std::vector<uint8_t>& b, const TensorView& t) {
      return TensorView::contiguous(b.data(), t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.rank),
                                    Device::cpu());
    };
    MOEKIT_RETURN_IF_ERROR(check_weight4_scale_values(method, view(s13, w.w13_scale), "w13_scale"));
    MOEKIT_RETURN_IF_ERROR(check_weight4_scale_values(method, view(s2, w.w2_scale), "w2_scale"));
    MoeWeights host = w;
    host.w13 = view(w13, w.w13);
    host.w2 = view(w2, w.w2);
    host.w13_scale = view(s13, w.w13_scale);
    host.w2_scale = view(s2, w.w2_scale);
    MOEKIT_RETURN_IF_ERROR(check_weight4_weights(method, host));
  }
  const Activation kind = config.activation.kind;
  const auto w13_row = [&](int64_t r) { return w13_source_row(kind, I, r); };
  std::vector<uint8_t> w13_prepared(w13.size());
  const int64_t row_bytes = H / 2;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < N1; ++r) {
      std::memcpy(w13_prepared.data() + (e * N1 + r) * row_bytes, w13.data() + (e * N1 + w13_row(r)) * row_bytes,
                  row_bytes);
    }
  }
  if (method != QuantMethod::kMxfp4) {
    // int4 nibbles hold v + 8; the kernels (and CUTLASS's int4b_t) take v in two's complement.
    for (uint8_t& b : w13_prepared) b ^= 0x88u;
    for (uint8_t& b : w2) b ^= 0x88u;
  }
  const std::vector<uint8_t> s13_t = transpose_scales(s13, E, N1, H / group, elem, w13_row);
  const std::vector<uint8_t> s2_t = transpose_scales(s2, E, H, I / group, elem, [](int64_t r) { return r; });
  MOEKIT_RETURN_IF_ERROR(copy_to(&out->w13, dev, w13_prepared.data(), w13_prepared.size()));
  MOEKIT_RETURN_IF_ERROR(copy_to(&out->w2, dev, w2.data(), w2.size()));
  MOEKIT_RETURN_IF_ERROR(copy_to(&out->w13_scale, dev, s13_t.data(), s13_t.size()));
  MOEKIT_RETURN_IF_ERROR(copy_to(&out->w2_scale, dev, s2_t.data(), s2_t.size()));
  MOEKIT_RETURN_IF_ERROR(prepare_extras(shape, kind, dev, w, out));
  if (method == QuantMethod::kMxfp4) {
    out->mxfp4_max_code = std::max(*std::max_element(s13.begin(), s13.end()), *std::max_element(s2.begin(), s2.end()));
  }
  MOEKIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return Status::Ok();
}

}  // namespace

Weight4ExpertWeights Sm90Weights::weight4(QuantMethod method) const {
  Weight4ExpertWeights ww;
  ww.method = method;
  ww.w13 = device_ptr<const uint8_t>(w13);
  ww.w2 = device_ptr<const uint8_t>(w2);
  ww.w13_scale = w13_scale.data();
  ww.w2_scale = w2_scale.data();
  ww.mxfp4_max_code = mxfp4_max_code;
  ww.w13_bias = device_ptr<const float>(w13_bias);
  ww.w2_bias = device_ptr<const float>(w2_bias);
  return ww;
}

Fp8ExpertWeights Sm90Weights::fp8(const QuantScheme& quant) const {
  Fp8ExpertWeights fw;
  fw.quant = quant;
  fw.w13 = device_ptr<const uint8_t>(w13);
  fw.w2 = device_ptr<const uint8_t>(w2);
  fw.w13_scale = device_ptr<const float>(w13_scale);
  fw.w2_scale = device_ptr<const float>(w2_scale);
  fw.a13_scale = device_ptr<const float>(a13_scale);
  fw.a2_scale = device_ptr<const float>(a2_scale);
  fw.w13_gemm_scale = device_ptr<const float>(w13_gemm_scale);
  fw.w2_gemm_scale = device_ptr<const float>(w2_gemm_scale);
  return fw;
}

Status prepare_sm90_weights(const MoeConfig& config, const ExpertsShape& shape, Sm90Pipeline pipeline,
                            int device_index, const char* kernel_name, const MoeWeights& w, Sm90Weights* out) {
  const Device dev = Device::cuda(device_index);
  MOEKIT_RETURN_IF_ERROR(require_current_device(device_index, kernel_name));
  // Device weights may still be written by work on any stream (a copy on a
  // non-blocking stream, which the default stream does not wait for), and when
  // re-preparing, forwards in flight may still read the buffers: both end first.
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::synchronize(dev));
  MOEKIT_RETURN_IF_ERROR(check_finite({{&w.w13, "w13"}, {&w.w2, "w2"}, {&w.w13_bias, "w13_bias"},
                                       {&w.w2_bias, "w2_bias"}, {&w.shared_w13, "shared_w13"},
                                       {&w.shared_w2, "shared_w2"}, {&w.shared_gate, "shared_gate"}},
                                      device_index, kernel_name));
  if (config.routing.has_score_bias) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(w.score_bias, "score_bias", {DType::kF32}, {shape.num_experts},
                                        weight_device(w.score_bias, dev)));
  }
  // Re-preparing writes into the buffers already there (same config, same
  // sizes), so the weights keep their addresses and a CUDA graph captured over
  // the kernel stays valid.
  Sm90Weights prepared = std::move(*out);
  *out = Sm90Weights{};
  prepared.prepared = false;
  switch (pipeline) {
    case Sm90Pipeline::kBf16: MOEKIT_RETURN_IF_ERROR(prepare_bf16(config, shape, dev, w, &prepared)); break;
    case Sm90Pipeline::kFp8: MOEKIT_RETURN_IF_ERROR(prepare_fp8(config, shape, dev, w, &prepared)); break;
    case Sm90Pipeline::kWeight4: MOEKIT_RETURN_IF_ERROR(prepare_weight4(config, shape, dev, w, &prepared)); break;
  }
  if (config.routing.has_score_bias) {
    MOEKIT_RETURN_IF_ERROR(copy_to(&prepared.score_bias, dev, w.score_bias.data, sizeof(float) * shape.num_experts));
  }
  MOEKIT_RETURN_IF_ERROR(copies_landed());
  prepared.prepared = true;
  *out = std::move(prepared);
  return Status::Ok();
}

Status prepare_sm90_shared_expert(const ExpertsShape& shape, int device_index, const char* kernel_name,
                                  const MoeWeights& w, Sm90Weights* out) {
  const Device dev = Device::cuda(device_index);
  if (shape.shared_intermediate == 0) return InvalidArgument(std::string(kernel_name) + ": the layer has no shared expert");
  MOEKIT_RETURN_IF_ERROR(require_current_device(device_index, kernel_name));
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::synchronize(dev));  // as in prepare_sm90_weights
  MOEKIT_RETURN_IF_ERROR(check_finite({{&w.shared_w13, "shared_w13"}, {&w.shared_w2, "shared_w2"},
                                       {&w.shared_gate, "shared_gate"}},
                                      device_index, kernel_name));
  MOEKIT_RETURN_IF_ERROR(check_shared_expert(shape, dev, w));
  *out = Sm90Weights{};
  Sm90Weights prepared;
  MOEKIT_RETURN_IF_ERROR(prepare_shared(shape, shape.activation.kind, dev, w, &prepared));
  MOEKIT_RETURN_IF_ERROR(copies_landed());
  prepared.prepared = true;
  *out = std::move(prepared);
  return Status::Ok();
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

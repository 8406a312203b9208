// quantize_weight4_tensor (include/moekit/io.h): the codec of core/weight4.h
// over a checked host tensor.
#include <cmath>
#include <string>

#include "core/weight4.h"
#include "moekit/io.h"

namespace moekit::io {

StatusOr<Weight4Tensor> quantize_weight4_tensor(const TensorView& w, QuantMethod method, std::string_view name) {
  const std::string n(name);
  if (quant_family(method) != QuantFamily::kWeight4) {
    return InvalidArgument(n + ": " + quant_method_name(method) + " is not a 4-bit scheme (mxfp4, int4_g32, int4_g128)");
  }
  if (w.dtype != DType::kF32 && w.dtype != DType::kBF16) {
    return InvalidArgument(n + ": quantizing needs F32 or BF16 weights, got " + dtype_name(w.dtype));
  }
  if (w.rank < 2) return InvalidArgument(n + ": quantizing needs rows [..., K], got " + w.shape_string());
  if (w.device.type != DeviceType::kCpu || !w.is_contiguous()) {
    return InvalidArgument(n + ": quantizing needs a contiguous host tensor");
  }
  const int64_t g = weight4_group(method), K = w.dim(w.rank - 1), rows = K == 0 ? 0 : w.numel() / K;
  if (K == 0 || K % g != 0) {
    return InvalidArgument(n + ": " + std::to_string(K) + " input columns (shape " + w.shape_string() +
                           ") are not a multiple of " + quant_method_name(method) + "'s group of " + std::to_string(g));
  }
  MOEKIT_ASSIGN_OR_RETURN(const HostTensor f, convert(w, DType::kF32));
  const float* x = f.data<float>();
  for (int64_t i = 0; i < rows * K; ++i) {
    if (!std::isfinite(x[i])) {
      return InvalidArgument(n + ": element " + std::to_string(i) + " (row " + std::to_string(i / K) + ", column " +
                             std::to_string(i % K) + ") is not finite; cannot quantize");
    }
  }
  std::vector<int64_t> shape(w.shape.begin(), w.shape.begin() + w.rank);
  Weight4Tensor out;
  shape.back() = K / 2;
  out.packed = HostTensor(DType::kU8, shape);
  shape.back() = K / g;
  out.scale = HostTensor(weight4_scale_dtype(method), shape);
  quantize_weight4(method, x, rows, K, out.packed.data<uint8_t>(), out.scale.data<unsigned char>());
  return out;
}

}  // namespace moekit::io

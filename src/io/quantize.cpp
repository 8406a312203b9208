#include <algorithm>
#include <cmath>
#include <string>

#include "moekit/io.h"

namespace moekit::io {
namespace {

float widen(const TensorView& w, int64_t i) {
  return w.dtype == DType::kF32 ? w.ptr<const float>()[i] : bf16_bits_to_f32(w.ptr<const uint16_t>()[i]);
}

float scale_of(float amax) { return (amax > kFp8ScaleFloor ? amax : kFp8ScaleFloor) / kFp8E4M3Max; }

}  // namespace

StatusOr<Fp8Matrix> quantize_fp8(const TensorView& w, QuantMethod method, std::string_view name) {
  const std::string n(name);
  if (w.dtype != DType::kF32 && w.dtype != DType::kBF16) {
    return InvalidArgument(n + ": quantizing needs an F32 or BF16 matrix, got " + dtype_name(w.dtype));
  }
  if (w.rank != 2) return InvalidArgument(n + ": quantizing needs a matrix [N, K], got " + w.shape_string());
  if (w.device.type != DeviceType::kCpu) return InvalidArgument(n + ": quantizing needs a host tensor");
  const int64_t N = w.dim(0), K = w.dim(1);
  for (int64_t i = 0; i < N * K; ++i) {
    if (!std::isfinite(widen(w, i))) {
      return InvalidArgument(n + ": element [" + std::to_string(i / K) + ", " + std::to_string(i % K) +
                             "] is not finite; cannot quantize");
    }
  }
  Fp8Matrix out;
  out.weight = HostTensor(DType::kF8E4M3, {N, K});
  uint8_t* q = out.weight.data<uint8_t>();
  switch (method) {
    case QuantMethod::kNone:
    case QuantMethod::kMxfp4:
    case QuantMethod::kInt4G32:
    case QuantMethod::kInt4G128:
      return InvalidArgument(n + ": quant method " + quant_method_name(method) + " is not an fp8 scheme");
    case QuantMethod::kFp8Block128: {
      const int64_t rb = (N + kFp8BlockSize - 1) / kFp8BlockSize, cb = (K + kFp8BlockSize - 1) / kFp8BlockSize;
      out.scale = HostTensor(DType::kF32, {rb, cb});
      for (int64_t br = 0; br < rb; ++br) {
        for (int64_t bc = 0; bc < cb; ++bc) {
          const int64_t r1 = std::min(N, (br + 1) * kFp8BlockSize), c1 = std::min(K, (bc + 1) * kFp8BlockSize);
          float amax = 0.0f;
          for (int64_t r = br * kFp8BlockSize; r < r1; ++r) {
            for (int64_t c = bc * kFp8BlockSize; c < c1; ++c) amax = std::fmax(amax, std::fabs(widen(w, r * K + c)));
          }
          const float s = scale_of(amax);
          out.scale.data<float>()[br * cb + bc] = s;
          for (int64_t r = br * kFp8BlockSize; r < r1; ++r) {
            for (int64_t c = bc * kFp8BlockSize; c < c1; ++c) q[r * K + c] = f32_to_f8e4m3_bits(widen(w, r * K + c) / s);
          }
        }
      }
      return out;
    }
    case QuantMethod::kFp8PerTensor: {
      float amax = 0.0f;
      for (int64_t i = 0; i < N * K; ++i) amax = std::fmax(amax, std::fabs(widen(w, i)));
      const float s = scale_of(amax);
      out.scale = HostTensor(DType::kF32, {1});
      out.scale.data<float>()[0] = s;
      for (int64_t i = 0; i < N * K; ++i) q[i] = f32_to_f8e4m3_bits(widen(w, i) / s);
      return out;
    }
  }
  return InvalidArgument(n + ": unknown quant method");
}

}  // namespace moekit::io

#include <cmath>
#include <cstring>
#include <limits>

#include "moekit/io.h"

namespace moekit::io {
namespace {

bool is_float(DType d) {
  switch (d) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3: return true;
    case DType::kI32:
    case DType::kI16:
    case DType::kU8: return false;
  }
  return false;
}

float load_float(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.ptr<const float>()[i];
    case DType::kF16: return f16_bits_to_f32(t.ptr<const uint16_t>()[i]);
    case DType::kBF16: return bf16_bits_to_f32(t.ptr<const uint16_t>()[i]);
    case DType::kF8E4M3: return f8e4m3_bits_to_f32(t.ptr<const uint8_t>()[i]);
    case DType::kI32:
    case DType::kI16:
    case DType::kU8: break;
  }
  return 0.0f;  // unreachable: callers pass float tensors only
}

void store_float(HostTensor& t, int64_t i, float v) {
  switch (t.dtype()) {
    case DType::kF32: t.data<float>()[i] = v; break;
    case DType::kF16: t.data<uint16_t>()[i] = f32_to_f16_bits(v); break;
    case DType::kBF16: t.data<uint16_t>()[i] = f32_to_bf16_bits(v); break;
    case DType::kF8E4M3: t.data<uint8_t>()[i] = f32_to_f8e4m3_bits(v); break;
    case DType::kI32:
    case DType::kI16:
    case DType::kU8: break;
  }
}

int64_t load_int(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kI32: return t.ptr<const int32_t>()[i];
    case DType::kI16: return t.ptr<const int16_t>()[i];
    case DType::kU8: return t.ptr<const uint8_t>()[i];
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3: break;
  }
  return 0;
}

void store_int(HostTensor& t, int64_t i, int64_t v) {
  switch (t.dtype()) {
    case DType::kI32: t.data<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DType::kI16: t.data<int16_t>()[i] = static_cast<int16_t>(v); break;
    case DType::kU8: t.data<uint8_t>()[i] = static_cast<uint8_t>(v); break;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3: break;
  }
}

void int_range(DType d, int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = 0;
  switch (d) {
    case DType::kI32: *lo = std::numeric_limits<int32_t>::min(); *hi = std::numeric_limits<int32_t>::max(); break;
    case DType::kI16: *lo = std::numeric_limits<int16_t>::min(); *hi = std::numeric_limits<int16_t>::max(); break;
    case DType::kU8: *hi = 255; break;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3: break;
  }
}

}  // namespace

StatusOr<HostTensor> convert(const TensorView& t, DType dtype) {
  if (t.device.type != DeviceType::kCpu) return InvalidArgument("convert: tensor must be on the host");
  if (!t.is_contiguous()) return InvalidArgument("convert: tensor must be contiguous");
  if (is_float(t.dtype) != is_float(dtype)) {
    return InvalidArgument(std::string("convert: cannot convert ") + dtype_name(t.dtype) + " to " + dtype_name(dtype));
  }
  HostTensor out(dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.rank));
  const int64_t n = t.numel();
  if (t.dtype == dtype) {
    if (n) std::memcpy(out.data<uint8_t>(), t.data, t.nbytes());
    return out;
  }
  if (is_float(dtype)) {
    for (int64_t i = 0; i < n; ++i) store_float(out, i, load_float(t, i));
    return out;
  }
  int64_t lo = 0, hi = 0;
  int_range(dtype, &lo, &hi);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = load_int(t, i);
    if (v < lo || v > hi) {
      return OutOfRange("convert: element " + std::to_string(i) + " = " + std::to_string(v) + " does not fit " +
                        dtype_name(dtype));
    }
    store_int(out, i, v);
  }
  return out;
}

}  // namespace moekit::io

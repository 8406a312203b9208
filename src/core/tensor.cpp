#include "moekit/tensor.h"

#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

namespace moekit {

std::string Device::to_string() const {
  return type == DeviceType::kCpu ? "cpu" : "cuda:" + std::to_string(index);
}

namespace {
// NOTE: saturating, so any view's arithmetic is defined; readers refuse
// shapes whose sizes overflow before a view exists (core/checked_size.h).
int64_t mul_sat(int64_t a, int64_t b) {
  int64_t p = 0;
  return __builtin_mul_overflow(a, b, &p) ? std::numeric_limits<int64_t>::max() : p;
}

template <typename Shape>
TensorView make_contiguous(void* data, DType dtype, const Shape& shape, Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) v.shape[i++] = s;
  int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.strides[d] = stride;
    stride = mul_sat(stride, v.shape[d]);
  }
  return v;
}
}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  return make_contiguous(data, dtype, shape, device);
}

TensorView TensorView::contiguous(void* data, DType dtype, const std::vector<int64_t>& shape,
                                  Device device) {
  return make_contiguous(data, dtype, shape, device);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n = mul_sat(n, shape[i]);
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    stride = mul_sat(stride, shape[d]);
  }
  return true;
}

std::string TensorView::shape_string() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

Status check_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                    std::initializer_list<int64_t> shape, Device device) {
  return check_tensor(t, name, dtypes, std::span<const int64_t>(shape.begin(), shape.size()), device);
}

Status check_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                    std::span<const int64_t> shape, Device device) {
  const std::string n(name);
  if (!t.defined()) return InvalidArgument(n + ": required tensor is missing");
  bool dtype_ok = false;
  std::string allowed;
  for (DType d : dtypes) {
    dtype_ok |= (d == t.dtype);
    allowed += (allowed.empty() ? "" : "|") + std::string(dtype_name(d));
  }
  if (!dtype_ok) {
    return InvalidArgument(n + ": expected dtype " + allowed + ", got " + dtype_name(t.dtype));
  }
  std::ostringstream want;
  want << "[";
  int i = 0;
  for (int64_t s : shape) want << (i++ ? ", " : "") << (s < 0 ? std::string("*") : std::to_string(s));
  want << "]";
  if (t.rank != static_cast<int>(shape.size())) {
    return InvalidArgument(n + ": expected shape " + want.str() + ", got " + t.shape_string());
  }
  i = 0;
  for (int64_t s : shape) {
    if (s >= 0 && t.shape[i] != s) {
      return InvalidArgument(n + ": expected shape " + want.str() + ", got " + t.shape_string());
    }
    if (t.shape[i] < 0) return InvalidArgument(n + ": negative dimension in " + t.shape_string());
    ++i;
  }
  if (!t.is_contiguous()) return InvalidArgument(n + ": must be contiguous");
  if (!(t.device == device)) {
    return InvalidArgument(n + ": expected on " + device.to_string() + ", got " + t.device.to_string());
  }
  return Status::Ok();
}

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  const size_t bytes = nbytes();
  storage_.resize((bytes + 63) / 64);
}

HostTensor HostTensor::borrowed(DType dtype, std::vector<int64_t> shape, void* data) {
  HostTensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.external_ = data;
  return t;
}

HostTensor::HostTensor(const HostTensor& other) : dtype_(other.dtype_), shape_(other.shape_) {
  if (other.owns_data()) {
    storage_ = other.storage_;
  } else {
    storage_.resize((nbytes() + 63) / 64);
    std::memcpy(storage_.data(), other.external_, nbytes());
  }
}

HostTensor& HostTensor::operator=(const HostTensor& other) {
  if (this != &other) *this = HostTensor(other);
  return *this;
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n = mul_sat(n, s);
  return n;
}

TensorView HostTensor::view() const {
  return TensorView::contiguous(const_cast<void*>(data<void>()), dtype_, shape_, Device::cpu());
}

}  // namespace moekit

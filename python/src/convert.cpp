#include "convert.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace moekit::python {

namespace {

std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  const char* code = "?";
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int: code = "int"; break;
    case nb::dlpack::dtype_code::UInt: code = "uint"; break;
    case nb::dlpack::dtype_code::Float: code = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: code = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: code = "complex"; break;
    case nb::dlpack::dtype_code::Bool: code = "bool"; break;
  }
  return std::string(code) + std::to_string(dt.bits);
}

std::optional<DType> to_dtype(nb::dlpack::dtype dt) {
  if (dt.lanes != 1) return std::nullopt;
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(dt.code);
  if (code == C::Float && dt.bits == 32) return DType::kF32;
  if (code == C::Float && dt.bits == 16) return DType::kF16;
  if (code == C::Bfloat && dt.bits == 16) return DType::kBF16;
  if (code == C::Int && dt.bits == 32) return DType::kI32;
  if (code == C::Int && dt.bits == 16) return DType::kI16;
  if (code == C::UInt && dt.bits == 8) return DType::kU8;
  // DLPack's kDLFloat8_e4m3fn (torch.float8_e4m3fn), a code newer than nanobind's enum.
  constexpr uint8_t kDLFloat8E4M3fn = 10;
  if (dt.code == kDLFloat8E4M3fn && dt.bits == 8) return DType::kF8E4M3;
  return std::nullopt;
}

}  // namespace

TensorView view_of(const Array& a, const char* name) {
  const std::string n(name);
  const std::optional<DType> dtype = to_dtype(a.dtype());
  if (!dtype) {
    throw nb::value_error((n + ": dtype " + dlpack_dtype_name(a.dtype()) +
                           " is not supported (float32, bfloat16, float16, int32, int16, uint8, float8_e4m3fn)").c_str());
  }
  if (a.ndim() > static_cast<size_t>(kMaxRank)) {
    throw nb::value_error((n + ": rank " + std::to_string(a.ndim()) + " exceeds " + std::to_string(kMaxRank)).c_str());
  }
  TensorView v;
  v.dtype = *dtype;
  v.rank = static_cast<int>(a.ndim());
  // DLPack allows a null strides field (a row-major tensor); whether nanobind
  // fills it in on import differs between versions, so never read through it
  // unchecked: compute the row-major strides here instead.
  const int64_t* strides = a.stride_ptr();
  for (int d = 0; d < v.rank; ++d) v.shape[d] = static_cast<int64_t>(a.shape(d));
  int64_t row_major = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.strides[d] = strides != nullptr ? strides[d] : row_major;
    row_major *= v.shape[d];
  }
  if (a.device_type() == nb::device::cpu::value) {
    v.device = Device::cpu();
  } else if (a.device_type() == nb::device::cuda::value) {
    v.device = Device::cuda(a.device_id());
  } else {
    throw nb::value_error((n + ": tensors on DLPack device type " + std::to_string(a.device_type()) +
                           " are not supported (cpu, cuda)").c_str());
  }
  v.data = const_cast<void*>(a.data());
  if (v.data == nullptr) {
    // An empty tensor has no storage; name the shape rather than call it missing.
    throw nb::value_error((n + ": empty tensor (shape " + v.shape_string() + ")").c_str());
  }
  return v;
}

TensorView view_of(const OptArray& a, const char* name) { return a ? view_of(*a, name) : TensorView{}; }

Device parse_device(const std::string& type, int index) {
  if (type == "cpu") return Device::cpu();
  if (type == "cuda") return Device::cuda(index);
  throw nb::value_error(("device: '" + type + "' is not supported (cpu, cuda)").c_str());
}

int64_t int_arg(const char* name, nb::handle v, int64_t lo, int64_t hi) {
  PyObject* o = v.ptr();
  if (PyBool_Check(o) || !PyIndex_Check(o)) {
    throw nb::type_error((std::string(name) + ": expected an int, got " + nb::type_name(v.type()).c_str()).c_str());
  }
  nb::object i = nb::steal(PyNumber_Index(o));
  if (!i.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (x == -1 && PyErr_Occurred()) throw nb::python_error();
  if (overflow != 0 || x < lo || x > hi) {
    throw nb::value_error((std::string(name) + ": must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "], got " + std::string(nb::repr(i).c_str()))
                              .c_str());
  }
  return x;
}

void throw_if_error(const Status& status) {
  if (status.ok()) return;
  const std::string msg = status.message();
  switch (status.code()) {
    case StatusCode::kOk: return;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnsupported:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kNotFound:
    case StatusCode::kDataLoss: throw nb::value_error(msg.c_str());
    case StatusCode::kIoError: PyErr_SetString(PyExc_OSError, msg.c_str()); throw nb::python_error();
    case StatusCode::kResourceExhausted: PyErr_SetString(PyExc_MemoryError, msg.c_str()); throw nb::python_error();
    case StatusCode::kInternal: throw std::runtime_error(msg);
    case StatusCode::kDeadlineExceeded: PyErr_SetString(PyExc_TimeoutError, msg.c_str()); throw nb::python_error();
  }
  throw std::runtime_error(msg);
}

nb::object to_torch(HostTensor t) {
  // A borrowed tensor is copied: the torch tensor must own what it points at.
  auto* owned = t.owns_data() ? new HostTensor(std::move(t)) : new HostTensor(static_cast<const HostTensor&>(t));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<HostTensor*>(p); });
  std::vector<size_t> shape(owned->shape().begin(), owned->shape().end());
  nb::dlpack::dtype dt{};
  dt.lanes = 1;
  switch (owned->dtype()) {
    case DType::kF32: dt.code = uint8_t(nb::dlpack::dtype_code::Float); dt.bits = 32; break;
    case DType::kF16: dt.code = uint8_t(nb::dlpack::dtype_code::Float); dt.bits = 16; break;
    case DType::kBF16: dt.code = uint8_t(nb::dlpack::dtype_code::Bfloat); dt.bits = 16; break;
    case DType::kI32: dt.code = uint8_t(nb::dlpack::dtype_code::Int); dt.bits = 32; break;
    case DType::kI16: dt.code = uint8_t(nb::dlpack::dtype_code::Int); dt.bits = 16; break;
    case DType::kU8: dt.code = uint8_t(nb::dlpack::dtype_code::UInt); dt.bits = 8; break;
    case DType::kF8E4M3: throw std::runtime_error("to_torch: f8_e4m3 host tensors are not exported");
  }
  nb::ndarray<nb::pytorch> arr(owned->data<void>(), shape.size(), shape.data(), owner, nullptr, dt);
  return nb::cast(arr, nb::rv_policy::reference);
}

}  // namespace moekit::python

// A non-owning view of a tensor (shape, strides, dtype, device), and a small
// owning host tensor for tools and tests.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/status.h"

namespace moekit {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  static Device cpu() { return {DeviceType::kCpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  bool operator==(const Device&) const = default;
  std::string to_string() const;  // "cpu", "cuda:0"
};

// Stream handle; a cudaStream_t on CUDA devices, ignored on the CPU. Kept as an
// opaque pointer so public headers need no CUDA include.
using Stream = void*;

inline constexpr int kMaxRank = 4;

// Non-owning. Strides are in elements. An empty view (data == nullptr, rank 0)
// means "not given" for optional arguments.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> strides{};
  Device device = Device::cpu();

  // A contiguous (row-major) view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu());
  static TensorView contiguous(void* data, DType dtype, const std::vector<int64_t>& shape,
                               Device device = Device::cpu());

  bool defined() const { return data != nullptr; }
  int64_t dim(int i) const { return shape[i]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  std::string shape_string() const;  // "[64, 8]"
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// Checks a view against what an argument must be. `shape` entries of -1 match
// any size. Messages name the argument: "topk_ids: expected dtype i32, got f32".
Status check_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                    std::initializer_list<int64_t> shape, Device device);
// The same with a shape computed at run time.
Status check_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                    std::span<const int64_t> shape, Device device);

// Owning, contiguous host tensor (64-byte aligned storage), or, made by
// borrowed(), a view of memory it does not own.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape);
  // Over `data` without a copy: the caller keeps it alive and unchanged as long
  // as this tensor and the tensors moved from it. A copy owns its data.
  static HostTensor borrowed(DType dtype, std::vector<int64_t> shape, void* data);
  HostTensor(const HostTensor& other);
  HostTensor& operator=(const HostTensor& other);
  HostTensor(HostTensor&&) noexcept = default;
  HostTensor& operator=(HostTensor&&) noexcept = default;

  bool owns_data() const { return external_ == nullptr; }
  TensorView view() const;
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  size_t nbytes() const { return numel() * dtype_size(dtype_); }
  template <typename T>
  T* data() {
    return reinterpret_cast<T*>(external_ != nullptr ? external_ : storage_.data());
  }
  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(external_ != nullptr ? external_ : storage_.data());
  }

 private:
  struct alignas(64) Block {
    unsigned char bytes[64];
  };
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  std::vector<Block> storage_;
  void* external_ = nullptr;  // borrowed(): the data, not owned
};

}  // namespace moekit

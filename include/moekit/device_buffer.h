// DeviceBuffer (public): owning memory on one device (64-byte aligned host memory for
// the CPU, cudaMalloc for a CUDA device) and pinned host memory for staging
// device-to-host copies. Move-only; freed on destruction.
#pragma once

#include <cstddef>

#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // bytes == 0 gives an empty buffer (data() == nullptr).
  static StatusOr<DeviceBuffer> allocate(Device device, size_t bytes);
  // Page-locked host memory (CUDA builds; plain host memory otherwise).
  static StatusOr<DeviceBuffer> allocate_pinned_host(size_t bytes);

  // A copy of `src` (contiguous; host or the same CUDA device) on `device`.
  static StatusOr<DeviceBuffer> copy_of(Device device, const TensorView& src);

  // Copies n bytes between host memory and/or CUDA device memory (synchronous).
  static Status copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n);
  // Waits for all work enqueued on a CUDA device, on every stream (nothing for the CPU).
  static Status synchronize(Device device);

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  enum class Kind { kHost, kCuda, kPinnedHost };
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::cpu();
  Kind kind_ = Kind::kHost;
};

}  // namespace moekit

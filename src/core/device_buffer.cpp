#include "moekit/device_buffer.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include <unistd.h>

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moekit {

namespace {
constexpr size_t kHostAlignment = 64;

std::string size_text(size_t bytes) { return std::to_string(bytes) + " bytes"; }

// Bytes of physical memory (0 if unknown). A host buffer larger than that can
// never be backed: where the kernel overcommits, malloc would hand it out and the
// first pass over it (a sentinel fill) would end with the process killed.
size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}
}  // namespace

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_),
      kind_(other.kind_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
    kind_ = other.kind_;
  }
  return *this;
}

void DeviceBuffer::release() {
  if (data_ == nullptr) return;
  switch (kind_) {
    case Kind::kHost: std::free(data_); break;
    case Kind::kCuda:
#ifdef MOEKIT_WITH_CUDA
      (void)cudaFree(data_);
#endif
      break;
    case Kind::kPinnedHost:
#ifdef MOEKIT_WITH_CUDA
      (void)cudaFreeHost(data_);
#else
      std::free(data_);
#endif
      break;
  }
  data_ = nullptr;
  bytes_ = 0;
}

StatusOr<DeviceBuffer> DeviceBuffer::allocate(Device device, size_t bytes) {
  DeviceBuffer b;
  b.device_ = device;
  if (bytes == 0) return b;
  switch (device.type) {
    case DeviceType::kCpu: {
      if (const size_t ram = physical_memory_bytes(); ram > 0 && bytes > ram) {
        return ResourceExhausted("host allocation of " + size_text(bytes) + " exceeds this machine's physical memory (" +
                                 size_text(ram) + ")");
      }
      const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
      b.data_ = std::aligned_alloc(kHostAlignment, rounded);
      if (b.data_ == nullptr) return ResourceExhausted("host allocation of " + size_text(bytes) + " failed");
      b.kind_ = Kind::kHost;
      break;
    }
    case DeviceType::kCuda: {
#ifdef MOEKIT_WITH_CUDA
      int previous = 0;
      if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device.index) != cudaSuccess) {
        (void)cudaGetLastError();
        return Internal("cannot select " + device.to_string());
      }
      const cudaError_t err = cudaMalloc(&b.data_, bytes);
      (void)cudaSetDevice(previous);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        b.data_ = nullptr;
        return ResourceExhausted("cudaMalloc of " + size_text(bytes) + " on " + device.to_string() +
                                 " failed: " + cudaGetErrorString(err));
      }
      b.kind_ = Kind::kCuda;
      break;
#else
      return Unsupported("cannot allocate on " + device.to_string() + ": this build has no CUDA support");
#endif
    }
  }
  b.bytes_ = bytes;
  return b;
}

StatusOr<DeviceBuffer> DeviceBuffer::allocate_pinned_host(size_t bytes) {
#ifdef MOEKIT_WITH_CUDA
  DeviceBuffer b;
  if (bytes == 0) return b;
  const cudaError_t err = cudaMallocHost(&b.data_, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    b.data_ = nullptr;
    return ResourceExhausted("cudaMallocHost of " + size_text(bytes) + " failed: " + cudaGetErrorString(err));
  }
  b.kind_ = Kind::kPinnedHost;
  b.bytes_ = bytes;
  return b;
#else
  return allocate(Device::cpu(), bytes);
#endif
}

Status DeviceBuffer::copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n) {
  if (n == 0) return Status::Ok();
  if (dst_device.type == DeviceType::kCpu && src_device.type == DeviceType::kCpu) {
    std::memcpy(dst, src, n);
    return Status::Ok();
  }
#ifdef MOEKIT_WITH_CUDA
  // cudaMemcpy returns before a pageable host source's DMA (or any device-to-device
  // copy) has landed, and a kernel on a non-blocking stream does not wait for it:
  // the default stream is synchronized so the bytes are there on return.
  cudaError_t err = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
  if (err == cudaSuccess) err = cudaStreamSynchronize(nullptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return Internal("copy from " + src_device.to_string() + " to " + dst_device.to_string() +
                    " failed: " + cudaGetErrorString(err));
  }
  return Status::Ok();
#else
  return Unsupported("cannot copy between " + src_device.to_string() + " and " + dst_device.to_string() +
                     ": this build has no CUDA support");
#endif
}

Status DeviceBuffer::synchronize(Device device) {
  if (device.type == DeviceType::kCpu) return Status::Ok();
#ifdef MOEKIT_WITH_CUDA
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return Internal(std::string("synchronize ") + device.to_string() + ": " + cudaGetErrorString(err));
  return Status::Ok();
#else
  return Unsupported("synchronize " + device.to_string() + ": this build has no CUDA support");
#endif
}

StatusOr<DeviceBuffer> DeviceBuffer::copy_of(Device device, const TensorView& src) {
  if (!src.is_contiguous()) return InvalidArgument("copy_of: the source must be contiguous");
  MOEKIT_ASSIGN_OR_RETURN(DeviceBuffer b, allocate(device, src.nbytes()));
  MOEKIT_RETURN_IF_ERROR(copy_bytes(b.data(), device, src.data, src.device, src.nbytes()));
  return b;
}

}  // namespace moekit

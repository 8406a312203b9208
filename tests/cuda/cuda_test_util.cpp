#include "cuda/cuda_test_util.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "util/test_util.h"

namespace moekit::cuda_test {

DeviceTensor::DeviceTensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  // At least one allocation granule, so an empty tensor ([0, E]) is still a defined view.
  const size_t n = std::max<size_t>(bytes(), 256);
  if (cudaMalloc(&data_, n) != cudaSuccess) {
    ADD_FAILURE() << "cudaMalloc of " << n << " bytes failed";
    data_ = nullptr;
  }
}

DeviceTensor::DeviceTensor(const HostTensor& host) : DeviceTensor(host.dtype(), host.shape()) { upload(host); }

DeviceTensor::~DeviceTensor() {
  if (data_ != nullptr) (void)cudaFree(data_);
}

DeviceTensor::DeviceTensor(DeviceTensor&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), dtype_(o.dtype_), shape_(std::move(o.shape_)) {}

DeviceTensor& DeviceTensor::operator=(DeviceTensor&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = std::exchange(o.data_, nullptr);
    dtype_ = o.dtype_;
    shape_ = std::move(o.shape_);
  }
  return *this;
}

size_t DeviceTensor::bytes() const {
  size_t n = dtype_size(dtype_);
  for (int64_t s : shape_) n *= static_cast<size_t>(s);
  return n;
}

TensorView DeviceTensor::view() const {
  int device = 0;
  (void)cudaGetDevice(&device);
  return TensorView::contiguous(data_, dtype_, shape_, Device::cuda(device));
}

void DeviceTensor::upload(const HostTensor& host) {
  ASSERT_EQ(host.nbytes(), bytes());
  if (bytes() == 0) return;
  ASSERT_EQ(cudaMemcpy(data_, host.data<void>(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  // The copy's DMA may land after cudaMemcpy returns, and the tests' kernels run on
  // non-blocking streams that do not wait for it (a poisoned output once overwrote
  // a forward's result this way).
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
}

HostTensor DeviceTensor::download() const {
  HostTensor h(dtype_, shape_);
  if (bytes() > 0) {
    const cudaError_t err = cudaMemcpy(h.data<void>(), data_, bytes(), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) ADD_FAILURE() << "download: " << cudaGetErrorString(err);
  }
  return h;
}

void DeviceTensor::poison() {
  HostTensor h(dtype_, shape_);
  testing::poison(h);
  upload(h);
}

DeviceBytes::DeviceBytes(size_t bytes) : bytes_(bytes) {
  if (bytes > 0 && cudaMalloc(&data_, bytes) != cudaSuccess) {
    ADD_FAILURE() << "cudaMalloc of " << bytes << " bytes failed";
    data_ = nullptr;
  }
}

DeviceBytes::~DeviceBytes() {
  if (data_ != nullptr) (void)cudaFree(data_);
}

std::string first_difference(const HostTensor& a, const HostTensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return "dtype or shape differ";
  const size_t es = dtype_size(a.dtype());
  const auto* pa = a.data<unsigned char>();
  const auto* pb = b.data<unsigned char>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + i * es, pb + i * es, es) != 0) return "element " + std::to_string(i) + " differs";
  }
  return "";
}

}  // namespace moekit::cuda_test

// Helpers of the gpu-labelled tests: the visible skip without an sm_90 device,
// and owning device tensors with host round trips.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/platform.h"
#include "moekit/tensor.h"

namespace moekit::cuda_test {

// Skips the test (reported as skipped by CTest, never as passed) without an sm_90 device.
#define MOEKIT_REQUIRE_SM90()                                                                \
  do {                                                                                       \
    if (!::moekit::Platform::probe().has_sm90())                                             \
      GTEST_SKIP() << "needs an sm_90 CUDA device: " << ::moekit::Platform::probe().to_string(); \
  } while (0)

#define ASSERT_CUDA_OK(stmt)                                                                  \
  do {                                                                                        \
    const cudaError_t err_ = (stmt);                                                          \
    ASSERT_EQ(err_, cudaSuccess) << #stmt << ": " << cudaGetErrorString(err_);                \
  } while (0)

// Device memory freed on destruction, with a TensorView of it.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(DType dtype, std::vector<int64_t> shape);
  explicit DeviceTensor(const HostTensor& host);  // allocates and uploads
  ~DeviceTensor();
  DeviceTensor(DeviceTensor&& o) noexcept;
  DeviceTensor& operator=(DeviceTensor&& o) noexcept;
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  TensorView view() const;
  void upload(const HostTensor& host);  // same size
  HostTensor download() const;
  // Fills the device memory with the poison pattern of testing::poison.
  void poison();
  void* data() const { return data_; }
  size_t bytes() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
};

// Raw device bytes (workspaces), 256-byte aligned by cudaMalloc.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes);
  ~DeviceBytes();
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Bitwise equality of two host tensors; "" when equal, else the first difference.
std::string first_difference(const HostTensor& a, const HostTensor& b);

}  // namespace moekit::cuda_test

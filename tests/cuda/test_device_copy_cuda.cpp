// Host-to-device copies have landed when moekit's copy returns: a kernel or copy
// on a non-blocking stream, which does not wait for the default stream, reads the
// new bytes. cudaMemcpy alone does not promise this (it returns once a pageable
// source is staged), which is how weights and a score bias updated from host
// memory could be read half-written by the next forward on the caller's stream.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "moekit/device_buffer.h"

namespace moekit {
namespace {

constexpr size_t kBytes = size_t{64} << 20;  // pageable and large: staged in many chunks
constexpr size_t kTail = size_t{64} << 10;   // the last chunk, read back at once
constexpr int kRounds = 24;

// Copies a fresh pattern with `copy`, then reads the buffer's tail on a non-blocking
// stream right away; the rounds where the tail was not yet the new pattern.
template <typename Copy>
int rounds_read_stale(Copy copy) {
  int dev = 0;
  EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
  auto buffer = DeviceBuffer::allocate(Device::cuda(dev), kBytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status().to_string();
  if (!buffer.ok()) return -1;
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  uint8_t* tail = nullptr;
  EXPECT_EQ(cudaMallocHost(&tail, kTail), cudaSuccess);
  std::vector<uint8_t> host(kBytes);
  int stale = 0;
  for (int round = 0; round < kRounds; ++round) {
    const auto value = static_cast<uint8_t>(round + 1);
    std::memset(host.data(), value, host.size());
    copy(buffer->data(), host.data(), kBytes);
    EXPECT_EQ(cudaMemcpyAsync(tail, static_cast<uint8_t*>(buffer->data()) + kBytes - kTail, kTail,
                              cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (size_t i = 0; i < kTail; ++i) {
      if (tail[i] != value) {
        ++stale;
        break;
      }
    }
  }
  cudaFreeHost(tail);
  cudaStreamDestroy(stream);
  return stale;
}

TEST(DeviceCopy, AHostToDeviceCopyHasLandedWhenCopyBytesReturns) {
  MOEKIT_REQUIRE_SM90();
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  // What cudaMemcpy alone gives, reported for the record (the hazard is timing-dependent, so not asserted).
  const int raw = rounds_read_stale([](void* dst, const void* src, size_t n) {
    EXPECT_EQ(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), cudaSuccess);
  });
  RecordProperty("cudaMemcpy_rounds_read_stale", raw);
  std::printf("cudaMemcpy alone: %d of %d rounds read stale bytes on a non-blocking stream\n", raw, kRounds);
  const int ours = rounds_read_stale([dev](void* dst, const void* src, size_t n) {
    const Status s = DeviceBuffer::copy_bytes(dst, Device::cuda(dev), src, Device::cpu(), n);
    EXPECT_TRUE(s.ok()) << s.to_string();
  });
  EXPECT_EQ(ours, 0) << "DeviceBuffer::copy_bytes returned before the bytes landed";
}

}  // namespace
}  // namespace moekit

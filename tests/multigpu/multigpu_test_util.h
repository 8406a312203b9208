// Helpers of the multigpu-labelled tests: the visible skip without NCCL or
// enough GPUs, and one NCCL rank per GPU as threads of this process.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "moekit/comm.h"

namespace moekit::multigpu_test {

inline int cuda_devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Skips the test (reported as skipped by CTest, never as passed).
#define MOEKIT_REQUIRE_GPUS(n)                                                                  \
  do {                                                                                          \
    if (!::moekit::nccl_built()) GTEST_SKIP() << "this build has no NCCL";                      \
    if (::moekit::multigpu_test::cuda_devices() < (n))                                          \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, found " << ::moekit::multigpu_test::cuda_devices(); \
  } while (0)

// Inside a function returning Status.
#define CUDA_OK(stmt)                                                                           \
  do {                                                                                          \
    const cudaError_t e_ = (stmt);                                                              \
    if (e_ != cudaSuccess) return Internal(#stmt + std::string(": ") + cudaGetErrorString(e_)); \
  } while (0)

// Rank r on cuda:r in its own thread, with an NCCL communicator and a
// non-blocking stream; returns every rank's Status.
inline std::vector<Status> run_gpu_ranks(int n, const std::function<Status(int, Communicator&, cudaStream_t)>& body) {
  StatusOr<CommUniqueId> id = nccl_unique_id();
  std::vector<Status> result(n, id.status());
  if (!id.ok()) return result;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      result[r] = [&]() -> Status {
        MOEKIT_ASSIGN_OR_RETURN(auto comm, create_nccl_communicator(*id, n, r, Device::cuda(r),
                                                                    {std::chrono::milliseconds(60000)}));
        cudaStream_t s = nullptr;
        CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        Status st = body(r, *comm, s);
        cudaStreamDestroy(s);
        return st;
      }();
    });
  }
  for (auto& t : threads) t.join();
  return result;
}

}  // namespace moekit::multigpu_test

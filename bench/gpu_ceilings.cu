// HBM read bandwidth (a streaming read kernel) and dense bf16 matmul throughput
// (cuBLAS), each the median of repeats after a warm-up, on random data.
#include "gpu_ceilings.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gpu_fill.h"

namespace moekit::bench {
namespace {

#define BENCH_CUDA_TRY(expr)                                                              \
  do {                                                                                    \
    cudaError_t e_ = (expr);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      *error = std::string(#expr) + ": " + cudaGetErrorString(e_);                        \
      return false;                                                                       \
    }                                                                                     \
  } while (0)

// Reads every 16-byte word of src once; 4 independent loads in flight per thread.
// The xor of all words is written per block so the loads cannot be dropped.
__global__ void read_kernel(const uint4* __restrict__ src, int64_t n_words, uint32_t* __restrict__ sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (; i + 3 * stride < n_words; i += 4 * stride) {
    uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
          d = __ldcs(src + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n_words; i += stride) {
    uint4 a = __ldcs(src + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // practically never taken; keeps the loads live
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool measure_read(double gib, int repeats, Ceilings* out, std::string* error) {
  const size_t bytes = static_cast<size_t>(gib * 1024.0 * 1024.0 * 1024.0) / 16 * 16;
  void* buf = nullptr;
  uint32_t* sink = nullptr;
  BENCH_CUDA_TRY(cudaMalloc(&buf, bytes));
  int sms = 0, dev = 0;
  BENCH_CUDA_TRY(cudaGetDevice(&dev));
  BENCH_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int blocks = sms * 8;
  BENCH_CUDA_TRY(cudaMalloc(&sink, blocks * sizeof(uint32_t)));
  BENCH_CUDA_TRY(fill_uniform_bf16(static_cast<uint16_t*>(buf), static_cast<int64_t>(bytes / 2), 7u, 0, nullptr));
  cudaEvent_t start, stop;
  BENCH_CUDA_TRY(cudaEventCreate(&start));
  BENCH_CUDA_TRY(cudaEventCreate(&stop));
  std::vector<double> secs;
  for (int r = 0; r < repeats + 2; ++r) {
    BENCH_CUDA_TRY(cudaEventRecord(start));
    read_kernel<<<blocks, 512>>>(static_cast<const uint4*>(buf), static_cast<int64_t>(bytes / 16), sink);
    BENCH_CUDA_TRY(cudaGetLastError());
    BENCH_CUDA_TRY(cudaEventRecord(stop));
    BENCH_CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    if (r >= 2) secs.push_back(ms * 1e-3);  // the first two are warm-up
  }
  out->read_bytes_per_s = static_cast<double>(bytes) / median(secs);
  out->read_gib = static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(sink);
  cudaFree(buf);
  return true;
}

bool measure_matmul(int n, int repeats, Ceilings* out, std::string* error) {
  const size_t elems = static_cast<size_t>(n) * n;
  uint16_t *a = nullptr, *b = nullptr, *c = nullptr;  // [n, n] bf16 each
  BENCH_CUDA_TRY(cudaMalloc(&a, elems * 2));
  BENCH_CUDA_TRY(cudaMalloc(&b, elems * 2));
  BENCH_CUDA_TRY(cudaMalloc(&c, elems * 2));
  BENCH_CUDA_TRY(fill_uniform_bf16(a, static_cast<int64_t>(elems), 11u, 0, nullptr));
  BENCH_CUDA_TRY(fill_uniform_bf16(b, static_cast<int64_t>(elems), 12u, 0, nullptr));
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    *error = "cublasCreate failed";
    return false;
  }
  const float alpha = 1.0f, beta = 0.0f;
  cudaEvent_t start, stop;
  BENCH_CUDA_TRY(cudaEventCreate(&start));
  BENCH_CUDA_TRY(cudaEventCreate(&stop));
  std::vector<double> secs;
  for (int r = 0; r < repeats + 3; ++r) {
    BENCH_CUDA_TRY(cudaEventRecord(start));
    const cublasStatus_t st =
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta,
                     c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
      *error = "cublasGemmEx failed with status " + std::to_string(static_cast<int>(st));
      return false;
    }
    BENCH_CUDA_TRY(cudaEventRecord(stop));
    BENCH_CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    if (r >= 3) secs.push_back(ms * 1e-3);  // the first three are warm-up
  }
  out->matmul_flops_per_s = 2.0 * n * static_cast<double>(n) * n / median(secs);
  out->matmul_n = n;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return true;
}

}  // namespace

bool measure_ceilings(double read_gib, int matmul_n, int repeats, Ceilings* out, std::string* error) {
  int dev = 0;
  cudaDeviceProp prop{};
  BENCH_CUDA_TRY(cudaGetDevice(&dev));
  BENCH_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
  out->device_name = prop.name;
  return measure_read(read_gib, repeats, out, error) && measure_matmul(matmul_n, repeats, out, error);
}

}  // namespace moekit::bench

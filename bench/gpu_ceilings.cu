// HBM read bandwidth (a streaming read kernel) and dense bf16 matmul throughput
// (cuBLAS), each the median of repeats after a warm-up, on random data.
#include "gpu_ceilings.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <cublasLt.h>
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

// The median seconds of `repeats` calls of launch() timed with events, after
// `warmup` untimed ones. launch() enqueues the work and returns false (with
// *error set) when it could not.
template <class Launch>
bool median_seconds(int warmup, int repeats, Launch&& launch, double* seconds, std::string* error) {
  cudaEvent_t start, stop;
  BENCH_CUDA_TRY(cudaEventCreate(&start));
  BENCH_CUDA_TRY(cudaEventCreate(&stop));
  std::vector<double> secs;
  bool ok = true;
  for (int r = 0; ok && r < warmup + repeats; ++r) {
    float ms = 0;
    ok = cudaEventRecord(start) == cudaSuccess && launch() && cudaEventRecord(stop) == cudaSuccess &&
         cudaEventSynchronize(stop) == cudaSuccess && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
    if (ok && r >= warmup) secs.push_back(ms * 1e-3);
  }
  if (!ok && error->empty()) *error = std::string("timing: ") + cudaGetErrorString(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (ok) *seconds = median(secs);
  return ok;
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
  double seconds = 0;
  const bool timed = median_seconds(2, repeats, [&] {
    read_kernel<<<blocks, 512>>>(static_cast<const uint4*>(buf), static_cast<int64_t>(bytes / 16), sink);
    BENCH_CUDA_TRY(cudaGetLastError());
    return true;
  }, &seconds, error);
  if (!timed) return false;
  out->read_bytes_per_s = static_cast<double>(bytes) / seconds;
  out->read_gib = static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
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
  double seconds = 0;
  const bool timed = median_seconds(3, repeats, [&] {
    const cublasStatus_t st =
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta,
                     c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) *error = "cublasGemmEx failed with status " + std::to_string(static_cast<int>(st));
    return st == CUBLAS_STATUS_SUCCESS;
  }, &seconds, error);
  if (!timed) return false;
  out->matmul_flops_per_s = 2.0 * n * static_cast<double>(n) * n / seconds;
  out->matmul_n = n;
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return true;
}

}  // namespace

bool measure_fp8_matmul(int n, int repeats, Ceilings* out, std::string* error) {
  const size_t elems = static_cast<size_t>(n) * n;
  uint8_t *a = nullptr, *b = nullptr;  // [n, n] e4m3 each
  uint16_t* c = nullptr;               // [n, n] bf16
  void* ws = nullptr;
  const size_t ws_bytes = size_t{32} << 20;
  BENCH_CUDA_TRY(cudaMalloc(&a, elems));
  BENCH_CUDA_TRY(cudaMalloc(&b, elems));
  BENCH_CUDA_TRY(cudaMalloc(&c, elems * 2));
  BENCH_CUDA_TRY(cudaMalloc(&ws, ws_bytes));
  BENCH_CUDA_TRY(fill_uniform_e4m3(a, static_cast<int64_t>(elems), 13u, nullptr));
  BENCH_CUDA_TRY(fill_uniform_e4m3(b, static_cast<int64_t>(elems), 14u, nullptr));
  auto lt_fail = [&](const char* what, cublasStatus_t st) {
    *error = std::string(what) + " failed with status " + std::to_string(static_cast<int>(st));
    return false;
  };
  cublasLtHandle_t lt;
  cublasStatus_t st = cublasLtCreate(&lt);
  if (st != CUBLAS_STATUS_SUCCESS) return lt_fail("cublasLtCreate", st);
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  const cublasOperation_t trans = CUBLAS_OP_T, notrans = CUBLAS_OP_N;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans));  // fp8: "TN" only
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &notrans, sizeof(notrans));
  cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n);
  cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  st = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &heur, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return lt_fail("cublasLtMatmulAlgoGetHeuristic (fp8)", st);
  const float alpha = 1.0f, beta = 0.0f;
  double seconds = 0;
  const bool timed = median_seconds(3, repeats, [&] {
    st = cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &heur.algo, ws, ws_bytes, nullptr);
    return st == CUBLAS_STATUS_SUCCESS || lt_fail("cublasLtMatmul (fp8)", st);
  }, &seconds, error);
  if (!timed) return false;
  out->fp8_matmul_flops_per_s = 2.0 * n * static_cast<double>(n) * n / seconds;
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(ws);
  return true;
}

bool measure_ceilings(double read_gib, int matmul_n, int repeats, Ceilings* out, std::string* error) {
  int dev = 0;
  cudaDeviceProp prop{};
  BENCH_CUDA_TRY(cudaGetDevice(&dev));
  BENCH_CUDA_TRY(cudaGetDeviceProperties(&prop, dev));
  out->device_name = prop.name;
  return measure_read(read_gib, repeats, out, error) && measure_matmul(matmul_n, repeats, out, error);
}

}  // namespace moekit::bench

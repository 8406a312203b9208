// The host cost of the CUDA runtime calls one eager forward makes (launches,
// attribute calls, device queries), each the median of many, so that the
// enqueue time the GPU benchmark reports (host_us) can be read as a sum of them.
//
//   moekit_host_api_costs            (prints one line per call, microseconds)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

__global__ void empty_kernel() {}
__global__ void big_smem_kernel() { extern __shared__ char smem[]; (void)smem; }
__global__ void __cluster_dims__(2, 1, 1) cluster_kernel() {}

template <class F>
double median_us(F&& f, int reps = 2000) {
  std::vector<double> t;
  t.reserve(reps);
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (i % 256 == 255) cudaDeviceSynchronize();  // the launch queue never fills
  }
  cudaDeviceSynchronize();
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

}  // namespace

int main() {
  cudaStream_t s;
  if (cudaStreamCreate(&s) != cudaSuccess) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  void* buf = nullptr;
  cudaMalloc(&buf, 1 << 20);
  constexpr int kSmem = 100 * 1024;
  cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  int dev = 0, sms = 0;
  std::printf("%-52s %8.2f us\n", "empty kernel <<<1, 32>>>",
              median_us([&] { empty_kernel<<<1, 32, 0, s>>>(); }));
  std::printf("%-52s %8.2f us\n", "kernel with 100 KiB dynamic smem <<<132, 128>>>",
              median_us([&] { big_smem_kernel<<<132, 128, kSmem, s>>>(); }));
  std::printf("%-52s %8.2f us\n", "cudaFuncSetAttribute(max dynamic smem)", median_us([&] {
                cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
              }));
  std::printf("%-52s %8.2f us\n", "cudaLaunchKernelEx, cluster 2", median_us([&] {
                cudaLaunchConfig_t cfg{};
                cfg.gridDim = dim3(132);
                cfg.blockDim = dim3(128);
                cfg.stream = s;
                cudaLaunchKernelEx(&cfg, cluster_kernel);
              }));
  std::printf("%-52s %8.2f us\n", "cudaGetDevice", median_us([&] { cudaGetDevice(&dev); }));
  std::printf("%-52s %8.2f us\n", "cudaDeviceGetAttribute(SM count)",
              median_us([&] { cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev); }));
  std::printf("%-52s %8.2f us\n", "cudaMemsetAsync 512 B", median_us([&] { cudaMemsetAsync(buf, 0, 512, s); }));
  std::printf("%-52s %8.2f us\n", "cudaMemcpyAsync 512 B device to device", median_us([&] {
                cudaMemcpyAsync(static_cast<char*>(buf) + 4096, buf, 512, cudaMemcpyDeviceToDevice, s);
              }));
  std::printf("%-52s %8.2f us\n", "cudaGetLastError", median_us([&] { (void)cudaGetLastError(); }));
  std::printf("%-52s %8.2f us\n", "getenv", median_us([&] { (void)std::getenv("MOEKIT_SM90_GEMM"); }));
  cudaFree(buf);
  cudaStreamDestroy(s);
  return 0;
}

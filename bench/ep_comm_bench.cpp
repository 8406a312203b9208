#include "ep_comm_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "moekit/comm.h"

namespace moekit::bench {

#define EPB_CUDA(stmt)                                                                      \
  do {                                                                                      \
    const cudaError_t e_ = (stmt);                                                          \
    if (e_ != cudaSuccess) return Internal(std::string(#stmt) + ": " + cudaGetErrorString(e_)); \
  } while (0)

StatusOr<double> time_all_to_all_us(Communicator& comm, void* stream, int64_t max_rows, size_t row_bytes, int reps) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int n = comm.size();
  const size_t bytes = static_cast<size_t>(n) * max_rows * row_bytes;
  void *send = nullptr, *recv = nullptr;
  int32_t *sc = nullptr, *rc = nullptr;
  EPB_CUDA(cudaMalloc(&send, bytes));
  EPB_CUDA(cudaMalloc(&recv, bytes));
  EPB_CUDA(cudaMalloc(reinterpret_cast<void**>(&sc), n * sizeof(int32_t)));
  EPB_CUDA(cudaMalloc(reinterpret_cast<void**>(&rc), n * sizeof(int32_t)));
  std::vector<int32_t> counts(n, static_cast<int32_t>(max_rows));
  EPB_CUDA(cudaMemcpy(sc, counts.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));
  EPB_CUDA(cudaMemset(send, 1, bytes));
  cudaEvent_t a, b;
  EPB_CUDA(cudaEventCreate(&a));
  EPB_CUDA(cudaEventCreate(&b));
  std::vector<double> us;
  Status st = Status::Ok();
  for (int i = 0; i < reps + 3 && st.ok(); ++i) {  // 3 warm-up calls
    st = comm.barrier(s);
    if (!st.ok()) break;
    cudaEventRecord(a, s);
    st = comm.all_to_all_v(send, sc, recv, rc, max_rows, row_bytes, s);
    cudaEventRecord(b, s);
    if (cudaEventSynchronize(b) != cudaSuccess) st = Internal("all_to_all_v did not complete");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (i >= 3) us.push_back(ms * 1000.0);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(send);
  cudaFree(recv);
  cudaFree(sc);
  cudaFree(rc);
  MOEKIT_RETURN_IF_ERROR(st);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}


Status run_ep_comm_bench(const EpCommBenchOptions& o, std::ostream& log) {
  if (!nccl_built()) return Unsupported("bench --ep: this build has no NCCL (cmake/nccl.cmake)");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;  // no driver or no device: none usable
  if (devices < o.ranks) {
    return Unsupported("bench --ep " + std::to_string(o.ranks) + ": needs that many CUDA devices, found " +
                       std::to_string(devices));
  }
  const int n = o.ranks;
  MOEKIT_ASSIGN_OR_RETURN(CommUniqueId id, nccl_unique_id());
  // results[case][m] from rank 0
  std::vector<std::vector<double>> results(3, std::vector<double>(o.m_list.size(), 0.0));
  std::vector<Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      status[r] = [&]() -> Status {
        MOEKIT_ASSIGN_OR_RETURN(auto comm, create_nccl_communicator(id, n, r, Device::cuda(r)));
        cudaStream_t s = nullptr;
        EPB_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        for (size_t i = 0; i < o.m_list.size(); ++i) {
          const int64_t m = o.m_list[i];
          const int64_t raw_rows = (m * o.top_k + n - 1) / n;
          const size_t header = (8 * static_cast<size_t>(o.top_k) + 15) / 16 * 16;  // as EpDeviceShape::header_bytes
          MOEKIT_ASSIGN_OR_RETURN(double raw, time_all_to_all_us(*comm, s, raw_rows, o.hidden * 2, o.reps));
          MOEKIT_ASSIGN_OR_RETURN(double disp, time_all_to_all_us(*comm, s, m, header + o.hidden * 2, o.reps));
          MOEKIT_ASSIGN_OR_RETURN(double comb, time_all_to_all_us(*comm, s, m, o.hidden * 2, o.reps));
          if (r == 0) {
            results[0][i] = raw;
            results[1][i] = disp;
            results[2][i] = comb;
          }
        }
        cudaStreamDestroy(s);
        return Status::Ok();
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : status) MOEKIT_RETURN_IF_ERROR(s);
  char line[256];
  std::snprintf(line, sizeof line, "bench --ep %d: H=%lld, k=%d, E=%lld, %d reps (median, rank 0, us)\n", n,
                static_cast<long long>(o.hidden), o.top_k, static_cast<long long>(o.experts), o.reps);
  log << line;
  log << "  tokens/rank       raw a2a    dispatch     combine   (disp+comb)/(2 raw)\n";
  for (size_t i = 0; i < o.m_list.size(); ++i) {
    std::snprintf(line, sizeof line, "  %11lld  %10.1f  %10.1f  %10.1f  %8.2f\n", static_cast<long long>(o.m_list[i]),
                  results[0][i], results[1][i], results[2][i],
                  (results[1][i] + results[2][i]) / (2.0 * results[0][i]));
    log << line;
  }
  return Status::Ok();
}

}  // namespace moekit::bench

// The NCCL communicator on two GPUs of one host, one rank per GPU (threads
// here; the API is the same for one process per GPU): every collective
// against a direct computation, all_to_all_v with counts only on the device,
// the same captured in a CUDA graph and replayed with new data, and a rank
// that never joins. Skips itself (reported as skipped) without NCCL or with
// fewer than two CUDA devices.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "moekit/comm.h"
#include "moekit/ep_layer.h"
#include "multigpu/multigpu_test_util.h"

namespace moekit {
namespace {

using multigpu_test::run_gpu_ranks;

template <typename T>
struct DeviceVec {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceVec(size_t count) : n(count) { cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)); }
  ~DeviceVec() { cudaFree(p); }
  Status put(const std::vector<T>& h) {
    CUDA_OK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return Status::Ok();
  }
  StatusOr<std::vector<T>> get() const {
    std::vector<T> h(n);
    CUDA_OK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

TEST(NcclComm, AllGatherAndReduceScatter) {
  MOEKIT_REQUIRE_GPUS(2);
  const int n = 2;
  const size_t count = 1000;
  auto st = run_gpu_ranks(n, [&](int r, Communicator& c, cudaStream_t s) -> Status {
    std::vector<float> mine(n * count);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(r * 1000000 + i);
    DeviceVec<float> send(n * count), gathered(n * n * count), reduced(count);
    MOEKIT_RETURN_IF_ERROR(send.put(mine));
    MOEKIT_RETURN_IF_ERROR(c.all_gather(send.p, gathered.p, n * count * sizeof(float), s));
    MOEKIT_RETURN_IF_ERROR(c.reduce_scatter_sum_f32(send.p, reduced.p, count, s));
    CUDA_OK(cudaStreamSynchronize(s));
    MOEKIT_ASSIGN_OR_RETURN(auto g, gathered.get());
    MOEKIT_ASSIGN_OR_RETURN(auto red, reduced.get());
    for (int src = 0; src < n; ++src) {
      for (size_t i = 0; i < n * count; ++i) {
        if (g[src * n * count + i] != static_cast<float>(src * 1000000 + i)) return Internal("all_gather element");
      }
    }
    for (size_t i = 0; i < count; ++i) {
      // Integers below 2^24: the sum is exact in any order.
      float expect = 0;
      for (int src = 0; src < n; ++src) expect += static_cast<float>(src * 1000000 + r * count + i);
      if (red[i] != expect) return Internal("reduce_scatter element " + std::to_string(i));
    }
    return c.barrier(s);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.to_string();
}

// Rank s sends rows(s, d) rows of 64 bytes to rank d; the counts live only on
// the device. Run eagerly, then captured in a graph and replayed with new data.
TEST(NcclComm, AllToAllVWithDeviceCountsEagerAndInACudaGraph) {
  MOEKIT_REQUIRE_GPUS(2);
  const int n = 2;
  const int64_t max_rows = 300;
  const size_t row = 64;
  auto rows = [&](int s, int d, int round) { return static_cast<int32_t>((37 * s + 101 * d + 53 * round) % (max_rows + 1)); };
  auto byte = [&](int s, int d, int64_t i, size_t b, int round) {
    return static_cast<uint8_t>(s * 31 + d * 17 + i * 7 + b + round * 5);
  };
  auto st = run_gpu_ranks(n, [&](int r, Communicator& c, cudaStream_t s) -> Status {
    DeviceVec<uint8_t> send(n * max_rows * row), recv(n * max_rows * row);
    DeviceVec<int32_t> send_counts(n), recv_counts(n);
    auto fill = [&](int round) -> Status {
      std::vector<uint8_t> h(n * max_rows * row, 0);
      std::vector<int32_t> cnt(n);
      for (int d = 0; d < n; ++d) {
        cnt[d] = rows(r, d, round);
        for (int64_t i = 0; i < cnt[d]; ++i) {
          for (size_t b = 0; b < row; ++b) h[(d * max_rows + i) * row + b] = byte(r, d, i, b, round);
        }
      }
      MOEKIT_RETURN_IF_ERROR(send.put(h));
      return send_counts.put(cnt);
    };
    auto check = [&](int round) -> Status {
      CUDA_OK(cudaStreamSynchronize(s));
      MOEKIT_ASSIGN_OR_RETURN(auto h, recv.get());
      MOEKIT_ASSIGN_OR_RETURN(auto cnt, recv_counts.get());
      for (int src = 0; src < n; ++src) {
        if (cnt[src] != rows(src, r, round)) return Internal("count from rank " + std::to_string(src));
        for (int64_t i = 0; i < cnt[src]; ++i) {
          for (size_t b = 0; b < row; ++b) {
            if (h[(src * max_rows + i) * row + b] != byte(src, r, i, b, round)) return Internal("row bytes");
          }
        }
      }
      return Status::Ok();
    };
    MOEKIT_RETURN_IF_ERROR(fill(0));
    MOEKIT_RETURN_IF_ERROR(c.all_to_all_v(send.p, send_counts.p, recv.p, recv_counts.p, max_rows, row, s));
    MOEKIT_RETURN_IF_ERROR(check(0));
    // The same call captured once, replayed for two new rounds of data and counts.
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const Status captured = c.all_to_all_v(send.p, send_counts.p, recv.p, recv_counts.p, max_rows, row, s);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    MOEKIT_RETURN_IF_ERROR(captured);
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 1; round <= 2; ++round) {
      MOEKIT_RETURN_IF_ERROR(fill(round));
      CUDA_OK(cudaGraphLaunch(exec, s));
      MOEKIT_RETURN_IF_ERROR(check(round));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return c.barrier(s);
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST(NcclComm, ARankThatNeverJoinsTimesOut) {
  MOEKIT_REQUIRE_GPUS(1);
  auto id = nccl_unique_id();
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  auto comm = create_nccl_communicator(*id, 2, 0, Device::cuda(0), {std::chrono::milliseconds(3000)});
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded) << comm.status().to_string();
  EXPECT_NE(comm.status().message().find("did not complete within 3000 ms"), std::string::npos)
      << comm.status().message();
}

TEST(NcclComm, NvlinkMulticastIsNotTurnedOn) {
  MOEKIT_REQUIRE_GPUS(1);
  // The library never sets it; the machines set it to 0 (docs/expert_parallel.md).
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  EXPECT_TRUE(nvls == nullptr || std::string(nvls) == "0") << "NCCL_NVLS_ENABLE=" << nvls;
}

// A configuration the GPU path does not serve (f32 weights) is refused on
// every rank with the reason, before any weights are read.
TEST(NcclComm, AnEpLayerOnGpusRefusesWhatItsDevicePathDoesNotServe) {
  MOEKIT_REQUIRE_GPUS(2);
  auto st = run_gpu_ranks(2, [&](int r, Communicator& c, cudaStream_t) -> Status {
    MoeConfig cfg;
    cfg.num_experts = 8;
    cfg.hidden = 64;
    cfg.intermediate = 32;
    cfg.max_num_tokens = 4;
    cfg.routing.top_k = 2;
    cfg.quant.weight_dtype = cfg.quant.act_dtype = DType::kF32;
    cfg.parallel.ep_size = cfg.parallel.dp_size = 2;
    cfg.parallel.ep_rank = cfg.parallel.dp_rank = r;
    cfg.parallel.all2all = All2AllBackend::kNccl;
    return ExpertParallelLayer::create(cfg, MoeWeights{}, c).status();
  });
  for (const Status& s : st) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("bf16"), std::string::npos) << s.to_string();
  }
}

}  // namespace
}  // namespace moekit

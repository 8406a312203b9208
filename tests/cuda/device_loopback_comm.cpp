#include "cuda/device_loopback_comm.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moekit::cuda_test {

// Where the ranks meet: each publishes two pointers, waits for all, reads the others'.
class DeviceLoopbackGroup {
 public:
  DeviceLoopbackGroup(int size, int device) : size_(size), device_(device), a_(size), b_(size) {}
  int size() const { return size_; }
  int device() const { return device_; }

  // Publishes (a, b) for `rank`, waits for every rank; then everyone's pointers.
  void exchange(int rank, const void* a, const void* b, std::vector<const void*>* all_a,
                std::vector<const void*>* all_b) {
    std::unique_lock<std::mutex> lock(mu_);
    a_[rank] = a;
    b_[rank] = b;
    wait_for_all(lock);
    *all_a = a_;
    *all_b = b_;
    wait_for_all(lock);  // nobody publishes the next call's pointers before everyone read these
  }
  void barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    wait_for_all(lock);
  }

 private:
  void wait_for_all(std::unique_lock<std::mutex>& lock) {
    const int gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }

  const int size_, device_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0, generation_ = 0;
  std::vector<const void*> a_, b_;
};

namespace {

#define DLB_CUDA(stmt)                                                                          \
  do {                                                                                          \
    const cudaError_t e_ = (stmt);                                                              \
    if (e_ != cudaSuccess) return Internal(#stmt + std::string(": ") + cudaGetErrorString(e_)); \
  } while (0)

class DeviceLoopbackComm final : public Communicator {
 public:
  DeviceLoopbackComm(std::shared_ptr<DeviceLoopbackGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
  const char* name() const override { return "device_loopback"; }
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  Device device() const override { return Device::cuda(g_->device()); }

  Status barrier(Stream stream) override {
    DLB_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    g_->barrier();
    return Status::Ok();
  }

  Status all_gather(const void* send, void* recv, size_t bytes, Stream stream) override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    DLB_CUDA(cudaStreamSynchronize(s));
    std::vector<const void*> sends, unused;
    g_->exchange(rank_, send, nullptr, &sends, &unused);
    for (int r = 0; r < size(); ++r) {
      DLB_CUDA(cudaMemcpyAsync(static_cast<char*>(recv) + r * bytes, sends[r], bytes, cudaMemcpyDeviceToDevice, s));
    }
    DLB_CUDA(cudaStreamSynchronize(s));
    g_->barrier();  // the senders may reuse their buffers only now
    return Status::Ok();
  }

  Status reduce_scatter_sum_f32(const float*, float*, size_t, Stream) override {
    return Unsupported("device loopback: reduce_scatter_sum_f32 is not needed by the GPU EP path");
  }

  Status all_to_all_v(const void* send, const int32_t* send_counts, void* recv, int32_t* recv_counts,
                      int64_t max_rows, size_t row_bytes, Stream stream) override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    DLB_CUDA(cudaStreamSynchronize(s));
    std::vector<const void*> sends, counts;
    g_->exchange(rank_, send, send_counts, &sends, &counts);
    const size_t block = static_cast<size_t>(max_rows) * row_bytes;
    for (int r = 0; r < size(); ++r) {
      DLB_CUDA(cudaMemcpyAsync(static_cast<char*>(recv) + r * block,
                               static_cast<const char*>(sends[r]) + rank_ * block, block, cudaMemcpyDeviceToDevice, s));
      DLB_CUDA(cudaMemcpyAsync(recv_counts + r, static_cast<const int32_t*>(counts[r]) + rank_, sizeof(int32_t),
                               cudaMemcpyDeviceToDevice, s));
    }
    DLB_CUDA(cudaStreamSynchronize(s));
    g_->barrier();
    return Status::Ok();
  }

 private:
  std::shared_ptr<DeviceLoopbackGroup> g_;
  int rank_;
};

}  // namespace

std::shared_ptr<DeviceLoopbackGroup> make_device_loopback_group(int size, int device) {
  return std::make_shared<DeviceLoopbackGroup>(size, device);
}

std::unique_ptr<Communicator> make_device_loopback_rank(const std::shared_ptr<DeviceLoopbackGroup>& group, int rank) {
  return std::make_unique<DeviceLoopbackComm>(group, rank);
}

std::vector<Status> run_device_loopback_ranks(int n,
                                              const std::function<Status(int, Communicator&, cudaStream_t)>& body) {
  auto group = make_device_loopback_group(n, 0);
  std::vector<Status> result(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      result[r] = [&]() -> Status {
        if (cudaSetDevice(0) != cudaSuccess) return Internal("cudaSetDevice(0)");
        std::unique_ptr<Communicator> comm = make_device_loopback_rank(group, r);
        cudaStream_t s = nullptr;
        if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return Internal("stream");
        Status st = body(r, *comm, s);
        cudaStreamDestroy(s);
        return st;
      }();
    });
  }
  for (auto& t : threads) t.join();
  return result;
}

}  // namespace moekit::cuda_test

// The NCCL Communicator: one process (or thread) per GPU, joined by an NCCL
// unique id the caller exchanges. Every call is enqueued on the caller's
// stream and never waits on the host, except barrier() and joining, which
// wait with the timeout and abort the communicator rather than hang.
//
// NOTE: NVLink multicast (NVLS) stays off: nothing here sets NCCL_NVLS_ENABLE
// or calls cuMulticastCreate (the machines set NCCL_NVLS_ENABLE=0).
#include "moekit/comm.h"

#ifdef MOEKIT_WITH_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "core/cuda_check.h"
#include "dispatch/nccl_check.h"

namespace moekit {

namespace dispatch {
Status nccl_error_status(ncclResult_t r, const char* stmt, const char* file, int line) {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  return Internal(std::string("NCCL error in `") + stmt + "` at " + file + ":" + std::to_string(line) + " on cuda:" +
                  std::to_string(device) + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) + ")");
}
}  // namespace dispatch

namespace {

static_assert(sizeof(ncclUniqueId) <= sizeof(CommUniqueId::bytes), "an ncclUniqueId must fit a CommUniqueId");

using Clock = std::chrono::steady_clock;

// Polls until `done` says so, NCCL reports an error, or the deadline: then
// aborts the communicator (so no kernel is left waiting) and says why.
template <typename Done>
Status wait_or_abort(ncclComm_t comm, std::chrono::milliseconds timeout, const std::string& what, Done done) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    ncclResult_t async = ncclSuccess;
    MOEKIT_NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      ncclCommAbort(comm);
      return Internal("NCCL communicator: " + what + " failed: " + ncclGetErrorString(async));
    }
    if (async == ncclSuccess && done()) return Status::Ok();
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      return DeadlineExceeded("NCCL communicator: " + what + " did not complete within " +
                              std::to_string(timeout.count()) + " ms (a rank never joined or never arrived); the "
                              "communicator was aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, CommOptions opt, int32_t* scratch)
      : comm_(comm), rank_(rank), size_(size), device_(device), options_(opt), scratch_(scratch) {}
  ~NcclCommunicator() override {
    if (comm_ != nullptr && !aborted_) ncclCommDestroy(comm_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  const char* name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cuda(device_); }

  // An all-reduce of one int, then a bounded wait for it.
  Status barrier(Stream stream) override {
    MOEKIT_RETURN_IF_ERROR(usable());
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    MOEKIT_RETURN_IF_ERROR(settle(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, s), "barrier"));
    cudaEvent_t done = nullptr;
    MOEKIT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    MOEKIT_CUDA_CHECK(cudaEventRecord(done, s));
    const Status st = wait_or_abort(comm_, options_.timeout, "barrier",
                                    [&] { return cudaEventQuery(done) != cudaErrorNotReady; });
    cudaEventDestroy(done);
    if (!st.ok()) aborted_ = true;
    return st;
  }

  Status all_gather(const void* send, void* recv, size_t bytes, Stream stream) override {
    MOEKIT_RETURN_IF_ERROR(usable());
    return settle(ncclAllGather(send, recv, bytes, ncclChar, comm_, static_cast<cudaStream_t>(stream)), "all_gather");
  }

  Status reduce_scatter_sum_f32(const float* send, float* recv, size_t count, Stream stream) override {
    MOEKIT_RETURN_IF_ERROR(usable());
    return settle(ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, comm_, static_cast<cudaStream_t>(stream)),
                  "reduce_scatter_sum_f32");
  }

  // Counts stay on the device, so every peer block moves whole (max_rows
  // rows): correct and graph-capturable, but it moves the worst case.
  // TODO(ep): a device kernel that reads the counts and writes only the
  // valid rows into peers' buffers (CUDA IPC / NCCL symmetric memory).
  Status all_to_all_v(const void* send, const int32_t* send_counts, void* recv, int32_t* recv_counts,
                      int64_t max_rows, size_t row_bytes, Stream stream) override {
    MOEKIT_RETURN_IF_ERROR(usable());
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const size_t block = static_cast<size_t>(max_rows) * row_bytes;
    MOEKIT_NCCL_CHECK(ncclGroupStart());
    // The first failure inside the group is reported after the group is closed.
    ncclResult_t first = ncclSuccess;
    auto keep = [&](ncclResult_t r) {
      if (first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) first = r;
    };
    for (int peer = 0; peer < size_; ++peer) {
      keep(ncclSend(static_cast<const char*>(send) + peer * block, block, ncclChar, peer, comm_, s));
      keep(ncclRecv(static_cast<char*>(recv) + peer * block, block, ncclChar, peer, comm_, s));
      keep(ncclSend(send_counts + peer, 1, ncclInt32, peer, comm_, s));
      keep(ncclRecv(recv_counts + peer, 1, ncclInt32, peer, comm_, s));
    }
    MOEKIT_RETURN_IF_ERROR(settle(ncclGroupEnd(), "all_to_all_v"));
    if (first != ncclSuccess) return dispatch::nccl_error_status(first, "ncclSend/ncclRecv in all_to_all_v", __FILE__, __LINE__);
    return Status::Ok();
  }

 private:
  // A non-blocking communicator may answer ncclInProgress while it sets up
  // connections: wait for that (bounded) before the next call.
  Status settle(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return Status::Ok();
    if (r != ncclInProgress) return dispatch::nccl_error_status(r, what, __FILE__, __LINE__);
    const Status st = wait_or_abort(comm_, options_.timeout, what, [] { return true; });
    if (!st.ok()) aborted_ = true;
    return st;
  }

  Status usable() const {
    if (aborted_) return DeadlineExceeded("NCCL communicator: aborted after an earlier timeout or error");
    return Status::Ok();
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
  CommOptions options_;
  int32_t* scratch_;  // [1] i32 on the device: barrier()'s all-reduce
  bool aborted_ = false;
};

}  // namespace

bool nccl_built() { return true; }

StatusOr<CommUniqueId> nccl_unique_id() {
  ncclUniqueId nid;
  MOEKIT_NCCL_CHECK(ncclGetUniqueId(&nid));
  CommUniqueId id;
  std::memcpy(id.bytes.data(), &nid, sizeof nid);
  return id;
}

StatusOr<std::unique_ptr<Communicator>> create_nccl_communicator(const CommUniqueId& id, int size, int rank,
                                                                 Device device, CommOptions options) {
  if (device.type != DeviceType::kCuda) {
    return InvalidArgument("NCCL communicator: needs a CUDA device, got " + device.to_string());
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgument("NCCL communicator: rank " + std::to_string(rank) + " not in [0, " + std::to_string(size) +
                           ")");
  }
  MOEKIT_CUDA_CHECK(cudaSetDevice(device.index));
  int32_t* scratch = nullptr;
  MOEKIT_CUDA_CHECK(cudaMalloc(&scratch, sizeof(int32_t)));
  ncclUniqueId nid;
  std::memcpy(&nid, id.bytes.data(), sizeof nid);
  // Non-blocking init, so joining can time out instead of hanging.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size, nid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    cudaFree(scratch);
    return dispatch::nccl_error_status(r, "ncclCommInitRankConfig", __FILE__, __LINE__);
  }
  const Status joined = wait_or_abort(comm, options.timeout, "joining (rank " + std::to_string(rank) + " of " +
                                                                 std::to_string(size) + ")",
                                      [] { return true; });
  if (!joined.ok()) {
    cudaFree(scratch);
    return joined;
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(comm, rank, size, device.index, options, scratch));
}

}  // namespace moekit

#else  // !MOEKIT_WITH_NCCL

namespace moekit {

bool nccl_built() { return false; }

StatusOr<CommUniqueId> nccl_unique_id() {
  return Unsupported("NCCL communicator: this build has no NCCL (a CUDA build finds it: cmake/nccl.cmake)");
}

StatusOr<std::unique_ptr<Communicator>> create_nccl_communicator(const CommUniqueId&, int, int, Device, CommOptions) {
  return Unsupported("NCCL communicator: this build has no NCCL (a CUDA build finds it: cmake/nccl.cmake)");
}

}  // namespace moekit

#endif  // MOEKIT_WITH_NCCL

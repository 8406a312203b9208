// Communicator: the collectives expert parallelism needs, over one group of
// ranks (docs/design.md §2.5). Two implementations sit behind it: NCCL (one process
// per GPU) and loopback (N ranks as threads of one process over host memory,
// so every EP code path runs without a GPU).
//
// Ranks join with a unique id that one rank makes and the caller hands to the
// others (a file, a socket, torch.distributed's store, ...). Every call is
// collective: each rank of the group makes the same calls in the same order
// with the same sizes, else the call fails (loopback: naming the mismatch).
// A rank that does not arrive within the timeout makes the call fail with
// kDeadlineExceeded naming the missing ranks, never a hang; after that the
// group is broken and every later call fails at once.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit {

// Opaque bytes shared by the ranks of one group (NCCL: an ncclUniqueId).
struct CommUniqueId {
  std::array<char, 128> bytes{};
};

struct CommOptions {
  // How long a rank waits for the others (joining, or inside a collective).
  std::chrono::milliseconds timeout{60000};
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual const char* name() const = 0;  // "loopback", "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the buffers of every call live (host for loopback, the GPU for NCCL).
  virtual Device device() const = 0;

  virtual Status barrier(Stream stream = nullptr) = 0;

  // recv [size() * bytes]: rank r's `bytes` from its `send` land at r * bytes.
  virtual Status all_gather(const void* send, void* recv, size_t bytes, Stream stream = nullptr) = 0;

  // send [size() * count] f32; recv [count] f32 = sum over ranks r = 0..size()-1,
  // in that order from 0.0f, of block rank() of rank r's send. (The fixed order
  // makes the loopback result exact and repeatable; NCCL's order is its own.)
  virtual Status reduce_scatter_sum_f32(const float* send, float* recv, size_t count, Stream stream = nullptr) = 0;

  // All-to-all whose row counts live only on the device: the host never reads
  // them, so buffers are sized for the worst case (max_rows per peer) and a
  // forward never waits on the host.
  //   send        [size(), max_rows, row_bytes]: block r holds the rows for rank r
  //   send_counts [size()] i32: valid rows of each send block (<= max_rows)
  //   recv        [size(), max_rows, row_bytes]: block s receives rank s's rows for this rank;
  //               rows past the count are left undefined
  //   recv_counts [size()] i32: rows that arrived from each rank
  virtual Status all_to_all_v(const void* send, const int32_t* send_counts, void* recv, int32_t* recv_counts,
                              int64_t max_rows, size_t row_bytes, Stream stream = nullptr) = 0;
};

// Loopback: N ranks as threads of this process, sharing host memory. One rank
// calls loopback_unique_id() and passes the id to every rank's thread; each
// thread then calls create_loopback_communicator with its own rank. Fails with
// kDeadlineExceeded when not every rank joins within the timeout, and with
// kInvalidArgument when ranks disagree on the size.
CommUniqueId loopback_unique_id();
StatusOr<std::unique_ptr<Communicator>> create_loopback_communicator(const CommUniqueId& id, int size, int rank,
                                                                     CommOptions options = {});

// NCCL: one process per GPU. nccl_unique_id() on one rank; every rank calls
// create_nccl_communicator with it and the CUDA device it owns. Unsupported in
// a build without NCCL (Platform::nccl_built says which).
StatusOr<CommUniqueId> nccl_unique_id();
StatusOr<std::unique_ptr<Communicator>> create_nccl_communicator(const CommUniqueId& id, int size, int rank,
                                                                 Device device, CommOptions options = {});
bool nccl_built();

}  // namespace moekit

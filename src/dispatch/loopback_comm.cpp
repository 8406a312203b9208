// The loopback Communicator: N ranks as threads of one process over host
// memory. Each collective is two rendezvous: every rank posts its call (kind,
// sizes, send pointers) and waits for all others; then each rank reads what it
// needs straight from the peers' send buffers and waits again, so no rank
// reuses a send buffer while a peer still reads it.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "moekit/comm.h"

namespace moekit {
namespace {

enum class OpKind { kBarrier, kAllGather, kReduceScatter, kAllToAllV };

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kBarrier: return "barrier";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter_sum_f32";
    case OpKind::kAllToAllV: return "all_to_all_v";
  }
  return "?";
}

// One rank's posted call.
struct Post {
  OpKind kind = OpKind::kBarrier;
  size_t bytes = 0;        // all_gather: bytes; reduce_scatter: count; all_to_all_v: row_bytes
  int64_t max_rows = 0;    // all_to_all_v only
  const void* send = nullptr;
  const int32_t* send_counts = nullptr;
};

std::string post_string(const Post& p) {
  std::string s = op_name(p.kind);
  switch (p.kind) {
    case OpKind::kBarrier: break;
    case OpKind::kAllGather: s += "(bytes=" + std::to_string(p.bytes) + ")"; break;
    case OpKind::kReduceScatter: s += "(count=" + std::to_string(p.bytes) + ")"; break;
    case OpKind::kAllToAllV:
      s += "(max_rows=" + std::to_string(p.max_rows) + ", row_bytes=" + std::to_string(p.bytes) + ")";
      break;
  }
  return s;
}

// The state the ranks of one group share.
struct Group {
  explicit Group(int n) : size(n), posts(n), joined(n, false), arrived(n, false) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Post> posts;
  std::vector<bool> joined;
  int num_joined = 0;
  // Rendezvous state: ranks arrived in the current generation.
  std::vector<bool> arrived;
  int num_arrived = 0;
  int64_t generation = 0;
  std::string broken;  // non-empty once a rank timed out: every later call fails with it

  // Waits until every rank reached this point (one generation) or the timeout.
  Status rendezvous(int rank, std::chrono::milliseconds timeout, const std::string& what) {
    std::unique_lock<std::mutex> lock(mu);
    if (!broken.empty()) return DeadlineExceeded(broken);
    const int64_t gen = generation;
    arrived[rank] = true;
    if (++num_arrived == size) {
      std::fill(arrived.begin(), arrived.end(), false);
      num_arrived = 0;
      ++generation;
      cv.notify_all();
      return Status::Ok();
    }
    if (cv.wait_for(lock, timeout, [&] { return generation != gen || !broken.empty(); })) {
      if (generation != gen) return Status::Ok();
      return DeadlineExceeded(broken);
    }
    std::string missing;
    for (int r = 0; r < size; ++r) {
      if (!arrived[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    broken = "loopback communicator: rank " + std::to_string(rank) + " waited " + std::to_string(timeout.count()) +
             " ms in " + what + " for rank(s) " + missing + ", which never arrived; the group is unusable";
    cv.notify_all();
    return DeadlineExceeded(broken);
  }
};

std::mutex g_registry_mu;
std::map<std::string, std::shared_ptr<Group>> g_registry;  // by unique id, while ranks join

std::string id_key(const CommUniqueId& id) { return std::string(id.bytes.data(), id.bytes.size()); }

class LoopbackCommunicator final : public Communicator {
 public:
  LoopbackCommunicator(std::shared_ptr<Group> g, int rank, CommOptions opt)
      : group_(std::move(g)), rank_(rank), options_(opt) {}

  const char* name() const override { return "loopback"; }
  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  Device device() const override { return Device::cpu(); }

  Status barrier(Stream) override {
    Post p;
    p.kind = OpKind::kBarrier;
    return run(p, [] {});
  }

  Status all_gather(const void* send, void* recv, size_t bytes, Stream) override {
    Post p;
    p.kind = OpKind::kAllGather;
    p.bytes = bytes;
    p.send = send;
    return run(p, [&] {
      for (int r = 0; r < size(); ++r) {
        std::memcpy(static_cast<char*>(recv) + r * bytes, group_->posts[r].send, bytes);
      }
    });
  }

  Status reduce_scatter_sum_f32(const float* send, float* recv, size_t count, Stream) override {
    Post p;
    p.kind = OpKind::kReduceScatter;
    p.bytes = count;
    p.send = send;
    return run(p, [&] {
      for (size_t i = 0; i < count; ++i) recv[i] = 0.0f;
      for (int r = 0; r < size(); ++r) {
        const float* src = static_cast<const float*>(group_->posts[r].send) + rank_ * count;
        for (size_t i = 0; i < count; ++i) recv[i] += src[i];
      }
    });
  }

  Status all_to_all_v(const void* send, const int32_t* send_counts, void* recv, int32_t* recv_counts,
                      int64_t max_rows, size_t row_bytes, Stream) override {
    Post p;
    p.kind = OpKind::kAllToAllV;
    p.bytes = row_bytes;
    p.max_rows = max_rows;
    p.send = send;
    p.send_counts = send_counts;
    // Every rank checks every count, so all ranks agree on the verdict.
    auto check_counts = [&]() -> Status {
      for (int s = 0; s < size(); ++s) {
        for (int d = 0; d < size(); ++d) {
          const int32_t c = group_->posts[s].send_counts[d];
          if (c < 0 || c > max_rows) {
            return OutOfRange("loopback all_to_all_v: rank " + std::to_string(s) + " sends " + std::to_string(c) +
                              " rows to rank " + std::to_string(d) + "; must be in [0, max_rows = " +
                              std::to_string(max_rows) + "]");
          }
        }
      }
      return Status::Ok();
    };
    return run(
        p,
        [&] {
          const size_t block = static_cast<size_t>(max_rows) * row_bytes;
          for (int s = 0; s < size(); ++s) {
            const Post& peer = group_->posts[s];
            const int32_t c = peer.send_counts[rank_];
            std::memcpy(static_cast<char*>(recv) + s * block,
                        static_cast<const char*>(peer.send) + rank_ * block, c * row_bytes);
            recv_counts[s] = c;
          }
        },
        check_counts);
  }

 private:
  // Post, meet, check that every rank made the same call, act, meet again.
  template <typename Act, typename Check = Status (*)()>
  Status run(const Post& post, Act act, Check check = [] { return Status::Ok(); }) {
    const std::string what = std::string(op_name(post.kind)) + " #" + std::to_string(calls_++);
    group_->posts[rank_] = post;
    MOEKIT_RETURN_IF_ERROR(group_->rendezvous(rank_, options_.timeout, what + " (arrive)"));
    Status verdict = Status::Ok();
    for (int r = 0; r < size() && verdict.ok(); ++r) {
      const Post& first = group_->posts[0];
      const Post& q = group_->posts[r];
      if (q.kind != first.kind || q.bytes != first.bytes || q.max_rows != first.max_rows) {
        verdict = InvalidArgument("loopback communicator: mismatched collective " + what + ": rank 0 called " +
                                  post_string(group_->posts[0]) + ", rank " + std::to_string(r) + " called " +
                                  post_string(q));
      }
    }
    if (verdict.ok()) verdict = check();
    if (verdict.ok()) act();
    MOEKIT_RETURN_IF_ERROR(group_->rendezvous(rank_, options_.timeout, what + " (depart)"));
    return verdict;
  }

  std::shared_ptr<Group> group_;
  int rank_;
  CommOptions options_;
  int64_t calls_ = 0;
};

}  // namespace

CommUniqueId loopback_unique_id() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const std::string key = "loopback:" + std::to_string(rd()) + ":" + std::to_string(counter++);
  CommUniqueId id;
  std::memcpy(id.bytes.data(), key.data(), std::min(key.size(), id.bytes.size()));
  return id;
}

StatusOr<std::unique_ptr<Communicator>> create_loopback_communicator(const CommUniqueId& id, int size, int rank,
                                                                     CommOptions options) {
  if (size < 1) return InvalidArgument("loopback communicator: size " + std::to_string(size) + " must be >= 1");
  if (rank < 0 || rank >= size) {
    return InvalidArgument("loopback communicator: rank " + std::to_string(rank) + " not in [0, " +
                           std::to_string(size) + ")");
  }
  const std::string key = id_key(id);
  std::shared_ptr<Group> group;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    auto it = g_registry.find(key);
    if (it == g_registry.end()) it = g_registry.emplace(key, std::make_shared<Group>(size)).first;
    group = it->second;
  }
  std::unique_lock<std::mutex> lock(group->mu);
  if (group->size != size) {
    return InvalidArgument("loopback communicator: rank " + std::to_string(rank) + " joins with size " +
                           std::to_string(size) + " but the group was made with size " + std::to_string(group->size));
  }
  if (group->joined[rank]) {
    return InvalidArgument("loopback communicator: rank " + std::to_string(rank) + " joined twice");
  }
  group->joined[rank] = true;
  if (++group->num_joined == size) {
    std::lock_guard<std::mutex> reg(g_registry_mu);
    g_registry.erase(key);  // complete: the id is spent
    group->cv.notify_all();
  } else if (!group->cv.wait_for(lock, options.timeout,
                                 [&] { return group->num_joined == size || !group->broken.empty(); })) {
    std::string missing;
    for (int r = 0; r < size; ++r) {
      if (!group->joined[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    group->broken = "loopback communicator: rank(s) " + missing + " never joined within " +
                    std::to_string(options.timeout.count()) + " ms";
    group->cv.notify_all();
    std::lock_guard<std::mutex> reg(g_registry_mu);
    g_registry.erase(key);
    return DeadlineExceeded(group->broken);
  } else if (!group->broken.empty()) {
    return DeadlineExceeded(group->broken);
  }
  return std::unique_ptr<Communicator>(new LoopbackCommunicator(group, rank, options));
}

}  // namespace moekit

// All-to-all PrepareFinalize: each token goes once to every rank that holds at
// least one of its experts (deduplicated), carrying the slots it wants there;
// each pair's output comes back as one row.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "dispatch/ep_pair_rows.h"
#include "dispatch/ep_host_exchange.h"
#include "dispatch/local_prepare_finalize.h"
#include "dispatch/topk_reduce.h"

namespace moekit::dispatch {
namespace {

class AllToAll final : public EpHostExchange {
 public:
  AllToAll(Communicator& comm, const EpShape& s) : comm_(comm), s_(s) {
    const int n = comm.size();
    row_bytes_ = dispatch_row_bytes(s);
    max_return_rows_ = s.max_tokens * std::min(s.top_k, s.slots_per_rank);
    send_.resize(n * s.max_tokens * row_bytes_);
    recv_.resize(n * s.max_tokens * row_bytes_);
    send_counts_.resize(n);
    recv_counts_.resize(n);
    pairs_to_.resize(n);
    const int64_t max_pairs = s.max_pairs(n);
    x_pairs_.resize(max_pairs * s.hidden);
    y_pairs_.resize(max_pairs * s.hidden);
    pair_slot_.resize(max_pairs);
    pairs_from_.resize(n + 1);
    ret_send_.resize(n * max_return_rows_ * s.hidden);
    ret_recv_.resize(n * max_return_rows_ * s.hidden);
    pair_to_row_.resize(s.max_tokens * s.top_k);
    y_.resize(s.max_tokens * s.hidden);
  }

  const char* name() const override { return "all_to_all"; }

  StatusOr<EpPairs> prepare(const TensorView& hidden, const int32_t* ids, const ExpertPlacement& placement) override {
    const int n = comm_.size();
    const int64_t M = hidden.dim(0), k = s_.top_k, spr = s_.slots_per_rank;
    MOEKIT_RETURN_IF_ERROR(agree(comm_, check_physical_ids(ids, M, k, placement)));
    num_tokens_ = M;
    // Pack: per destination rank, the tokens that need it, in token order.
    std::fill(send_counts_.begin(), send_counts_.end(), 0);
    std::fill(pairs_to_.begin(), pairs_to_.end(), 0);
    const size_t act_bytes = dtype_size(s_.act_dtype) * s_.hidden;
    for (int64_t t = 0; t < M; ++t) {
      for (int d = 0; d < n; ++d) {
        bool needed = false;
        for (int64_t j = 0; j < k; ++j) needed |= ids[t * k + j] / spr == d;
        if (!needed) continue;
        char* row = send_.data() + (d * s_.max_tokens + send_counts_[d]++) * row_bytes_;
        int32_t* want = reinterpret_cast<int32_t*>(row);  // [k] slot on d, or -1
        for (int64_t j = 0; j < k; ++j) {
          const int32_t slot = ids[t * k + j];
          if (slot / spr == d) {
            want[j] = static_cast<int32_t>(slot % spr);
            pair_to_row_[t * k + j] = static_cast<int32_t>(d * max_return_rows_ + pairs_to_[d]++);
          } else {
            want[j] = -1;
          }
        }
        std::memcpy(row + k * sizeof(int32_t), static_cast<const char*>(hidden.data) + t * act_bytes, act_bytes);
      }
    }
    MOEKIT_RETURN_IF_ERROR(comm_.all_to_all_v(send_.data(), send_counts_.data(), recv_.data(), recv_counts_.data(),
                                              s_.max_tokens, row_bytes_));
    // Unpack into pairs, in (source rank, token, slot) order.
    int64_t p = 0;
    for (int src = 0; src < n; ++src) {
      pairs_from_[src] = p;
      for (int32_t i = 0; i < recv_counts_[src]; ++i) {
        const char* row = recv_.data() + (src * s_.max_tokens + i) * row_bytes_;
        p = unpack_dispatch_row(row, s_, p, x_pairs_.data(), pair_slot_.data());
      }
    }
    pairs_from_[n] = p;
    return EpPairs{x_pairs_.data(), pair_slot_.data(), y_pairs_.data(), p};
  }

  Status finalize(const float* topk_weights, const TensorView& out,
                  const std::function<void(float* y)>& before_narrowing) override {
    const int n = comm_.size();
    const int64_t H = s_.hidden;
    // Return every source's pair outputs in the order they arrived.
    for (int src = 0; src < n; ++src) {
      const int64_t count = pairs_from_[src + 1] - pairs_from_[src];
      send_counts_[src] = static_cast<int32_t>(count);
      std::memcpy(ret_send_.data() + src * max_return_rows_ * H, y_pairs_.data() + pairs_from_[src] * H,
                  count * H * sizeof(float));
    }
    MOEKIT_RETURN_IF_ERROR(comm_.all_to_all_v(ret_send_.data(), send_counts_.data(), ret_recv_.data(),
                                              recv_counts_.data(), max_return_rows_, H * sizeof(float)));
    float* y = local_output_buffer(out, y_.data());
    weighted_topk_reduce(ret_recv_.data(), pair_to_row_.data(), topk_weights, num_tokens_, s_.top_k, H, y);
    if (before_narrowing && num_tokens_ > 0) before_narrowing(y);
    local_finalize(y, out);
    return Status::Ok();
  }

 private:
  Communicator& comm_;
  EpShape s_;
  size_t row_bytes_ = 0;         // dispatch row: [k] i32 wanted slots, then H act values
  int64_t max_return_rows_ = 0;  // pairs one rank can return to one source
  std::vector<char> send_, recv_;                 // [N, max_tokens, row_bytes]
  std::vector<int32_t> send_counts_, recv_counts_;  // [N]
  std::vector<int32_t> pairs_to_;                 // [N]: pairs sent to each rank so far
  std::vector<float> x_pairs_, y_pairs_;          // [max_pairs, H] f32
  std::vector<int32_t> pair_slot_;                // [max_pairs]
  std::vector<int64_t> pairs_from_;               // [N + 1]: pairs of each source rank
  std::vector<float> ret_send_, ret_recv_;        // [N, max_return_rows, H] f32
  std::vector<int32_t> pair_to_row_;              // [max_tokens * k]: row of ret_recv_ holding pair (t, j)
  std::vector<float> y_;                          // [max_tokens, H] f32 before finalize (bf16 acts)
  int64_t num_tokens_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<EpHostExchange>> make_all_to_all(Communicator& comm, const EpShape& shape) {
  MOEKIT_RETURN_IF_ERROR(check_ep_shape(comm, shape));
  return std::unique_ptr<EpHostExchange>(new AllToAll(comm, shape));
}

}  // namespace moekit::dispatch

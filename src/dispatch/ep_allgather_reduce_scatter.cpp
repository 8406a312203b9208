// Allgather + reduce-scatter PrepareFinalize: every rank gathers every token
// (with its physical ids), computes the pairs it holds, and writes each
// pair's output into a [ranks, max_tokens, k, H] buffer that is zero where
// another rank computes; a reduce-scatter brings every rank its own tokens'
// [max_tokens, k, H]. Each (t, j) has exactly one nonzero contributor, so the
// sum is exact and the slot-order reduce that follows matches the single-rank
// layer bit for bit. It moves k times the bytes of a summed output: the price
// of exactness, paid only at the small sizes the oracle picks it for.
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

class AllgatherReduceScatter final : public EpHostExchange {
 public:
  AllgatherReduceScatter(Communicator& comm, const EpShape& s) : comm_(comm), s_(s) {
    const int n = comm.size();
    row_bytes_ = dispatch_row_bytes(s);
    block_bytes_ = sizeof(int64_t) + s.max_tokens * row_bytes_;
    send_.resize(block_bytes_);
    gathered_.resize(n * block_bytes_);
    const int64_t max_pairs = s.max_pairs(n);
    x_pairs_.resize(max_pairs * s.hidden);
    y_pairs_.resize(max_pairs * s.hidden);
    pair_slot_.resize(max_pairs);
    pair_dest_.resize(max_pairs);
    partial_.resize(n * s.max_tokens * s.top_k * s.hidden);
    mine_.resize(s.max_tokens * s.top_k * s.hidden);
    pair_to_row_.resize(s.max_tokens * s.top_k);
    for (int64_t i = 0; i < s.max_tokens * s.top_k; ++i) pair_to_row_[i] = static_cast<int32_t>(i);
    y_.resize(s.max_tokens * s.hidden);
  }

  const char* name() const override { return "allgather_reduce_scatter"; }

  StatusOr<EpPairs> prepare(const TensorView& hidden, const int32_t* ids, const ExpertPlacement& placement) override {
    const int n = comm_.size(), me = comm_.rank();
    const int64_t M = hidden.dim(0), k = s_.top_k, spr = s_.slots_per_rank;
    MOEKIT_RETURN_IF_ERROR(agree(comm_, check_physical_ids(ids, M, k, placement)));
    num_tokens_ = M;
    // Block: [i64 M] then max_tokens dispatch rows holding the *physical* ids.
    std::memcpy(send_.data(), &M, sizeof(int64_t));
    const size_t act_bytes = dtype_size(s_.act_dtype) * s_.hidden;
    for (int64_t t = 0; t < M; ++t) {
      char* row = send_.data() + sizeof(int64_t) + t * row_bytes_;
      std::memcpy(row, ids + t * k, k * sizeof(int32_t));
      std::memcpy(row + k * sizeof(int32_t), static_cast<const char*>(hidden.data) + t * act_bytes, act_bytes);
    }
    MOEKIT_RETURN_IF_ERROR(comm_.all_gather(send_.data(), gathered_.data(), block_bytes_));
    // Pairs held here, in (source rank, token, slot) order.
    int64_t p = 0;
    for (int src = 0; src < n; ++src) {
      char* block = gathered_.data() + src * block_bytes_;
      int64_t m_src = 0;
      std::memcpy(&m_src, block, sizeof(int64_t));
      for (int64_t t = 0; t < m_src; ++t) {
        char* row = block + sizeof(int64_t) + t * row_bytes_;
        int32_t* slots = reinterpret_cast<int32_t*>(row);
        // Rewrite the row's physical ids as "slot here or -1" (unpack appends
        // pairs in slot order) and note where each pair's output goes.
        int64_t next = p;
        for (int64_t j = 0; j < k; ++j) {
          const bool here = slots[j] / spr == me;
          if (here) pair_dest_[next++] = static_cast<int32_t>((src * s_.max_tokens + t) * k + j);
          slots[j] = here ? slots[j] % spr : -1;
        }
        p = unpack_dispatch_row(row, s_, p, x_pairs_.data(), pair_slot_.data());
      }
    }
    num_pairs_ = p;
    return EpPairs{x_pairs_.data(), pair_slot_.data(), y_pairs_.data(), p};
  }

  Status finalize(const float* topk_weights, const TensorView& out,
                  const std::function<void(float* y)>& before_narrowing) override {
    const int64_t H = s_.hidden, count = s_.max_tokens * s_.top_k * H;
    std::fill(partial_.begin(), partial_.end(), 0.0f);
    for (int64_t p = 0; p < num_pairs_; ++p) {
      std::memcpy(partial_.data() + static_cast<int64_t>(pair_dest_[p]) * H, y_pairs_.data() + p * H, H * sizeof(float));
    }
    MOEKIT_RETURN_IF_ERROR(comm_.reduce_scatter_sum_f32(partial_.data(), mine_.data(), count));
    float* y = local_output_buffer(out, y_.data());
    weighted_topk_reduce(mine_.data(), pair_to_row_.data(), topk_weights, num_tokens_, s_.top_k, H, y);
    if (before_narrowing && num_tokens_ > 0) before_narrowing(y);
    local_finalize(y, out);
    return Status::Ok();
  }

 private:
  Communicator& comm_;
  EpShape s_;
  size_t row_bytes_ = 0, block_bytes_ = 0;
  std::vector<char> send_;              // [block_bytes]: this rank's token count, ids and rows
  std::vector<char> gathered_;          // [N, block_bytes]
  std::vector<float> x_pairs_, y_pairs_;  // [max_pairs, H] f32
  std::vector<int32_t> pair_slot_;      // [max_pairs]: slot on this rank
  std::vector<int32_t> pair_dest_;      // [max_pairs]: (src, t, j) flat index of each pair in partial_
  std::vector<float> partial_;          // [N, max_tokens, k, H] f32: this rank's outputs, zero elsewhere
  std::vector<float> mine_;             // [max_tokens, k, H] f32: every pair output of this rank's tokens
  std::vector<int32_t> pair_to_row_;    // [max_tokens * k]: identity (mine_ is in (t, j) order)
  std::vector<float> y_;                // [max_tokens, H] f32 before finalize (bf16 acts)
  int64_t num_tokens_ = 0, num_pairs_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<EpHostExchange>> make_allgather_reduce_scatter(Communicator& comm, const EpShape& shape) {
  MOEKIT_RETURN_IF_ERROR(check_ep_shape(comm, shape));
  return std::unique_ptr<EpHostExchange>(new AllgatherReduceScatter(comm, shape));
}

}  // namespace moekit::dispatch

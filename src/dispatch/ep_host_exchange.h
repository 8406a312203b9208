// The token movement of the host expert-parallel PrepareFinalize
// (prepare_finalize.h, docs/design.md §1, §2.5): prepare moves token rows from the
// rank that routed them to the ranks holding their experts; finalize brings the
// expert outputs back and reduces them.
//
// Both implementations hand the experts stage *pairs*: one row per (token,
// slot) whose physical expert lives on this rank, with the rank-local slot it
// goes to. Pairs are ordered by (source rank, token, slot), so each expert
// sees its tokens in the group's token order (rank 0's first), exactly as a
// single-rank layer over the concatenated batch does. The experts stage
// returns each pair's *unweighted* fp32 output; finalize reduces them with the
// top-k weights in slot order through the same function the CPU experts stage
// uses (dispatch::weighted_topk_reduce), which makes an EP layer's output bitwise
// equal to the single-rank layer's.
//
// Every buffer is sized at create() for the worst case (max_num_tokens per
// rank, every token hitting every rank), so a forward allocates nothing and
// the host never needs the counts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "moekit/comm.h"
#include "moekit/config.h"
#include "moekit/eplb.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::dispatch {

// The sizes every rank of the group shares.
struct EpShape {
  int64_t max_tokens = 0;      // per rank (config.max_num_tokens)
  int64_t hidden = 0;          // H
  int64_t top_k = 0;           // k
  int64_t slots_per_rank = 0;  // physical expert slots on each rank
  DType act_dtype = DType::kBF16;
  // Most pairs one rank can receive: every token of every rank, each with
  // min(k, slots_per_rank) slots here.
  int64_t max_pairs(int ranks) const;
};

// What prepare hands the experts stage (views into the PrepareFinalize's own buffers).
struct EpPairs {
  const float* x = nullptr;              // [num_pairs, H] f32: the pair's token row
  const int32_t* local_slot = nullptr;   // [num_pairs] i32: slot on this rank, in [0, slots_per_rank)
  float* y = nullptr;                    // [num_pairs, H] f32: where the experts stage writes outputs
  int64_t num_pairs = 0;
};

class EpHostExchange {
 public:
  virtual ~EpHostExchange() = default;
  virtual const char* name() const = 0;

  // hidden: [M, H] act dtype (host); physical_ids: [M, k] i32 physical slots,
  // each held by some rank under `placement` (checked; an id of an empty or
  // unknown slot is an OutOfRange error naming it). Collective.
  virtual StatusOr<EpPairs> prepare(const TensorView& hidden, const int32_t* physical_ids,
                                    const ExpertPlacement& placement) = 0;
  // After the experts stage filled pairs.y: brings the outputs back and writes
  // out [M, H] (act dtype) = sum_j topk_weights[t, j] * y(t, j), calling
  // before_narrowing (when set) on that fp32 sum [M, H] first (the shared
  // expert's addend). Collective.
  virtual Status finalize(const float* topk_weights, const TensorView& out,
                          const std::function<void(float* y)>& before_narrowing) = 0;
};

// (a) all-to-all: each token sent once per destination rank holding at least
// one of its experts, with the slots it wants there; outputs return one row
// per pair.
StatusOr<std::unique_ptr<EpHostExchange>> make_all_to_all(Communicator& comm, const EpShape& shape);
// (b) allgather + reduce-scatter: every rank sees every token, computes the
// pairs it holds, and partial outputs [M, k, H] (zero where another rank
// computes) are reduce-scattered back.
StatusOr<std::unique_ptr<EpHostExchange>> make_allgather_reduce_scatter(Communicator& comm, const EpShape& shape);

// Every rank learns whether all ranks' `local` verdicts are ok; the first
// failing rank's verdict is returned on every rank (its own message on that
// rank, a pointer to it elsewhere). Collective; keeps a bad input on one rank
// from leaving the others waiting in the next collective.
Status agree(Communicator& comm, const Status& local);

}  // namespace moekit::dispatch

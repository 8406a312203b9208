// The host expert-parallel PrepareFinalize (prepare_finalize.h): the replica of
// every (token, slot), then the token movement of ep_host_exchange.h.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "dispatch/ep_replica_table.h"
#include "dispatch/prepare_finalize.h"

namespace moekit::dispatch {
namespace {

class EpHostPrepareFinalize final : public PrepareFinalize {
 public:
  EpHostPrepareFinalize(Communicator& comm, const EpShape& shape, std::unique_ptr<EpHostExchange> exchange,
                        const ExpertPlacement& placement, ReplicaTable replicas, SharedExpertPass shared)
      : comm_(comm), shape_(shape), exchange_(std::move(exchange)), placement_(placement),
        replicas_(std::move(replicas)), shared_(std::move(shared)), physical_ids_(shape.max_tokens * shape.top_k),
        ones_(std::max<int64_t>(shape.max_pairs(comm.size()), 1), 1.0f) {}

  const char* name() const override { return exchange_->name(); }

  Status admit(const Status& verdict, bool* without_tokens) override {
    *without_tokens = false;
    return agree(comm_, verdict);
  }

  StatusOr<MoeRunArgs> prepare(const RoutedTokens& tokens, const TensorView&, Stream) override {
    const int64_t m = tokens.num_tokens, k = shape_.top_k, H = shape_.hidden;
    // The replica of every (token, slot) is a function of the token's position
    // in the group alone (replica_slot, the device path's rule too).
    const int64_t token_key0 = static_cast<int64_t>(comm_.rank()) * shape_.max_tokens;
    const int32_t* ids = m > 0 ? tokens.topk_ids.ptr<const int32_t>() : nullptr;
    const int32_t E = static_cast<int32_t>(placement_.num_logical);
    for (int64_t t = 0; t < m; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        physical_ids_[t * k + j] = replica_slot(replicas_.offsets.data(), replicas_.slots.data(), E, ids[t * k + j],
                                                token_key0 + t);
      }
    }
    MOEKIT_ASSIGN_OR_RETURN(EpPairs pairs, exchange_->prepare(tokens.hidden, physical_ids_.data(), placement_));
    computed_pairs_ += pairs.num_pairs;
    const int64_t P = pairs.num_pairs;
    MoeRunArgs run;
    run.hidden = TensorView::contiguous(const_cast<float*>(pairs.x), DType::kF32, {P, H});
    run.out = TensorView::contiguous(pairs.y, DType::kF32, {P, H});
    run.topk_ids = TensorView::contiguous(const_cast<int32_t*>(pairs.local_slot), DType::kI32, {P, 1});
    run.topk_weights = TensorView::contiguous(ones_.data(), DType::kF32, {P, 1});
    return run;
  }

  Status finalize(const RoutedTokens& tokens, const Status& experts, const TensorView& out, Stream) override {
    MOEKIT_RETURN_IF_ERROR(agree(comm_, experts));
    std::function<void(float*)> before_narrowing;
    if (shared_) before_narrowing = [&](float* y) { shared_(tokens.hidden, tokens.num_tokens, y); };
    return exchange_->finalize(tokens.num_tokens > 0 ? tokens.topk_weights.ptr<const float>() : nullptr, out,
                               before_narrowing);
  }

  StatusOr<int64_t> computed_pairs() const override { return computed_pairs_; }
  Status reset_computed_pairs() override {
    computed_pairs_ = 0;
    return Status::Ok();
  }

 private:
  Communicator& comm_;
  EpShape shape_;
  std::unique_ptr<EpHostExchange> exchange_;
  ExpertPlacement placement_;
  ReplicaTable replicas_;                       // logical -> physical slots
  SharedExpertPass shared_;                     // the shared expert on this rank's tokens, or empty
  std::vector<int32_t> physical_ids_;           // [max_tokens, k]
  std::vector<float> ones_;                     // [max_pairs]: the k = 1 weight of each pair
  int64_t computed_pairs_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<PrepareFinalize>> make_ep_host_prepare_finalize(
    Communicator& comm, const EpShape& shape, All2AllBackend kind, const ExpertPlacement& placement,
    const std::vector<std::vector<int32_t>>& replicas, SharedExpertPass shared) {
  MOEKIT_ASSIGN_OR_RETURN(ReplicaTable table, make_replica_table(replicas));
  StatusOr<std::unique_ptr<EpHostExchange>> exchange =
      kind == All2AllBackend::kAllgatherReducescatter ? make_allgather_reduce_scatter(comm, shape)
                                                      : make_all_to_all(comm, shape);
  MOEKIT_RETURN_IF_ERROR(exchange.status());
  return std::unique_ptr<PrepareFinalize>(
      new EpHostPrepareFinalize(comm, shape, std::move(*exchange), placement, std::move(table), std::move(shared)));
}

}  // namespace moekit::dispatch

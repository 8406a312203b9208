// The PrepareFinalize defaults and the local (single-rank) implementation.
#include "dispatch/prepare_finalize.h"

#include <string>

namespace moekit::dispatch {

Status PrepareFinalize::set_phase_timing(bool) {
  return Unsupported(std::string("phase timing: the ") + name() + " prepare/finalize does not time its phases");
}

Status PrepareFinalize::use_replicas(const std::vector<std::vector<int32_t>>&) {
  return Unsupported(std::string("the ") + name() + " prepare/finalize takes a new placement only when rebuilt");
}

Status PrepareFinalize::last_phase_times(double*, double*, double*) const {
  return Unsupported(std::string("phase timing: the ") + name() + " prepare/finalize does not time its phases");
}

namespace {

// One rank: nothing moves. The experts kernel reads hidden and writes out
// itself (local_prepare / local_finalize inside the CPU kernels, fused on GPUs).
class LocalPrepareFinalize final : public PrepareFinalize {
 public:
  const char* name() const override { return "local"; }
  Status admit(const Status& verdict, bool* without_tokens) override {
    *without_tokens = false;
    return verdict;
  }
  StatusOr<MoeRunArgs> prepare(const RoutedTokens& tokens, const TensorView& out, Stream) override {
    MoeRunArgs run;
    run.hidden = tokens.hidden;
    run.out = out;
    run.topk_ids = tokens.topk_ids;
    run.topk_weights = tokens.topk_weights;
    pairs_ += tokens.topk_ids.numel();
    return run;
  }
  Status finalize(const RoutedTokens&, const Status& experts, const TensorView&, Stream) override { return experts; }
  StatusOr<int64_t> computed_pairs() const override { return pairs_; }
  Status reset_computed_pairs() override {
    pairs_ = 0;
    return Status::Ok();
  }

 private:
  int64_t pairs_ = 0;
};

}  // namespace

std::unique_ptr<PrepareFinalize> make_local_prepare_finalize() { return std::make_unique<LocalPrepareFinalize>(); }

}  // namespace moekit::dispatch

// choose_ep_dispatch: all-to-all or allgather + reduce-scatter for an
// expert-parallel layer, with the reason.
#include <string>

#include "moekit/oracle.h"

namespace moekit {
namespace {
// Tokens of the whole group (ep_size * max_num_tokens) up to which moving every
// token to every rank is cheaper than the all-to-all's two rounds: at decode
// sizes the bytes are small and the latency of a round dominates.
constexpr int64_t kAllgatherMaxGroupTokens = 256;
}  // namespace

StatusOr<EpDispatchChoice> choose_ep_dispatch(const MoeConfig& config) {
  MOEKIT_RETURN_IF_ERROR(config.validate());
  const ParallelConfig& par = config.parallel;
  if (par.ep_size < 2) return InvalidArgument("choose_ep_dispatch: parallel.ep_size is 1; nothing moves between ranks");
  EpDispatchChoice c;
  switch (par.all2all) {
    case All2AllBackend::kNone:
      return InvalidArgument("parallel.all2all: ep > 1 needs nccl, allgather_reducescatter or auto, got none");
    case All2AllBackend::kNccl:
      c.kind = All2AllBackend::kNccl;
      c.reason = "all-to-all: asked for by parallel.all2all = nccl";
      return c;
    case All2AllBackend::kAllgatherReducescatter:
      c.kind = All2AllBackend::kAllgatherReducescatter;
      c.reason = "allgather + reduce-scatter: asked for by parallel.all2all = allgather_reducescatter";
      return c;
    case All2AllBackend::kAuto: break;
  }
  const int64_t group_tokens = par.ep_size * config.max_num_tokens;
  if (group_tokens <= kAllgatherMaxGroupTokens) {
    c.kind = All2AllBackend::kAllgatherReducescatter;
    c.reason = "allgather + reduce-scatter: at most " + std::to_string(group_tokens) + " tokens in the group (<= " +
               std::to_string(kAllgatherMaxGroupTokens) + "), so one gather of every token costs less than the "
               "all-to-all's count exchange and two scatter rounds";
  } else {
    c.kind = All2AllBackend::kNccl;
    c.reason = "all-to-all: up to " + std::to_string(group_tokens) + " tokens in the group (> " +
               std::to_string(kAllgatherMaxGroupTokens) + "); each token goes only to the <= min(top_k, ep) ranks "
               "holding its experts instead of to all " + std::to_string(par.ep_size);
  }
  return c;
}

}  // namespace moekit

// What the experts stage of an expert-parallel layer (ep > 1) cannot do yet,
// as a supports() reason every modular kernel class reports in the oracle's
// walk (ExpertParallelLayer asks the oracle with its real parallel config).
#pragma once

#include "moekit/config.h"
#include "moekit/kernel.h"

namespace moekit {

// The limits every backend shares: the EP prepare/finalize moves (token, slot)
// pairs to the rank holding the slot's expert (an expert's biases travel with
// its slot); a shared expert does not run on the token's own rank yet.
// TODO(ep): the shared MLP once per token on the token's own rank.
inline Support expert_parallel_support(const MoeConfig& c) {
  if (c.parallel.ep_size <= 1) return Support::yes();
  if (c.shared_intermediate > 0) {
    return Support::no("expert parallel: a shared expert is not placed on ranks yet; run this layer with ep_size 1");
  }
  return Support::yes();
}

}  // namespace moekit

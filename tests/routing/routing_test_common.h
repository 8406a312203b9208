// Shared pieces of the CPU routing tests: owned buffers for one routing call
// and the translation of a RoutingConfig into the reference's parameters.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "moekit/routing.h"
#include "reference/reference.h"
#include "util/test_util.h"

namespace moekit::routing_test {

// Buffers of one route_cpu call; outputs start poisoned.
struct RouteBuffers {
  HostTensor logits;   // [M, E] f32|bf16
  HostTensor bias;     // [E] f32, optional
  HostTensor forced;   // [M, k] i32, optional
  HostTensor ids;      // [M, k] i32
  HostTensor weights;  // [M, k] f32
  HostTensor counts;   // [E] i32
  HostTensor replay;   // [M + kReplayExtraRows, k] i16

  static constexpr int64_t kReplayExtraRows = 3;  // rows past M that must stay untouched

  RouteBuffers(HostTensor logits_in, int k) : logits(std::move(logits_in)) {
    const int64_t M = logits.shape()[0], E = logits.shape()[1];
    ids = HostTensor(DType::kI32, {M, k});
    weights = HostTensor(DType::kF32, {M, k});
    counts = HostTensor(DType::kI32, {E});
    replay = HostTensor(DType::kI16, {M + kReplayExtraRows, k});
    for (HostTensor* t : {&ids, &weights, &counts, &replay}) testing::poison(*t);
  }

  RoutingArgs args() const {
    RoutingArgs a;
    a.logits = logits.view();
    if (bias.numel() > 0 && !bias.shape().empty()) a.score_bias = bias.view();
    if (forced.numel() > 0 && !forced.shape().empty()) a.forced_ids = forced.view();
    a.topk_ids = ids.view();
    a.topk_weights = weights.view();
    a.expert_counts = counts.view();
    a.replay_out = replay.view();
    return a;
  }
};

inline moekit_ref::RoutingParams ref_params(const RoutingConfig& cfg, const std::vector<double>& bias) {
  moekit_ref::RoutingParams p;
  p.method = routing_method_name(cfg.method);
  p.top_k = cfg.top_k;
  p.num_groups = cfg.num_groups;
  p.topk_groups = cfg.topk_groups;
  p.scaling = cfg.routed_scaling_factor;
  p.bias = bias;
  return p;
}

template <typename T>
std::vector<T> copy_out(const HostTensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data<T>(), t.nbytes());
  return v;
}

}  // namespace moekit::routing_test

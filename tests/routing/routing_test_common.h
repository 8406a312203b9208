// Shared pieces of the routing tests (route_cpu and route_cuda): owned buffers
// for one routing call, inputs whose routing is unambiguous, and the weight
// comparison of the tolerance table (docs/testing.md).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moekit/routing.h"
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
    a.routing_replay_out = replay.view();
    return a;
  }
};

// deepseek_v3 selects on fp32 sigmoid(x) + bias, which each backend computes
// with its own exp and fp64 sees slightly differently. A row passes only when
// every decision it takes (the group boundary, and the order of the first
// k + 1 biased scores in the kept groups) is separated by far more than that
// error. A filter on inputs, not a second implementation of the result: the
// ids still come from the reference. row: [E] exact logits; bias: [E] or empty.
bool deepseek_row_separated(const RoutingConfig& cfg, int64_t num_experts, const double* row,
                            const std::vector<double>& bias);

// Tie-free logits [M, E] in `dtype` (testing::tie_free_logits, spacing `gap`);
// for deepseek_v3, rows that fail deepseek_row_separated are redrawn. Fills
// `exact` with the stored values widened to double.
HostTensor routing_logits(std::mt19937_64& rng, const RoutingConfig& cfg, DType dtype, int64_t M, int64_t E,
                          double gap, const std::vector<double>& bias, std::vector<double>* exact);

// [M, k] forced ids: each row k distinct experts drawn uniformly from [0, E).
std::vector<int32_t> random_forced_ids(std::mt19937_64& rng, int64_t M, int64_t E, int k);

// The first weight with |got - want| > atol + rtol * |want| (NaN fails), named
// with its [token, slot]; "" when every weight is within the bound.
std::string compare_weights(const std::vector<float>& got, const std::vector<double>& want, int k, double atol,
                            double rtol);

template <typename T>
std::vector<T> copy_out(const HostTensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data<T>(), t.nbytes());
  return v;
}

}  // namespace moekit::routing_test

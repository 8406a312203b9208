#include "routing/routing_test_common.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

namespace moekit::routing_test {

bool deepseek_row_separated(const RoutingConfig& cfg, int64_t num_experts, const double* row,
                            const std::vector<double>& bias) {
  // Two values count as apart when they differ by more than kRel of their
  // magnitudes plus one: >= 100x the fp32 error of a score or of a 2-term sum
  // on either backend, and never less than 1e-5 absolute.
  constexpr double kRel = 1e-5;
  const int64_t E = num_experts, per = E / cfg.num_groups;
  std::vector<double> b(E), mag(E);
  for (int64_t e = 0; e < E; ++e) {
    const double s = 1.0 / (1.0 + std::exp(-row[e]));
    const double bb = bias.empty() ? 0.0 : bias[e];
    b[e] = s + bb;
    mag[e] = std::abs(s) + std::abs(bb);
  }
  auto apart = [&](double x, double mx, double y, double my) { return std::abs(x - y) > kRel * (mx + my + 1.0); };
  std::vector<bool> kept(cfg.num_groups, true);
  if (cfg.topk_groups < cfg.num_groups) {
    std::vector<std::pair<double, double>> gs;  // (group score, its magnitude)
    for (int g = 0; g < cfg.num_groups; ++g) {
      std::vector<int64_t> members(per);
      std::iota(members.begin(), members.end(), g * per);
      std::sort(members.begin(), members.end(), [&](int64_t x, int64_t y) { return b[x] > b[y]; });
      gs.emplace_back(b[members[0]] + b[members[1]], mag[members[0]] + mag[members[1]]);
    }
    std::vector<int> order(cfg.num_groups);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int x, int y) { return gs[x].first > gs[y].first; });
    const auto& lo = gs[order[cfg.topk_groups - 1]];
    const auto& hi = gs[order[cfg.topk_groups]];
    if (!apart(lo.first, lo.second, hi.first, hi.second)) return false;
    std::fill(kept.begin(), kept.end(), false);
    for (int j = 0; j < cfg.topk_groups; ++j) kept[order[j]] = true;
  }
  std::vector<int64_t> cand;
  for (int64_t e = 0; e < E; ++e) {
    if (kept[e / per]) cand.push_back(e);
  }
  std::sort(cand.begin(), cand.end(), [&](int64_t x, int64_t y) { return b[x] > b[y]; });
  const size_t n = std::min(cand.size(), static_cast<size_t>(cfg.top_k) + 1);
  for (size_t i = 0; i + 1 < n; ++i) {
    if (!apart(b[cand[i]], mag[cand[i]], b[cand[i + 1]], mag[cand[i + 1]])) return false;
  }
  return true;
}

HostTensor routing_logits(std::mt19937_64& rng, const RoutingConfig& cfg, DType dtype, int64_t M, int64_t E,
                          double gap, const std::vector<double>& bias, std::vector<double>* exact) {
  HostTensor logits = testing::tie_free_logits(rng, dtype, M, E, gap, exact);
  if (cfg.method != RoutingMethod::kDeepseekV3) return logits;
  const size_t row_bytes = static_cast<size_t>(E) * dtype_size(dtype);
  for (int64_t r = 0; r < M; ++r) {
    int tries = 0;
    while (!deepseek_row_separated(cfg, E, exact->data() + r * E, bias)) {
      if (++tries > 1000) {
        ADD_FAILURE() << "could not draw a well-separated deepseek_v3 row";
        return logits;
      }
      std::vector<double> fresh_exact;
      HostTensor fresh = testing::tie_free_logits(rng, dtype, 1, E, gap, &fresh_exact);
      std::memcpy(logits.data<unsigned char>() + r * row_bytes, fresh.data<unsigned char>(), row_bytes);
      std::copy(fresh_exact.begin(), fresh_exact.end(), exact->begin() + r * E);
    }
  }
  return logits;
}

std::vector<int32_t> random_forced_ids(std::mt19937_64& rng, int64_t M, int64_t E, int k) {
  std::vector<int32_t> ids, perm(E);
  for (int64_t r = 0; r < M; ++r) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    ids.insert(ids.end(), perm.begin(), perm.begin() + k);
  }
  return ids;
}

std::string compare_weights(const std::vector<float>& got, const std::vector<double>& want, int k, double atol,
                            double rtol) {
  if (got.size() != want.size()) {
    return "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::abs(want[i]))) {  // NaN fails
      return "weights[" + std::to_string(i / k) + ", " + std::to_string(i % k) + "] = " + std::to_string(got[i]) +
             ", reference " + std::to_string(want[i]) + " (err " + std::to_string(err) + ")";
    }
  }
  return "";
}

}  // namespace moekit::routing_test

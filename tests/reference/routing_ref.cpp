// fp64 reference of the routing spec (docs/routing.md). Written for clarity,
// not speed: every selection is a full sort of (key, index) pairs under the
// spec's order (key descending, then index ascending). Shares no code with any
// backend.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>
#include <vector>

#include "reference.h"

namespace moekit_ref {

namespace {

using Keyed = std::pair<double, int>;  // (key, index)

// The spec's order: higher key first; equal keys -> lower index first.
bool ranks_before(const Keyed& a, const Keyed& b) {
  if (a.first != b.first) return a.first > b.first;
  return a.second < b.second;
}

std::vector<int> sorted_indices(std::vector<Keyed> keyed) {
  std::sort(keyed.begin(), keyed.end(), ranks_before);
  std::vector<int> order;
  for (const Keyed& kv : keyed) order.push_back(kv.second);
  return order;
}

double logistic(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// Ids for one row (selection only).
std::vector<int> choose(const RoutingParams& p, const double* row, int E) {
  std::vector<Keyed> keyed;
  if (p.method != "deepseek_v3") {
    // Every other method's score is strictly increasing in the logit, so the
    // spec ranks experts by the logit itself.
    for (int e = 0; e < E; ++e) keyed.emplace_back(row[e], e);
  } else {
    std::vector<double> biased(E);
    for (int e = 0; e < E; ++e) biased[e] = logistic(row[e]) + (p.bias.empty() ? 0.0 : p.bias[e]);
    const int group_size = E / p.num_groups;
    std::vector<bool> keep(p.num_groups, true);
    if (p.topk_groups < p.num_groups) {
      std::vector<Keyed> groups;
      for (int g = 0; g < p.num_groups; ++g) {
        std::vector<double> members(biased.begin() + g * group_size, biased.begin() + (g + 1) * group_size);
        std::sort(members.begin(), members.end(), [](double a, double b) { return a > b; });
        groups.emplace_back(members[0] + members[1], g);
      }
      const std::vector<int> group_order = sorted_indices(groups);
      std::fill(keep.begin(), keep.end(), false);
      for (int j = 0; j < p.topk_groups; ++j) keep[group_order[j]] = true;
    }
    for (int e = 0; e < E; ++e) {
      if (keep[e / group_size]) keyed.emplace_back(biased[e], e);
    }
  }
  std::vector<int> order = sorted_indices(keyed);
  order.resize(p.top_k);
  return order;
}

// Divides by the sum; a zero sum gives 1/k each (the spec's underflow rule).
void normalize(std::vector<double>& w) {
  double total = 0.0;
  for (double v : w) total += v;
  for (double& v : w) v = total > 0.0 ? v / total : 1.0 / static_cast<double>(w.size());
}

// Weights the method gives to `chosen` in this row.
std::vector<double> weigh(const RoutingParams& p, const double* row, int E, const std::vector<int>& chosen) {
  std::vector<double> w;
  if (p.method == "softmax_topk" || p.method == "renormalize_naive") {
    double peak = row[0];
    for (int e = 1; e < E; ++e) peak = std::max(peak, row[e]);
    double z = 0.0;
    for (int e = 0; e < E; ++e) z += std::exp(row[e] - peak);
    for (int id : chosen) w.push_back(std::exp(row[id] - peak) / z);
    if (p.method == "renormalize_naive") normalize(w);
  } else if (p.method == "renormalize") {
    double peak = row[chosen[0]];
    for (int id : chosen) peak = std::max(peak, row[id]);
    for (int id : chosen) w.push_back(std::exp(row[id] - peak));
    normalize(w);
  } else if (p.method == "topk") {
    for (int id : chosen) w.push_back(row[id]);
  } else if (p.method == "sigmoid" || p.method == "sigmoid_renorm" || p.method == "llama4") {
    for (int id : chosen) w.push_back(logistic(row[id]));
    if (p.method == "sigmoid_renorm") normalize(w);
  } else if (p.method == "deepseek_v3") {
    for (int id : chosen) w.push_back(logistic(row[id]));  // the bias never enters the weights
    if (p.renormalize) normalize(w);
    for (double& v : w) v *= p.scaling;
  } else {
    std::abort();  // unknown method: a bug in the calling test
  }
  return w;
}

}  // namespace

RoutingResult route(const RoutingParams& p, const std::vector<double>& logits, int64_t M, int64_t E,
                    const std::vector<int32_t>& forced_ids) {
  RoutingResult res;
  res.counts.assign(static_cast<size_t>(E), 0);
  for (int64_t t = 0; t < M; ++t) {
    const double* row = logits.data() + t * E;
    std::vector<int> chosen;
    if (forced_ids.empty()) {
      chosen = choose(p, row, static_cast<int>(E));
    } else {
      chosen.assign(forced_ids.begin() + t * p.top_k, forced_ids.begin() + (t + 1) * p.top_k);
    }
    const std::vector<double> w = weigh(p, row, static_cast<int>(E), chosen);
    for (int j = 0; j < p.top_k; ++j) {
      res.ids.push_back(chosen[j]);
      res.weights.push_back(w[j]);
      ++res.counts[chosen[j]];
    }
  }
  return res;
}

}  // namespace moekit_ref

#include "batch_schedule.h"

#include <algorithm>
#include <random>

namespace moekit::tools {

std::vector<Request> make_requests(int num_requests, int64_t total_prompt_tokens, int64_t decode_tokens,
                                   uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x5eedf00dull);
  std::uniform_real_distribution<double> share(0.2, 1.0);
  std::vector<double> w(static_cast<size_t>(num_requests));
  double sum = 0.0;
  for (double& x : w) sum += (x = share(rng));
  std::vector<Request> reqs(static_cast<size_t>(num_requests));
  int64_t left = total_prompt_tokens;
  for (int r = 0; r < num_requests; ++r) {
    const int64_t others = num_requests - r - 1;  // each later prompt keeps >= 1 token
    int64_t n = r + 1 == num_requests ? left
                                      : static_cast<int64_t>(static_cast<double>(total_prompt_tokens) * w[r] / sum);
    n = std::clamp<int64_t>(n, 1, left - others);
    reqs[r] = {r, n, decode_tokens};
    left -= n;
  }
  return reqs;
}

std::vector<Step> schedule(const std::vector<Request>& requests, int64_t max_tokens_per_step) {
  struct State {
    int64_t prefilled = 0;
    int64_t decoded = 0;
  };
  std::vector<State> st(requests.size());
  std::vector<Step> steps;
  while (true) {
    Step step;
    int64_t budget = max_tokens_per_step;
    // Decode first: a running request must not stall behind new prompts.
    for (size_t r = 0; r < requests.size() && budget > 0; ++r) {
      const Request& q = requests[r];
      if (st[r].prefilled == q.prompt_tokens && st[r].decoded < q.decode_tokens) {
        step.slices.push_back({q.id, q.prompt_tokens + st[r].decoded, 1, false});
        ++st[r].decoded;
        --budget;
      }
    }
    for (size_t r = 0; r < requests.size() && budget > 0; ++r) {
      const Request& q = requests[r];
      const int64_t left = q.prompt_tokens - st[r].prefilled;
      if (left == 0) continue;
      const int64_t n = std::min(left, budget);
      step.slices.push_back({q.id, st[r].prefilled, n, true});
      st[r].prefilled += n;
      budget -= n;
    }
    if (step.slices.empty()) break;
    step.num_tokens = max_tokens_per_step - budget;
    steps.push_back(std::move(step));
  }
  return steps;
}

}  // namespace moekit::tools

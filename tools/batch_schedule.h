// How an inference engine batches requests: continuous batching under a token
// budget per step. Each step first gives every running request its next decode
// token, then fills the rest of the budget with prefill chunks of waiting
// prompts (a long prompt is split over several steps).
#pragma once

#include <cstdint>
#include <vector>

namespace moekit::tools {

struct Request {
  int id = 0;
  int64_t prompt_tokens = 0;
  int64_t decode_tokens = 0;  // generated after the prompt, one per step
};

// A contiguous run of rows of one step that belong to one request.
struct StepSlice {
  int request = 0;
  int64_t first_position = 0;  // token position within the request
  int64_t num_tokens = 0;
  bool prefill = false;
};

struct Step {
  std::vector<StepSlice> slices;  // in row order
  int64_t num_tokens = 0;         // rows of the step (sum of slices)
};

// Prompts of different lengths summing to total_prompt_tokens (each >= 1),
// drawn from `seed`.
std::vector<Request> make_requests(int num_requests, int64_t total_prompt_tokens, int64_t decode_tokens,
                                   uint64_t seed);

// The steps that serve `requests` with at most `max_tokens_per_step` rows each.
std::vector<Step> schedule(const std::vector<Request>& requests, int64_t max_tokens_per_step);

}  // namespace moekit::tools

// Capture and replay for `moekit run` and `moekit replay`: the request names
// and step layouts of the schedule, the description of the run stored in the
// capture file (enough to rebuild the model and the schedule), per-step output
// digests, and the replay that checks a capture reproduces the run bit for bit.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "batch_schedule.h"
#include "model_forward.h"
#include "moekit/capture.h"
#include "synthetic_model.h"

namespace moekit::tools {

// The capture file's extra metadata key holding a RunDescription (JSON).
inline constexpr const char* kRunMetadataKey = "moekit_run";

// What `moekit run` did: its flags, and the digest of the last layer's output
// of every step (FNV-1a over the bf16 bits).
struct RunDescription {
  SyntheticModelSpec spec;
  std::string model_dir;  // `run --model DIR`: the folder whose MoE layers ran (empty: the synthetic model)
  std::string backend;  // the backend that ran; a replay forces it (bits match within one backend)
  int num_requests = 0;
  int64_t prompt_tokens = 0;
  int64_t decode_tokens = 0;
  std::vector<uint64_t> step_digests;  // [steps]
};
std::string encode_run_description(const RunDescription& run);
StatusOr<RunDescription> decode_run_description(const std::string& json);

std::string request_name(int request);  // "request-<id>"
StepLayout step_layout(const Step& step);
// Registers every request of the schedule with the capturer.
Status add_requests(RoutedExpertsCapturer& capturer, const std::vector<Request>& requests);
// FNV-1a of out[:M] ([M, H] bf16).
uint64_t output_digest(const HostTensor& out, int64_t num_tokens, int64_t hidden);

// "run: step 120/480 (25%)" on stderr, at most once a second, for runs longer
// than a few seconds; nothing for short runs.
class Progress {
 public:
  Progress(std::string what, size_t total);
  void update(size_t done);
  void finish();

 private:
  std::string what_;
  size_t total_;
  std::chrono::steady_clock::time_point start_, last_;
  bool shown_ = false;
};

struct ReplayOutcome {
  size_t steps = 0;
  bool matched = true;
  std::string mismatch;  // the first step whose output differs, when !matched
  double seconds = 0.0;
};

// Serves the run's schedule again through `model` with the captured ids forced
// in every layer, and compares each step's output digest with the recorded one.
StatusOr<ReplayOutcome> replay_run(const RunDescription& run, SyntheticModel& model, CaptureSet captures);

// `moekit replay`'s job: reads the capture file, rebuilds the model it
// describes (on the CPU backend) and replays it.
StatusOr<ReplayOutcome> replay_capture_file(const std::string& path, const Platform& platform,
                                            RunDescription* run_out = nullptr);

}  // namespace moekit::tools

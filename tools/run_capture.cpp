#include "run_capture.h"

#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

#include "memory_budget.h"

namespace moekit::tools {

namespace {
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr double kProgressAfterSeconds = 2.0;  // short runs print nothing
constexpr double kProgressEverySeconds = 1.0;

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}
}  // namespace

std::string encode_run_description(const RunDescription& r) {
  const SyntheticModelSpec& s = r.spec;
  Json digests = Json::array();
  for (uint64_t d : r.step_digests) digests.push_back(hex(d));
  Json j = {{"spec",
                   {{"num_layers", s.num_layers},
                    {"num_experts", s.num_experts},
                    {"top_k", s.top_k},
                    {"hidden", s.hidden},
                    {"intermediate", s.intermediate},
                    {"num_groups", s.num_groups},
                    {"topk_groups", s.topk_groups},
                    {"routed_scaling_factor", s.routed_scaling_factor},
                    {"max_num_tokens", s.max_num_tokens},
                    {"seed", s.seed}}},
                  {"backend", r.backend},
                  {"num_requests", r.num_requests},
                  {"prompt_tokens", r.prompt_tokens},
                  {"decode_tokens", r.decode_tokens},
                  {"step_digests", digests}};
  if (!r.model_dir.empty()) j["model_dir"] = r.model_dir;
  return j.dump();
}

StatusOr<RunDescription> decode_run_description(const std::string& text) {
  const std::string what = std::string("capture metadata \"") + kRunMetadataKey + "\"";
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (text.find('\0') != std::string::npos || j.is_discarded() || !j.is_object()) {
    return DataLoss(what + " is not a JSON object");
  }
  auto need = [&](const Json& obj, const char* key) -> StatusOr<Json> {
    if (!obj.is_object() || !obj.contains(key)) return DataLoss(what + " lacks \"" + key + "\"");
    return obj.at(key);
  };
  // An integer in [lo, hi]: never truncated into a smaller type.
  auto integer = [&](const Json& obj, const char* key, int64_t lo, int64_t hi) -> StatusOr<int64_t> {
    MOEKIT_ASSIGN_OR_RETURN(Json v, need(obj, key));
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(hi)
                                             : v.is_number_integer() && v.get<int64_t>() <= hi;
    if (!fits || v.get<int64_t>() < lo) {
      return DataLoss(what + ": \"" + key + "\" must be an integer in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
    }
    return v.get<int64_t>();
  };
  constexpr int64_t kInt = std::numeric_limits<int>::max(), kInt64 = std::numeric_limits<int64_t>::max();
  RunDescription r;
  MOEKIT_ASSIGN_OR_RETURN(Json spec, need(j, "spec"));
  SyntheticModelSpec& s = r.spec;
  MOEKIT_ASSIGN_OR_RETURN(const int64_t layers, integer(spec, "num_layers", 1, kInt));
  MOEKIT_ASSIGN_OR_RETURN(s.num_experts, integer(spec, "num_experts", 1, kInt64));
  MOEKIT_ASSIGN_OR_RETURN(const int64_t top_k, integer(spec, "top_k", 1, kInt));
  MOEKIT_ASSIGN_OR_RETURN(s.hidden, integer(spec, "hidden", 1, kInt64));
  MOEKIT_ASSIGN_OR_RETURN(s.intermediate, integer(spec, "intermediate", 1, kInt64));
  MOEKIT_ASSIGN_OR_RETURN(const int64_t groups, integer(spec, "num_groups", 1, kInt));
  MOEKIT_ASSIGN_OR_RETURN(const int64_t topk_groups, integer(spec, "topk_groups", 1, kInt));
  MOEKIT_ASSIGN_OR_RETURN(s.max_num_tokens, integer(spec, "max_num_tokens", 1, kInt64));
  MOEKIT_ASSIGN_OR_RETURN(Json seed, need(spec, "seed"));
  MOEKIT_ASSIGN_OR_RETURN(Json scaling, need(spec, "routed_scaling_factor"));
  if (!seed.is_number_unsigned()) return DataLoss(what + ": \"seed\" must be an integer in [0, 2^64)");
  const double scale = scaling.is_number() ? scaling.get<double>() : 0.0;
  if (!(scale > 0.0) || !std::isfinite(scale) || scale > std::numeric_limits<float>::max()) {
    return DataLoss(what + ": \"routed_scaling_factor\" must be a finite number > 0 (f32)");
  }
  s.num_layers = static_cast<int>(layers);
  s.top_k = static_cast<int>(top_k);
  s.num_groups = static_cast<int>(groups);
  s.topk_groups = static_cast<int>(topk_groups);
  s.seed = seed.get<uint64_t>();
  s.routed_scaling_factor = static_cast<float>(scale);
  if (j.contains("model_dir")) {
    if (!j["model_dir"].is_string() || j["model_dir"].get<std::string>().empty()) {
      return DataLoss(what + ": \"model_dir\" must be a non-empty string");
    }
    r.model_dir = j["model_dir"].get<std::string>();
  }
  MOEKIT_ASSIGN_OR_RETURN(Json backend, need(j, "backend"));
  if (!backend.is_string()) return DataLoss(what + ": \"backend\" must be a string");
  r.backend = backend.get<std::string>();
  MOEKIT_ASSIGN_OR_RETURN(const int64_t requests, integer(j, "num_requests", 1, kInt));
  r.num_requests = static_cast<int>(requests);
  MOEKIT_ASSIGN_OR_RETURN(r.prompt_tokens, integer(j, "prompt_tokens", 1, kInt64));
  MOEKIT_ASSIGN_OR_RETURN(r.decode_tokens, integer(j, "decode_tokens", 0, kInt64));
  MOEKIT_ASSIGN_OR_RETURN(Json digests, need(j, "step_digests"));
  if (!digests.is_array()) return DataLoss(what + ": \"step_digests\" must be an array");
  for (const Json& d : digests) {
    // Exactly 16 hex digits (how encode_run_description writes them).
    const std::string* hex_text = d.is_string() ? d.get_ptr<const std::string*>() : nullptr;
    uint64_t v = 0;
    const bool ok = hex_text && hex_text->size() == 16 &&
                    std::from_chars(hex_text->data(), hex_text->data() + 16, v, 16).ptr == hex_text->data() + 16;
    if (!ok) return DataLoss(what + ": step digest " + std::to_string(r.step_digests.size()) + " is not 16 hex digits");
    r.step_digests.push_back(v);
  }
  if (r.prompt_tokens < r.num_requests) return DataLoss(what + ": request counts are inconsistent");
  return r;
}

std::string request_name(int request) { return "request-" + std::to_string(request); }

StepLayout step_layout(const Step& step) {
  StepLayout layout;
  for (const StepSlice& s : step.slices) layout.segments.push_back({request_name(s.request), s.num_tokens});
  return layout;
}

Status add_requests(RoutedExpertsCapturer& capturer, const std::vector<Request>& requests) {
  for (const Request& r : requests) {
    MOEKIT_RETURN_IF_ERROR(capturer.add_request(request_name(r.id), /*skip_prompt_tokens=*/0, r.prompt_tokens));
  }
  return Status::Ok();
}

uint64_t output_digest(const HostTensor& out, int64_t num_tokens, int64_t hidden) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = out.data<unsigned char>();
  for (int64_t i = 0; i < num_tokens * hidden * 2; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

Progress::Progress(std::string what, size_t total)
    : what_(std::move(what)), total_(total), start_(Clock::now()), last_(start_) {}

void Progress::update(size_t done) {
  const auto now = Clock::now();
  if (std::chrono::duration<double>(now - start_).count() < kProgressAfterSeconds ||
      std::chrono::duration<double>(now - last_).count() < kProgressEverySeconds) {
    return;
  }
  last_ = now;
  shown_ = true;
  std::fprintf(stderr, "%s: step %zu/%zu (%.0f%%)\n", what_.c_str(), done, total_,
               100.0 * static_cast<double>(done) / static_cast<double>(total_));
}

void Progress::finish() {
  if (shown_) std::fprintf(stderr, "%s: step %zu/%zu (100%%)\n", what_.c_str(), total_, total_);
}

StatusOr<ReplayOutcome> replay_run(const RunDescription& run, SyntheticModel& model, CaptureSet captures) {
  const SyntheticModelSpec& spec = run.spec;
  const std::vector<Request> requests =
      make_requests(run.num_requests, run.prompt_tokens, run.decode_tokens, spec.seed);
  const std::vector<Step> steps = schedule(requests, spec.max_num_tokens);
  if (steps.size() != run.step_digests.size()) {
    return DataLoss("the run's schedule has " + std::to_string(steps.size()) + " steps, the capture recorded " +
                    std::to_string(run.step_digests.size()));
  }
  MOEKIT_ASSIGN_OR_RETURN(auto replayer, RoutedExpertsReplayer::create(std::move(captures), model.model));
  // The replay runs without capture: only the forced ids and the outputs matter.
  for (int l = 0; l < model.model.num_layers(); ++l) MOEKIT_RETURN_IF_ERROR(model.model.layer(l).set_capture_target({}));
  const RoutedLayer& first = model.model.layer(0);
  MOEKIT_ASSIGN_OR_RETURN(StepBuffers buffers, StepBuffers::create(first.config(), first.device()));
  std::vector<LayerStats> stats(static_cast<size_t>(spec.num_layers),
                                LayerStats{std::vector<int64_t>(static_cast<size_t>(spec.num_experts), 0), 0.0});
  ReplayOutcome outcome;
  Progress progress("replay", steps.size());
  const auto t0 = Clock::now();
  for (size_t i = 0; i < steps.size(); ++i) {
    MOEKIT_RETURN_IF_ERROR(replayer->begin_step(step_layout(steps[i])));
    MOEKIT_RETURN_IF_ERROR(forward_step(spec, model, steps[i], buffers, stats, replayer.get()));
    const uint64_t d = output_digest(buffers.out, steps[i].num_tokens, spec.hidden);
    ++outcome.steps;
    if (d != run.step_digests[i]) {
      outcome.matched = false;
      outcome.mismatch = "step " + std::to_string(i) + " (" + std::to_string(steps[i].num_tokens) +
                         " tokens): output digest " + hex(d) + ", recorded " + hex(run.step_digests[i]);
      break;
    }
    progress.update(i + 1);
  }
  progress.finish();
  outcome.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return outcome;
}

StatusOr<ReplayOutcome> replay_capture_file(const std::string& path, const Platform& platform,
                                            RunDescription* run_out) {
  MOEKIT_ASSIGN_OR_RETURN(CaptureSet captures, read_capture_file(path));
  auto it = captures.extra_metadata.find(kRunMetadataKey);
  if (it == captures.extra_metadata.end()) {
    return InvalidArgument(path + ": not made by `moekit run` (no \"" + kRunMetadataKey +
                           "\" metadata); replay a single layer with `moekit layer --replay` instead");
  }
  MOEKIT_ASSIGN_OR_RETURN(RunDescription run, decode_run_description(it->second));
  MoeConfig config = synthetic_config(run.spec, run.backend);
  config.needs_replay = true;
  if (run.model_dir.empty()) {
    MOEKIT_RETURN_IF_ERROR(config.validate());
  }
  // The capture is held already; the model and schedule it describes are not.
  MOEKIT_RETURN_IF_ERROR(check_memory("replay", run_memory_bytes(run.spec, run.num_requests, run.prompt_tokens,
                                                                 run.decode_tokens, /*capture=*/false)));
  SyntheticModel model;
  if (run.model_dir.empty()) {
    MOEKIT_ASSIGN_OR_RETURN(model, build_synthetic_model(run.spec, config, platform));
  } else {
    // The folder the run served: its MoE layers again, checked against what the capture recorded.
    SyntheticModelSpec folder = run.spec;
    std::vector<int> moe_layers;
    MOEKIT_RETURN_IF_ERROR(spec_of_model_folder(run.model_dir, &folder, &moe_layers));
    // Every size the capture depends on, named in the message so the one that changed shows.
    const auto sizes = [](const SyntheticModelSpec& s) {
      return std::to_string(s.num_layers) + " MoE layers (E = " + std::to_string(s.num_experts) +
             ", k = " + std::to_string(s.top_k) + ", H = " + std::to_string(s.hidden) +
             ", I = " + std::to_string(s.intermediate) + ")";
    };
    if (sizes(folder) != sizes(run.spec)) {
      return FailedPrecondition(path + ": captured from " + run.model_dir + " with " + sizes(run.spec) +
                                ", but the folder now describes " + sizes(folder));
    }
    MoeConfig first;
    MOEKIT_ASSIGN_OR_RETURN(model, build_checkpoint_model(run.model_dir, moe_layers, config, platform, &first));
  }
  if (run_out) *run_out = run;
  return replay_run(run, model, std::move(captures));
}

}  // namespace moekit::tools

// `moekit run`: the main job. Builds a small synthetic MoE model from a seed,
// serves a batch of requests through it the way an engine batches them, on
// the backend the oracle picks (the GPU when one is present), and prints what happened: config, platform, kernel chosen,
// tokens/s and the expert load of every layer. It captures the routed experts
// (unless --no-capture), writes the capture file, replays it and reports
// whether the outputs matched bit for bit.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batch_schedule.h"
#include "cli_util.h"
#include "expert_load.h"
#include "commands.h"
#include "flag_checks.h"
#include "memory_budget.h"
#include "model_forward.h"
#include "moekit/capture.h"
#include "moekit/oracle.h"
#include "moekit/platform.h"
#include "output_paths.h"
#include "run_capture.h"
#include "run_ep.h"
#include "synthetic_model.h"

// OpenBLAS's thread count (the CPU expert GEMMs run on its threads).
extern "C" void openblas_set_num_threads(int num_threads);

namespace moekit::tools {
namespace {

struct RunOptions {
  SyntheticModelSpec spec;
  int num_requests = 8;
  int64_t prompt_tokens = 1024;  // all prompts together
  int64_t decode_tokens = 16;    // per request
  int threads = 0;               // 0: every hardware thread
  std::string backend = "auto";  // MoeConfig::backend: "auto" or a backend name
  std::string model_dir;         // --model: the MoE layers of this folder instead of synthetic ones
  std::vector<int> moe_layers;   // --model: their model layer indices (spec_of_model_folder)
  std::string capture_path = "moekit_capture.safetensors";
  bool no_capture = false;
  int ep = 1;                    // expert-parallel ranks (run_ep.h)
  int64_t eplb_redundant = -1;   // EPLB replicas beyond E; -1 (not given): one per rank
  bool eplb_redundant_given = false;
};

using Clock = std::chrono::steady_clock;
constexpr double kMaxRunTokens = 1099511627776.0;  // 2^40
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Status check_options(const RunOptions& o) {
  const SyntheticModelSpec& s = o.spec;
  if (s.num_layers < 1) return InvalidArgument("--layers must be >= 1, got " + std::to_string(s.num_layers));
  if (o.num_requests < 1) return InvalidArgument("--requests must be >= 1");
  if (o.prompt_tokens < o.num_requests) {
    return InvalidArgument("--tokens (" + std::to_string(o.prompt_tokens) + ") must be >= --requests (" +
                           std::to_string(o.num_requests) + "): every prompt has at least one token");
  }
  if (o.decode_tokens < 0) return InvalidArgument("--decode must be >= 0");
  // Token positions are int64 and digests are kept per step: bound the total.
  const double total = static_cast<double>(o.prompt_tokens) +
                       static_cast<double>(o.num_requests) * static_cast<double>(o.decode_tokens);
  if (total > kMaxRunTokens) {
    char msg[128];
    std::snprintf(msg, sizeof msg, "--tokens + --requests x --decode is %.3g tokens; at most 2^40 per run", total);
    return InvalidArgument(msg);
  }
  if (o.model_dir.empty()) MOEKIT_RETURN_IF_ERROR(synthetic_config(s).validate());
  if (!o.model_dir.empty() && o.ep > 1) {
    return Unsupported("--model with --ep: an expert-parallel run serves the synthetic model only (for now)");
  }
  if (o.eplb_redundant_given) {
    if (o.ep < 2) return InvalidArgument("--eplb-redundant applies to an expert-parallel run (--ep N, N >= 2) only");
    // At most every rank holding every expert: E x N slots in all.
    const int64_t most = s.num_experts * (o.ep - 1);
    if (o.eplb_redundant < 0 || o.eplb_redundant > most) {
      return InvalidArgument("--eplb-redundant must be in [0, " + std::to_string(most) + "] (E x (N - 1) with --experts " +
                             std::to_string(s.num_experts) + " and --ep " + std::to_string(o.ep) + "), got " +
                             std::to_string(o.eplb_redundant));
    }
  }
  if (!o.no_capture) {
    const std::vector<PathFlag> inputs = o.model_dir.empty() ? std::vector<PathFlag>() : model_folder_inputs(o.model_dir);
    MOEKIT_RETURN_IF_ERROR(check_output_paths({{"--capture", o.capture_path}}, inputs));
  }
  return check_memory("run", run_memory_bytes(s, o.num_requests, o.prompt_tokens, o.decode_tokens, !o.no_capture));
}

// FNV-1a over bytes: a digest of the outputs, to compare runs.
uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

Status run_run(RunOptions o) {
  // --model: the folder's sizes replace the synthetic model's before anything is checked or sized.
  if (!o.model_dir.empty()) MOEKIT_RETURN_IF_ERROR(spec_of_model_folder(o.model_dir, &o.spec, &o.moe_layers));
  MOEKIT_RETURN_IF_ERROR(check_options(o));
  if (o.threads > 0) {
    // Before the first parallel_for creates its pool.
    setenv("MOEKIT_NUM_THREADS", std::to_string(o.threads).c_str(), 1);
    openblas_set_num_threads(o.threads);
  }
  if (o.ep > 1) {
    return run_expert_parallel({o.spec, o.ep, o.eplb_redundant, o.num_requests, o.prompt_tokens, o.decode_tokens,
                                o.backend, o.no_capture ? std::string() : o.capture_path});
  }
  const SyntheticModelSpec& spec = o.spec;
  MoeConfig config = synthetic_config(spec, o.backend);
  config.needs_capture = config.needs_replay = !o.no_capture;
  const Platform& platform = Platform::probe();
  const auto t_build = Clock::now();
  std::optional<SyntheticModel> folder_model;
  if (!o.model_dir.empty()) {  // built first: the oracle then answers for the folder's own config
    MoeConfig first;
    MOEKIT_ASSIGN_OR_RETURN(folder_model, build_checkpoint_model(o.model_dir, o.moe_layers, config, platform, &first));
    config = first;
  }
  MOEKIT_ASSIGN_OR_RETURN(const Resolution resolution, select_backend(config, platform));

  const std::vector<Request> requests = make_requests(o.num_requests, o.prompt_tokens, o.decode_tokens, spec.seed);
  const std::vector<Step> steps = schedule(requests, spec.max_num_tokens);
  int64_t total_tokens = 0;
  for (const Step& s : steps) total_tokens += s.num_tokens;

  if (o.model_dir.empty()) {
    std::printf("moekit run: synthetic MoE model, seed %" PRIu64 "\n", spec.seed);
  } else {
    std::printf("moekit run: the MoE layers of %s (model layers", o.model_dir.c_str());
    for (int l : o.moe_layers) std::printf(" %d", l);
    std::printf("), synthetic embeddings, seed %" PRIu64 "\n", spec.seed);
  }
  std::printf("config:   %d MoE layers, %s\n", spec.num_layers, config.to_string().c_str());
  std::printf("platform: %s\n", platform.to_string().c_str());
  std::printf("backend:  %s, kernel %s (%s)\n%s", resolution.backend.c_str(), resolution.kernel.name.c_str(),
              resolution.kernel.monolithic ? "monolithic" : "modular", format_report(resolution.report).c_str());
  std::printf("batch:    %d requests, prompts of", o.num_requests);
  for (const Request& r : requests) std::printf(" %" PRId64, r.prompt_tokens);
  std::printf(" tokens, %" PRId64 " decode tokens each; %zu steps of <= %" PRId64 " tokens, %" PRId64 " tokens\n",
              o.decode_tokens, steps.size(), spec.max_num_tokens, total_tokens);
  std::fflush(stdout);

  SyntheticModel model;
  if (folder_model) {
    model = std::move(*folder_model);
  } else {
    MOEKIT_ASSIGN_OR_RETURN(model, build_synthetic_model(spec, config, platform));
  }
  std::printf("weights:  %d layers built and prepared in %.2f s\n", spec.num_layers, seconds_since(t_build));
  std::printf("workspace: %.1f MiB per layer, %.1f MiB for the model (its layers share one)\n",
              static_cast<double>(model.model.moe_layer(0)->workspace_bytes()) / (1 << 20),
              static_cast<double>(model.model.workspace_bytes()) / (1 << 20));
  std::fflush(stdout);

  print_gemm_plan(model.model.moe_layer(0)->kernel(), spec.max_num_tokens);
  const Device device = model.model.layer(0).device();
  std::printf("device:   MoE layers run on %s\n", device.to_string().c_str());
  MOEKIT_ASSIGN_OR_RETURN(auto capturer, RoutedExpertsCapturer::create(spec.num_layers, spec.max_num_tokens,
                                                                     spec.top_k, device, !o.no_capture));
  MOEKIT_RETURN_IF_ERROR(bind(model.model, *capturer));
  MOEKIT_RETURN_IF_ERROR(add_requests(*capturer, requests));
  RunDescription described{spec, o.model_dir, resolution.backend, o.num_requests, o.prompt_tokens, o.decode_tokens, {}};
  Progress progress("run", steps.size());

  MOEKIT_ASSIGN_OR_RETURN(StepBuffers buffers, StepBuffers::create(config, device));
  std::vector<LayerStats> stats(static_cast<size_t>(spec.num_layers),
                                LayerStats{std::vector<int64_t>(static_cast<size_t>(spec.num_experts), 0), 0.0});
  uint64_t digest = 0xcbf29ce484222325ull;
  const auto t_run = Clock::now();
  for (const Step& step : steps) {
    MOEKIT_RETURN_IF_ERROR(capturer->begin_step(step_layout(step)));
    MOEKIT_RETURN_IF_ERROR(forward_step(spec, model, step, buffers, stats));
    MOEKIT_RETURN_IF_ERROR(capturer->end_step());
    digest = fnv1a(digest, buffers.out.data<uint16_t>(), static_cast<size_t>(step.num_tokens * spec.hidden) * 2);
    described.step_digests.push_back(output_digest(buffers.out, step.num_tokens, spec.hidden));
    progress.update(described.step_digests.size());
  }
  progress.finish();
  const double run_s = seconds_since(t_run);
  double moe_s = 0;
  for (const LayerStats& l : stats) moe_s += l.seconds;
  // Expert GEMM flops: per token and layer, k experts x (H x 2I + I x H) MACs.
  const double flops = 2.0 * static_cast<double>(total_tokens) * spec.num_layers * spec.top_k * 3.0 *
                       static_cast<double>(spec.hidden) * static_cast<double>(spec.intermediate);
  std::printf("run:      %" PRId64 " tokens x %d layers in %.3f s: %.1f tokens/s (MoE layers %.3f s, %.1f GFLOP/s)\n",
              total_tokens, spec.num_layers, run_s, static_cast<double>(total_tokens) / run_s, moe_s,
              flops / moe_s * 1e-9);
  std::vector<std::vector<int64_t>> load;
  for (const LayerStats& l : stats) load.push_back(l.expert_tokens);
  print_load(load);
  std::printf("output digest: %016" PRIx64 " (FNV-1a of the last layer's bf16 outputs)\n", digest);
  if (o.no_capture) return Status::Ok();

  MOEKIT_ASSIGN_OR_RETURN(CaptureSet captures, capturer->snapshot());
  captures.extra_metadata[kRunMetadataKey] = encode_run_description(described);
  MOEKIT_RETURN_IF_ERROR(write_capture_file(o.capture_path, captures));
  std::printf("capture:  %zu requests x %d MoE layers x top-%d logical expert ids -> %s\n", captures.requests.size(),
              spec.num_layers, spec.top_k, o.capture_path.c_str());
  std::fflush(stdout);
  MOEKIT_ASSIGN_OR_RETURN(CaptureSet from_file, read_capture_file(o.capture_path));
  MOEKIT_ASSIGN_OR_RETURN(const ReplayOutcome replay, replay_run(described, model, std::move(from_file)));
  if (!replay.matched) return DataLoss("replay of " + o.capture_path + " differs from the run at " + replay.mismatch);
  std::printf("replay:   %zu steps with the captured experts forced in every layer, %.3f s: "
              "outputs matched bit for bit\n",
              replay.steps, replay.seconds);
  return Status::Ok();
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Serve a batch of requests through a seeded synthetic MoE model (GPU when present) and report");
  SyntheticModelSpec& s = o->spec;
  CLI::Option* model = cmd->add_option(
      "--model", o->model_dir,
      "a model folder (config.json + safetensors): serve every MoE layer of it, with its own routers, "
      "instead of the synthetic layers");
  std::vector<CLI::Option*> synthetic;  // what --model's config.json describes instead
  synthetic.push_back(cmd->add_option("--layers", s.num_layers, "MoE layers")->capture_default_str());
  synthetic.push_back(cmd->add_option("--experts", s.num_experts, "experts per layer (E)")->capture_default_str());
  synthetic.push_back(cmd->add_option("--top-k", s.top_k, "experts per token (k)")->capture_default_str());
  synthetic.push_back(cmd->add_option("--hidden", s.hidden, "hidden size (H)")->capture_default_str());
  synthetic.push_back(cmd->add_option("--intermediate", s.intermediate, "expert intermediate size (I)")->capture_default_str());
  synthetic.push_back(cmd->add_option("--num-groups", s.num_groups, "deepseek_v3 expert groups")->capture_default_str());
  synthetic.push_back(cmd->add_option("--topk-groups", s.topk_groups, "deepseek_v3 groups kept per token")->capture_default_str());
  synthetic.push_back(cmd->add_option("--scaling", s.routed_scaling_factor, "deepseek_v3 routed scaling factor")
                          ->check(finite_positive_f32())
                          ->capture_default_str());
  for (CLI::Option* opt : synthetic) opt->excludes(model);
  cmd->add_option("--tokens", o->prompt_tokens, "prompt tokens of all requests together")->capture_default_str();
  cmd->add_option("--requests", o->num_requests, "requests in the batch")->capture_default_str();
  cmd->add_option("--decode", o->decode_tokens, "tokens generated per request")->capture_default_str();
  cmd->add_option("--max-batch-tokens", s.max_num_tokens, "token budget of one step (max_num_tokens)")
      ->capture_default_str();
  cmd->add_option("--seed", s.seed, "seed of weights, embeddings and prompt lengths")
      ->check(unsigned_64())
      ->capture_default_str();
  // NOTE: the bound of MOEKIT_NUM_THREADS too (src/core/parallel_for.cpp).
  cmd->add_option("--threads", o->threads, "CPU threads (0: all)")->check(integer_in(0, 1024))->capture_default_str();
  cmd->add_option("--backend", o->backend, "auto (the oracle picks; the GPU when present), or a backend name")
      ->capture_default_str();
  cmd->add_option("--capture", o->capture_path, "capture file to write (then replayed)")->capture_default_str();
  cmd->add_flag("--no-capture", o->no_capture, "run without capture (nothing allocated) and without the replay");
  cmd->add_option("--ep", o->ep,
                  "expert-parallel ranks: > 1 runs N ranks (N GPUs over NCCL when present, else loopback), rebalances with EPLB, captures and replays")
      ->check(integer_in(1, 64))
      ->capture_default_str();
  cmd->add_option("--eplb-redundant", o->eplb_redundant,
                  "with --ep: EPLB replica slots beyond the experts, over all ranks, in [0, E x (N - 1)] (default: one per rank)")
      ->capture_default_str();
  cmd->callback([o, cmd] {
    o->eplb_redundant_given = cmd->count("--eplb-redundant") > 0;
    const Status st = cmd->count("--model") > 0 && o->model_dir.empty()
                          ? InvalidArgument("--model: the option is empty; give a model folder")
                          : run_run(*o);
    finish(st.ok() ? kExitOk : report_error("run", st));
  });
}

}  // namespace moekit::tools

// `moekit route`: route a dump of router logits with the CPU routing spec and
// write the ids and weights, to compare against another engine's routing.
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "memory_budget.h"
#include "moekit/io.h"
#include "moekit/routing.h"
#include "output_paths.h"

namespace moekit::tools {
namespace {

struct RouteOptions {
  RoutingFlags routing;
  std::string logits_path;
  std::string bias_path;
  std::string ids_path;
  std::string weights_path;
  std::string counts_path;
  bool counts_given = false, bias_given = false;  // the optional path flags, given (even as "")
};

// Logits as route_cpu takes them: [M, E] f32 or bf16 (f16 widened to f32).
StatusOr<HostTensor> load_logits(const std::string& path) {
  MOEKIT_ASSIGN_OR_RETURN(HostTensor t, io::read_npy(path));
  if (t.shape().size() != 2) {
    return InvalidArgument(path + ": logits must be [M, E], got rank " + std::to_string(t.shape().size()));
  }
  if (t.shape()[0] < 1 || t.shape()[1] < 1) return InvalidArgument(path + ": logits are empty");
  switch (t.dtype()) {
    case DType::kF32:
    case DType::kBF16: return t;
    case DType::kF16: return io::convert(t.view(), DType::kF32);
    case DType::kF8E4M3:
    case DType::kI32:
    case DType::kI16:
    case DType::kU8: break;
  }
  return InvalidArgument(path + ": logits must be f32 or bf16, got " + dtype_name(t.dtype()));
}

// The score bias as route_cpu takes it: [E] f32.
StatusOr<HostTensor> load_bias(const std::string& path, int64_t num_experts) {
  // The header first: a file of another shape is refused before its data is read.
  MOEKIT_ASSIGN_OR_RETURN(const io::NpyInfo info, io::read_npy_info(path));
  if (info.shape != std::vector<int64_t>{num_experts}) {
    return InvalidArgument(path + ": bias must be [" + std::to_string(num_experts) + "] (one per expert), got " +
                           TensorView::contiguous(nullptr, info.dtype, info.shape).shape_string());
  }
  MOEKIT_ASSIGN_OR_RETURN(HostTensor t, io::read_npy(path));
  switch (t.dtype()) {
    case DType::kF32: return t;
    case DType::kBF16:
    case DType::kF16: return io::convert(t.view(), DType::kF32);
    case DType::kF8E4M3:
    case DType::kI32:
    case DType::kI16:
    case DType::kU8: break;
  }
  return InvalidArgument(path + ": bias must be f32 or bf16, got " + dtype_name(t.dtype()));
}

// Logits (and their f32 copy when f16), ids and weights, and the encoded files.
Status check_route_memory(const RouteOptions& o) {
  MOEKIT_ASSIGN_OR_RETURN(const io::NpyInfo info, io::read_npy_info(o.logits_path));
  if (info.shape.size() != 2) return Status::Ok();  // load_logits says what is wrong
  const double M = static_cast<double>(info.shape[0]), E = static_cast<double>(info.shape[1]);
  const double logits = M * E * static_cast<double>(dtype_size(info.dtype)) * (info.dtype == DType::kF16 ? 3.0 : 1.0);
  const double outputs = 2.0 * (M * o.routing.top_k * 8.0 + E * 4.0);
  return check_memory("route", logits + outputs);
}

// One line on success: what was routed, where it went, and how loaded the
// busiest expert is (a quick sign of a skewed dump).
void print_route_summary(const RoutingConfig& cfg, int64_t M, int64_t E, const HostTensor& counts,
                         const std::vector<std::pair<std::string, std::vector<uint8_t>>>& files) {
  const int32_t* c = counts.data<int32_t>();
  int64_t busiest = 0, used = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (c[e] > c[busiest]) busiest = e;
    used += c[e] > 0;
  }
  std::string written;
  for (const auto& [path, bytes] : files) written += (written.empty() ? "" : ", ") + path;
  std::printf("moekit route: %" PRId64 " tokens, %s top-%d of %" PRId64 " experts (%" PRId64
              " used; busiest: expert %" PRId64 " with %d tokens); wrote %s\n",
              M, routing_method_name(cfg.method), cfg.top_k, E, used, busiest, c[busiest], written.c_str());
}

Status run_route(const RouteOptions& o) {
  std::vector<PathFlag> outputs = {{"--out-ids", o.ids_path}, {"--out-weights", o.weights_path}};
  std::vector<PathFlag> inputs = {{"--logits", o.logits_path}};
  if (o.counts_given) outputs.push_back({"--out-counts", o.counts_path});
  if (o.bias_given) inputs.push_back({"--bias", o.bias_path});
  MOEKIT_RETURN_IF_ERROR(check_output_paths(outputs, inputs));
  MOEKIT_RETURN_IF_ERROR(check_route_memory(o));
  MOEKIT_ASSIGN_OR_RETURN(HostTensor logits, load_logits(o.logits_path));
  const int64_t M = logits.shape()[0];
  const int64_t E = logits.shape()[1];
  const bool has_bias = !o.bias_path.empty();
  MOEKIT_ASSIGN_OR_RETURN(RoutingConfig cfg, routing_config_from(o.routing, E, has_bias));
  HostTensor bias;  // [E] f32, or empty
  if (has_bias) {
    MOEKIT_ASSIGN_OR_RETURN(bias, load_bias(o.bias_path, E));
  }
  HostTensor ids(DType::kI32, {M, cfg.top_k});      // [M, k] i32
  HostTensor weights(DType::kF32, {M, cfg.top_k});  // [M, k] f32
  HostTensor counts(DType::kI32, {E});              // [E] i32
  RoutingArgs args;
  args.logits = logits.view();
  if (has_bias) args.score_bias = bias.view();
  args.topk_ids = ids.view();
  args.topk_weights = weights.view();
  args.expert_counts = counts.view();
  MOEKIT_RETURN_IF_ERROR(route_cpu(cfg, args));

  // Encode everything, then write all files or none.
  std::vector<std::pair<std::string, std::vector<uint8_t>>> files;
  auto add = [&files](const std::string& path, const HostTensor& t) -> Status {
    MOEKIT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, io::encode_npy(t.view()));
    files.emplace_back(path, std::move(bytes));
    return Status::Ok();
  };
  MOEKIT_RETURN_IF_ERROR(add(o.ids_path, ids));
  MOEKIT_RETURN_IF_ERROR(add(o.weights_path, weights));
  if (!o.counts_path.empty()) MOEKIT_RETURN_IF_ERROR(add(o.counts_path, counts));
  MOEKIT_RETURN_IF_ERROR(io::write_files_atomic(files));
  print_route_summary(cfg, M, E, counts, files);
  return Status::Ok();
}

}  // namespace

void add_route_command(CLI::App& app) {
  auto opts = std::make_shared<RouteOptions>();
  CLI::App* cmd = app.add_subcommand(
      "route", "Route a dump of router logits [M, E] (.npy, f32 or raw bf16) with moekit's routing spec");
  add_routing_flags(cmd, &opts->routing, /*top_k_required=*/true);
  cmd->add_option("--bias", opts->bias_path, "deepseek_v3: e_score_correction_bias [E] .npy (selection only)");
  cmd->add_option("--logits", opts->logits_path, "router logits [M, E] .npy")->required();
  cmd->add_option("--out-ids", opts->ids_path, "output: expert ids [M, k] i32 .npy")->required();
  cmd->add_option("--out-weights", opts->weights_path, "output: weights [M, k] f32 .npy")->required();
  cmd->add_option("--out-counts", opts->counts_path, "output: tokens per expert [E] i32 .npy");
  cmd->callback([opts, cmd] {
    opts->counts_given = cmd->count("--out-counts") > 0;
    opts->bias_given = cmd->count("--bias") > 0;
    const Status s = run_route(*opts);
    finish(s.ok() ? kExitOk : report_error("route", s));
  });
}

}  // namespace moekit::tools

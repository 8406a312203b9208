#include "cli_util.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <limits>

#include "flag_checks.h"
#include "moekit/oracle.h"

namespace moekit::tools {

std::string one_line(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

int report_error(std::string_view command, const Status& status) {
  std::cerr << "moekit " << command << ": error: " << one_line(status.to_string()) << "\n";
  return status.code() == StatusCode::kInternal ? kExitInternal : kExitBadInput;
}

std::string unknown_command(const CLI::App& app, int argc, const char* const* argv) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  if (argc < 2) return "a command is required: one of " + names + " (moekit --help describes them)";
  const std::string first = argv[1];
  if (!first.empty() && first[0] == '-') return {};  // --help; CLI11 answers any other flag
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->check_name(first)) return {};
  }
  return "unknown command '" + one_line(first) + "': one of " + names + " (moekit --help describes them)";
}

std::string command_of(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) return " " + sub->get_name();
  return {};
}

void finish(int code) {
  if (code != kExitOk) throw CLI::RuntimeError(code);
}

std::string routing_method_list() {
  std::string s;
  for (RoutingMethod m : kAllRoutingMethods) {
    if (m == RoutingMethod::kCustom) continue;  // ids come from a file, not from these flags
    s += (s.empty() ? "" : "|") + std::string(routing_method_name(m));
  }
  return s;
}

void add_routing_flags(CLI::App* cmd, RoutingFlags* flags, bool top_k_required) {
  cmd->add_option("--method", flags->method, "routing method: " + routing_method_list())->capture_default_str();
  auto* k = cmd->add_option("--top-k", flags->top_k, "experts per token (k)");
  if (top_k_required) {
    k->required();
  } else {
    k->capture_default_str();
  }
  flags->deepseek_only = {
      cmd->add_option("--num-groups", flags->num_groups, "deepseek_v3: expert groups")->capture_default_str(),
      cmd->add_option("--topk-groups", flags->topk_groups, "deepseek_v3: groups kept per token")->capture_default_str(),
      cmd->add_option("--scaling", flags->scaling, "deepseek_v3: routed scaling factor")
          ->check(finite_positive_f32())
          ->capture_default_str(),
      cmd->add_flag("--no-renormalize", flags->no_renormalize,
                    "deepseek_v3: do not divide the selected scores by their sum (norm_topk_prob = false)"),
  };
}

StatusOr<RoutingConfig> routing_config_from(const RoutingFlags& flags, int64_t num_experts, bool has_bias) {
  const auto method = parse_routing_method(flags.method);
  if (!method || *method == RoutingMethod::kCustom) {
    return InvalidArgument("--method: unknown routing method '" + flags.method + "' (one of " +
                           routing_method_list() + ")");
  }
  if (*method != RoutingMethod::kDeepseekV3) {
    for (const CLI::Option* o : flags.deepseek_only) {
      if (o->count() > 0) return InvalidArgument(o->get_name() + " applies to --method deepseek_v3 only");
    }
    if (has_bias) return InvalidArgument("--bias applies to --method deepseek_v3 only");
  }
  if (num_experts > std::numeric_limits<int>::max()) {
    return InvalidArgument("num_experts " + std::to_string(num_experts) + " is too large");
  }
  RoutingConfig cfg;
  cfg.method = *method;
  cfg.top_k = flags.top_k;
  cfg.num_groups = flags.num_groups;
  cfg.topk_groups = flags.topk_groups;
  cfg.routed_scaling_factor = flags.scaling;
  cfg.renormalize = !flags.no_renormalize;
  cfg.has_score_bias = has_bias;
  MOEKIT_RETURN_IF_ERROR(cfg.validate(static_cast<int>(num_experts)));
  return cfg;
}

void print_gemm_plan(const MoeKernel& kernel, int64_t max_tokens) {
  std::printf("%s", format_gemm_plan(kernel, max_tokens).c_str());
}

}  // namespace moekit::tools

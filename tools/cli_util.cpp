#include "cli_util.h"

#include <iostream>
#include <limits>

namespace moekit::tools {
namespace {

constexpr RoutingMethod kMethods[] = {
    RoutingMethod::kSoftmaxTopk, RoutingMethod::kRenormalize, RoutingMethod::kRenormalizeNaive,
    RoutingMethod::kTopk,        RoutingMethod::kSigmoid,     RoutingMethod::kSigmoidRenorm,
    RoutingMethod::kLlama4,      RoutingMethod::kDeepseekV3,
};

}  // namespace

int report_error(std::string_view command, const Status& status) {
  std::cerr << "moekit " << command << ": error: " << status.to_string() << "\n";
  return status.code() == StatusCode::kInternal ? kExitInternal : kExitBadInput;
}

void finish(int code) {
  if (code != kExitOk) throw CLI::RuntimeError(code);
}

std::string routing_method_list() {
  std::string s;
  for (RoutingMethod m : kMethods) s += (s.empty() ? "" : "|") + std::string(routing_method_name(m));
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
      cmd->add_option("--scaling", flags->scaling, "deepseek_v3: routed scaling factor")->capture_default_str(),
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
  cfg.has_score_bias = has_bias;
  MOEKIT_RETURN_IF_ERROR(cfg.validate(static_cast<int>(num_experts)));
  return cfg;
}

}  // namespace moekit::tools

// `moekit backends`: the oracle's resolution report for a configuration — which
// backend and kernel class would run it, and why every other candidate lost.
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "flag_checks.h"
#include "moekit/checkpoint.h"
#include "moekit/oracle.h"
#include "moekit/platform.h"

namespace moekit::tools {
namespace {

struct BackendsOptions {
  RoutingFlags routing;
  int64_t experts = 128, hidden = 2048, intermediate = 768, max_tokens = 256;
  std::string activation = "silu";
  std::string weight_dtype = "bf16", act_dtype = "bf16", logits_dtype = "f32";
  std::string quant = "none", act_scale = "dynamic";
  bool score_bias = false;
  int tp = 1, ep = 1, dp = 1;
  std::string all2all = "none";
  bool eplb = false, capture = false, replay = false, cpu_only = false;
  std::string backend = "auto";
  std::string model_dir;  // --model: the layer from a model folder's config.json and tensors
  int layer = -1;
  std::vector<const CLI::Option*> layer_description;  // flags config.json describes instead
};

StatusOr<DType> dtype_flag(const std::string& flag, const std::string& value) {
  auto d = parse_dtype(value);
  if (!d) return InvalidArgument(flag + ": unknown dtype '" + value + "'");
  return *d;
}

StatusOr<MoeConfig> config_from(const BackendsOptions& o) {
  MoeConfig c;
  c.num_experts = o.experts;
  c.hidden = o.hidden;
  c.intermediate = o.intermediate;
  c.max_num_tokens = o.max_tokens;
  MOEKIT_ASSIGN_OR_RETURN(c.quant.weight_dtype, dtype_flag("--weight-dtype", o.weight_dtype));
  MOEKIT_ASSIGN_OR_RETURN(c.quant.act_dtype, dtype_flag("--act-dtype", o.act_dtype));
  MOEKIT_ASSIGN_OR_RETURN(c.logits_dtype, dtype_flag("--logits-dtype", o.logits_dtype));
  const std::optional<QuantMethod> quant = parse_quant_method(o.quant);
  if (!quant) {
    return InvalidArgument("--quant: unknown method '" + o.quant + "' (" + name_list(kAllQuantMethods, quant_method_name) +
                           ")");
  }
  c.quant.method = *quant;
  // The method implies its weight dtype unless --weight-dtype says otherwise.
  if (o.weight_dtype == "bf16") c.quant.weight_dtype = default_weight_dtype(c.quant.method);
  const std::optional<ActScale> act_scale = parse_act_scale(o.act_scale);
  if (!act_scale) {
    return InvalidArgument("--act-scale must be " + name_list(kAllActScales, act_scale_name, " or ") + ", got '" +
                           o.act_scale + "'");
  }
  c.quant.act_scale = *act_scale;
  auto act = parse_activation(o.activation);
  if (!act) {
    return InvalidArgument("--activation: unknown activation '" + o.activation + "' (" +
                           name_list(kAllActivations, activation_name) + ")");
  }
  c.activation.kind = *act;
  if (o.routing.method == "custom") {
    // The oracle's answer for caller-supplied routing (not a --method of `route`).
    c.routing.method = RoutingMethod::kCustom;
    c.routing.top_k = o.routing.top_k;
  } else {
    MOEKIT_ASSIGN_OR_RETURN(c.routing, routing_config_from(o.routing, o.experts, o.score_bias));
  }
  c.parallel.tp_size = o.tp;
  c.parallel.ep_size = o.ep;
  c.parallel.dp_size = o.dp;
  if (o.all2all == "none") {
    c.parallel.all2all = All2AllBackend::kNone;
  } else if (o.all2all == "nccl") {
    c.parallel.all2all = All2AllBackend::kNccl;
  } else if (o.all2all == "allgather_reducescatter") {
    c.parallel.all2all = All2AllBackend::kAllgatherReducescatter;
  } else if (o.all2all == "auto") {
    c.parallel.all2all = All2AllBackend::kAuto;
  } else {
    return InvalidArgument("--all2all: one of none|nccl|allgather_reducescatter|auto, got '" + o.all2all + "'");
  }
  c.parallel.enable_eplb = o.eplb;
  c.needs_capture = o.capture;
  c.needs_replay = o.replay;
  c.backend = o.backend;
  MOEKIT_RETURN_IF_ERROR(c.validate());
  return c;
}

// The layer of a model folder (--model DIR --layer N): config.json and the
// tensors describe it; the call's flags (--max-tokens, --capture, --replay,
// --backend) still apply.
StatusOr<MoeConfig> config_of_model(const BackendsOptions& o) {
  for (const CLI::Option* opt : o.layer_description) {
    if (opt->count() > 0) {
      return InvalidArgument(opt->get_name() + ": with --model the layer is described by " + o.model_dir +
                             "/config.json (docs/layer_files.md)");
    }
  }
  if (o.layer < 0) return InvalidArgument("--layer N is required with --model");
  MOEKIT_ASSIGN_OR_RETURN(const CheckpointLayer ck, load_checkpoint_layer(o.model_dir, o.layer));
  std::printf("%s\n", ck.summary().c_str());
  MoeConfig c = ck.config;
  c.max_num_tokens = o.max_tokens;
  c.needs_capture = o.capture;
  c.needs_replay = o.replay;
  c.backend = o.backend;
  MOEKIT_RETURN_IF_ERROR(c.validate());
  return c;
}

Status run_backends(const BackendsOptions& o) {
  MOEKIT_ASSIGN_OR_RETURN(const MoeConfig config, o.model_dir.empty() ? config_from(o) : config_of_model(o));
  const Platform platform = o.cpu_only ? Platform::cpu_only(Platform::probe().cpu_threads) : Platform::probe();
  std::printf("config:   %s\n", config.to_string().c_str());
  std::printf("platform: %s\n", platform.to_string().c_str());
  auto res = select_backend(config, platform);
  if (!res.ok()) return res.status();
  std::printf("%s", res->report_string().c_str());
  // The chosen class's GEMM paths (no weights needed to ask).
  if (const auto kernel = res->kernel.create(config, platform); kernel.ok()) {
    print_gemm_plan(**kernel, config.max_num_tokens);
  } else {
    std::printf("gemm plan: not available (%s)\n", kernel.status().message().c_str());
  }
  if (config.parallel.ep_size > 1) {
    // How an expert-parallel layer of this config would move its tokens (docs/expert_parallel.md).
    MOEKIT_ASSIGN_OR_RETURN(const EpDispatchChoice ep, choose_ep_dispatch(config));
    std::printf("ep dispatch: %s\n", ep.reason.c_str());
  }
  return Status::Ok();
}

}  // namespace

void add_backends_command(CLI::App& app) {
  auto o = std::make_shared<BackendsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "backends", "Show which backend and kernel the oracle picks for a configuration, and why the others lost");
  o->routing.top_k = 8;
  add_routing_flags(cmd, &o->routing, /*top_k_required=*/false);
  cmd->get_option("--method")->description("routing method: " + routing_method_list() + "|custom");
  cmd->add_flag("--score-bias", o->score_bias, "deepseek_v3: the layer has an e_score_correction_bias");
  cmd->add_option("--experts", o->experts, "experts (E)")->capture_default_str();
  cmd->add_option("--hidden", o->hidden, "hidden size (H)")->capture_default_str();
  cmd->add_option("--intermediate", o->intermediate, "expert intermediate size (I)")->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "tokens per call at most")->capture_default_str();
  cmd->add_option("--activation", o->activation, name_list(kAllActivations, activation_name, "|"))->capture_default_str();
  cmd->add_option("--weight-dtype", o->weight_dtype, "f32|bf16")->capture_default_str();
  cmd->add_option("--act-dtype", o->act_dtype, "f32|bf16")->capture_default_str();
  cmd->add_option("--logits-dtype", o->logits_dtype, "f32|bf16")->capture_default_str();
  cmd->add_option("--quant", o->quant, name_list(kAllQuantMethods, quant_method_name, "|") + " (docs/fp8.md, docs/weights_4bit.md)")->capture_default_str();
  cmd->add_option("--act-scale", o->act_scale, "fp8_per_tensor activation scales: " + name_list(kAllActScales, act_scale_name, "|"))
      ->capture_default_str();
  cmd->add_option("--tp", o->tp, "tensor-parallel size")->capture_default_str();
  cmd->add_option("--ep", o->ep, "expert-parallel size")->capture_default_str();
  cmd->add_option("--dp", o->dp, "data-parallel size")->capture_default_str();
  cmd->add_option("--all2all", o->all2all, "none|nccl|allgather_reducescatter|auto")->capture_default_str();
  cmd->add_flag("--eplb", o->eplb, "expert-parallel load balancing on");
  cmd->add_flag("--capture", o->capture, "routed-expert capture needed");
  cmd->add_flag("--replay", o->replay, "forced ids (replay) needed");
  cmd->add_option("--backend", o->backend, "auto, or a backend name (never falls back)")->capture_default_str();
  cmd->add_flag("--cpu-only", o->cpu_only, "resolve as on a machine without a GPU");
  cmd->add_option("--model", o->model_dir, "a model folder: layer --layer N as its config.json and tensors say");
  CLI::Option* layer = cmd->add_option("--layer", o->layer, "with --model: the model layer")
                           ->check(integer_in(0, std::numeric_limits<int>::max()));
  for (const char* name : {"--method", "--top-k", "--num-groups", "--topk-groups", "--scaling", "--no-renormalize", "--score-bias",
                           "--experts", "--hidden", "--intermediate", "--activation", "--weight-dtype", "--act-dtype",
                           "--quant", "--act-scale"}) {
    if (const CLI::Option* opt = cmd->get_option_no_throw(name)) o->layer_description.push_back(opt);
  }
  cmd->callback([o, layer] {
    // --layer names a layer of a model folder; without --model the flags describe the layer.
    const Status st = layer->count() > 0 && o->model_dir.empty()
                          ? InvalidArgument("--layer goes with --model DIR (a layer of a model folder); without "
                                            "--model the flags describe the layer")
                          : run_backends(*o);
    finish(st.ok() ? kExitOk : report_error("backends", st));
  });
}

}  // namespace moekit::tools

#include "moekit/config.h"

#include <cmath>
#include <iterator>
#include <sstream>
#include <utility>

namespace moekit {

namespace {
template <typename Enum, size_t N>
std::optional<Enum> parse_by_name(std::string_view name, const Enum (&all)[N],
                                  const char* (*name_of)(Enum)) {
  for (Enum e : all) {
    if (name == name_of(e)) return e;
  }
  return std::nullopt;
}
std::string field(std::string_view f, const std::string& what) { return std::string(f) + ": " + what; }
}  // namespace

const char* routing_method_name(RoutingMethod m) {
  switch (m) {
    case RoutingMethod::kSoftmaxTopk: return "softmax_topk";
    case RoutingMethod::kRenormalize: return "renormalize";
    case RoutingMethod::kRenormalizeNaive: return "renormalize_naive";
    case RoutingMethod::kTopk: return "topk";
    case RoutingMethod::kSigmoid: return "sigmoid";
    case RoutingMethod::kSigmoidRenorm: return "sigmoid_renorm";
    case RoutingMethod::kLlama4: return "llama4";
    case RoutingMethod::kDeepseekV3: return "deepseek_v3";
    case RoutingMethod::kCustom: return "custom";
  }
  return "?";
}

static_assert(std::size(kAllRoutingMethods) == static_cast<size_t>(RoutingMethod::kCustom) + 1,
              "kAllRoutingMethods lists every RoutingMethod");

std::optional<RoutingMethod> parse_routing_method(std::string_view name) {
  return parse_by_name(name, kAllRoutingMethods, routing_method_name);
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kSiluGated: return "silu";
    case Activation::kGeluGated: return "gelu";
    case Activation::kSwigluOai: return "swiglu_oai";
    case Activation::kRelu2: return "relu2";
  }
  return "?";
}

static_assert(std::size(kAllActivations) == static_cast<size_t>(Activation::kRelu2) + 1,
              "kAllActivations lists every Activation");

std::optional<Activation> parse_activation(std::string_view name) {
  return parse_by_name(name, kAllActivations, activation_name);
}

const char* all2all_name(All2AllBackend b) {
  switch (b) {
    case All2AllBackend::kNone: return "none";
    case All2AllBackend::kNccl: return "nccl";
    case All2AllBackend::kAllgatherReducescatter: return "allgather_reducescatter";
    case All2AllBackend::kAuto: return "auto";
  }
  return "?";
}

Status RoutingConfig::validate(int num_experts) const {
  if (num_experts < 1) return InvalidArgument(field("num_experts", "must be >= 1, got " + std::to_string(num_experts)));
  if (top_k < 1) return InvalidArgument(field("routing.top_k", "must be >= 1, got " + std::to_string(top_k)));
  if (top_k > num_experts) {
    return InvalidArgument(field("routing.top_k", "(" + std::to_string(top_k) + ") must be <= num_experts (" +
                                                      std::to_string(num_experts) + ")"));
  }
  if (num_experts > 32767) {
    return InvalidArgument(field("num_experts", "must be <= 32767 (ids are captured as int16)"));
  }
  if (method == RoutingMethod::kDeepseekV3) {
    if (num_groups < 1) return InvalidArgument(field("routing.num_groups", "must be >= 1"));
    if (num_experts % num_groups != 0) {
      return InvalidArgument(field("routing.num_groups", "num_experts (" + std::to_string(num_experts) +
                                                             ") is not divisible by num_groups (" +
                                                             std::to_string(num_groups) + ")"));
    }
    if (topk_groups < 1 || topk_groups > num_groups) {
      return InvalidArgument(field("routing.topk_groups", "(" + std::to_string(topk_groups) +
                                                              ") must be in [1, num_groups=" +
                                                              std::to_string(num_groups) + "]"));
    }
    const int per_group = num_experts / num_groups;
    if (num_groups > 1 && per_group < 2) {
      return InvalidArgument(field("routing.num_groups", "each group needs >= 2 experts (group score is a top-2 sum)"));
    }
    if (top_k > topk_groups * per_group) {
      return InvalidArgument(field("routing.top_k", "(" + std::to_string(top_k) + ") exceeds the experts in the kept groups (" +
                                                        std::to_string(topk_groups * per_group) + ")"));
    }
    if (!(routed_scaling_factor > 0.0f) || !std::isfinite(routed_scaling_factor)) {
      return InvalidArgument(field("routing.routed_scaling_factor", "must be finite and > 0"));
    }
  } else if (has_score_bias) {
    return InvalidArgument(field("routing.has_score_bias", "a score bias is only used by deepseek_v3"));
  }
  return Status::Ok();
}

std::string RoutingConfig::to_string() const {
  std::ostringstream os;
  os << "{method=" << routing_method_name(method) << ", top_k=" << top_k;
  if (method == RoutingMethod::kDeepseekV3) {
    os << ", num_groups=" << num_groups << ", topk_groups=" << topk_groups
       << ", routed_scaling_factor=" << routed_scaling_factor << ", bias=" << (has_score_bias ? "yes" : "no")
       << ", renormalize=" << (renormalize ? "yes" : "no");
  }
  os << "}";
  return os.str();
}

std::string ActivationConfig::to_string() const {
  std::ostringstream os;
  os << "{kind=" << activation_name(kind);
  if (kind == Activation::kSwigluOai) os << ", limit=" << swiglu_limit << ", alpha=" << swiglu_alpha;
  os << "}";
  return os.str();
}

const char* quant_method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::kNone: return "none";
    case QuantMethod::kFp8Block128: return "fp8_block128";
    case QuantMethod::kFp8PerTensor: return "fp8_per_tensor";
    case QuantMethod::kMxfp4: return "mxfp4";
    case QuantMethod::kInt4G32: return "int4_g32";
    case QuantMethod::kInt4G128: return "int4_g128";
  }
  return "?";
}

static_assert(std::size(kAllQuantMethods) == static_cast<size_t>(QuantMethod::kInt4G128) + 1,
              "kAllQuantMethods lists every QuantMethod");

std::optional<QuantMethod> parse_quant_method(std::string_view name) {
  return parse_by_name(name, kAllQuantMethods, quant_method_name);
}

const char* act_scale_name(ActScale s) {
  switch (s) {
    case ActScale::kDynamic: return "dynamic";
    case ActScale::kStatic: return "static";
  }
  return "?";
}

static_assert(std::size(kAllActScales) == static_cast<size_t>(ActScale::kStatic) + 1,
              "kAllActScales lists every ActScale");

std::optional<ActScale> parse_act_scale(std::string_view name) {
  return parse_by_name(name, kAllActScales, act_scale_name);
}

Status QuantScheme::validate() const {
  if (act_dtype != DType::kF32 && act_dtype != DType::kBF16) {
    return InvalidArgument(field("quant.act_dtype", std::string("must be f32 or bf16, got ") + dtype_name(act_dtype)));
  }
  switch (quant_family(method)) {
    case QuantFamily::kNone:
      if (weight_dtype != DType::kF32 && weight_dtype != DType::kBF16) {
        return InvalidArgument(field("quant.weight_dtype", std::string("must be f32 or bf16 for method none, got ") +
                                                               dtype_name(weight_dtype)));
      }
      break;
    case QuantFamily::kFp8:
    case QuantFamily::kWeight4: {
      const DType want = quant_family(method) == QuantFamily::kFp8 ? DType::kF8E4M3 : DType::kU8;
      if (weight_dtype != want) {
        return InvalidArgument(field("quant.weight_dtype", std::string("must be ") + dtype_name(want) +
                                                               " for method " + quant_method_name(method) + ", got " +
                                                               dtype_name(weight_dtype)));
      }
      break;
    }
  }
  if (method != QuantMethod::kFp8PerTensor && act_scale != ActScale::kDynamic) {
    return InvalidArgument(field("quant.act_scale", std::string("static activation scales belong to fp8_per_tensor, "
                                                                "not ") + quant_method_name(method)));
  }
  return Status::Ok();
}

std::string QuantScheme::to_string() const {
  std::string s = std::string("{method=") + quant_method_name(method) + ", weights=" + dtype_name(weight_dtype) +
                  ", acts=" + dtype_name(act_dtype);
  if (method == QuantMethod::kFp8PerTensor) s += std::string(", act_scale=") + act_scale_name(act_scale);
  return s + "}";
}

Status ParallelConfig::validate() const {
  auto check = [](const char* name, int size, int rank) -> Status {
    if (size < 1) return InvalidArgument(std::string("parallel.") + name + "_size: must be >= 1");
    if (rank < 0 || rank >= size) {
      return InvalidArgument(std::string("parallel.") + name + "_rank: " + std::to_string(rank) +
                             " not in [0, " + std::to_string(size) + ")");
    }
    return Status::Ok();
  };
  MOEKIT_RETURN_IF_ERROR(check("tp", tp_size, tp_rank));
  MOEKIT_RETURN_IF_ERROR(check("ep", ep_size, ep_rank));
  MOEKIT_RETURN_IF_ERROR(check("dp", dp_size, dp_rank));
  if (use_all2all() && all2all == All2AllBackend::kNone) {
    return InvalidArgument("parallel.all2all: dp > 1 and ep > 1 need an all-to-all backend");
  }
  return Status::Ok();
}

std::string ParallelConfig::to_string() const {
  std::ostringstream os;
  os << "{tp=" << tp_size << ", ep=" << ep_size << ", dp=" << dp_size << ", all2all=" << all2all_name(all2all)
     << ", eplb=" << (enable_eplb ? "on" : "off") << "}";
  return os.str();
}

Status MoeConfig::validate() const {
  if (num_experts < 1) return InvalidArgument(field("num_experts", "must be >= 1, got " + std::to_string(num_experts)));
  if (hidden < 1) return InvalidArgument(field("hidden", "must be >= 1, got " + std::to_string(hidden)));
  if (intermediate < 1) return InvalidArgument(field("intermediate", "must be >= 1, got " + std::to_string(intermediate)));
  if (max_num_tokens < 1) return InvalidArgument(field("max_num_tokens", "must be >= 1, got " + std::to_string(max_num_tokens)));
  if (logits_dtype != DType::kF32 && logits_dtype != DType::kBF16) {
    return InvalidArgument(field("logits_dtype", std::string("must be f32 or bf16, got ") + dtype_name(logits_dtype)));
  }
  MOEKIT_RETURN_IF_ERROR(quant.validate());
  if (activation.kind == Activation::kSwigluOai && !(activation.swiglu_limit > 0.0f)) {
    return InvalidArgument(field("activation.swiglu_limit", "must be > 0"));
  }
  // Range first: routing.validate takes an int, and narrowing 2^32 + 16 would check 16.
  if (num_experts > 32767) {
    return InvalidArgument(field("num_experts", "must be <= 32767 (ids are captured as int16), got " +
                                                    std::to_string(num_experts)));
  }
  MOEKIT_RETURN_IF_ERROR(routing.validate(static_cast<int>(num_experts)));
  MOEKIT_RETURN_IF_ERROR(parallel.validate());
  if (shared_intermediate < 0) {
    return InvalidArgument(field("shared_intermediate", "must be >= 0 (0: no shared expert), got " +
                                                            std::to_string(shared_intermediate)));
  }
  if (has_shared_gate && shared_intermediate == 0) {
    return InvalidArgument(field("has_shared_gate", "a shared-expert gate needs a shared expert (shared_intermediate > 0)"));
  }
  // TODO(fp8): expert biases and shared experts in the fp8 schemes (their
  // weights would need scales of their own); refused rather than half-served.
  if (quant.is_fp8() && (has_expert_bias || shared_intermediate > 0)) {
    return InvalidArgument(field("quant.method", std::string(quant_method_name(quant.method)) +
                                                     " does not take expert biases or a shared expert yet"));
  }
  if (quant.is_weight4()) {
    // TODO(weight4): a shared expert (its own packed weights and scales).
    if (shared_intermediate > 0) {
      return InvalidArgument(field("quant.method", std::string(quant_method_name(quant.method)) +
                                                       " does not take a shared expert yet"));
    }
    const int64_t g = weight4_group(quant.method);
    for (const auto& [name, n] : {std::pair<const char*, int64_t>{"hidden", hidden}, {"intermediate", intermediate}}) {
      if (n % g != 0) {
        return InvalidArgument(field(name, std::to_string(n) + " is not a multiple of " +
                                               quant_method_name(quant.method) + "'s group of " + std::to_string(g) +
                                               " input columns"));
      }
    }
  }
  if (batch_invariant && quant.method == QuantMethod::kFp8PerTensor && quant.act_scale == ActScale::kDynamic) {
    // One activation scale per call: every row depends on the batch's amax.
    return InvalidArgument(field("batch_invariant", "cannot hold with fp8_per_tensor's dynamic activation scale "
                                                    "(one amax over the batch); use act_scale=static or fp8_block128"));
  }
  if (parallel.ep_size > 1 && quant.method == QuantMethod::kFp8PerTensor && quant.act_scale == ActScale::kDynamic) {
    // Each rank sees its own pairs only, never the whole GEMM input.
    return InvalidArgument(field("quant.act_scale", "fp8_per_tensor's dynamic activation scale is one amax over "
                                                    "the batch, which no expert-parallel rank sees; use "
                                                    "act_scale=static or fp8_block128"));
  }
  if (needs_replay && routing.method == RoutingMethod::kCustom) {
    return InvalidArgument(field("needs_replay", "custom routing supplies its own ids; replay does not apply"));
  }
  return kernel_options_in_effect(kernel).validate();  // the environment's overrides are checked too
}

std::string MoeConfig::to_string() const {
  std::ostringstream os;
  os << "MoeConfig{E=" << num_experts << ", k=" << routing.top_k << ", H=" << hidden << ", I=" << intermediate
     << ", max_tokens=" << max_num_tokens << ", logits=" << dtype_name(logits_dtype) << ", quant=" << quant.to_string()
     << ", activation=" << activation.to_string() << ", routing=" << routing.to_string()
     << ", parallel=" << parallel.to_string() << ", backend=" << backend
     << ", capture=" << (needs_capture ? "yes" : "no") << ", replay=" << (needs_replay ? "yes" : "no");
  if (has_expert_bias) os << ", expert_bias=yes";
  if (shared_intermediate > 0) {
    os << ", shared_I=" << shared_intermediate << (has_shared_gate ? " (gated)" : "")
       << (shared_expert_overlap ? " (side stream)" : "");
  }
  if (batch_invariant) os << ", batch_invariant";
  if (!kernel.empty()) os << ", kernel{" << kernel.to_string() << "}";
  os << "}";
  return os.str();
}

}  // namespace moekit

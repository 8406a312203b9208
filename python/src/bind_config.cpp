// moekit.MoeConfig: the C++ MoeConfig, built from keywords. Names are parsed
// and the whole config validated by the library (MoeConfig::validate).
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "bind.h"
#include "convert.h"
#include "moekit/config.h"

namespace moekit::python {

namespace {

DType dtype_named(const std::string& field, const std::string& name) {
  // torch's names as well as moekit's, so torch.bfloat16 -> "bfloat16" works.
  static const std::pair<const char*, DType> kAliases[] = {
      {"float32", DType::kF32}, {"bfloat16", DType::kBF16}, {"float16", DType::kF16}};
  for (const auto& [alias, dtype] : kAliases) {
    if (name == alias) return dtype;
  }
  const std::optional<DType> d = parse_dtype(name);
  if (!d) throw nb::value_error((field + ": unknown dtype '" + name + "' (f32, bf16, ...)").c_str());
  return *d;
}

// deepseek_v3's keywords, with the CLI's rule (tools/cli_util.cpp,
// routing_config_from): given for another method, they are refused, never ignored.
void refuse_unless_deepseek_v3(RoutingMethod method, const std::string& routing, const char* name, bool given) {
  if (given && method != RoutingMethod::kDeepseekV3) {
    throw nb::value_error((std::string(name) + " applies to routing='deepseek_v3' only (this config routes with '" +
                           routing + "')").c_str());
  }
}

template <typename Enum, size_t N>
std::vector<std::string> names_of(const Enum (&all)[N], const char* (*name_of)(Enum)) {
  std::vector<std::string> names;
  for (Enum e : all) names.emplace_back(name_of(e));
  return names;
}

MoeConfig make_config(nb::handle num_experts, nb::handle top_k, nb::handle hidden_size,
                      nb::handle intermediate_size, const std::string& routing, nb::handle num_groups,
                      nb::handle topk_groups, std::optional<double> routed_scaling_factor,
                      const std::string& activation, nb::handle max_num_tokens, const std::string& backend,
                      const std::string& weight_dtype, const std::string& act_dtype, const std::string& logits_dtype,
                      bool capture, std::optional<bool> replay, std::optional<bool> renormalize,
                      bool batch_invariant, const std::string& quant, const std::string& act_scale,
                      const std::map<std::string, std::string>& kernel) {
  MoeConfig c;
  // Every integer is range-checked as the Python int it is, before it is
  // narrowed to its C++ field (2**32 + 16 experts once read as 16).
  c.num_experts = int_arg("num_experts", num_experts, 1, 32767);
  c.hidden = int_arg("hidden_size", hidden_size, 1, INT64_MAX);
  c.intermediate = int_arg("intermediate_size", intermediate_size, 1, INT64_MAX);
  c.max_num_tokens = int_arg("max_num_tokens", max_num_tokens, 1, INT64_MAX);
  const std::optional<RoutingMethod> method = parse_routing_method(routing);
  if (!method) throw nb::value_error(("routing: unknown routing method '" + routing + "'").c_str());
  c.routing.method = *method;
  c.routing.top_k = static_cast<int>(int_arg("top_k", top_k, 1, INT32_MAX));
  refuse_unless_deepseek_v3(*method, routing, "num_groups", !num_groups.is_none());
  refuse_unless_deepseek_v3(*method, routing, "topk_groups", !topk_groups.is_none());
  refuse_unless_deepseek_v3(*method, routing, "routed_scaling_factor", routed_scaling_factor.has_value());
  // renormalize=True is every method's behaviour; only False (the CLI's --no-renormalize) is deepseek_v3's.
  refuse_unless_deepseek_v3(*method, routing, "renormalize=False", renormalize == false);
  if (!num_groups.is_none()) c.routing.num_groups = static_cast<int>(int_arg("num_groups", num_groups, 1, INT32_MAX));
  if (!topk_groups.is_none()) {
    c.routing.topk_groups = static_cast<int>(int_arg("topk_groups", topk_groups, 1, INT32_MAX));
  }
  if (routed_scaling_factor) {
    const double f = *routed_scaling_factor;
    if (!std::isfinite(f) || !(f > 0.0) || f > static_cast<double>(std::numeric_limits<float>::max())) {
      throw nb::value_error(("routed_scaling_factor: must be finite, > 0 and fit a float32, got " +
                             std::string(nb::repr(nb::float_(f)).c_str())).c_str());
    }
    c.routing.routed_scaling_factor = static_cast<float>(f);
  }
  c.routing.renormalize = renormalize.value_or(true);
  const std::optional<Activation> act = parse_activation(activation);
  if (!act) {
    throw nb::value_error(("activation: unknown activation '" + activation + "' (" +
                           name_list(kAllActivations, activation_name) + ")").c_str());
  }
  c.activation.kind = *act;
  c.quant.weight_dtype = dtype_named("weight_dtype", weight_dtype);
  const std::optional<QuantMethod> method_q = parse_quant_method(quant);
  if (!method_q) {
    throw nb::value_error(
        ("quant: unknown method '" + quant + "' (" + name_list(kAllQuantMethods, quant_method_name) + ")").c_str());
  }
  c.quant.method = *method_q;
  // The default weight dtype follows the method (e4m3 for fp8, packed u8 for 4-bit).
  if (weight_dtype == "bf16") c.quant.weight_dtype = default_weight_dtype(c.quant.method);
  const std::optional<ActScale> scale = parse_act_scale(act_scale);
  if (!scale) {
    throw nb::value_error(("act_scale: must be " + name_list(kAllActScales, act_scale_name, " or ") + ", got '" +
                           act_scale + "'").c_str());
  }
  c.quant.act_scale = *scale;
  c.quant.act_dtype = dtype_named("act_dtype", act_dtype);
  c.logits_dtype = dtype_named("logits_dtype", logits_dtype);
  c.backend = backend;
  c.needs_capture = capture;
  c.batch_invariant = batch_invariant;
  // Replay forces ids through the routing method; custom routing has none, so off by default there.
  c.needs_replay = replay.value_or(c.routing.method != RoutingMethod::kCustom);
  for (const auto& [name, value] : kernel) throw_if_error(c.kernel.set(name, value));
  throw_if_error(c.validate());
  return c;
}

}  // namespace

void bind_config(nb::module_& m) {
  nb::class_<MoeConfig>(m, "MoeConfig",
                        "An MoE layer's configuration (plain data, validated on construction).")
      .def(nb::new_(&make_config), nb::kw_only(), nb::arg("num_experts"), nb::arg("top_k"), nb::arg("hidden_size"),
           nb::arg("intermediate_size"), nb::arg("routing") = "softmax_topk", nb::arg("num_groups").none() = nb::none(),
           nb::arg("topk_groups").none() = nb::none(), nb::arg("routed_scaling_factor").none() = nb::none(),
           nb::arg("activation") = "silu",
           nb::arg("max_num_tokens") = 4096, nb::arg("backend") = "auto", nb::arg("weight_dtype") = "bf16",
           nb::arg("act_dtype") = "bf16", nb::arg("logits_dtype") = "f32", nb::arg("capture") = true,
           nb::arg("replay").none() = nb::none(), nb::arg("renormalize").none() = nb::none(),
           nb::arg("batch_invariant") = false, nb::arg("quant") = "none", nb::arg("act_scale") = "dynamic",
           nb::arg("kernel") = std::map<std::string, std::string>{})
      .def_prop_ro("num_experts", [](const MoeConfig& c) { return c.num_experts; })
      .def_prop_ro("top_k", [](const MoeConfig& c) { return c.top_k(); })
      .def_prop_ro("hidden_size", [](const MoeConfig& c) { return c.hidden; })
      .def_prop_ro("intermediate_size", [](const MoeConfig& c) { return c.intermediate; })
      .def_prop_ro("routing", [](const MoeConfig& c) { return std::string(routing_method_name(c.routing.method)); })
      .def_prop_ro("num_groups", [](const MoeConfig& c) { return c.routing.num_groups; })
      .def_prop_ro("topk_groups", [](const MoeConfig& c) { return c.routing.topk_groups; })
      .def_prop_ro("routed_scaling_factor", [](const MoeConfig& c) { return c.routing.routed_scaling_factor; })
      .def_prop_ro("activation", [](const MoeConfig& c) { return std::string(activation_name(c.activation.kind)); })
      .def_prop_ro("max_num_tokens", [](const MoeConfig& c) { return c.max_num_tokens; })
      .def_prop_ro("backend", [](const MoeConfig& c) { return c.backend; })
      .def_prop_ro("weight_dtype", [](const MoeConfig& c) { return std::string(dtype_name(c.quant.weight_dtype)); })
      .def_prop_ro("quant", [](const MoeConfig& c) { return std::string(quant_method_name(c.quant.method)); })
      .def_prop_ro("act_scale", [](const MoeConfig& c) { return std::string(act_scale_name(c.quant.act_scale)); })
      .def_prop_ro("act_dtype", [](const MoeConfig& c) { return std::string(dtype_name(c.quant.act_dtype)); })
      .def_prop_ro("logits_dtype", [](const MoeConfig& c) { return std::string(dtype_name(c.logits_dtype)); })
      .def_prop_ro("capture", [](const MoeConfig& c) { return c.needs_capture; })
      .def_prop_ro("replay", [](const MoeConfig& c) { return c.needs_replay; })
      .def_prop_ro("renormalize", [](const MoeConfig& c) { return c.routing.renormalize; })
      .def_prop_ro("expert_bias", [](const MoeConfig& c) { return c.has_expert_bias; })
      .def_prop_ro("shared_intermediate_size", [](const MoeConfig& c) { return c.shared_intermediate; })
      .def_prop_ro("shared_gate", [](const MoeConfig& c) { return c.has_shared_gate; })
      .def_prop_ro("batch_invariant", [](const MoeConfig& c) { return c.batch_invariant; })
      .def_prop_ro("kernel", [](const MoeConfig& c) { return c.kernel.to_string(); })
      .def("__repr__", [](const MoeConfig& c) { return c.to_string(); });
  m.def("routing_methods", [] { return names_of(kAllRoutingMethods, routing_method_name); },
        "Every routing method's name, in the spec's order (the library's own list).");
  m.def("activations", [] { return names_of(kAllActivations, activation_name); },
        "Every activation's name (the library's own list).");
  m.def("quant_methods", [] { return names_of(kAllQuantMethods, quant_method_name); },
        "Every quantization method's name (the library's own list).");
}

}  // namespace moekit::python

#include "util/reference_params.h"

#include <utility>

namespace moekit::testing {
namespace {

// The reference's activation names, spelled out here rather than taken from
// activation_name(), so a renamed display string cannot change what is checked.
const char* ref_activation(Activation a) {
  switch (a) {
    case Activation::kSiluGated: return "silu";
    case Activation::kGeluGated: return "gelu";
    case Activation::kSwigluOai: return "swiglu_oai";
    case Activation::kRelu2: return "relu2";
  }
  return "?";
}

}  // namespace

moekit_ref::RoutingParams ref_routing(const RoutingConfig& routing, std::vector<double> bias) {
  moekit_ref::RoutingParams p;
  p.method = routing_method_name(routing.method);
  p.top_k = routing.top_k;
  p.num_groups = routing.num_groups;
  p.topk_groups = routing.topk_groups;
  p.scaling = routing.routed_scaling_factor;
  p.renormalize = routing.renormalize;
  p.bias = std::move(bias);
  return p;
}

moekit_ref::LayerParams ref_layer(const MoeConfig& config) {
  moekit_ref::LayerParams p;
  p.activation = ref_activation(config.activation.kind);
  p.swiglu_limit = config.activation.swiglu_limit;
  p.swiglu_alpha = config.activation.swiglu_alpha;
  p.E = config.num_experts;
  p.H = config.hidden;
  p.I = config.intermediate;
  return p;
}

}  // namespace moekit::testing

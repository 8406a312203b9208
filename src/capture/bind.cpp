// bind(model, capturer): every MoE layer gets buffer[layer] as its capture
// target, after every layer has been checked (nothing half-bound on error).
#include <string>

#include "moekit/capture.h"

namespace moekit {

namespace {
std::string layer_name(const Model& model, int l) {
  return "MoE layer " + std::to_string(l) + " (model layer " + std::to_string(model.model_layer_index(l)) + ")";
}

bool same_routing(const RoutingConfig& a, const RoutingConfig& b) {
  return a.method == b.method && a.top_k == b.top_k && a.num_groups == b.num_groups &&
         a.topk_groups == b.topk_groups && a.routed_scaling_factor == b.routed_scaling_factor &&
         a.has_score_bias == b.has_score_bias;
}
}  // namespace

Status bind(Model& model, RoutedExpertsCapturer& capturer) {
  const int layers = model.num_layers();
  if (layers == 0) return InvalidArgument("bind: the model has no MoE layers to capture");
  if (layers != capturer.num_moe_layers()) {
    return InvalidArgument("bind: the model has " + std::to_string(layers) + " MoE layers, the capturer " +
                           std::to_string(capturer.num_moe_layers()));
  }
  if (!capturer.enabled()) {
    // Capture off: no layer writes ids, and nothing was allocated.
    for (int l = 0; l < layers; ++l) MOEKIT_RETURN_IF_ERROR(model.layer(l).set_capture_target({}));
    capturer.bound_ = true;
    return Status::Ok();
  }

  const MoeConfig& first = model.layer(0).config();
  for (int l = 0; l < layers; ++l) {
    const RoutedLayer& layer = model.layer(l);
    const MoeConfig& cfg = layer.config();
    const std::string name = layer_name(model, l);
    // Checked for every layer before any is bound (MoeLayer::capture_supported).
    if (Status s = layer.capture_supported(); !s.ok()) {
      return Unsupported("bind: " + name + " runs " + s.message() +
                         "; capture would return nothing. Use a modular kernel or a capture-capable one "
                         "(MoeConfig.needs_capture = true makes the oracle choose one)");
    }
    if (cfg.top_k() != capturer.top_k()) {
      return InvalidArgument("bind: " + name + " has top_k " + std::to_string(cfg.top_k()) + ", the capturer " +
                             std::to_string(capturer.top_k()));
    }
    if (!(layer.device() == capturer.device())) {
      return InvalidArgument("bind: " + name + " runs on " + layer.device().to_string() +
                             ", the capture buffer is on " + capturer.device().to_string());
    }
    if (cfg.max_num_tokens > capturer.max_num_tokens()) {
      return InvalidArgument("bind: " + name + " takes up to " + std::to_string(cfg.max_num_tokens) +
                             " tokens per call, the capture buffer holds " +
                             std::to_string(capturer.max_num_tokens()) + " rows");
    }
    if (cfg.num_experts != first.num_experts || !same_routing(cfg.routing, first.routing)) {
      return InvalidArgument("bind: " + name + " (E=" + std::to_string(cfg.num_experts) + ", routing " +
                             cfg.routing.to_string() + ") differs from MoE layer 0 (E=" +
                             std::to_string(first.num_experts) + ", routing " + first.routing.to_string() +
                             "); one capture describes one routing");
    }
  }
  if (capturer.records_router_weights()) {
    for (int l = 0; l < layers; ++l) {
      if (Status s = model.layer(l).router_weights_capture_supported(); !s.ok()) {
        return Unsupported("bind: " + layer_name(model, l) + ": " + s.message());
      }
    }
  }
  for (int l = 0; l < layers; ++l) {
    MOEKIT_RETURN_IF_ERROR(
        model.layer(l).set_capture_target(capturer.layer_target(l), capturer.layer_router_weights_target(l)));
  }

  CaptureInfo info;
  info.routing = first.routing;
  info.num_experts = first.num_experts;
  info.model_layers = model.model_layer_indices();
  if (capturer.records_router_weights()) info.router_weights_dtype = DType::kF32;
  // The producing backend/kernel ("cpu/CpuModular"); layers that differ are listed in layer order, once each.
  for (int l = 0; l < layers; ++l) {
    const std::string name = model.layer(l).producer();
    if (info.backend.find(name) == std::string::npos) info.backend += (info.backend.empty() ? "" : ",") + name;
  }
  capturer.info_ = std::move(info);
  capturer.bound_ = true;
  return Status::Ok();
}

}  // namespace moekit

#include "layer/forward_checks.h"

#include <string>

#include "moekit/routing.h"

namespace moekit {

Status check_ids_rows(const TensorView& target, const char* name, int64_t min_rows, const char* rows_for, int k,
                      Device device) {
  MOEKIT_RETURN_IF_ERROR(check_tensor(target, name, {DType::kI16}, {-1, k}, device));
  if (target.dim(0) < min_rows) {
    return InvalidArgument(std::string(name) + ": needs at least " + rows_for + " = " + std::to_string(min_rows) +
                           " rows, got " + target.shape_string());
  }
  return Status::Ok();
}

Status check_capture_targets(const RoutedLayer& layer, const TensorView& ids, const TensorView& router_weights) {
  if (!ids.defined()) {
    if (router_weights.defined()) return InvalidArgument("capture router weights: given without an ids target");
    return Status::Ok();
  }
  const MoeConfig& c = layer.config();
  if (Status s = layer.capture_supported(); !s.ok()) return Unsupported("capture target: " + s.message());
  MOEKIT_RETURN_IF_ERROR(check_ids_rows(ids, "capture target", c.max_num_tokens, "max_num_tokens", c.top_k(),
                                        layer.device()));
  if (router_weights.defined()) {
    if (Status s = layer.router_weights_capture_supported(); !s.ok()) {
      return Unsupported("capture router weights: " + s.message());
    }
    MOEKIT_RETURN_IF_ERROR(check_tensor(router_weights, "capture router weights", {DType::kF32},
                                        {ids.dim(0), c.top_k()}, layer.device()));
  }
  return Status::Ok();
}

Status check_forward_args(const RoutedLayer& layer, const LayerForwardArgs& a) {
  const MoeConfig& c = layer.config();
  const Device dev = layer.device();
  const int64_t H = c.hidden, E = c.num_experts, k = c.top_k();
  if (a.hidden.defined() && a.hidden.dtype != c.quant.act_dtype) {
    // Which dtype the layer computes in, and why: a layer read from a folder follows its weights.
    const std::string why = c.quant.method == QuantMethod::kNone
                                ? std::string("its weights' dtype")
                                : std::string(quant_method_name(c.quant.method)) + " weights take " +
                                      dtype_name(c.quant.act_dtype) + " activations";
    return InvalidArgument("hidden: expected dtype " + std::string(dtype_name(c.quant.act_dtype)) + ", got " +
                           dtype_name(a.hidden.dtype) + " (this layer computes in " +
                           dtype_name(c.quant.act_dtype) + ": " + why + "; convert the hidden states)");
  }
  MOEKIT_RETURN_IF_ERROR(check_tensor(a.hidden, "hidden", {c.quant.act_dtype}, {-1, H}, dev));
  const int64_t m = a.hidden.dim(0);
  if (m < 1 || m > c.max_num_tokens) {
    return InvalidArgument("hidden: " + std::to_string(m) + " tokens; must be in [1, max_num_tokens = " +
                           std::to_string(c.max_num_tokens) + "]");
  }
  MOEKIT_RETURN_IF_ERROR(check_tensor(a.out, "out", {c.quant.act_dtype}, {m, H}, dev));
  if (a.expert_counts.defined()) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.expert_counts, "expert_counts", {DType::kI32}, {E}, dev));
  }
  if (a.routing_replay_out.defined()) {
    if (Status s = layer.capture_supported(); !s.ok()) return Unsupported("routing_replay_out: " + s.message());
    MOEKIT_RETURN_IF_ERROR(
        check_ids_rows(a.routing_replay_out, "routing_replay_out", m, "M", static_cast<int>(k), dev));
  }
  if (c.routing.method == RoutingMethod::kCustom) {
    if (a.forced_ids.defined()) return InvalidArgument("forced_ids: custom routing takes topk_ids instead");
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.topk_ids, "topk_ids", {DType::kI32}, {m, k}, dev));
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.topk_weights, "topk_weights", {DType::kF32}, {m, k}, dev));
    // Ids on a GPU are the device's to check (docs/routing.md: the token's row is NaN).
    return dev.type == DeviceType::kCpu ? check_forced_ids(a.topk_ids, E) : Status::Ok();
  }
  if (a.topk_ids.defined() || a.topk_weights.defined()) {
    return InvalidArgument(std::string("topk_ids/topk_weights: only custom routing takes them; this layer routes with ") +
                           routing_method_name(c.routing.method));
  }
  MOEKIT_RETURN_IF_ERROR(check_tensor(a.router_logits, "router_logits", {c.logits_dtype}, {m, E}, dev));
  if (a.forced_ids.defined()) {
    // Forced ids are validated on the host (range, duplicates, sentinel) before anything runs.
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.forced_ids, "forced_ids", {DType::kI32}, {m, k}, Device::cpu()));
    MOEKIT_RETURN_IF_ERROR(check_forced_ids(a.forced_ids, E));
  }
  return Status::Ok();
}

}  // namespace moekit

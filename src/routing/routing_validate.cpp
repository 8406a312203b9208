// Host-side checks of routing arguments, shared by every backend
// (docs/routing.md, "Arguments" and "Bad logits").
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/dtype.h"
#include "moekit/routing.h"

namespace moekit {

namespace {

std::string at(int64_t row, int64_t col) { return "[" + std::to_string(row) + ", " + std::to_string(col) + "]"; }

template <typename T>
int64_t load_id(const void* data, int64_t i) {
  return static_cast<const T*>(data)[i];
}

}  // namespace

Status check_logits_finite(const TensorView& logits) {
  if (logits.rank != 2) return InvalidArgument("logits: expected rank 2, got " + logits.shape_string());
  if (logits.device.type != DeviceType::kCpu) {
    return InvalidArgument("logits: finiteness can only be checked on the host, got " + logits.device.to_string());
  }
  const int64_t M = logits.shape[0], E = logits.shape[1];
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t i = r * logits.strides[0] + e * logits.strides[1];
      float v = 0.0f;
      switch (logits.dtype) {
        case DType::kF32: v = logits.ptr<const float>()[i]; break;
        case DType::kBF16: v = bf16_bits_to_f32(logits.ptr<const uint16_t>()[i]); break;
        case DType::kF16:
        case DType::kF8E4M3:
        case DType::kI32:
        case DType::kI16:
        case DType::kU8:
          return InvalidArgument(std::string("logits: expected dtype f32|bf16, got ") + dtype_name(logits.dtype));
      }
      if (!std::isfinite(v)) {
        const char* what = std::isnan(v) ? "NaN" : (v > 0 ? "+Inf" : "-Inf");
        return InvalidArgument("logits" + at(r, e) + " (row " + std::to_string(r) + ", expert " + std::to_string(e) +
                               ") is " + what + ": router logits must be finite (docs/routing.md)");
      }
    }
  }
  return Status::Ok();
}

Status check_forced_ids(const TensorView& ids, int64_t num_experts) {
  MOEKIT_RETURN_IF_ERROR(check_tensor(ids, "forced_ids", {DType::kI32, DType::kI16}, {-1, -1}, Device::cpu()));
  const int64_t M = ids.shape[0], k = ids.shape[1];
  std::vector<int64_t> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t v = ids.dtype == DType::kI32 ? load_id<int32_t>(ids.data, r * k + j)
                                                 : load_id<int16_t>(ids.data, r * k + j);
      if (v == -1) {
        return InvalidArgument("forced_ids" + at(r, j) +
                               " is -1, the capture sentinel of an unwritten row: this row was never captured");
      }
      if (v < 0 || v >= num_experts) {
        return OutOfRange("forced_ids" + at(r, j) + " = " + std::to_string(v) + " is not an expert id in [0, " +
                          std::to_string(num_experts) + ")");
      }
      for (int64_t p = 0; p < j; ++p) {
        if (row[p] == v) {
          return InvalidArgument("forced_ids" + at(r, j) + " = " + std::to_string(v) + " duplicates forced_ids" +
                                 at(r, p) + ": a token cannot use an expert twice");
        }
      }
      row[j] = v;
    }
  }
  return Status::Ok();
}

Status validate_routing_args(const RoutingConfig& cfg, const RoutingArgs& args, Device device) {
  if (cfg.method == RoutingMethod::kCustom) {
    return InvalidArgument("routing.method: custom routing has no router (the caller supplies topk_ids/topk_weights)");
  }
  MOEKIT_RETURN_IF_ERROR(check_tensor(args.logits, "logits", {DType::kF32, DType::kBF16}, {-1, -1}, device));
  const int64_t M = args.logits.shape[0];
  const int64_t E = args.logits.shape[1];
  if (E > 32767) {
    return InvalidArgument("logits: " + std::to_string(E) + " experts; at most 32767 (ids are captured as int16)");
  }
  MOEKIT_RETURN_IF_ERROR(cfg.validate(static_cast<int>(E)));
  const int64_t k = cfg.top_k;
  MOEKIT_RETURN_IF_ERROR(check_tensor(args.topk_ids, "topk_ids", {DType::kI32}, {M, k}, device));
  MOEKIT_RETURN_IF_ERROR(check_tensor(args.topk_weights, "topk_weights", {DType::kF32}, {M, k}, device));
  if (args.expert_counts.defined()) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(args.expert_counts, "expert_counts", {DType::kI32}, {E}, device));
  }
  if (args.routing_replay_out.defined()) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(args.routing_replay_out, "routing_replay_out", {DType::kI16}, {-1, k}, device));
    if (args.routing_replay_out.shape[0] < M) {
      return InvalidArgument("routing_replay_out: needs at least M rows (M = " + std::to_string(M) + ", k = " +
                             std::to_string(k) + "), got " + args.routing_replay_out.shape_string());
    }
  }
  if (cfg.has_score_bias) {
    if (!args.score_bias.defined()) {
      return InvalidArgument("score_bias: routing.has_score_bias is set but no score_bias [" + std::to_string(E) +
                             "] f32 was given");
    }
    MOEKIT_RETURN_IF_ERROR(check_tensor(args.score_bias, "score_bias", {DType::kF32}, {E}, device));
  } else if (args.score_bias.defined()) {
    return InvalidArgument("score_bias: given, but routing.has_score_bias is false (the bias would be ignored)");
  }
  if (args.forced_ids.defined()) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(args.forced_ids, "forced_ids", {DType::kI32}, {M, k}, device));
  }
  // Content checks need host-readable data; device kernels apply the device
  // rule of docs/routing.md instead.
  if (device.type == DeviceType::kCpu) {
    if (cfg.has_score_bias) {
      const float* bias = args.score_bias.ptr<const float>();
      for (int64_t e = 0; e < E; ++e) {
        if (!std::isfinite(bias[e])) {
          return InvalidArgument("score_bias[" + std::to_string(e) + "] is not finite");
        }
      }
    }
    if (args.forced_ids.defined()) MOEKIT_RETURN_IF_ERROR(check_forced_ids(args.forced_ids, E));
    MOEKIT_RETURN_IF_ERROR(check_logits_finite(args.logits));
  }
  return Status::Ok();
}

}  // namespace moekit

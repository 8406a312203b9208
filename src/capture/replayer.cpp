// RoutedExpertsReplayer: turns a capture back into per-step forced ids.
#include <set>
#include <string>

#include "moekit/capture.h"
#include "moekit/routing.h"

namespace moekit {

namespace {
std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Every stored id in [0, E), no id twice within one (token, layer) row.
Status check_request_ids(const RequestCapture& r, const CaptureInfo& info) {
  const int layers = info.num_moe_layers();
  const int k = info.top_k();
  const std::vector<int64_t>& shape = r.ids.shape();
  if (r.ids.dtype() != DType::kI16 || shape.size() != 3 || shape[1] != layers || shape[2] != k) {
    return InvalidArgument("request " + quoted(r.request) + ": ids must be i16 [num_tokens, " +
                           std::to_string(layers) + ", " + std::to_string(k) + "], got " +
                           dtype_name(r.ids.dtype()) + " " + r.ids.view().shape_string());
  }
  const int16_t* ids = r.ids.data<int16_t>();
  for (int64_t t = 0; t < shape[0]; ++t) {
    for (int l = 0; l < layers; ++l) {
      const int16_t* row = ids + (t * layers + l) * k;
      for (int j = 0; j < k; ++j) {
        const std::string at = "request " + quoted(r.request) + ", token " + std::to_string(r.first_token + t) +
                               ", MoE layer " + std::to_string(l) + ", slot " + std::to_string(j);
        if (row[j] == kUnwrittenExpertId) return DataLoss(at + ": unwritten row (sentinel -1) in the capture");
        if (row[j] < 0 || row[j] >= info.num_experts) {
          return OutOfRange(at + ": expert id " + std::to_string(row[j]) + " outside [0, " +
                            std::to_string(info.num_experts) + ")");
        }
        for (int i = 0; i < j; ++i) {
          if (row[i] == row[j]) {
            return InvalidArgument(at + ": expert id " + std::to_string(row[j]) + " repeats slot " +
                                   std::to_string(i));
          }
        }
      }
    }
  }
  return Status::Ok();
}
}  // namespace

StatusOr<std::unique_ptr<RoutedExpertsReplayer>> RoutedExpertsReplayer::create(CaptureSet captures,
                                                                               const Model& model) {
  const CaptureInfo& info = captures.info;
  if (model.num_layers() == 0) return InvalidArgument("replay: the model has no MoE layers");
  if (info.num_moe_layers() != model.num_layers()) {
    return InvalidArgument("replay: the capture has " + std::to_string(info.num_moe_layers()) +
                           " MoE layers, the model " + std::to_string(model.num_layers()));
  }
  for (int l = 0; l < model.num_layers(); ++l) {
    const MoeConfig& cfg = model.layer(l).config();
    const std::string name = "replay: MoE layer " + std::to_string(l);
    if (info.model_layers[l] != model.model_layer_index(l)) {
      return InvalidArgument(name + " is model layer " + std::to_string(model.model_layer_index(l)) +
                             " in the model, " + std::to_string(info.model_layers[l]) + " in the capture");
    }
    if (cfg.num_experts != info.num_experts || cfg.top_k() != info.top_k()) {
      return InvalidArgument(name + " has E=" + std::to_string(cfg.num_experts) + ", k=" +
                             std::to_string(cfg.top_k()) + "; the capture E=" + std::to_string(info.num_experts) +
                             ", k=" + std::to_string(info.top_k()));
    }
    if (cfg.routing.method != info.routing.method) {
      return InvalidArgument(name + " routes with " + routing_method_name(cfg.routing.method) +
                             ", the capture was made with " + routing_method_name(info.routing.method));
    }
    if (cfg.routing.method == RoutingMethod::kCustom) {
      return InvalidArgument(name + ": custom routing supplies its own ids; there is nothing to replay");
    }
  }
  std::set<std::string> names;
  for (const RequestCapture& r : captures.requests) {
    if (!names.insert(r.request).second) return InvalidArgument("replay: request " + quoted(r.request) + " appears twice");
    MOEKIT_RETURN_IF_ERROR(check_request_ids(r, info));
  }
  std::unique_ptr<RoutedExpertsReplayer> rp(new RoutedExpertsReplayer());
  for (const RequestCapture& r : captures.requests) rp->cursor_[r.request] = r.first_token;
  rp->captures_ = std::move(captures);
  return rp;
}

Status RoutedExpertsReplayer::start_token(const std::string& request, int64_t token) {
  const RequestCapture* r = captures_.find(request);
  if (r == nullptr) return NotFound("replay: request " + quoted(request) + " is not in the capture");
  if (token < r->first_token || token > r->first_token + r->num_tokens()) {
    return OutOfRange("replay: request " + quoted(request) + " has tokens [" + std::to_string(r->first_token) +
                      ", " + std::to_string(r->first_token + r->num_tokens()) + "); cannot start at " +
                      std::to_string(token));
  }
  cursor_[request] = token;
  return Status::Ok();
}

Status RoutedExpertsReplayer::begin_step(const StepLayout& layout) {
  const int layers = captures_.info.num_moe_layers();
  const int k = captures_.info.top_k();
  std::set<std::string> seen;
  for (const StepSegment& s : layout.segments) {
    const RequestCapture* r = captures_.find(s.request);
    if (r == nullptr) return NotFound("replay: request " + quoted(s.request) + " is not in the capture");
    if (!seen.insert(s.request).second) {
      return InvalidArgument("replay: request " + quoted(s.request) + " appears twice in one step");
    }
    if (s.num_rows < 1) return InvalidArgument("replay: request " + quoted(s.request) + " has no rows in the step");
    const int64_t begin = cursor_.at(s.request);
    const int64_t end = r->first_token + r->num_tokens();
    if (begin + s.num_rows > end) {
      return OutOfRange("replay: request " + quoted(s.request) + " needs tokens [" + std::to_string(begin) + ", " +
                        std::to_string(begin + s.num_rows) + "), the capture holds [" +
                        std::to_string(r->first_token) + ", " + std::to_string(end) + ")");
    }
  }
  const int64_t m = layout.num_rows();
  // forced_ is [layers, M, k]; the capture is [tokens, layers, k].
  std::vector<int32_t> forced(static_cast<size_t>(layers) * m * k);
  int64_t row0 = 0;
  for (const StepSegment& s : layout.segments) {
    const RequestCapture* r = captures_.find(s.request);
    const int64_t t0 = cursor_.at(s.request) - r->first_token;
    const int16_t* src = r->ids.data<int16_t>();
    for (int64_t i = 0; i < s.num_rows; ++i) {
      for (int l = 0; l < layers; ++l) {
        const int16_t* from = src + ((t0 + i) * layers + l) * k;
        int32_t* to = forced.data() + (static_cast<int64_t>(l) * m + row0 + i) * k;
        for (int j = 0; j < k; ++j) to[j] = from[j];
      }
    }
    row0 += s.num_rows;
  }
  for (const StepSegment& s : layout.segments) cursor_[s.request] += s.num_rows;
  forced_ = std::move(forced);
  step_rows_ = m;
  has_step_ = true;
  return Status::Ok();
}

TensorView RoutedExpertsReplayer::forced_ids(int layer) const {
  if (layer < 0 || layer >= captures_.info.num_moe_layers() || step_rows_ == 0) return {};
  const int64_t k = captures_.info.top_k();
  return TensorView::contiguous(const_cast<int32_t*>(forced_.data()) + layer * step_rows_ * k, DType::kI32,
                                {step_rows_, k});
}

}  // namespace moekit

// check_capture: the capture validator. Reports, never fails; each finding
// names its request, token, MoE layer (and model layer) and slot.
#include <algorithm>
#include <set>
#include <string>

#include "moekit/capture_check.h"

namespace moekit {

const char* capture_finding_name(CaptureFindingKind kind) {
  switch (kind) {
    case CaptureFindingKind::kTokenCount: return "token_count";
    case CaptureFindingKind::kPromptBoundary: return "prompt_boundary";
    case CaptureFindingKind::kUnwritten: return "unwritten";
    case CaptureFindingKind::kOutOfRange: return "out_of_range";
    case CaptureFindingKind::kPhysicalId: return "physical_id";
    case CaptureFindingKind::kDuplicate: return "duplicate";
    case CaptureFindingKind::kZeroPadding: return "zero_padding";
    case CaptureFindingKind::kConstantLayer: return "constant_layer";
    case CaptureFindingKind::kDenseLayer: return "dense_layer";
  }
  return "?";
}

int64_t CaptureCheckReport::total() const {
  int64_t n = 0;
  for (const auto& [kind, count] : counts) n += count;
  return n;
}

namespace {

class Reporter {
 public:
  Reporter(const CaptureInfo& info, const CaptureCheckOptions& options, CaptureCheckReport* report)
      : info_(info), options_(options), report_(report) {}

  void add(CaptureFindingKind kind, const std::string& request, int64_t token, int layer, int slot,
           const std::string& what) {
    const int64_t n = ++report_->counts[kind];
    if (n > options_.max_findings_per_kind) return;
    CaptureFinding f{kind, request, token, layer, layer >= 0 ? info_.model_layers[layer] : -1, slot, ""};
    // A finding about the capture as a whole (request "") names no request.
    std::string where = request.empty() ? "" : "request '" + request + "'";
    if (token >= 0) where += ", token " + std::to_string(token);
    if (layer >= 0) {
      where += std::string(where.empty() ? "" : ", ") + "MoE layer " + std::to_string(layer) + " (model layer " +
               std::to_string(f.model_layer) + ")";
    }
    f.message = std::string(capture_finding_name(kind)) + ": " + where;
    if (slot >= 0) f.message += ", slot " + std::to_string(slot);
    f.message += ": " + what;
    report_->findings.push_back(std::move(f));
  }

 private:
  const CaptureInfo& info_;
  const CaptureCheckOptions& options_;
  CaptureCheckReport* report_;
};

std::string row_string(const int16_t* row, int k) {
  std::string s = "[";
  for (int j = 0; j < k; ++j) s += (j ? ", " : "") + std::to_string(row[j]);
  return s + "]";
}

void check_request(const RequestCapture& r, const CaptureInfo& info, const CaptureCheckOptions& options,
                   Reporter& out) {
  const int layers = info.num_moe_layers();
  const int k = info.top_k();
  const int64_t E = info.num_experts;
  const int64_t tokens = r.num_tokens();
  const int16_t* ids = r.ids.data<int16_t>();
  const int64_t num_physical = options.physical_to_logical.empty()
                                   ? options.num_physical_experts
                                   : static_cast<int64_t>(options.physical_to_logical.size());
  auto row_at = [&](int64_t t, int l) { return ids + (t * layers + l) * k; };
  auto is_zero_row = [&](const int16_t* row) { return std::all_of(row, row + k, [](int16_t v) { return v == 0; }); };

  if (auto it = options.expected_tokens.find(r.request); it != options.expected_tokens.end() && it->second != tokens) {
    out.add(CaptureFindingKind::kTokenCount, r.request, -1, -1, -1,
            std::to_string(tokens) + " rows, expected " + std::to_string(it->second) + " tokens");
  }
  if (r.first_generated_token >= 0 &&
      (r.first_generated_token < r.first_token || r.first_generated_token > r.first_token + tokens)) {
    out.add(CaptureFindingKind::kPromptBoundary, r.request, -1, -1, -1,
            "first_generated_token " + std::to_string(r.first_generated_token) + " outside the captured tokens [" +
                std::to_string(r.first_token) + ", " + std::to_string(r.first_token + tokens) +
                "]: prompt rows are missing or misaligned");
  }
  // k = 1 cannot tell padding from expert 0 row by row: a run of >= 2 all-zero
  // tokens at the end of a request is reported as padding.
  int64_t zero_tail = tokens;  // tokens >= zero_tail are padding-like (k = 1 only)
  if (k == 1) {
    while (zero_tail > 0 && [&] {
      for (int l = 0; l < layers; ++l) {
        if (!is_zero_row(row_at(zero_tail - 1, l))) return false;
      }
      return true;
    }()) {
      --zero_tail;
    }
    if (tokens - zero_tail < 2 || zero_tail == 0) zero_tail = tokens;
  }
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t token = r.first_token + t;
    for (int l = 0; l < layers; ++l) {
      const int16_t* row = row_at(t, l);
      if (std::all_of(row, row + k, [](int16_t v) { return v == kUnwrittenExpertId; })) {
        out.add(CaptureFindingKind::kUnwritten, r.request, token, l, -1, "the row holds the sentinel -1 (never captured)");
        continue;
      }
      if ((k >= 2 && is_zero_row(row)) || t >= zero_tail) {
        out.add(CaptureFindingKind::kZeroPadding, r.request, token, l, -1,
                "the row is all expert 0: padding written as 0 where the sentinel -1 belongs");
        continue;
      }
      for (int j = 0; j < k; ++j) {
        const int16_t id = row[j];
        if (id == kUnwrittenExpertId) {
          out.add(CaptureFindingKind::kUnwritten, r.request, token, l, j, "the sentinel -1 in a partly written row " + row_string(row, k));
          continue;
        }
        if (id >= E && id < num_physical) {
          const auto& map = options.physical_to_logical;
          out.add(CaptureFindingKind::kPhysicalId, r.request, token, l, j,
                  "id " + std::to_string(id) + " is outside the " + std::to_string(E) +
                      " logical experts but inside the " + std::to_string(num_physical) +
                      " physical ones: ids captured after the EPLB remap" +
                      (map.empty() ? "" : " (logical expert " + std::to_string(map[id]) + ")"));
          continue;
        }
        if (id < 0 || id >= E) {
          out.add(CaptureFindingKind::kOutOfRange, r.request, token, l, j,
                  "id " + std::to_string(id) + " outside [0, " + std::to_string(E) + ")");
          continue;
        }
        for (int i = 0; i < j; ++i) {
          if (row[i] == id) {
            out.add(CaptureFindingKind::kDuplicate, r.request, token, l, j,
                    "id " + std::to_string(id) + " repeats slot " + std::to_string(i) + " in " + row_string(row, k));
            break;
          }
        }
      }
    }
  }
  if (tokens >= std::max<int64_t>(2, options.min_tokens_constant)) {
    for (int l = 0; l < layers; ++l) {
      const int16_t* first = row_at(0, l);
      bool constant = true;
      for (int64_t t = 1; t < tokens && constant; ++t) constant = std::equal(first, first + k, row_at(t, l));
      if (constant && first[0] != kUnwrittenExpertId) {
        out.add(CaptureFindingKind::kConstantLayer, r.request, -1, l, -1,
                "all " + std::to_string(tokens) + " tokens have the ids " + row_string(first, k) +
                    (is_zero_row(first) ? " (an all-zero layer: the layer's ids were never written)"
                                        : " (a router that ignores its input, or ids never written)"));
      }
    }
  }
}

}  // namespace

CaptureCheckReport check_capture(const CaptureSet& captures, const CaptureCheckOptions& options) {
  CaptureCheckReport report;
  Reporter out(captures.info, options, &report);
  const std::set<int> dense(options.dense_layers.begin(), options.dense_layers.end());
  for (int l = 0; l < captures.info.num_moe_layers(); ++l) {
    if (dense.count(captures.info.model_layers[l])) {
      out.add(CaptureFindingKind::kDenseLayer, "", -1, l, -1,
              "model layer " + std::to_string(captures.info.model_layers[l]) +
                  " is dense (no router) but the capture has a layer for it: the layer axis counts dense layers");
    }
  }
  for (const RequestCapture& r : captures.requests) {
    const std::vector<int64_t>& shape = r.ids.shape();
    if (r.ids.dtype() != DType::kI16 || shape.size() != 3 || shape[1] != captures.info.num_moe_layers() ||
        shape[2] != captures.info.top_k()) {
      out.add(CaptureFindingKind::kTokenCount, r.request, -1, -1, -1,
              "ids are " + std::string(dtype_name(r.ids.dtype())) + " " + r.ids.view().shape_string() +
                  ", not i16 [tokens, " + std::to_string(captures.info.num_moe_layers()) + ", " +
                  std::to_string(captures.info.top_k()) + "]");
      continue;
    }
    check_request(r, captures.info, options, out);
  }
  // A request the caller expects but the capture lacks is a finding too, never "ok".
  std::set<std::string> present;
  for (const RequestCapture& r : captures.requests) present.insert(r.request);
  for (const auto& [request, tokens] : options.expected_tokens) {
    if (!present.count(request)) {
      out.add(CaptureFindingKind::kTokenCount, request, -1, -1, -1,
              "the request is not in the capture (expected " + std::to_string(tokens) + " tokens)");
    }
  }
  return report;
}

}  // namespace moekit

// The capture validator (docs/capture.md, "Checking a capture"): every
// inconsistency of a capture, each named by request, token and layer. What
// `moekit capture check FILE` and moekit.r3.check() report.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moekit/capture.h"

namespace moekit {

// What a finding is about. The names are stable (the CLI and Python print them).
enum class CaptureFindingKind : uint8_t {
  kTokenCount,      // a request's rows differ from the tokens the caller expected
  kPromptBoundary,  // first_generated_token outside the request's tokens
  kUnwritten,       // a row still holding the sentinel -1 (never captured)
  kOutOfRange,      // an id outside [0, E) that is not the sentinel
  kPhysicalId,      // an id in [E, num_physical_experts): looks like an EPLB physical id
  kDuplicate,       // an id twice in one (token, layer) row
  kZeroPadding,     // a row of zeros where the sentinel belongs (padding written as expert 0)
  kConstantLayer,   // every token of a request got the same ids in one layer
  kDenseLayer,      // a captured layer the caller says is dense (no router)
};
const char* capture_finding_name(CaptureFindingKind kind);  // "unwritten", "duplicate", ...

struct CaptureFinding {
  CaptureFindingKind kind;
  std::string request;   // empty: about the capture as a whole (a dense layer)
  int64_t token = -1;    // token index in the request (first_token based); -1: the whole request
  int layer = -1;        // MoE layer; -1: every layer
  int model_layer = -1;  // its model layer (capture's map); -1 with layer
  int slot = -1;         // slot in the row; -1: the whole row
  std::string message;   // one line, naming all of the above
};

struct CaptureCheckOptions {
  // Tokens each request should have (rows), e.g. prompt + generated - 1; requests not listed are not checked.
  std::map<std::string, int64_t> expected_tokens;
  // > E: ids in [E, num_physical_experts) are reported as physical (an EPLB map's replicas), not just out of range.
  int64_t num_physical_experts = 0;
  // An EPLB map, physical expert -> logical expert ([P]); when given, P = its size and each physical-looking id
  // is reported with the logical expert it stands for.
  std::vector<int> physical_to_logical;
  // Model layers that are dense (no router): a captured layer among them is reported.
  std::vector<int> dense_layers;
  // A layer whose ids are the same for every token is reported when the request has at least this many tokens.
  int64_t min_tokens_constant = 8;
  // At most this many findings of each kind are listed (the rest are counted).
  int max_findings_per_kind = 20;
};

struct CaptureCheckReport {
  std::vector<CaptureFinding> findings;        // in request, token, layer order per kind, capped per kind
  std::map<CaptureFindingKind, int64_t> counts;  // every finding, listed or not
  bool ok() const { return counts.empty(); }
  int64_t total() const;
};

// Checks every request of `captures` (ids are i16 with -1 as the sentinel, as
// read_capture_file returns them; read with check_ids = false to see ids out
// of range). Never fails: what is wrong is the report's content.
CaptureCheckReport check_capture(const CaptureSet& captures, const CaptureCheckOptions& options = {});

}  // namespace moekit

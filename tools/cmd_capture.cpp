// `moekit capture check FILE`: reads a capture file (any version) and lists
// every inconsistency, each named by request, token and layer
// (include/moekit/capture_check.h). Exit 0: clean; 2: findings or a bad file.
// `moekit capture stats FILE`: what the file holds and the expert load of
// each MoE layer over every captured token, as `moekit run` prints it.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "expert_load.h"
#include "moekit/capture.h"
#include "moekit/capture_check.h"

namespace moekit::tools {
namespace {

struct CheckFlags {
  std::string path;
  std::vector<std::string> expect_tokens;  // "request=N"
  int64_t physical_experts = 0;
  std::vector<int> dense_layers;
  int max_per_kind = 20;
  int64_t min_tokens_constant = 8;
  bool json = false;
};

// "requests: a (12 tokens), b (7 tokens), ...": the names --expect-tokens
// takes, the first kListedRequests of them (a capture can hold thousands).
constexpr size_t kListedRequests = 20;
void print_requests(const std::vector<RequestCapture>& requests) {
  std::string line;
  for (size_t i = 0; i < requests.size() && i < kListedRequests; ++i) {
    line += (i ? ", " : "") + one_line(requests[i].request) + " (" + std::to_string(requests[i].num_tokens()) +
            " token" + (requests[i].num_tokens() == 1 ? "" : "s") + ")";
  }
  if (requests.size() > kListedRequests) line += ", and " + std::to_string(requests.size() - kListedRequests) + " more";
  std::printf("requests: %s\n", requests.empty() ? "none" : line.c_str());
}

StatusOr<CaptureCheckOptions> options_from(const CheckFlags& f) {
  CaptureCheckOptions o;
  for (const std::string& e : f.expect_tokens) {
    const size_t eq = e.rfind('=');
    int64_t n = -1;
    if (eq != std::string::npos && eq + 1 < e.size()) {
      try {
        size_t used = 0;
        n = std::stoll(e.substr(eq + 1), &used);
        if (used != e.size() - eq - 1) n = -1;
      } catch (const std::exception&) {
        n = -1;
      }
    }
    if (eq == std::string::npos || n < 0) {
      return InvalidArgument("--expect-tokens: expected REQUEST=N with N >= 0, got '" + one_line(e) + "'");
    }
    o.expected_tokens[e.substr(0, eq)] = n;
  }
  o.num_physical_experts = f.physical_experts;
  o.dense_layers = f.dense_layers;
  o.max_findings_per_kind = f.max_per_kind;
  o.min_tokens_constant = f.min_tokens_constant;
  return o;
}

// Returns kExitOk when the capture is clean, kExitBadInput when it has findings or cannot be read.
int run_check(const CheckFlags& flags) {
  if (flags.path.empty()) {
    return report_error("capture check", InvalidArgument("file: the argument is empty; give the capture file"));
  }
  auto options = options_from(flags);
  if (!options.ok()) return report_error("capture check", options.status());
  CaptureReadOptions read;
  read.check_ids = false;  // the validator names every bad id
  auto captures = read_capture_file(flags.path, read);
  if (!captures.ok()) return report_error("capture check", captures.status());
  const CaptureInfo& info = captures->info;
  const CaptureCheckReport report = check_capture(*captures, *options);
  if (flags.json) {
    nlohmann::json j = {{"file", flags.path}, {"ok", report.ok()}, {"findings", nlohmann::json::array()}};
    nlohmann::json counts = nlohmann::json::object();
    for (const auto& [kind, n] : report.counts) counts[capture_finding_name(kind)] = n;
    j["counts"] = counts;
    j["requests"] = nlohmann::json::array();
    for (const RequestCapture& r : captures->requests) {
      j["requests"].push_back({{"request", r.request}, {"tokens", r.num_tokens()}});
    }
    for (const CaptureFinding& f : report.findings) {
      j["findings"].push_back({{"kind", capture_finding_name(f.kind)}, {"request", f.request}, {"token", f.token},
                               {"layer", f.layer}, {"model_layer", f.model_layer}, {"slot", f.slot},
                               {"message", f.message}});
    }
    std::printf("%s\n", j.dump(1).c_str());
  } else {
    int64_t tokens = 0;
    for (const RequestCapture& r : captures->requests) tokens += r.num_tokens();
    std::printf("moekit capture check: %s\n", one_line(flags.path).c_str());
    std::printf("capture:  format %d, routing spec %d, %s, E=%" PRId64 ", k=%d, %d MoE layers, %zu requests, "
                "%" PRId64 " tokens, backend %s, router weights %s\n",
                info.format_version, info.routing_spec_version, info.routing.to_string().c_str(), info.num_experts,
                info.top_k(), info.num_moe_layers(), captures->requests.size(), tokens,
                info.backend.empty() ? "not recorded" : one_line(info.backend).c_str(),
                info.router_weights_dtype ? dtype_name(*info.router_weights_dtype) : "none");
    print_requests(captures->requests);
    for (const CaptureFinding& f : report.findings) std::printf("  %s\n", one_line(f.message).c_str());
    for (const auto& [kind, n] : report.counts) {
      const int64_t listed = std::min<int64_t>(n, flags.max_per_kind);
      std::printf("%-16s %" PRId64 " finding%s%s\n", capture_finding_name(kind), n, n == 1 ? "" : "s",
                  listed < n ? (" (" + std::to_string(listed) + " listed)").c_str() : "");
    }
    std::printf("%s\n", report.ok() ? "ok: no findings" : "NOT OK");
  }
  std::fflush(stdout);
  if (report.ok()) return kExitOk;
  std::fprintf(stderr, "moekit capture check: error: %" PRId64 " findings in %s\n", report.total(),
               one_line(flags.path).c_str());
  return kExitBadInput;
}

Status run_stats(const std::string& path) {
  MOEKIT_ASSIGN_OR_RETURN(const CaptureSet set, read_capture_file(path));
  const CaptureInfo& info = set.info;
  const int L = info.num_moe_layers(), k = info.top_k();
  std::vector<std::vector<int64_t>> load(static_cast<size_t>(L), std::vector<int64_t>(info.num_experts, 0));
  int64_t tokens = 0, unwritten = 0;
  for (const RequestCapture& r : set.requests) {
    tokens += r.num_tokens();
    const int16_t* ids = r.ids.data<int16_t>();
    for (int64_t t = 0; t < r.num_tokens(); ++t) {
      for (int l = 0; l < L; ++l) {
        for (int j = 0; j < k; ++j) {
          const int16_t id = ids[(t * L + l) * k + j];
          if (id < 0) {
            ++unwritten;  // the sentinel: a row no forward wrote (read_capture_file refused anything else)
          } else {
            ++load[l][id];
          }
        }
      }
    }
  }
  std::printf("capture:  %s: %zu requests, %" PRId64 " tokens, %d MoE layers x top-%d of E=%" PRId64
              ", routing %s%s\n", path.c_str(), set.requests.size(), tokens, L, k, info.num_experts,
              routing_method_name(info.routing.method), info.backend.empty() ? "" : (", by " + info.backend).c_str());
  print_requests(set.requests);
  if (unwritten > 0) std::printf("unwritten: %" PRId64 " ids hold the sentinel -1 (not counted)\n", unwritten);
  std::vector<std::string> names;
  for (int l = 0; l < L; ++l) names.push_back("model layer " + std::to_string(info.model_layers[l]));
  print_load(load, names);
  return Status::Ok();
}

}  // namespace

void add_capture_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("capture", "Inspect capture files (docs/capture.md)");
  cmd->require_subcommand(1);
  auto flags = std::make_shared<CheckFlags>();
  CLI::App* check = cmd->add_subcommand(
      "check", "List every inconsistency of a capture file by request, token and layer (exit 2 when any)");
  check->add_option("file", flags->path, "capture file")->required();
  check->add_option("--expect-tokens", flags->expect_tokens, "REQUEST=N: the request should have N rows (repeatable)");
  check->add_option("--physical-experts", flags->physical_experts,
                    "number of physical experts under EPLB: ids in [E, N) are reported as physical ids")
      ->check(CLI::NonNegativeNumber);
  check->add_option("--dense-layers", flags->dense_layers, "model layers that are dense (no router)")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  check->add_option("--max-per-kind", flags->max_per_kind, "list at most N findings of each kind (default 20)")
      ->check(CLI::Range(1, 1000000));
  check->add_option("--min-tokens-constant", flags->min_tokens_constant,
                    "report a layer with the same ids for every token when a request has >= N tokens (default 8)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 40));
  check->add_flag("--json", flags->json, "print the report as JSON");
  check->callback([flags] { finish(run_check(*flags)); });
  auto stats_path = std::make_shared<std::string>();
  CLI::App* stats = cmd->add_subcommand("stats", "What a capture file holds, and each MoE layer's expert load");
  stats->add_option("file", *stats_path, "capture file")->required();
  stats->callback([stats_path] {
    const Status st = run_stats(*stats_path);
    finish(st.ok() ? kExitOk : report_error("capture stats", st));
  });
}

}  // namespace moekit::tools

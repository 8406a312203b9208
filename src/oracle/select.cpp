// select_backend: walk backends x candidates in priority order, first supported
// class wins; every candidate is evaluated so the report can say why each lost.
#include <algorithm>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "moekit/oracle.h"

namespace moekit {

namespace {

std::string known_backends(const std::vector<Backend>& registry) {
  std::string names;
  for (const Backend& b : registry) names += (names.empty() ? "" : ", ") + b.name;
  return names.empty() ? "none" : names;
}

Support evaluate(const KernelClass& kernel, const MoeConfig& config, const Platform& platform) {
  if (kernel.supports == nullptr || kernel.create == nullptr) {
    return Support::no("kernel class is registered without supports()/create()");
  }
  const Support s = kernel.supports(config, platform);
  // Capture needs are checked last (docs/design.md §2.2), here once for every class.
  if (s.ok && config.needs_capture && kernel.monolithic && !kernel.writes_routing_replay_out) {
    return Support::no("cannot write the routed expert ids (no routing_replay_out) while capture is on");
  }
  return s;
}

}  // namespace

std::string format_report(const std::vector<CandidateReport>& report) {
  size_t backend_w = 7, kernel_w = 6;
  for (const CandidateReport& c : report) {
    backend_w = std::max(backend_w, c.backend.size());
    kernel_w = std::max(kernel_w, c.kernel.size());
  }
  std::ostringstream os;
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w - s.size(), ' '); };
  os << "  " << pad("backend", backend_w) << "  " << pad("kernel", kernel_w) << "  kind        verdict\n";
  for (const CandidateReport& c : report) {
    os << (c.chosen ? "* " : "  ") << pad(c.backend, backend_w) << "  " << pad(c.kernel, kernel_w) << "  "
       << pad(c.monolithic ? "monolithic" : "modular", 10) << "  ";
    if (c.chosen) {
      os << "chosen";
    } else if (c.supported) {
      os << "supported, not chosen: " << c.reason;
    } else {
      os << "rejected: " << c.reason;
    }
    os << "\n";
  }
  return os.str();
}

std::string format_gemm_plan(const MoeKernel& kernel, int64_t max_tokens) {
  std::vector<std::pair<int64_t, std::string>> plans;  // (M, plan), M increasing
  for (const int64_t m : {int64_t{1}, int64_t{16}, int64_t{256}, int64_t{4096}, max_tokens}) {
    const int64_t rows = std::min(m, max_tokens);
    if (plans.empty() || rows > plans.back().first) plans.emplace_back(rows, kernel.gemm_plan(rows));
  }
  std::ostringstream os;
  os << "gemm plan (" << kernel.name() << "):\n";
  for (size_t i = 0; i < plans.size();) {
    size_t j = i;
    while (j + 1 < plans.size() && plans[j + 1].second == plans[i].second) ++j;
    const std::string ms = j == i ? std::to_string(plans[i].first)
                                  : std::to_string(plans[i].first) + ".." + std::to_string(plans[j].first);
    os << "  M=" << ms << std::string(ms.size() < 11 ? 11 - ms.size() : 0, ' ') << " " << plans[i].second << "\n";
    i = j + 1;
  }
  return os.str();
}

std::string Resolution::report_string() const {
  return format_report(report) + "resolved: " + backend + " / " + kernel.name + "\n";
}

StatusOr<Resolution> select_backend(const MoeConfig& config, const Platform& platform,
                                    const std::vector<Backend>& registry) {
  MOEKIT_RETURN_IF_ERROR(config.validate());
  const bool forced = config.backend != "auto";
  if (forced) {
    const bool known = std::any_of(registry.begin(), registry.end(),
                                   [&](const Backend& b) { return b.name == config.backend; });
    if (!known) {
      return NotFound("backend '" + config.backend + "' is not available in this build on this platform (available: " +
                      known_backends(registry) + ")");
    }
  }

  Resolution res;
  std::optional<size_t> winner;  // index into res.report
  for (const Backend& backend : registry) {
    if (forced && backend.name != config.backend) continue;
    for (const KernelClass& kernel : backend.candidates) {
      const Support s = evaluate(kernel, config, platform);
      CandidateReport c{backend.name, kernel.name, kernel.monolithic, s.ok, false, s.reason};
      if (s.ok && !winner) {
        c.chosen = true;
        winner = res.report.size();
        res.backend = backend.name;
        res.kernel = kernel;
      }
      res.report.push_back(std::move(c));
    }
  }
  if (!winner) {
    std::string what = forced ? "backend '" + config.backend + "' (forced) cannot serve this configuration"
                              : "no backend can serve this configuration";
    if (res.report.empty()) return Unsupported(what + ": no kernel class is registered");
    return Unsupported(what + "; every candidate was rejected:\n" + format_report(res.report));
  }
  const CandidateReport& w = res.report[*winner];
  const std::string lost = "lower priority than " + w.backend + "/" + w.kernel;
  for (CandidateReport& c : res.report) {
    if (c.supported && !c.chosen) c.reason = lost;
  }
  return res;
}

StatusOr<Resolution> select_backend(const MoeConfig& config, const Platform& platform) {
  return select_backend(config, platform, backend_registry(platform));
}

StatusOr<Resolution> select_backend_on(const MoeConfig& config, const Platform& platform, DeviceType device_type) {
  std::vector<Backend> registry;
  std::string others;
  for (Backend& b : backend_registry(platform)) {
    if (b.device_type == device_type) {
      registry.push_back(std::move(b));
    } else {
      others += (others.empty() ? "" : ", ") + b.name;
    }
  }
  if (registry.empty()) {
    const char* where = device_type == DeviceType::kCuda ? "a CUDA device" : "the CPU";
    return Unsupported(std::string("no backend of this build runs on ") + where + " on this platform (" +
                       platform.to_string() + "; available: " + (others.empty() ? "none" : others) + ")");
  }
  return select_backend(config, platform, registry);
}

}  // namespace moekit

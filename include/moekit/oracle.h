// The backend oracle (docs/design.md §2.2, docs/oracle.md): a registry of backends,
// each listing its kernel classes in priority order, and select_backend(), which
// walks them and returns the first class whose supports() says yes, with a
// report of every candidate and its reason. Selection is pure and deterministic:
// the same config and platform give the same answer on every rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/platform.h"
#include "moekit/status.h"

namespace moekit {

// One kernel class: its name, its kind, and the two functions the oracle needs.
struct KernelClass {
  std::string name;         // "CpuMonolithic"
  bool monolithic = false;  // routing inside the kernel (router logits in)
  // ok, or the first failing reason in the order of docs/design.md §2.2.
  Support (*supports)(const MoeConfig& config, const Platform& platform) = nullptr;
  // Builds the kernel for a config that supports() accepted.
  StatusOr<std::unique_ptr<MoeKernel>> (*create)(const MoeConfig& config, const Platform& platform) = nullptr;
  // Capture capability of a monolithic class: it writes the selected ids into
  // routing_replay_out (MoeKernel::supports_routing_replay_capture() of its
  // kernels says the same). Modular classes need not: their router writes them.
  // select_backend rejects a monolithic class without it when capture is on.
  bool writes_routing_replay_out = false;
};

// A family of kernels on one kind of device, candidates in priority order.
struct Backend {
  std::string name;                     // "cpu", "cuda_sm90"
  std::vector<KernelClass> candidates;  // tried first to last
  DeviceType device_type = DeviceType::kCpu;  // where its kernels run
};

// The backends of this build and platform, in priority order (CUDA backends
// before "cpu" when present; "cpu" always last).
std::vector<Backend> backend_registry(const Platform& platform);

// One line of the resolution report.
struct CandidateReport {
  std::string backend;
  std::string kernel;
  bool monolithic = false;
  bool supported = false;  // supports() said yes
  bool chosen = false;
  std::string reason;      // why it was rejected, or why it lost while supported
};

struct Resolution {
  std::string backend;                  // chosen backend
  KernelClass kernel;                   // chosen kernel class
  std::vector<CandidateReport> report;  // every candidate considered, in walk order
  std::string report_string() const;    // the printable report (docs/oracle.md)
};

// Walks `registry` (backends in order x their candidates in order); the first
// supported class wins. config.backend == "auto" considers every backend; any
// other name considers only that backend and never falls back. Fails with
// kInvalidArgument when the config is invalid, kNotFound for an unknown backend
// name, and kUnsupported (listing every rejection) when nothing fits.
StatusOr<Resolution> select_backend(const MoeConfig& config, const Platform& platform,
                                    const std::vector<Backend>& registry);
// The same over backend_registry(platform).
StatusOr<Resolution> select_backend(const MoeConfig& config, const Platform& platform);
// The same over the backends whose kernels run on `device_type` only: a
// caller that wants the layer on a CUDA device never gets the CPU backend (and
// the reverse); with none of that type registered it fails with kUnsupported.
StatusOr<Resolution> select_backend_on(const MoeConfig& config, const Platform& platform, DeviceType device_type);

// The report when selection fails: every candidate with its reason (what the
// error message of select_backend lists), for tools that print it.
std::string format_report(const std::vector<CandidateReport>& report);

// The GEMM paths the chosen kernel takes and why (MoeKernel::gemm_plan) at
// M = 1, 16, 256, 4096 and max_num_tokens, equal plans of consecutive M on one
// line: part of a layer's report (MoeLayer::report_string).
std::string format_gemm_plan(const MoeKernel& kernel, int64_t max_num_tokens);

// The token movement of an expert-parallel layer (ep > 1): all-to-all or
// allgather + reduce-scatter, with the reason in words. parallel.all2all set
// to one of them is obeyed; kAuto picks allgather + reduce-scatter for small
// batches (where the all-to-all's two rounds of count exchange and scatter cost
// more than moving every token everywhere) and all-to-all otherwise. Pure, so
// every rank agrees.
struct EpDispatchChoice {
  All2AllBackend kind = All2AllBackend::kNccl;  // kNccl (all-to-all) or kAllgatherReducescatter
  std::string reason;
};
StatusOr<EpDispatchChoice> choose_ep_dispatch(const MoeConfig& config);

}  // namespace moekit

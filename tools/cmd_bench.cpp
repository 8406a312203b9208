// `moekit bench`: the GPU MoE layer benchmark (bench/gpu_moe_bench.h): the two
// hardware ceilings, then every (shape, M) case against its floor, with the
// workspace each case needs. Needs a CUDA build and a CUDA device.
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "moekit/platform.h"

#ifdef MOEKIT_WITH_GPU_BENCH
#include "ep_comm_bench.h"
#include "ep_layer_bench.h"
#include "gpu_bench_flags.h"
#include "gpu_moe_bench.h"
#endif

namespace moekit::tools {

#ifdef MOEKIT_WITH_GPU_BENCH
namespace {

// The CUDA devices a run needs, asked of the platform probe first: a machine
// without them is told so, not "Internal: cudaGetDeviceCount...".
Status check_devices(int needed, const std::string& what) {
  const Platform& p = Platform::probe();
  const int found = static_cast<int>(p.cuda_devices.size());
  if (found >= needed) return Status::Ok();
  return Unsupported(what + " needs " + std::to_string(needed) + " NVIDIA GPU" + (needed > 1 ? "s" : "") +
                     "; this machine has " + std::to_string(found) + " usable (" + p.to_string() + ")");
}

}  // namespace
#endif

void add_bench_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("bench", "GPU MoE layer benchmark: ceilings, then each (shape, M) vs its floor");
#ifdef MOEKIT_WITH_GPU_BENCH
  auto opt = std::make_shared<bench::GpuBenchOptions>();
  auto ep = std::make_shared<int>(1);
  auto collectives_only = std::make_shared<bool>(false);
  bench::add_gpu_bench_flags(cmd, opt.get());
  // --ep: the collectives the EP layer issues (bench/ep_comm_bench.h), then the
  // whole EP layer against one GPU (bench/ep_layer_bench.h).
  cmd->add_option("--ep", *ep,
                  "GPUs: > 1 times the EP all-to-alls over NCCL and the whole EP layer (one rank per GPU) against "
                  "one GPU; --m sets the tokens per rank");
  cmd->add_flag("--ep-collectives-only", *collectives_only, "with --ep: time only the all-to-alls");
  cmd->callback([opt, ep, collectives_only] {
    const std::string what = *ep > 1 ? "bench --ep " + std::to_string(*ep) : std::string("bench");
    if (const Status st = check_devices(std::max(*ep, 1), what); !st.ok()) {
      finish(report_error("bench", st));
      return;
    }
    if (*ep > 1) {
      bench::EpCommBenchOptions eo;
      eo.ranks = *ep;
      if (!opt->m_list.empty()) eo.m_list = opt->m_list;
      eo.time_layer = !*collectives_only;
      eo.scheme = opt->scheme;
      Status st = bench::run_ep_comm_bench(eo, std::cout);
      if (st.ok() && eo.time_layer) st = bench::run_ep_layer_bench(eo, std::cout);
      finish(st.ok() ? kExitOk : report_error("bench", st));
      return;
    }
    const Status st = bench::run_gpu_moe_bench(*opt, std::cout);
    finish(st.ok() ? kExitOk : report_error("bench", st));
  });
#else
  cmd->allow_extras();
  cmd->callback([] {
    finish(report_error("bench", Unsupported("this moekit was built without CUDA; the benchmark needs a CUDA build "
                                             "and an NVIDIA GPU (see README)")));
  });
#endif
}

}  // namespace moekit::tools

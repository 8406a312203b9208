// `moekit bench`: the GPU MoE layer benchmark (bench/gpu_moe_bench.h): the two
// hardware ceilings, then every (shape, M) case against its floor, with the
// workspace each case needs. Needs a CUDA build and a CUDA device.
#include <iostream>
#include <memory>

#include "cli_util.h"
#include "commands.h"

#ifdef MOEKIT_WITH_GPU_BENCH
#include "ep_comm_bench.h"
#include "gpu_bench_flags.h"
#include "gpu_moe_bench.h"
#endif

namespace moekit::tools {

void add_bench_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("bench", "GPU MoE layer benchmark: ceilings, then each (shape, M) vs its floor");
#ifdef MOEKIT_WITH_GPU_BENCH
  auto opt = std::make_shared<bench::GpuBenchOptions>();
  auto ep = std::make_shared<int>(1);
  bench::add_gpu_bench_flags(cmd, opt.get());
  // TODO(ep): time the whole EP layer once its device path exists; for now
  // --ep times what moving its tokens over NCCL costs (bench/ep_comm_bench.h).
  cmd->add_option("--ep", *ep, "GPUs: > 1 times the EP dispatch/combine all-to-alls over NCCL, one rank per GPU");
  cmd->callback([opt, ep] {
    if (*ep > 1) {
      bench::EpCommBenchOptions eo;
      eo.ranks = *ep;
      if (!opt->m_list.empty()) eo.m_list = opt->m_list;
      const Status st = bench::run_ep_comm_bench(eo, std::cout);
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

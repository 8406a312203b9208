// `moekit bench`: the GPU MoE layer benchmark (bench/gpu_moe_bench.h): the two
// hardware ceilings, then every (shape, M) case against its floor, with the
// workspace each case needs. Needs a CUDA build and a CUDA device.
#include <iostream>
#include <memory>

#include "cli_util.h"
#include "commands.h"

#ifdef MOEKIT_WITH_GPU_BENCH
#include "gpu_bench_flags.h"
#include "gpu_moe_bench.h"
#endif

namespace moekit::tools {

void add_bench_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("bench", "GPU MoE layer benchmark: ceilings, then each (shape, M) vs its floor");
#ifdef MOEKIT_WITH_GPU_BENCH
  auto opt = std::make_shared<bench::GpuBenchOptions>();
  bench::add_gpu_bench_flags(cmd, opt.get());
  cmd->callback([opt] {
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

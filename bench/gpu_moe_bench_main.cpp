// moekit_gpu_bench: the GPU MoE layer benchmark as its own binary
// (`moekit bench` runs the same code).
#include <iostream>

#include <CLI/CLI.hpp>

#include "gpu_moe_bench.h"

int main(int argc, char** argv) {
  moekit::bench::GpuBenchOptions opt;
  CLI::App app{"moekit GPU MoE layer benchmark: ceilings, then each (shape, M) against its floor"};
  app.add_option("--shapes", opt.shapes_path, "shape list (JSON)");
  app.add_option("--m", opt.m_list, "token counts (default: the shape list's)");
  app.add_option("--only", opt.only, "shape names to run (default: all)");
  app.add_option("--backend", opt.backend, "MoeConfig backend: cuda_sm90 or auto");
  app.add_option("--json", opt.json_path, "write results here");
  app.add_option("--dump-dir", opt.dump_dir, "write outputs of the dump cases here (.npy) for the peer check");
  app.add_option("--dump-m", opt.dump_m, "M values whose output is dumped");
  app.add_option("--sets", opt.num_sets, "rotating input sets per case")->check(CLI::Range(1, 64));
  app.add_option("--seconds", opt.seconds_per_case, "timed seconds per case");
  app.add_option("--min-reps", opt.min_reps, "timed launches per input set, at least")->check(CLI::Range(1, 1000));
  app.add_option("--read-gib", opt.read_gib, "bytes read by the bandwidth ceiling, GiB")->check(CLI::Range(4.0, 64.0));
  app.add_option("--matmul-n", opt.matmul_n, "size of the matmul ceiling");
  app.add_option("--seed", opt.seed, "base seed of every input");
  CLI11_PARSE(app, argc, argv);
  const moekit::Status st = moekit::bench::run_gpu_moe_bench(opt, std::cout);
  if (!st.ok()) {
    std::cerr << st.to_string() << "\n";
    return 1;
  }
  return 0;
}

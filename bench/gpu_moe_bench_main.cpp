// moekit_gpu_bench: the GPU MoE layer benchmark as its own binary
// (`moekit bench` runs the same code with the same flags).
#include <iostream>

#include <CLI/CLI.hpp>

#include "gpu_bench_flags.h"
#include "gpu_moe_bench.h"

int main(int argc, char** argv) {
  moekit::bench::GpuBenchOptions opt;
  CLI::App app{"moekit GPU MoE layer benchmark: ceilings, then each (shape, M) against its floor"};
  moekit::bench::add_gpu_bench_flags(&app, &opt);
  CLI11_PARSE(app, argc, argv);
  const moekit::Status st = moekit::bench::run_gpu_moe_bench(opt, std::cout);
  if (!st.ok()) {
    std::cerr << st.to_string() << "\n";
    return 1;
  }
  return 0;
}

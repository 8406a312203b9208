// The command-line flags of the GPU MoE benchmark, shared by its own binary
// (moekit_gpu_bench) and `moekit bench`.
#pragma once

#include <CLI/CLI.hpp>

#include "gpu_moe_bench.h"

namespace moekit::bench {

inline void add_gpu_bench_flags(CLI::App* app, GpuBenchOptions* opt) {
  app->add_option("--shapes", opt->shapes_path, "shape list (JSON)");
  app->add_option("--m", opt->m_list, "token counts (default: the shape list's)");
  app->add_option("--only", opt->only, "shape names to run (default: all)");
  app->add_option("--backend", opt->backend, "MoeConfig backend: auto, cuda_sm90 or cuda_sm80");
  app->add_option("--json", opt->json_path, "write results here");
  app->add_option("--dump-dir", opt->dump_dir, "write outputs of the dump cases here (.npy) for the peer check");
  app->add_option("--dump-m", opt->dump_m, "M values whose output is dumped");
  app->add_option("--sets", opt->num_sets, "rotating input sets per case")->check(CLI::Range(1, 64));
  app->add_option("--seconds", opt->seconds_per_case, "timed seconds per case");
  app->add_option("--min-reps", opt->min_reps, "timed launches per input set, at least")->check(CLI::Range(1, 1000));
  app->add_option("--read-gib", opt->read_gib, "bytes read by the bandwidth ceiling, GiB")->check(CLI::Range(4.0, 64.0));
  app->add_option("--matmul-n", opt->matmul_n, "size of the matmul ceiling");
  app->add_option("--seed", opt->seed, "base seed of every input");
  app->add_option("--variant", opt->variants,
                  "NAME:VAR=VALUE,... environment overrides (e.g. MOEKIT_SM90_STREAM=rows32_k64_t16) whose graphs "
                  "are timed interleaved with the default's; repeatable");
  app->add_option("--scheme", opt->scheme, "weights: bf16 (default), fp8-block (128x128 block scales) or fp8-tensor "
                  "(one scale per tensor), dynamic activation scales; or 4-bit weights with bf16 activations: "
                  "mxfp4, int4_g32, int4_g128 (docs/weights_4bit.md)")
      ->check(CLI::IsMember({"bf16", "fp8-block", "fp8-tensor", "mxfp4", "int4_g32", "int4_g128"}));
  app->add_option("--skew", opt->skew, "expert popularity skew: 0 balanced (default), ALPHA > 0 adds -ALPHA*ln(1+e) "
                  "to expert e's logits (Zipf-like)")->check(CLI::Range(0.0, 8.0));
  app->add_flag("--expert-bias", opt->expert_bias, "add gate/up and down expert biases to every shape");
  app->add_option("--shared-intermediate", opt->shared_intermediate,
                  "add a shared expert of this width to every shape (0: none)")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app->add_flag("--shared-gate", opt->shared_gate, "gate the shared expert by sigmoid(x . g) (Qwen2-MoE style)");
  app->add_option("--shared-overlap", opt->shared_overlap,
                  "run the shared expert on a side stream overlapping the routed experts: off (default), on, or "
                  "both (off, plus a variant 'overlap' with it on, timed interleaved; its diff must be 0)")
      ->check(CLI::IsMember({"off", "on", "both"}));
  app->add_flag("--capture-modes,!--no-capture-modes", opt->capture_modes,
                "also time each case with capture on (ids written, rows copied to pinned host memory) and with "
                "replay (forced ids), interleaved with the default (default: on)");
  app->add_flag("--batch-invariant", opt->batch_invariant,
                "run every layer in batch-invariant mode (one GEMM path for every M); compare with a run without");
}

}  // namespace moekit::bench

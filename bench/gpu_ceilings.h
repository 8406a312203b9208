// The two hardware ceilings every benchmark case is measured against, read on
// the device the benchmark runs on: HBM read bandwidth and dense bf16 matmul rate.
#pragma once

#include <string>

namespace moekit::bench {

struct Ceilings {
  double read_bytes_per_s = 0;  // streaming read of a buffer >> L2, median of repeats
  double matmul_flops_per_s = 0;  // cuBLAS bf16 x bf16 -> bf16, fp32 accumulate, median of repeats
  double fp8_matmul_flops_per_s = 0;  // cuBLASLt e4m3 x e4m3 -> bf16, fp32 accumulate (0: not measured)
  double read_gib = 0;          // size of the buffer read
  int matmul_n = 0;             // square matmul size
  std::string device_name;
};

// Measures both on the current device. Returns false and fills *error on a CUDA or
// cuBLAS failure.
bool measure_ceilings(double read_gib, int matmul_n, int repeats, Ceilings* out, std::string* error);

// The fp8 matmul rate (n x n x n, A transposed as FP8 GEMMs require) on the current device.
bool measure_fp8_matmul(int n, int repeats, Ceilings* out, std::string* error);

}  // namespace moekit::bench

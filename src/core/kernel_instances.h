// The instance names the sm90 kernels are built with, host-only, so that
// KernelOptions::validate() knows them in a build without CUDA. Each table is
// in the order of its enum (src/experts/cuda/*_gemm.h); the enum's name
// function indexes it.
// NOTE: each enum's header static_asserts names_every_value() on its value
// list and its table, so a new instance without a name does not build.
#pragma once

#include <array>
#include <cstddef>

namespace moekit {

// kernel.sm90_stream: the bf16 streaming GEMM (StreamVariant, streaming_gemm.h).
inline constexpr std::array<const char*, 10> kSm90StreamNames = {
    "rows128_k64",       "rows64_k64",      "rows64_k64_t32",     "rows32_k64_t16",     "rows32_k64_t16_s4",
    "rows32_k64_t16_s3", "rows32_k64_t32",  "rows32_k128_t16",    "rows32_k128_t16_s3", "rows32_k128_t16_s2"};
// kernel.sm90_cutlass: the bf16 CUTLASS tile (CutlassTile, grouped_gemm_cutlass.h), of
// either backend (the sm80_ tiles are cuda_sm80's, and run on Hopper too).
inline constexpr std::array<const char*, 6> kSm90CutlassNames = {"m128_n256", "m64_n256",       "swap_n32",
                                                                 "swap_n64",  "sm80_m128_n256", "sm80_m128_n128"};
// kernel.sm90_fp8_stream: the fp8 streaming GEMM (Fp8StreamVariant, fp8_streaming_gemm.h), or "off".
inline constexpr std::array<const char*, 6> kSm90Fp8StreamNames = {
    "w1_t8_k128_s2", "w1_t8_k128_s3", "w1_t8_k256_s2", "w1_t16_k128_s2", "w1_t16_k256_s2", "w1_t32_k256_s2"};
// kernel.sm90_w4_stream: the 4-bit streaming GEMM (W4StreamVariant, weight4_streaming_gemm.h).
inline constexpr std::array<const char*, 5> kSm90W4StreamNames = {"w1_t8_k128_s3", "w4_t8_k128_s3", "w4_t16_k128_s3",
                                                                  "w4_t32_k128_s3", "w4_t64_k128_s3"};

// True when `all` lists an enum's values 0, 1, ... in order, one for each of
// `names`: what lets a name function index its table with the value.
template <typename E, size_t N, size_t M>
constexpr bool names_every_value(const E (&all)[N], const std::array<const char*, M>& names) {
  if (N != names.size()) return false;
  for (size_t i = 0; i < N; ++i) {
    if (static_cast<size_t>(all[i]) != i) return false;
  }
  return true;
}

}  // namespace moekit

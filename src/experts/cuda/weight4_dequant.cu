#include "experts/cuda/weight4_dequant.h"

#include <cuda_bf16.h>

#include <string>

#include "core/cuda_check.h"
#include "experts/cuda/weight4_streaming_gemm.h"

namespace moekit::cuda {
namespace {

// The e2m1 value of a nibble, exactly: its sign to bit 31 and its exponent and
// mantissa bits to bits 24..22 make the f32 e2m1 * 2^-126 (e2m1's subnormal 0.5
// lands on f32's subnormal 2^-127), and 2^126 restores it. Arithmetic, not a
// table: a lookup indexed by each thread's nibble would serialize.
__device__ __forceinline__ float e2m1_value(uint32_t nib) {
  return __uint_as_float(((nib & 8u) << 28) | ((nib & 7u) << 22)) * 0x1p126f;
}

// One thread per 16 packed bytes (32 values) of a row, all in one scale group.
__global__ void dequantize_weight4_kernel(const Weight4DequantArgs a, int group) {
  const int64_t chunks_per_row = a.k / 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.num_experts * a.n * chunks_per_row) return;
  const int64_t row = i / chunks_per_row, chunk = i % chunks_per_row;  // row among the chunk's experts
  const int64_t e = a.first_expert + row / a.n, r = row % a.n;
  const uint4 bytes = reinterpret_cast<const uint4*>(a.packed + (e * a.n + r) * (a.k / 2))[chunk];
  const int64_t scale_index = (e * (a.k / group) + chunk * 32 / group) * a.n + weight4_scale_position(r);
  float scale;
  if (a.method == QuantMethod::kMxfp4) {
    const uint32_t code = static_cast<const uint8_t*>(a.scales)[scale_index];
    scale = code == 0 ? 0x1p-127f : __uint_as_float(code << 23);
  } else {
    scale = static_cast<const float*>(a.scales)[scale_index];
  }
  const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
  __nv_bfloat162 out[16];
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (words[wi] >> (8 * b)) & 0xFFu;
      float v[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t nib = (byte >> (4 * h)) & 0xFu;
        // int4 nibbles are two's complement: nibble ^ 8 is v + 8.
        v[h] = a.method == QuantMethod::kMxfp4 ? e2m1_value(nib) : static_cast<float>(static_cast<int>(nib ^ 8u) - 8);
      }
      out[wi * 4 + b] = __floats2bfloat162_rn(v[0] * scale, v[1] * scale);
    }
  }
  uint4* dst = reinterpret_cast<uint4*>(a.out + row * a.k + chunk * 32);
#pragma unroll
  for (int q = 0; q < 4; ++q) dst[q] = reinterpret_cast<const uint4*>(out)[q];
}

// One thread per output scale.
__global__ void bf16_scales_kernel(const Weight4DequantArgs a, int64_t groups) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.num_experts * groups * a.n) return;
  const int64_t row = i / a.n, r = i % a.n;  // row = e * groups + q
  const int64_t at = (a.first_expert * groups + row) * a.n + weight4_scale_position(r);
  uint16_t bits;
  if (a.method == QuantMethod::kMxfp4) {
    const uint32_t code = static_cast<const uint8_t*>(a.scales)[at];
    bits = static_cast<uint16_t>(code == 0 ? 0x0040u : code << 7);  // 2^-127 is a bf16 subnormal
  } else {
    const __nv_bfloat16 b = __float2bfloat16_rn(static_cast<const float*>(a.scales)[at]);
    bits = *reinterpret_cast<const uint16_t*>(&b);
  }
  a.out[i] = bits;
}

bool shape_ok(const Weight4DequantArgs& a) {
  return quant_family(a.method) == QuantFamily::kWeight4 && a.n % 32 == 0 && a.k % weight4_group(a.method) == 0;
}

}  // namespace

Status weight4_bf16_scales(const Weight4DequantArgs& a, cudaStream_t stream) {
  if (!shape_ok(a)) {
    return InvalidArgument(std::string("weight4_bf16_scales: ") + quant_method_name(a.method) + " with n=" +
                           std::to_string(a.n) + ", k=" + std::to_string(a.k));
  }
  const int64_t groups = a.k / weight4_group(a.method), threads = a.num_experts * groups * a.n;
  if (threads == 0) return Status::Ok();
  constexpr int kBlock = 256;
  bf16_scales_kernel<<<static_cast<unsigned>((threads + kBlock - 1) / kBlock), kBlock, 0, stream>>>(a, groups);
  MOEKIT_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status dequantize_weight4(const Weight4DequantArgs& a, cudaStream_t stream) {
  if (!shape_ok(a)) {
    return InvalidArgument(std::string("dequantize_weight4: ") + quant_method_name(a.method) + " with n=" +
                           std::to_string(a.n) + ", k=" + std::to_string(a.k));
  }
  const int64_t threads = a.num_experts * a.n * (a.k / 32);
  if (threads == 0) return Status::Ok();
  constexpr int kBlock = 256;
  dequantize_weight4_kernel<<<static_cast<unsigned>((threads + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
      a, static_cast<int>(weight4_group(a.method)));
  MOEKIT_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace moekit::cuda

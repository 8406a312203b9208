// Seeded device fill for benchmark inputs. The recipe is part of the benchmark's
// contract: bench/peer_torch.py regenerates the same bits from the same seeds,
// so the two runs compute the same layer on the same data.
//
// NOTE: keep in step with fill_uniform() in bench/peer_torch.py.
//   h(i)  = mix32(lo32(i) ^ mix32(hi32(i) ^ mix32(seed)))      (lowbias32 mixer)
//   u(i)  = (h(i) >> 8) * 2^-24                                (exact in fp32, [0, 1))
//   v(i)  = (2 u(i) - 1) * 2^scale_log2                        (exact in fp32)
//   bf16 tensors store v(i) rounded to nearest even; f32 tensors store v(i).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace moekit::bench {

// dst: [n] bf16 (raw bits). Enqueued on `stream`.
cudaError_t fill_uniform_bf16(uint16_t* dst, int64_t n, uint32_t seed, int scale_log2, cudaStream_t stream);
// dst: [n] f32.
cudaError_t fill_uniform_f32(float* dst, int64_t n, uint32_t seed, int scale_log2, cudaStream_t stream);
// dst: [n] e4m3fn bytes: v(i) with scale_log2 8 ([-256, 256), inside e4m3's
// +-448), rounded to nearest even; a weight tensor whose scales set its magnitude.
cudaError_t fill_uniform_e4m3(uint8_t* dst, int64_t n, uint32_t seed, cudaStream_t stream);

}  // namespace moekit::bench

#include "experts/cpu/fp8_emulation.h"

#include <cmath>

#include "moekit/parallel_for.h"

namespace moekit::cpu {

void fp8_fake_quant_groups(float* a, int64_t rows, int64_t cols, int64_t ld) {
  parallel_for(rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = a + r * ld;
      for (int64_t c0 = 0; c0 < cols; c0 += kFp8BlockSize) {
        const int64_t c1 = c0 + kFp8BlockSize < cols ? c0 + kFp8BlockSize : cols;
        float amax = 0.0f;
        for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(row[c]));
        const float scale = fp8_act_scale(amax);
        for (int64_t c = c0; c < c1; ++c) row[c] = fp8_fake_quant(row[c], scale);
      }
    }
  });
}

float fp8_amax(const float* a, int64_t rows, int64_t cols, int64_t ld) {
  // Sequential: max is order-independent, and this runs once per GEMM input.
  float amax = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) amax = std::fmax(amax, std::fabs(a[r * ld + c]));
  }
  return amax;
}

void fp8_fake_quant_scaled(float* a, int64_t rows, int64_t cols, int64_t ld, float scale) {
  parallel_for(rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t c = 0; c < cols; ++c) a[r * ld + c] = fp8_fake_quant(a[r * ld + c], scale);
    }
  });
}

void dequantize_fp8_weights(QuantMethod method, const uint8_t* w, const float* scale, int64_t E, int64_t N,
                            int64_t K, int64_t parts, float* out) {
  const int64_t part_rows = N / parts;
  const int64_t row_blocks = (part_rows + kFp8BlockSize - 1) / kFp8BlockSize;  // per part
  const int64_t col_blocks = (K + kFp8BlockSize - 1) / kFp8BlockSize;
  parallel_for(E * N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t en = begin; en < end; ++en) {
      const int64_t e = en / N, n = en % N, part = n / part_rows, r = n % part_rows;
      const uint8_t* src = w + en * K;
      float* dst = out + en * K;
      switch (method) {
        case QuantMethod::kFp8Block128: {
          const float* srow = scale + (e * parts * row_blocks + part * row_blocks + r / kFp8BlockSize) * col_blocks;
          for (int64_t k = 0; k < K; ++k) dst[k] = f8e4m3_bits_to_f32(src[k]) * srow[k / kFp8BlockSize];
          break;
        }
        case QuantMethod::kFp8PerTensor: {
          const float s = scale[e * parts + part];
          for (int64_t k = 0; k < K; ++k) dst[k] = f8e4m3_bits_to_f32(src[k]) * s;
          break;
        }
        case QuantMethod::kNone:
        case QuantMethod::kMxfp4:
        case QuantMethod::kInt4G32:
        case QuantMethod::kInt4G128: break;  // not an fp8 tensor; prepare() never calls this
      }
    }
  });
}

}  // namespace moekit::cpu

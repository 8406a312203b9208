#include "experts/cpu/cpu_gemm.h"

#include <cblas.h>


#include "core/weight4.h"
#include "moekit/parallel_for.h"
#include "moekit/platform.h"
#include "experts/cpu/fp8_emulation.h"
#include "experts/cpu/packed_bf16_gemm.h"

namespace moekit::cpu {

const char* cpu_gemm_path_name(CpuGemmPath path) {
  switch (path) {
    case CpuGemmPath::kBlasF32: return "blas_f32";
    case CpuGemmPath::kPackedBf16: return "packed_bf16";
    case CpuGemmPath::kPackedF32: return "packed_f32";
  }
  return "?";
}

CpuGemmPath cpu_gemm_path(const MoeConfig& config) {
  // kernel.cpu_gemm = blas forces the f32 BLAS path (packed is the table's choice where it can serve).
  const bool force_blas = kernel_option_in_effect(config.kernel, &KernelOptions::cpu_gemm) == "blas";
  if (force_blas || !packed_gemm_supported()) return CpuGemmPath::kBlasF32;
  return config.quant.weight_dtype == DType::kBF16 ? CpuGemmPath::kPackedBf16 : CpuGemmPath::kPackedF32;
}

void gemm_abt(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m,
              int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), 0.0f, c,
              static_cast<blasint>(ldc));
}

void gemm_abt_fixed_order(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                          int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  // NOTE: one row per task, one accumulator per element, k ascending: the
  // result of a row depends only on that row (and the weights).
  // Eight columns at a time: eight independent sums (instruction-level
  // parallelism), each still one element's products added in K order.
  constexpr int64_t kCols = 8;
  parallel_for(m, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* ai = a + i * lda;
      int64_t j = 0;
      for (; j + kCols <= n; j += kCols) {
        float acc[kCols] = {};
        const float* bj = b + j * ldb;
        for (int64_t kk = 0; kk < k; ++kk) {
          const float x = ai[kk];
          for (int64_t q = 0; q < kCols; ++q) acc[q] += x * bj[q * ldb + kk];
        }
        for (int64_t q = 0; q < kCols; ++q) c[i * ldc + j + q] = acc[q];
      }
      for (; j < n; ++j) {
        const float* bj = b + j * ldb;
        float acc = 0.0f;
        for (int64_t kk = 0; kk < k; ++kk) acc += ai[kk] * bj[kk];
        c[i * ldc + j] = acc;
      }
    }
  });
}

void ExpertWeightsF32::assign_fp8(QuantMethod method, const TensorView& src, const TensorView& scale,
                                  int64_t parts) {
  data_.assign(static_cast<size_t>(src.numel()), 0.0f);
  dequantize_fp8_weights(method, src.ptr<const uint8_t>(), scale.ptr<const float>(), src.shape[0], src.shape[1],
                         src.shape[2], parts, data_.data());
}

void ExpertWeightsF32::assign_weight4(QuantMethod method, const TensorView& src, const TensorView& scale) {
  const int64_t rows = src.shape[0] * src.shape[1], cols = 2 * src.shape[2];
  const int64_t groups = cols / weight4_group(method);
  const size_t scale_bytes = dtype_size(scale.dtype);
  data_.assign(static_cast<size_t>(rows * cols), 0.0f);
  parallel_for(rows, 64, [&](int64_t begin, int64_t end) {
    dequantize_weight4(method, src.ptr<const uint8_t>() + begin * cols / 2,
                       scale.ptr<const uint8_t>() + static_cast<size_t>(begin * groups) * scale_bytes, end - begin,
                       cols, data_.data() + begin * cols);
  });
}

void ExpertWeightsF32::assign(const TensorView& src) {
  const int64_t n = src.numel();
  data_.assign(static_cast<size_t>(n), 0.0f);
  float* dst = data_.data();
  switch (src.dtype) {
    case DType::kF32: {
      const float* s = src.ptr<const float>();
      parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = s[i];
      });
      return;
    }
    case DType::kBF16: {
      const uint16_t* s = src.ptr<const uint16_t>();
      parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = bf16_bits_to_f32(s[i]);
      });
      return;
    }
    case DType::kF16:
    case DType::kF8E4M3:
    case DType::kI32:
    case DType::kI16:
    case DType::kU8:
      return;  // rejected by the kernel's prepare_weights before we get here
  }
}

}  // namespace moekit::cpu

extern "C" void openblas_set_num_threads(int num_threads);

namespace moekit {

Status set_num_threads(int num_threads) {
  MOEKIT_RETURN_IF_ERROR(set_parallel_num_threads(num_threads));
  openblas_set_num_threads(num_threads);
  return Status::Ok();
}

}  // namespace moekit

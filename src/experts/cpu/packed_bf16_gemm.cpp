#include "experts/cpu/packed_bf16_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>

#include "moekit/parallel_for.h"

namespace moekit::cpu {
namespace {

using L = PackedBf16Layout;
constexpr int64_t kHalf = L::kPanelCols / 2;  // columns per zmm of fp32

template <typename T>
using PanelKernel = void (*)(const float*, int64_t, int64_t, const T*, int64_t, float*, int64_t, int64_t);
struct Isa {
  PanelKernel<uint16_t> bf16 = nullptr;
  PanelKernel<float> f32 = nullptr;
  const char* name = nullptr;
};

// The widest kernels this CPU runs, if any. __builtin_cpu_supports also checks
// that the OS saves the registers' state.
Isa isa() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const Isa chosen =
      __builtin_cpu_supports("avx512f") ? Isa{packed_bf16_panel_avx512, packed_f32_panel_avx512, "AVX-512"}
      : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
          ? Isa{packed_bf16_panel_avx2, packed_f32_panel_avx2, "AVX2"}
          : Isa{};
  return chosen;
#else
  return Isa{};
#endif
}

template <typename T>
PanelKernel<T> panel_kernel() {
  if constexpr (std::is_same_v<T, float>) {
    return isa().f32;
  } else {
    return isa().bf16;
  }
}

// Where column j of a panel sits in its line. bf16: lane j % 16, column j in
// the high half (element 2j + 1), column j + 16 in the low half (element
// 2(j - 16)), so one AND and one shift widen a line. f32: in order.
template <typename T>
int64_t line_position(int64_t j) {
  if constexpr (std::is_same_v<T, float>) {
    return j;
  } else {
    return j < kHalf ? 2 * j + 1 : 2 * (j - kHalf);
  }
}

}  // namespace

bool packed_gemm_supported() { return isa().name != nullptr; }

const char* packed_gemm_isa() { return isa().name; }

template <typename T>
void PackedWeights<T>::assign(const T* w, int64_t num_experts, int64_t n, int64_t k) {
  num_experts_ = num_experts;
  n_ = n;
  k_ = k;
  panels_ = (n_ + L::kPanelCols - 1) / L::kPanelCols;
  // A re-assignment of the same size keeps the buffer (an in-place update: no
  // fresh pages to fault in, the same address).
  const size_t lines = static_cast<size_t>(num_experts_ * panels_ * k_);
  if (lines != lines_) {
    data_.reset(new Line[lines]);  // default-initialized: written below
    lines_ = lines;
  }
  // One (expert, panel) per item: each writes its own panel, pads as zeros.
  parallel_for(num_experts_ * panels_, 4, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t e = item / panels_, p = item % panels_;
      Line* dst = &data_[static_cast<size_t>(item * k_)];  // [K] lines
      const int64_t n0 = p * L::kPanelCols, cols = std::min(L::kPanelCols, n_ - n0);
      if (cols < L::kPanelCols) std::memset(static_cast<void*>(dst), 0, static_cast<size_t>(k_) * sizeof(Line));
      for (int64_t j = 0; j < cols; ++j) {
        const T* row = w + (e * n_ + n0 + j) * k_;  // W_e[n0 + j, :]
        const int64_t at = line_position<T>(j);
        for (int64_t kk = 0; kk < k_; ++kk) dst[kk].v[at] = row[kk];
      }
    }
  });
}

template <typename T>
const T* PackedWeights<T>::panel(int64_t e, int64_t p) const {
  return data_[static_cast<size_t>((e * panels_ + p) * k_)].v;
}

template <typename T>
void grouped_gemm_packed(const float* a, int64_t lda, const int32_t* offsets, const PackedWeights<T>& w, float* c,
                         int64_t ldc, int32_t* active) {
  const int64_t E = w.num_experts(), panels = w.panels();
  int64_t num_active = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (offsets[e + 1] > offsets[e]) active[num_active++] = static_cast<int32_t>(e);
  }
  const int64_t tasks = num_active * panels;
  if (tasks == 0) return;
  const PanelKernel<T> panel = panel_kernel<T>();
  // Tasks (expert-major, so neighbouring tasks share the expert's A rows) are
  // handed out one at a time: experts carry unequal row counts, and a task's
  // result does not depend on which thread runs it.
  std::atomic<int64_t> next{0};
  parallel_for(parallel_num_threads(), 1, [&](int64_t, int64_t) {
    for (int64_t t = next.fetch_add(1, std::memory_order_relaxed); t < tasks;
         t = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t e = active[t / panels], p = t % panels;
      const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
      const int64_t n0 = p * L::kPanelCols;
      panel(a + r0 * lda, lda, rows, w.panel(e, p), w.k(), c + r0 * ldc + n0, ldc,
            std::min(L::kPanelCols, w.n() - n0));
    }
  });
}

template class PackedWeights<uint16_t>;
template class PackedWeights<float>;
template void grouped_gemm_packed(const float*, int64_t, const int32_t*, const PackedWeights<uint16_t>&, float*,
                                  int64_t, int32_t*);
template void grouped_gemm_packed(const float*, int64_t, const int32_t*, const PackedWeights<float>&, float*,
                                  int64_t, int32_t*);

}  // namespace moekit::cpu

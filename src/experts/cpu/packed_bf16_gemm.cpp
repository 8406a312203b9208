#include "experts/cpu/packed_bf16_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "moekit/parallel_for.h"

namespace moekit::cpu {
namespace {

using L = PackedBf16Layout;
constexpr int64_t kHalf = L::kPanelCols / 2;  // columns per zmm of fp32

using PanelKernel = void (*)(const float*, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t);
struct Isa {
  PanelKernel kernel = nullptr;
  const char* name = nullptr;
};

// The widest kernel this CPU runs, if any. __builtin_cpu_supports also checks
// that the OS saves the registers' state.
Isa isa() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const Isa chosen = __builtin_cpu_supports("avx512f") ? Isa{packed_bf16_panel_avx512, "AVX-512"}
                            : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                                ? Isa{packed_bf16_panel_avx2, "AVX2"}
                                : Isa{};
  return chosen;
#else
  return Isa{};
#endif
}

}  // namespace

bool packed_bf16_gemm_supported() { return isa().kernel != nullptr; }

const char* packed_bf16_gemm_isa() { return isa().name; }

void PackedBf16Weights::assign(const TensorView& src) {
  num_experts_ = src.dim(0);
  n_ = src.dim(1);
  k_ = src.dim(2);
  panels_ = (n_ + L::kPanelCols - 1) / L::kPanelCols;
  // A re-assignment of the same size keeps the buffer (an in-place update: no
  // fresh pages to fault in, the same address).
  const size_t lines = static_cast<size_t>(num_experts_ * panels_ * k_);
  if (lines != lines_) {
    data_.reset(new Line[lines]);  // default-initialized: written below
    lines_ = lines;
  }
  const uint16_t* w = src.ptr<const uint16_t>();
  // One (expert, panel) per item: each writes its own panel, pads as zeros.
  parallel_for(num_experts_ * panels_, 4, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t e = item / panels_, p = item % panels_;
      Line* dst = &data_[static_cast<size_t>(item * k_)];  // [K] lines
      const int64_t n0 = p * L::kPanelCols, cols = std::min(L::kPanelCols, n_ - n0);
      if (cols < L::kPanelCols) std::memset(static_cast<void*>(dst), 0, static_cast<size_t>(k_) * sizeof(Line));
      for (int64_t j = 0; j < cols; ++j) {
        const uint16_t* row = w + (e * n_ + n0 + j) * k_;  // W_e[n0 + j, :]
        // Lane j % 16: column j in the high half (element 2j + 1), column
        // j + 16 in the low half (element 2(j - 16)).
        const int64_t at = j < kHalf ? 2 * j + 1 : 2 * (j - kHalf);
        for (int64_t kk = 0; kk < k_; ++kk) dst[kk].v[at] = row[kk];
      }
    }
  });
}

const uint16_t* PackedBf16Weights::panel(int64_t e, int64_t p) const {
  return data_[static_cast<size_t>((e * panels_ + p) * k_)].v;
}

void grouped_gemm_packed_bf16(const float* a, int64_t lda, const int32_t* offsets, const PackedBf16Weights& w,
                              float* c, int64_t ldc, int32_t* active) {
  const int64_t E = w.num_experts(), panels = w.panels();
  int64_t num_active = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (offsets[e + 1] > offsets[e]) active[num_active++] = static_cast<int32_t>(e);
  }
  const int64_t tasks = num_active * panels;
  if (tasks == 0) return;
  const PanelKernel panel = isa().kernel;
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

}  // namespace moekit::cpu

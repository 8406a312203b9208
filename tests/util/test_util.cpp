#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

namespace moekit::testing {

uint64_t seed_from(std::initializer_list<int64_t> params) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int64_t p : params) {
    h ^= static_cast<uint64_t>(p) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  }
  return h;
}

namespace {
void store(HostTensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kF32: t.data<float>()[i] = static_cast<float>(v); return;
    case DType::kBF16: t.data<uint16_t>()[i] = f32_to_bf16_bits(static_cast<float>(v)); return;
    case DType::kF16: t.data<uint16_t>()[i] = f32_to_f16_bits(static_cast<float>(v)); return;
    case DType::kF8E4M3:
    case DType::kI32:
    case DType::kI16:
    case DType::kU8: std::abort();  // random_tensor and tie_free_logits draw float tensors only
  }
}
double load(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.ptr<float>()[i];
    case DType::kBF16: return bf16_bits_to_f32(t.ptr<uint16_t>()[i]);
    case DType::kF16: return f16_bits_to_f32(t.ptr<uint16_t>()[i]);
    case DType::kF8E4M3: return f8e4m3_bits_to_f32(t.ptr<uint8_t>()[i]);
    case DType::kI32: return t.ptr<int32_t>()[i];
    case DType::kI16: return t.ptr<int16_t>()[i];
    case DType::kU8: return t.ptr<uint8_t>()[i];
  }
  return std::nan("");
}
}  // namespace

HostTensor random_tensor(std::mt19937_64& rng, DType dtype, std::vector<int64_t> shape, double stddev,
                         std::vector<double>* exact) {
  HostTensor t(dtype, std::move(shape));
  std::normal_distribution<double> dist(0.0, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) store(t, i, dist(rng));
  if (exact) *exact = to_double(t.view());
  return t;
}

HostTensor tie_free_logits(std::mt19937_64& rng, DType dtype, int64_t M, int64_t E, double gap,
                           std::vector<double>* exact) {
  // Each row is a random permutation of distinct levels spaced by `gap`, shifted
  // by a random offset; levels are chosen exactly representable in bf16 when
  // dtype is bf16 (small integers times a power-of-two gap).
  HostTensor t(dtype, {M, E});
  std::vector<int64_t> perm(E);
  std::uniform_real_distribution<double> shift(-2.0, 2.0);
  for (int64_t r = 0; r < M; ++r) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const double base = dtype == DType::kBF16 ? 0.0 : shift(rng);
    for (int64_t e = 0; e < E; ++e) {
      const double v = base + (static_cast<double>(perm[e]) - E / 2.0) * gap;
      store(t, r * E + e, v);
    }
  }
  if (exact) *exact = to_double(t.view());
  return t;
}

std::vector<double> to_double(const TensorView& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = load(t, i);
  return out;
}

double rel_l2_error(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return std::numeric_limits<double>::infinity();
    const double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

HostTensor random_distinct_ids(std::mt19937_64& rng, int64_t M, int64_t E, int k, std::vector<int32_t>* counts) {
  HostTensor ids(DType::kI32, {M, k});
  if (counts != nullptr) counts->assign(static_cast<size_t>(E), 0);
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < M; ++t) {
    for (int32_t e = 0; e < E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < k; ++j) {
      ids.data<int32_t>()[t * k + j] = perm[j];
      if (counts != nullptr) ++(*counts)[perm[j]];
    }
  }
  return ids;
}

void poison(HostTensor& t) {
  switch (t.dtype()) {
    case DType::kF32: std::fill_n(t.data<float>(), t.numel(), std::numeric_limits<float>::quiet_NaN()); return;
    case DType::kBF16:
    case DType::kF16: std::fill_n(t.data<uint16_t>(), t.numel(), uint16_t{0x7fc1}); return;  // NaN in both
    case DType::kI32: std::fill_n(t.data<int32_t>(), t.numel(), int32_t{0x7fffffff}); return;
    case DType::kI16: std::fill_n(t.data<int16_t>(), t.numel(), int16_t{0x7fff}); return;
    case DType::kU8:
    case DType::kF8E4M3: std::fill_n(t.data<uint8_t>(), t.numel(), uint8_t{0x7f}); return;
  }
}

Platform described_h200() {
  Platform h200 = Platform::cpu_only();
  h200.cuda_built = h200.sm90a_built = true;
  CudaDeviceInfo d;
  d.index = 0;
  d.cc_major = 9;
  d.cc_minor = 0;
  h200.cuda_devices.push_back(d);
  return h200;
}

}  // namespace moekit::testing

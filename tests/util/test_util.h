// Helpers shared by tests: deterministic random inputs seeded from the test's
// parameters (never from time), conversions, and the error metrics of the
// tolerance table (docs/testing.md).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "moekit/platform.h"
#include "moekit/tensor.h"

namespace moekit::testing {

// A seed derived from the test parameters, so every case draws fresh inputs
// and any failure reproduces.
uint64_t seed_from(std::initializer_list<int64_t> params);

// Values ~ N(0, stddev), stored in `dtype` (f32 or bf16); returns the tensor and
// fills `exact` with the stored values widened to double (what a backend sees).
HostTensor random_tensor(std::mt19937_64& rng, DType dtype, std::vector<int64_t> shape, double stddev,
                         std::vector<double>* exact = nullptr);

// Logits [M, E] whose values in each row are pairwise distinct by at least
// `gap` after rounding to `dtype`, so top-k selection has no ties.
HostTensor tie_free_logits(std::mt19937_64& rng, DType dtype, int64_t M, int64_t E, double gap,
                           std::vector<double>* exact = nullptr);

// Widen any float tensor (f32/bf16/f16) or int tensor to double.
std::vector<double> to_double(const TensorView& t);

// ||out - ref|| / ||ref||; +inf when `out` holds a NaN or Inf (NaN never passes).
double rel_l2_error(const std::vector<double>& out, const std::vector<double>& ref);

// Fills a tensor with a poison pattern (bf16/f32 NaN, ints 0x7fff...) so an
// unwritten element fails the check.
void poison(HostTensor& t);

// Caller routing: ids [M, k] i32, each row k distinct experts of [0, E) drawn
// uniformly; `counts` (optional) gets the tokens routed to each expert.
HostTensor random_distinct_ids(std::mt19937_64& rng, int64_t M, int64_t E, int k,
                               std::vector<int32_t>* counts = nullptr);

// A platform that describes an H200 (compute capability 9.0, sm_90a kernels
// built) without touching a device: for the oracle's and the sm90 classes'
// rules on a machine without one.
Platform described_h200();

}  // namespace moekit::testing

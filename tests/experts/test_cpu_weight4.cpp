// 4-bit weights on the CPU kernels (docs/weights_4bit.md): the codec against
// the fp64 reference's own decoder, the quantizer's rounding, both kernels
// bitwise equal, the layer against the fp64 layer on the decoded weights, and
// every bad weight or scale refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/weight4.h"
#include "experts/cpu_kernel_pair.h"
#include "experts/cpu/cpu_modular.h"
#include "util/weight4_test_layer.h"
#include "reference/reference.h"
#include "util/reference_params.h"
#include "util/test_util.h"

namespace moekit::cpu {
namespace {

using moekit::testing::Packed;
using moekit::testing::Weight4Layer;
using moekit::testing::Weight4Shape;
using moekit::testing::bytes_of;
using moekit::testing::random_packed;
using moekit::testing::weight_values;

using moekit::testing::random_tensor;
using moekit::testing::ref_layer;
using moekit::testing::ref_routing;
using moekit::testing::rel_l2_error;
using moekit::testing::seed_from;
using moekit::testing::tie_free_logits;
using moekit::testing::to_double;

// Tolerance (||out - ref|| / ||ref||). The decoded weights are the
// reference's (mxfp4 exactly; int4 rounded once to f32, 2^-24 relative, since
// these tests draw arbitrary f32 scales), so what remains is the f32
// arithmetic of the GEMMs, fp32 accumulation over K <= 256 terms (K u =
// 1.5e-5 worst case), the activation and the weighted sum: 2e-5. bf16 outputs add one rounding of each element (2^-8 relative).
constexpr double kF32Bound = 2e-5;
constexpr double kBf16Bound = 0.00390625 * (1.0 + kF32Bound) + kF32Bound;

constexpr QuantMethod kMethods[] = {QuantMethod::kMxfp4, QuantMethod::kInt4G32, QuantMethod::kInt4G128};

// ---------------------------------------------------------------------------
// The codec.

TEST(Weight4Codec, DequantizeEqualsTheReferenceDecoder) {
  for (QuantMethod m : kMethods) {
    std::mt19937_64 rng(seed_from({41, int64_t(m)}));
    Packed p = random_packed(rng, m, {6, 256});
    // Every nibble pair at least once in the first row.
    for (int b = 0; b < 128; ++b) p.bytes.data<uint8_t>()[b] = static_cast<uint8_t>(b * 2 + (b % 2));
    std::vector<float> out(6 * 256);
    dequantize_weight4(m, p.bytes.data<uint8_t>(), p.scales.data<uint8_t>(), 6, 256, out.data());
    const std::vector<double> ref = weight_values(m, p);
    // mxfp4: exact (a 2-bit significand times a power of two); int4: the
    // product of a 4-bit integer and an f32 scale, rounded once to f32 (exact
    // for bf16-valued scales, as checkpoints store them).
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], static_cast<float>(ref[i])) << quant_method_name(m) << " " << i;
      if (m == QuantMethod::kMxfp4) ASSERT_EQ(static_cast<double>(out[i]), ref[i]) << i;
    }
  }
}

TEST(Weight4Codec, QuantizerRoundsToTheNearestGridValueAndIsIdempotent) {
  for (QuantMethod m : kMethods) {
    std::mt19937_64 rng(seed_from({42, int64_t(m)}));
    const int64_t rows = 8, cols = 256, g = weight4_group(m);
    std::vector<double> exact;
    const HostTensor w = random_tensor(rng, DType::kF32, {rows, cols}, 0.05, &exact);
    Packed p{HostTensor(DType::kU8, {rows, cols / 2}), HostTensor(weight4_scale_dtype(m), {rows, cols / g})};
    quantize_weight4(m, w.data<float>(), rows, cols, p.bytes.data<uint8_t>(), p.scales.data<uint8_t>());
    const std::vector<double> q = weight_values(m, p);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < cols / g; ++b) {
        double amax = 0.0;
        for (int64_t j = 0; j < g; ++j) amax = std::max(amax, std::fabs(exact[r * cols + b * g + j]));
        for (int64_t j = 0; j < g; ++j) {
          const int64_t i = r * cols + b * g + j;
          const double x = exact[i], err = std::fabs(x - q[i]);
          if (m == QuantMethod::kMxfp4) {
            // Grid step at |x| (e2m1 has 1 mantissa bit): 2^(floor(log2|x|) - 1), at least the
            // subnormal step 2^(e - 1) with e the group exponent; beyond 6 * 2^e: saturation.
            const int e = p.scales.data<uint8_t>()[r * (cols / g) + b] - 127;
            const double top = 6.0 * std::ldexp(1.0, e);
            const double step = std::max(std::ldexp(1.0, std::ilogb(std::fabs(x)) - 1), std::ldexp(1.0, e - 1));
            if (std::fabs(x) > top) {
              EXPECT_EQ(std::fabs(q[i]), top) << "saturation at " << i;
            } else {
              EXPECT_LE(err, step / 2) << "mxfp4 rounding at " << i;
            }
          } else {
            const double s = p.scales.data<float>()[r * (cols / g) + b];
            EXPECT_EQ(s, static_cast<double>(round_to_bf16(static_cast<float>(s)))) << "scale not a bf16 value";
            EXPECT_NEAR(s * kInt4Max, amax, amax * 0.0079) << "scale = amax / 7 (within bf16 rounding)";
            EXPECT_LE(err, s / 2 * (1 + 1e-6)) << "int4 rounding at " << i;
          }
        }
      }
    }
    // Quantizing the decoded values gives the same bytes and scales again.
    std::vector<float> decoded(q.begin(), q.end());
    Packed again{HostTensor(DType::kU8, {rows, cols / 2}), HostTensor(weight4_scale_dtype(m), {rows, cols / g})};
    quantize_weight4(m, decoded.data(), rows, cols, again.bytes.data<uint8_t>(), again.scales.data<uint8_t>());
    EXPECT_EQ(bytes_of(again.bytes), bytes_of(p.bytes)) << quant_method_name(m);
    EXPECT_EQ(std::memcmp(again.scales.data<uint8_t>(), p.scales.data<uint8_t>(), p.scales.nbytes()), 0)
        << quant_method_name(m);
  }
}

// ---------------------------------------------------------------------------
// The layer.

using GridParam = std::tuple<QuantMethod, Activation, DType>;

class CpuWeight4Grid : public ::testing::TestWithParam<GridParam> {};

TEST_P(CpuWeight4Grid, ModularEqualsMonolithicAndMatchesTheReference) {
  const auto [method, act, dtype] = GetParam();
  const Weight4Shape s{19, 8, 2, 256, 128};
  const bool biases = act == Activation::kSwigluOai;  // gpt-oss's layer has them
  const Weight4Layer layer(s, method, act, biases, dtype, seed_from({int64_t(method), int64_t(act), int64_t(dtype), 4}));
  ASSERT_TRUE(layer.config.validate().ok()) << layer.config.validate().to_string();
  StatusOr<KernelPairRun> run = run_kernel_pair(layer.config, layer.weights(), layer.hidden, layer.logits);
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_TRUE(run->outputs_equal()) << "modular and monolithic outputs differ";
  const int64_t M = s.M, k = s.k;
  const moekit_ref::RoutingResult rr = moekit_ref::route(ref_routing(layer.config.routing), layer.logits_exact, M, s.E);
  const std::vector<double> captured = to_double(run->ids.view());
  for (int64_t i = 0; i < M * k; ++i) ASSERT_EQ(captured[i], rr.ids[i]) << "captured ids differ at pair " << i;
  moekit_ref::LayerExtras extras;
  extras.b13 = layer.b13_exact;
  extras.b2 = layer.b2_exact;
  const std::vector<double> ref = moekit_ref::moe_layer(ref_layer(layer.config), layer.hidden_exact, M, layer.w13_exact,
                                                        layer.w2_exact, rr.ids, rr.weights, static_cast<int>(k), extras);
  const double err = rel_l2_error(to_double(run->monolithic.view()), ref);
  char text[32];
  std::snprintf(text, sizeof text, "%.3e", err);
  RecordProperty("rel_l2_error", text);
  EXPECT_LE(err, dtype == DType::kF32 ? kF32Bound : kBf16Bound);
}

std::string grid_name(const ::testing::TestParamInfo<GridParam>& info) {
  const auto [method, act, dtype] = info.param;
  return std::string(quant_method_name(method)) + "_" + activation_name(act) + "_" + dtype_name(dtype);
}

INSTANTIATE_TEST_SUITE_P(Grid, CpuWeight4Grid,
                         ::testing::Combine(::testing::ValuesIn(kMethods),
                                            ::testing::Values(Activation::kSiluGated, Activation::kSwigluOai,
                                                              Activation::kRelu2),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         grid_name);

// ---------------------------------------------------------------------------
// Bad input: named, and the kernel keeps nothing of it.

Status prepare(const MoeConfig& c, const MoeWeights& w) {
  CpuModular kernel(c);
  return kernel.prepare_weights(w);
}

void expect_refused(const Status& st, const std::string& needle) {
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
}

TEST(CpuWeight4, BadWeightsAndScalesAreRefusedByName) {
  const Weight4Shape s{4, 4, 2, 128, 128};
  for (QuantMethod m : kMethods) {
    const Weight4Layer layer(s, m, Activation::kSiluGated, false, DType::kBF16, seed_from({43, int64_t(m)}));
    ASSERT_TRUE(prepare(layer.config, layer.weights()).ok());
    {  // unpacked widths: [E, n1, H] instead of [E, n1, H/2]
      HostTensor wide(DType::kU8, {s.E, 2 * s.I, s.H});
      MoeWeights w = layer.weights();
      w.w13 = wide.view();
      expect_refused(prepare(layer.config, w), "w13");
    }
    {  // a scale tensor of the other scheme's dtype
      HostTensor other(m == QuantMethod::kMxfp4 ? DType::kF32 : DType::kU8, layer.w2.scales.shape());
      MoeWeights w = layer.weights();
      w.w2_scale = other.view();
      expect_refused(prepare(layer.config, w), "w2_scale");
    }
    {  // one scale per row instead of one per group
      HostTensor rows(weight4_scale_dtype(m), {s.E, 2 * s.I, 1});
      MoeWeights w = layer.weights();
      w.w13_scale = rows.view();
      expect_refused(prepare(layer.config, w), "w13_scale");
    }
    {  // E8M0 code 255 (NaN) / an int4 scale of 0 or NaN
      HostTensor bad = layer.w2.scales;  // a copy
      if (m == QuantMethod::kMxfp4) {
        bad.data<uint8_t>()[5] = kE8M0Nan;
      } else {
        bad.data<float>()[5] = 0.0f;
      }
      MoeWeights w = layer.weights();
      w.w2_scale = bad.view();
      expect_refused(prepare(layer.config, w), "w2_scale: element 5");
      if (m != QuantMethod::kMxfp4) {
        bad.data<float>()[5] = std::nanf("");
        expect_refused(prepare(layer.config, w), "w2_scale: element 5");
      }
    }
  }
}

// A scale that passes on its own but takes a weight past f32's range (mxfp4:
// code 254 = 2^127 with e2m1 6.0; int4: 3e38 with -8) would give infinite
// weights and NaN rows: refused by name, and the largest finite products pass.
TEST(CpuWeight4, ScalesThatTakeAWeightPastF32AreRefused) {
  const Weight4Shape s{4, 4, 2, 128, 128};
  for (QuantMethod m : kMethods) {
    SCOPED_TRACE(quant_method_name(m));
    const bool mx = m == QuantMethod::kMxfp4;
    const Weight4Layer layer(s, m, Activation::kSiluGated, false, DType::kBF16, seed_from({47, int64_t(m)}));
    HostTensor bytes = layer.w2.bytes, scales = layer.w2.scales;  // copies
    const int64_t group = 3, first = group * weight4_group(m) / 2;  // the group's first byte
    for (int64_t j = 0; j < weight4_group(m) / 2; ++j) bytes.data<uint8_t>()[first + j] = 0x00;
    MoeWeights w = layer.weights();
    w.w2 = bytes.view();
    w.w2_scale = scales.view();
    // Largest finite: mxfp4 1.5 (0x3) x 2^127, int4 -8 (nibble 0) x FLT_MAX / 8.
    if (mx) {
      scales.data<uint8_t>()[group] = 254;
      for (int64_t j = 0; j < weight4_group(m) / 2; ++j) bytes.data<uint8_t>()[first + j] = 0x33;
    } else {
      scales.data<float>()[group] = std::numeric_limits<float>::max() / 8.0f;
    }
    EXPECT_TRUE(prepare(layer.config, w).ok()) << prepare(layer.config, w).to_string();
    if (mx) {
      bytes.data<uint8_t>()[first + 5] = 0x70;  // column 11 of the group: e2m1 6.0
    } else {
      scales.data<float>()[group] = 3e38f;
    }
    const int64_t per_row = s.I / weight4_group(m);
    const std::string where = "w2_scale[0, " + std::to_string(group / per_row) + ", " + std::to_string(group % per_row) + "]";
    expect_refused(prepare(layer.config, w), std::string("w2: a value ") + (mx ? "6" : "-8") + " times its scale " +
                                                 where + " = " + (mx ? "2^127" : "3e+38") + " leaves f32's range");
    if (mx) {  // code 253 (2^126) with 4.0
      scales.data<uint8_t>()[group] = 253;
      bytes.data<uint8_t>()[first + 5] = 0x60;
      expect_refused(prepare(layer.config, w), "w2: a value 4 times its scale " + where + " = 2^126");
    }
  }
}

TEST(CpuWeight4, ConfigRulesAreNamed) {
  MoeConfig c;
  c.max_num_tokens = 8;
  c.num_experts = 4;
  c.hidden = 96;  // not a multiple of 128
  c.intermediate = 128;
  c.routing.top_k = 2;
  c.quant.method = QuantMethod::kInt4G128;
  c.quant.weight_dtype = DType::kU8;
  Status st = c.validate();
  expect_refused(st, "hidden");
  expect_refused(st, "int4_g128");
  c.hidden = 128;
  EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
  c.quant.weight_dtype = DType::kBF16;
  expect_refused(c.validate(), "quant.weight_dtype: must be u8");
  c.quant.weight_dtype = DType::kU8;
  c.shared_intermediate = 128;
  expect_refused(c.validate(), "shared expert");
  c.shared_intermediate = 0;
  c.quant.method = QuantMethod::kMxfp4;
  c.intermediate = 48;  // not a multiple of 32
  expect_refused(c.validate(), "intermediate");
  for (QuantMethod m : kMethods) EXPECT_EQ(parse_quant_method(quant_method_name(m)), m);
}

}  // namespace
}  // namespace moekit::cpu

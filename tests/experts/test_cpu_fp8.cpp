// The fp8 W8A8 schemes on the CPU kernels (docs/fp8.md): the e4m3 rounding
// against the reference's own, both kernels bitwise equal, the layer against
// the fp64 reference's independent fp8 emulation and against the unquantized
// fp64 layer, capture/replay bit for bit, and every bad scale rejected by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "experts/cpu_kernel_pair.h"
#include "experts/cpu/cpu_modular.h"
#include "experts/cpu/cpu_monolithic.h"
#include "moekit/io.h"
#include "moekit/routing.h"
#include "reference/reference.h"
#include "util/reference_params.h"
#include "util/fp8_test_layer.h"
#include "util/test_util.h"

namespace moekit::cpu {
namespace {

using moekit::testing::poison;
using moekit::testing::random_tensor;
using moekit::testing::ref_layer;
using moekit::testing::ref_routing;
using moekit::testing::rel_l2_error;
using moekit::testing::seed_from;
using moekit::testing::tie_free_logits;
using moekit::testing::to_double;

// Tolerance table (normalized error ||out - ref|| / ||ref||).
//
// Against the reference's fp8 emulation (same scheme, fp64 elsewhere). GEMM1's
// input is rounded identically on both sides (same f32 scale, same f32
// quotient, same e4m3 value), so what remains is fp32 arithmetic: dequantized
// products q * s rounded to f32 (2^-24 each) and fp32 accumulation over
// K <= 256 terms (worst case K u = 1.5e-5). GEMM2's input is rounded from
// values that already differ by that fp32 error, so an element lying within
// ~1e-6 (relative) of an e4m3 rounding midpoint may land one e4m3 step apart
// (chance ~1e-5 per element; a step is <= 2^-3 of the element, which moves the
// normalized output error by well under 1e-3 at these sizes). Bound: 2e-5 for
// the fp32 part plus 1e-3 for at most one such flip.
constexpr double kEmulationF32Bound = 2e-5 + 1e-3;
// bf16 outputs add one rounding of each output element (2^-8 relative).
constexpr double kEmulationBf16Bound = 0.00390625 * (1.0 + kEmulationF32Bound) + kEmulationF32Bound;
// Against the unquantized fp64 layer: the error the fp8 rounding explains.
// e4m3 keeps 3 mantissa bits, so rounding moves a normal value by at most 2^-4
// of itself, and, spread uniformly, by 2^-4/sqrt(3) = 0.036 rms. Each GEMM
// multiplies two such operands (weights, activations): ~sqrt(2) * 0.036 = 0.051
// rms per GEMM; GEMM2's error adds GEMM1's, propagated through the activation
// (gain <= 1 in rms for silu/relu2 on these scales): sqrt(2) * 0.051 = 0.072.
// Block scaling only helps (small blocks are not flushed to subnormals).
// Bound 0.1; measured values are recorded as rel_l2_error_unquantized.
constexpr double kUnquantizedBound = 0.1;

using moekit::testing::Fp8Layer;
using moekit::testing::Fp8Scheme;
using moekit::testing::fp8_scheme_name;
using Shape = moekit::testing::Fp8Shape;
using Scheme = Fp8Scheme;


struct Workbuf {
  std::vector<unsigned char> bytes;
  explicit Workbuf(size_t n) : bytes(n) {}
  Workspace ws() { return {bytes.data(), bytes.size()}; }
};

bool all_bytes_equal(const HostTensor& a, const HostTensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data<unsigned char>(), b.data<unsigned char>(), a.nbytes()) == 0;
}

// ---------------------------------------------------------------------------
// e4m3 rounding: the library's conversion against the reference's table search.

TEST(Fp8Rounding, ConversionMatchesReference) {
  // Every code decodes to the reference's value.
  for (int b = 0; b < 256; ++b) {
    const double lib = f8e4m3_bits_to_f32(static_cast<uint8_t>(b)), ref = moekit_ref::e4m3_value(static_cast<uint8_t>(b));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(lib)) << "code " << b;
    } else {
      EXPECT_EQ(lib, ref) << "code " << b;
    }
  }
  // Midpoints between neighbours (the ties), the points just around them,
  // saturation and random magnitudes across the whole range, both signs.
  std::vector<float> xs = {0.0f, -0.0f, 448.0f, 449.0f, 464.0f, 1e6f, 3.4e38f, 1e-30f, 0.0009765625f, 0.001953125f};
  for (int c = 0; c < 0x7e; ++c) {
    const float mid = static_cast<float>((moekit_ref::e4m3_value(c) + moekit_ref::e4m3_value(c + 1)) / 2);
    xs.insert(xs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)});
  }
  std::mt19937_64 rng(seed_from({8, 4, 3}));
  std::uniform_real_distribution<float> log2mag(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) xs.push_back(std::exp2(log2mag(rng)));
  for (const float x : xs) {
    for (const float v : {x, -x}) {
      const double lib = f8e4m3_bits_to_f32(f32_to_f8e4m3_bits(v));
      ASSERT_EQ(lib, moekit_ref::e4m3_round(v)) << "x = " << v;
    }
  }
  EXPECT_TRUE(std::isnan(f8e4m3_bits_to_f32(f32_to_f8e4m3_bits(std::nanf("")))));
}

// ---------------------------------------------------------------------------
// The grid: scheme x activation x shape (aligned, partial blocks) x act dtype.

using GridParam = std::tuple<Scheme, Activation, int /*shape*/, DType>;
constexpr Shape kShapes[] = {{9, 6, 2, 256, 128}, {7, 5, 3, 200, 72}};

class CpuFp8Grid : public ::testing::TestWithParam<GridParam> {};

TEST_P(CpuFp8Grid, ModularEqualsMonolithicAndMatchesReferences) {
  const auto [scheme, act, shape, dtype] = GetParam();
  const Shape s = kShapes[shape];
  const Fp8Layer layer(s, scheme, act, dtype, seed_from({int64_t(scheme), int64_t(act), shape, int64_t(dtype), 8}));
  ASSERT_TRUE(layer.config.validate().ok()) << layer.config.validate().to_string();
  StatusOr<KernelPairRun> run = run_kernel_pair(layer.config, layer.weights(), layer.hidden, layer.logits);
  ASSERT_TRUE(run.ok()) << run.status().to_string();
  EXPECT_TRUE(run->outputs_equal()) << "modular and monolithic outputs differ";
  const int64_t M = s.M, k = s.k;
  const moekit_ref::RoutingResult rr = moekit_ref::route(ref_routing(layer.config.routing), layer.logits_exact, M, s.E);
  const std::vector<double> captured = to_double(run->ids.view());
  for (int64_t i = 0; i < M * k; ++i) ASSERT_EQ(captured[i], rr.ids[i]) << "routing_replay_out differs at pair " << i;

  const std::vector<double> out = to_double(run->monolithic.view());
  const std::vector<double> ref_fp8 = moekit_ref::moe_layer_fp8(
      ref_layer(layer.config), layer.ref_params(), layer.hidden_exact, M, layer.bytes(layer.w13),
      to_double(layer.w13_scale.view()), layer.bytes(layer.w2), to_double(layer.w2_scale.view()), rr.ids, rr.weights,
      static_cast<int>(k));
  const std::vector<double> ref_exact = moekit_ref::moe_layer(ref_layer(layer.config), layer.hidden_exact, M,
                                                              layer.w13_exact, layer.w2_exact, rr.ids, rr.weights,
                                                              static_cast<int>(k));
  const double err = rel_l2_error(out, ref_fp8), err_exact = rel_l2_error(out, ref_exact);
  char text[64];
  std::snprintf(text, sizeof text, "%.3e", err);
  RecordProperty("rel_l2_error_fp8_emulation", text);
  std::snprintf(text, sizeof text, "%.3e", err_exact);
  RecordProperty("rel_l2_error_unquantized", text);
  EXPECT_LE(err, dtype == DType::kF32 ? kEmulationF32Bound : kEmulationBf16Bound) << "vs the reference's fp8 emulation";
  EXPECT_LE(err_exact, kUnquantizedBound) << "vs the unquantized fp64 layer";
  // The scheme does something: the emulation is much closer than the unquantized layer.
  EXPECT_LT(err * 10, err_exact);
}

std::string grid_name(const ::testing::TestParamInfo<GridParam>& info) {
  const auto [scheme, act, shape, dtype] = info.param;
  const Shape s = kShapes[shape];
  return std::string(fp8_scheme_name(scheme)) + "_" + activation_name(act) + "_H" + std::to_string(s.H) + "_I" +
         std::to_string(s.I) + "_" + dtype_name(dtype);
}

INSTANTIATE_TEST_SUITE_P(Grid, CpuFp8Grid,
                         ::testing::Combine(::testing::Values(Scheme::kBlock128, Scheme::kTensorDynamic,
                                                              Scheme::kTensorStatic),
                                            ::testing::Values(Activation::kSiluGated, Activation::kRelu2),
                                            ::testing::Values(0, 1), ::testing::Values(DType::kF32, DType::kBF16)),
                         grid_name);

// ---------------------------------------------------------------------------

TEST(CpuFp8, ReplayOfCaptureReproducesOutputBitwise) {
  for (Scheme scheme : {Scheme::kBlock128, Scheme::kTensorDynamic}) {
    const Shape s{33, 8, 2, 256, 128};
    Fp8Layer layer(s, scheme, Activation::kSiluGated, DType::kBF16, seed_from({33, int64_t(scheme), 9}));
    layer.config.needs_capture = layer.config.needs_replay = true;
    CpuMonolithic mono(layer.config);
    ASSERT_TRUE(mono.prepare_weights(layer.weights()).ok());
    Workbuf w(mono.workspace_size(s.M));
    HostTensor out1(DType::kBF16, {s.M, s.H}), out2(DType::kBF16, {s.M, s.H});
    HostTensor replay(DType::kI16, {s.M, s.k}), forced(DType::kI32, {s.M, s.k});
    for (HostTensor* t : {&out1, &out2, &replay}) poison(*t);
    MoeRunArgs a;
    a.hidden = layer.hidden.view();
    a.router_logits = layer.logits.view();
    a.out = out1.view();
    a.routing_replay_out = replay.view();
    ASSERT_TRUE(mono.run(a, w.ws(), nullptr).ok());
    for (int64_t i = 0; i < s.M * s.k; ++i) forced.data<int32_t>()[i] = replay.data<int16_t>()[i];
    a.routing_replay_out = {};
    a.out = out2.view();
    a.forced_ids = forced.view();
    ASSERT_TRUE(mono.run(a, w.ws(), nullptr).ok());
    EXPECT_TRUE(all_bytes_equal(out1, out2)) << fp8_scheme_name(scheme) << ": replay did not reproduce the captured run";
  }
}

// Every bad scale is refused by prepare_weights with the tensor's name.
TEST(CpuFp8, BadScalesAreRejectedByName) {
  const Shape s{4, 3, 2, 200, 72};
  for (Scheme scheme : {Scheme::kBlock128, Scheme::kTensorStatic}) {
    const Fp8Layer layer(s, scheme, Activation::kSiluGated, DType::kF32, seed_from({4, int64_t(scheme), 10}));
    const auto expect_error = [&](const MoeWeights& w, const std::string& what, const std::string& case_name) {
      CpuModular kernel(layer.config);
      const Status st = kernel.prepare_weights(w);
      EXPECT_FALSE(st.ok()) << case_name;
      EXPECT_NE(st.message().find(what), std::string::npos) << case_name << ": " << st.to_string();
    };
    MoeWeights missing = layer.weights();
    missing.w13_scale = {};
    expect_error(missing, "w13_scale: required tensor is missing", "missing");
    HostTensor wrong_shape(DType::kF32, {s.E, 1});
    if (scheme == Scheme::kTensorStatic) wrong_shape = HostTensor(DType::kF32, {s.E, 3});
    std::fill_n(wrong_shape.data<float>(), wrong_shape.numel(), 1.0f);
    MoeWeights shaped = layer.weights();
    shaped.w13_scale = wrong_shape.view();
    expect_error(shaped, "w13_scale: expected shape", "misshapen");
    HostTensor as_bf16(DType::kBF16, layer.w2_scale.shape());
    MoeWeights typed = layer.weights();
    typed.w2_scale = as_bf16.view();
    expect_error(typed, "w2_scale: expected dtype f32, got bf16", "dtype");
    for (const float bad : {std::nanf(""), INFINITY, 0.0f, -1.0f}) {
      HostTensor copy(DType::kF32, layer.w2_scale.shape());
      std::memcpy(copy.data<float>(), layer.w2_scale.data<float>(), copy.nbytes());
      copy.data<float>()[copy.numel() - 1] = bad;
      MoeWeights w = layer.weights();
      w.w2_scale = copy.view();
      expect_error(w, "w2_scale: element " + std::to_string(copy.numel() - 1), "value " + std::to_string(bad));
    }
    if (scheme == Scheme::kTensorStatic) {
      MoeWeights no_act = layer.weights();
      no_act.a2_scale = {};
      expect_error(no_act, "a2_scale: required tensor is missing", "static act scale missing");
    } else {
      MoeWeights extra = layer.weights();
      extra.a13_scale = layer.w2_scale.view();
      expect_error(extra, "a13_scale: given, but quant", "static scale for a block scheme");
    }
  }
  // Scales given to an unquantized layer are an error too, not ignored.
  MoeConfig plain;
  plain.num_experts = 2;
  plain.hidden = 16;
  plain.intermediate = 8;
  plain.max_num_tokens = 2;
  plain.quant.weight_dtype = plain.quant.act_dtype = DType::kF32;
  HostTensor w13(DType::kF32, {2, 16, 16}), w2(DType::kF32, {2, 16, 8}), sc(DType::kF32, {2});
  CpuModular kernel(plain);
  const Status st = kernel.prepare_weights({.w13 = w13.view(), .w2 = w2.view(), .w2_scale = sc.view()});
  EXPECT_NE(st.message().find("w2_scale: given, but quant"), std::string::npos) << st.to_string();
}

TEST(CpuFp8, ConfigValidationAndSupportReasons) {
  MoeConfig c;
  c.num_experts = 4;
  c.hidden = 200;
  c.intermediate = 72;
  c.max_num_tokens = 4;
  c.routing.top_k = 2;
  c.quant.method = QuantMethod::kFp8Block128;
  c.quant.weight_dtype = DType::kBF16;
  Status st = c.validate();
  EXPECT_NE(st.message().find("quant.weight_dtype: must be f8_e4m3 for method fp8_block128"), std::string::npos)
      << st.to_string();
  EXPECT_NE(CpuModular::supports(c, Platform::cpu_only()).reason.find("fp8_block128 needs f8_e4m3 weights"),
            std::string::npos);
  c.quant.weight_dtype = DType::kF8E4M3;
  EXPECT_TRUE(c.validate().ok());
  EXPECT_TRUE(CpuModular::supports(c, Platform::cpu_only()).ok);  // partial 128-blocks: the CPU handles them
  c.quant.act_scale = ActScale::kStatic;
  st = c.validate();
  EXPECT_NE(st.message().find("quant.act_scale"), std::string::npos) << st.to_string();
  c.quant.method = QuantMethod::kFp8PerTensor;
  EXPECT_TRUE(c.validate().ok());
  EXPECT_NE(c.to_string().find("quant={method=fp8_per_tensor, weights=f8_e4m3, acts=bf16, act_scale=static}"),
            std::string::npos)
      << c.to_string();
  c.quant.method = QuantMethod::kNone;
  c.quant.act_scale = ActScale::kDynamic;
  st = c.validate();
  EXPECT_NE(st.message().find("quant.weight_dtype: must be f32 or bf16 for method none"), std::string::npos)
      << st.to_string();
  MoeConfig extras = c;
  extras.quant.method = QuantMethod::kFp8Block128;
  extras.quant.weight_dtype = DType::kF8E4M3;
  extras.shared_intermediate = 128;
  st = extras.validate();
  EXPECT_NE(st.message().find("quant.method: fp8_block128 does not take expert biases or a shared expert yet"),
            std::string::npos)
      << st.to_string();
  MoeConfig invariant = c;  // a per-batch activation scale makes every row depend on the batch
  invariant.quant.method = QuantMethod::kFp8PerTensor;
  invariant.quant.weight_dtype = DType::kF8E4M3;
  invariant.batch_invariant = true;
  st = invariant.validate();
  EXPECT_NE(st.message().find("batch_invariant: cannot hold with fp8_per_tensor's dynamic activation scale"),
            std::string::npos)
      << st.to_string();
  invariant.quant.act_scale = ActScale::kStatic;
  EXPECT_TRUE(invariant.validate().ok()) << invariant.validate().to_string();
  EXPECT_EQ(parse_quant_method("fp8_block128"), QuantMethod::kFp8Block128);
  EXPECT_EQ(parse_quant_method("fp8_per_tensor"), QuantMethod::kFp8PerTensor);
  EXPECT_FALSE(parse_quant_method("fp8").has_value());
}

TEST(Fp8Quantize, BadMatricesAreRejected) {
  HostTensor w(DType::kF32, {130, 260});
  std::fill_n(w.data<float>(), w.numel(), 0.5f);
  StatusOr<io::Fp8Matrix> ok = io::quantize_fp8(w.view(), QuantMethod::kFp8Block128, "m");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->scale.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ok->scale.data<float>()[0], 0.5f / 448.0f);
  EXPECT_EQ(f8e4m3_bits_to_f32(ok->weight.data<uint8_t>()[0]), 448.0f);  // amax maps onto the largest value
  w.data<float>()[5] = INFINITY;
  StatusOr<io::Fp8Matrix> bad = io::quantize_fp8(w.view(), QuantMethod::kFp8PerTensor, "m");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("m: element [0, 5] is not finite"), std::string::npos);
  HostTensor zeros(DType::kF32, {3, 3});
  std::fill_n(zeros.data<float>(), zeros.numel(), 0.0f);
  StatusOr<io::Fp8Matrix> z = io::quantize_fp8(zeros.view(), QuantMethod::kFp8PerTensor, "z");
  ASSERT_TRUE(z.ok());
  EXPECT_GT(z->scale.data<float>()[0], 0.0f);  // clamped away from 0
}

}  // namespace
}  // namespace moekit::cpu

// Bad input to route_cpu: each case gets a clear error and writes nothing
// (every output keeps the poison it had before the call).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "moekit/routing.h"
#include "routing/routing_test_common.h"
#include "util/test_util.h"

namespace moekit::routing_test {
namespace {

constexpr int64_t kM = 5;
constexpr int64_t kE = 16;
constexpr int kK = 4;

// A valid deepseek_v3 call (bias on, groups 4 / keep 2) that each case then breaks.
struct BadInputCase {
  RoutingConfig cfg;
  RouteBuffers buf;
  RoutingArgs args;
  std::vector<HostTensor> extra;  // replacement tensors a case points the args at (poisoned)

  BadInputCase() : buf(make_logits(), kK) {
    cfg.method = RoutingMethod::kDeepseekV3;
    cfg.top_k = kK;
    cfg.num_groups = 4;
    cfg.topk_groups = 2;
    cfg.has_score_bias = true;
    buf.bias = HostTensor(DType::kF32, {kE});
    for (int64_t e = 0; e < kE; ++e) buf.bias.data<float>()[e] = 0.01f * static_cast<float>(e);
    buf.forced = HostTensor(DType::kI32, {kM, kK});
    for (int64_t i = 0; i < kM * kK; ++i) buf.forced.data<int32_t>()[i] = static_cast<int32_t>(i % kK);
    args = buf.args();
    args.forced_ids = TensorView();  // on only where a case wants it
    extra.reserve(8);
  }

  static HostTensor make_logits() {
    std::mt19937_64 rng(testing::seed_from({kM, kE, kK}));
    return testing::tie_free_logits(rng, DType::kF32, kM, kE, 0.125);
  }

  // A poisoned tensor that lives as long as the case.
  TensorView make(DType dt, std::vector<int64_t> shape) {
    extra.emplace_back(dt, std::move(shape));
    testing::poison(extra.back());
    return extra.back().view();
  }
};

std::vector<unsigned char> snapshot(const TensorView& t) {
  if (!t.defined()) return {};
  std::vector<unsigned char> bytes(t.nbytes());
  std::memcpy(bytes.data(), t.data, bytes.size());
  return bytes;
}

// Runs the broken call; expects failure whose message contains `needle`, and
// that no output byte changed (outputs were poisoned when made).
void expect_rejected(BadInputCase& c, const std::string& needle) {
  const TensorView outs[] = {c.args.topk_ids, c.args.topk_weights, c.args.expert_counts, c.args.routing_replay_out};
  std::vector<std::vector<unsigned char>> before;
  for (const TensorView& t : outs) before.push_back(snapshot(t));
  const Status st = route_cpu(c.cfg, c.args);
  ASSERT_FALSE(st.ok()) << "accepted; expected an error mentioning '" << needle << "'";
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(snapshot(outs[i]), before[i]) << "output " << i << " written despite the error: " << st.to_string();
  }
  // The outputs of the fixture itself are still entirely poison.
  for (int64_t i = 0; i < kM * kK; ++i) {
    ASSERT_EQ(c.buf.ids.data<int32_t>()[i], 0x7fffffff);
    ASSERT_TRUE(std::isnan(c.buf.weights.data<float>()[i]));
  }
}

TEST(RoutingBadInput, BaselineIsValid) {
  // The unbroken case routes fine, so every rejection below is due to its one change.
  BadInputCase c;
  ASSERT_TRUE(route_cpu(c.cfg, c.args).ok());
  c.args.forced_ids = c.buf.forced.view();
  ASSERT_TRUE(route_cpu(c.cfg, c.args).ok());
}

struct Breakage {
  const char* name;
  std::function<void(BadInputCase&)> apply;
  const char* needle;
};

const Breakage kBreakages[] = {
    // Configuration.
    {"top_k_above_E", [](BadInputCase& c) { c.cfg.top_k = kE + 1; }, "routing.top_k"},
    {"top_k_zero", [](BadInputCase& c) { c.cfg.top_k = 0; }, "routing.top_k"},
    {"groups_not_dividing_E", [](BadInputCase& c) { c.cfg.num_groups = 3; }, "not divisible by num_groups"},
    {"topk_groups_above_groups", [](BadInputCase& c) { c.cfg.topk_groups = 5; }, "routing.topk_groups"},
    {"scaling_inf", [](BadInputCase& c) { c.cfg.routed_scaling_factor = std::numeric_limits<float>::infinity(); },
     "routing.routed_scaling_factor: must be finite and > 0"},
    {"scaling_nan", [](BadInputCase& c) { c.cfg.routed_scaling_factor = std::nanf(""); },
     "routing.routed_scaling_factor: must be finite and > 0"},
    {"scaling_zero", [](BadInputCase& c) { c.cfg.routed_scaling_factor = 0.0f; },
     "routing.routed_scaling_factor: must be finite and > 0"},
    {"custom_method",
     [](BadInputCase& c) {
       c.cfg.method = RoutingMethod::kCustom;
       c.cfg.has_score_bias = false;
     },
     "custom routing has no router"},
    // Logits.
    {"logits_missing", [](BadInputCase& c) { c.args.logits = TensorView(); }, "logits: required"},
    {"logits_rank_1", [](BadInputCase& c) { c.args.logits = c.make(DType::kF32, {kM * kE}); }, "logits: expected shape"},
    {"logits_dtype_f16", [](BadInputCase& c) { c.args.logits = c.make(DType::kF16, {kM, kE}); }, "logits: expected dtype"},
    {"logits_on_cuda", [](BadInputCase& c) { c.args.logits.device = Device::cuda(0); }, "logits: expected on cpu"},
    {"logits_nan",
     [](BadInputCase& c) { c.buf.logits.data<float>()[3 * kE + 7] = std::numeric_limits<float>::quiet_NaN(); },
     "logits[3, 7] (row 3, expert 7) is NaN"},
    {"logits_pos_inf",
     [](BadInputCase& c) { c.buf.logits.data<float>()[4 * kE + 0] = std::numeric_limits<float>::infinity(); },
     "(row 4, expert 0) is +Inf"},
    {"logits_neg_inf",
     [](BadInputCase& c) { c.buf.logits.data<float>()[0 * kE + 15] = -std::numeric_limits<float>::infinity(); },
     "(row 0, expert 15) is -Inf"},
    {"logits_bf16_nan",
     [](BadInputCase& c) {
       TensorView v = c.make(DType::kBF16, {kM, kE});
       for (int64_t i = 0; i < kM * kE; ++i) v.ptr<uint16_t>()[i] = f32_to_bf16_bits(0.01f * static_cast<float>(i % kE));
       v.ptr<uint16_t>()[2 * kE + 9] = 0x7fc0;
       c.args.logits = v;
     },
     "(row 2, expert 9) is NaN"},
    // Outputs.
    {"ids_missing", [](BadInputCase& c) { c.args.topk_ids = TensorView(); }, "topk_ids: required"},
    {"ids_wrong_shape", [](BadInputCase& c) { c.args.topk_ids = c.make(DType::kI32, {kM, kK - 1}); },
     "topk_ids: expected shape [5, 4], got [5, 3]"},
    {"ids_wrong_rows", [](BadInputCase& c) { c.args.topk_ids = c.make(DType::kI32, {kM + 1, kK}); },
     "topk_ids: expected shape"},
    {"ids_wrong_dtype", [](BadInputCase& c) { c.args.topk_ids = c.make(DType::kI16, {kM, kK}); },
     "topk_ids: expected dtype i32"},
    {"ids_rank_3", [](BadInputCase& c) { c.args.topk_ids = c.make(DType::kI32, {kM, kK, 1}); },
     "topk_ids: expected shape"},
    {"weights_wrong_shape", [](BadInputCase& c) { c.args.topk_weights = c.make(DType::kF32, {kM, kK + 1}); },
     "topk_weights: expected shape"},
    {"weights_wrong_dtype", [](BadInputCase& c) { c.args.topk_weights = c.make(DType::kBF16, {kM, kK}); },
     "topk_weights: expected dtype f32"},
    {"counts_wrong_shape", [](BadInputCase& c) { c.args.expert_counts = c.make(DType::kI32, {kE + 1}); },
     "expert_counts: expected shape [16]"},
    {"counts_wrong_dtype", [](BadInputCase& c) { c.args.expert_counts = c.make(DType::kF32, {kE}); },
     "expert_counts: expected dtype i32"},
    {"replay_out_too_small", [](BadInputCase& c) { c.args.routing_replay_out = c.make(DType::kI16, {kM - 1, kK}); },
     "routing_replay_out: needs at least M rows"},
    {"replay_out_wrong_dtype", [](BadInputCase& c) { c.args.routing_replay_out = c.make(DType::kI32, {kM, kK}); },
     "routing_replay_out: expected dtype i16"},
    {"replay_out_wrong_cols", [](BadInputCase& c) { c.args.routing_replay_out = c.make(DType::kI16, {kM, kK + 1}); },
     "routing_replay_out: expected shape"},
    {"replay_out_rank_3", [](BadInputCase& c) { c.args.routing_replay_out = c.make(DType::kI16, {1, kM, kK}); },
     "routing_replay_out: expected shape"},
    // Bias.
    {"bias_missing", [](BadInputCase& c) { c.args.score_bias = TensorView(); }, "score_bias: routing.has_score_bias is set"},
    {"bias_unexpected", [](BadInputCase& c) { c.cfg.has_score_bias = false; }, "score_bias: given"},
    {"bias_wrong_shape", [](BadInputCase& c) { c.args.score_bias = c.make(DType::kF32, {kE - 1}); },
     "score_bias: expected shape"},
    {"bias_wrong_dtype", [](BadInputCase& c) { c.args.score_bias = c.make(DType::kBF16, {kE}); },
     "score_bias: expected dtype f32"},
    {"bias_nan", [](BadInputCase& c) { c.buf.bias.data<float>()[5] = std::nanf(""); }, "score_bias[5] is not finite"},
    // Forced ids (replay).
    {"forced_out_of_range",
     [](BadInputCase& c) {
       c.buf.forced.data<int32_t>()[1 * kK + 2] = kE;
       c.args.forced_ids = c.buf.forced.view();
     },
     "forced_ids[1, 2] = 16 is not an expert id in [0, 16)"},
    {"forced_negative",
     [](BadInputCase& c) {
       c.buf.forced.data<int32_t>()[0] = -7;
       c.args.forced_ids = c.buf.forced.view();
     },
     "forced_ids[0, 0] = -7"},
    {"forced_sentinel",
     [](BadInputCase& c) {
       c.buf.forced.data<int32_t>()[3 * kK + 1] = -1;
       c.args.forced_ids = c.buf.forced.view();
     },
     "forced_ids[3, 1] is -1, the capture sentinel"},
    {"forced_duplicate",
     [](BadInputCase& c) {
       c.buf.forced.data<int32_t>()[2 * kK + 3] = c.buf.forced.data<int32_t>()[2 * kK + 1];
       c.args.forced_ids = c.buf.forced.view();
     },
     "forced_ids[2, 3] = 1 duplicates forced_ids[2, 1]"},
    {"forced_wrong_shape",
     [](BadInputCase& c) {
       TensorView v = c.make(DType::kI32, {kM, kK - 1});
       for (int64_t i = 0; i < v.numel(); ++i) v.ptr<int32_t>()[i] = static_cast<int32_t>(i % (kK - 1));
       c.args.forced_ids = v;
     },
     "forced_ids: expected shape [5, 4], got [5, 3]"},
    {"forced_wrong_dtype",
     [](BadInputCase& c) {
       TensorView v = c.make(DType::kI16, {kM, kK});
       for (int64_t i = 0; i < v.numel(); ++i) v.ptr<int16_t>()[i] = static_cast<int16_t>(i % kK);
       c.args.forced_ids = v;
     },
     "forced_ids: expected dtype i32"},
};

class RoutingBadInputs : public ::testing::TestWithParam<Breakage> {};

TEST_P(RoutingBadInputs, RejectedAndNothingWritten) {
  BadInputCase c;
  GetParam().apply(c);
  expect_rejected(c, GetParam().needle);
}

INSTANTIATE_TEST_SUITE_P(Cpu, RoutingBadInputs, ::testing::ValuesIn(kBreakages),
                         [](const ::testing::TestParamInfo<Breakage>& info) { return std::string(info.param.name); });

TEST(RoutingBadInput, NonDeepseekRejectsBias) {
  BadInputCase c;
  c.cfg.method = RoutingMethod::kRenormalize;
  expect_rejected(c, "a score bias is only used by deepseek_v3");
}

TEST(CheckForcedIds, AcceptsI16AndNamesTheBadSlot) {
  HostTensor ids(DType::kI16, {2, 3});
  const int16_t ok_rows[] = {0, 5, 2, 7, 1, 3};
  std::copy(ok_rows, ok_rows + 6, ids.data<int16_t>());
  EXPECT_TRUE(check_forced_ids(ids.view(), 8).ok());
  ids.data<int16_t>()[4] = -1;
  Status st = check_forced_ids(ids.view(), 8);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("forced_ids[1, 1] is -1"), std::string::npos) << st.to_string();
  ids.data<int16_t>()[4] = 8;
  st = check_forced_ids(ids.view(), 8);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  HostTensor f(DType::kF32, {2, 3});
  EXPECT_FALSE(check_forced_ids(f.view(), 8).ok());
}

TEST(CheckLogitsFinite, CleanLogitsPass) {
  HostTensor t(DType::kBF16, {3, 4});
  for (int i = 0; i < 12; ++i) t.data<uint16_t>()[i] = f32_to_bf16_bits(-1e30f * static_cast<float>(i));
  EXPECT_TRUE(check_logits_finite(t.view()).ok());
  t.data<uint16_t>()[11] = 0x7f80;  // +Inf in bf16
  const Status st = check_logits_finite(t.view());
  EXPECT_NE(st.message().find("(row 2, expert 3) is +Inf"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace moekit::routing_test

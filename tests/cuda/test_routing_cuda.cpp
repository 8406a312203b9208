// The device router (route_cuda) against the fp64 reference and route_cpu:
// every method of docs/routing.md, f32 and bf16 logits, ids exact on tie-free
// inputs, forced ids, capture rows, counts, exact ties, and the device rule for
// bad logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "moekit/routing.h"
#include "reference/reference.h"
#include "routing/cuda/route_cuda.h"
#include "routing/routing_test_common.h"
#include "util/reference_params.h"
#include "util/test_util.h"

namespace moekit {
namespace {

using cuda_test::DeviceTensor;
using routing_test::copy_out;
using routing_test::RouteBuffers;

// Weights vs the fp64 reference: fp32 scores with up to 256 exponentials summed
// (a warp tree on the device, ascending order on the CPU): relative error
// <= ~log2(E)·2^-24 ≈ 5e-7 of the sum; 2e-5 leaves a 40x margin, 1e-7 absolute
// covers weights too small for a relative error to mean anything.
constexpr double kRtol = 2e-5;
constexpr double kAtol = 1e-7;
constexpr double kGap = 1.0 / 32.0;  // tie-free logits: distinct by >= 1/32 after rounding

struct Case {
  RoutingMethod method;
  int64_t M, E;
  int k;
  DType dtype;
  int groups = 1, topk_groups = 1;
  bool bias = false;
  bool renormalize = true;  // deepseek_v3 norm_topk_prob

  RoutingConfig config() const {
    RoutingConfig c;
    c.method = method;
    c.top_k = k;
    if (method == RoutingMethod::kDeepseekV3) {
      c.num_groups = groups;
      c.topk_groups = topk_groups;
      c.routed_scaling_factor = 2.5f;
      c.has_score_bias = bias;
      c.renormalize = renormalize;
    }
    return c;
  }
  std::string name() const {
    return std::string(routing_method_name(method)) + "_M" + std::to_string(M) + "_E" + std::to_string(E) + "_k" +
           std::to_string(k) + "_" + dtype_name(dtype) + "_g" + std::to_string(groups) + "_" +
           std::to_string(topk_groups) + (bias ? "_bias" : "") + (renormalize ? "" : "_norenorm");
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const RoutingMethod plain[] = {RoutingMethod::kSoftmaxTopk, RoutingMethod::kRenormalize,
                                 RoutingMethod::kRenormalizeNaive, RoutingMethod::kTopk,
                                 RoutingMethod::kSigmoid, RoutingMethod::kSigmoidRenorm, RoutingMethod::kLlama4};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t M : {1, 513}) {
      for (int64_t E : {8, 64, 256}) {
        for (int k : {1, 2, 8}) {
          for (RoutingMethod m : plain) out.push_back({m, M, E, k, dt});
          out.push_back({RoutingMethod::kDeepseekV3, M, E, k, dt, 1, 1, false});
          // Grouped cases need k <= topk_groups * E / groups (RoutingConfig::validate).
          if (k <= 2 * E / 4) out.push_back({RoutingMethod::kDeepseekV3, M, E, k, dt, 4, 2, true});
          if (k <= 2 * E / 4) out.push_back({RoutingMethod::kDeepseekV3, M, E, k, dt, 4, 2, true, false});
          if (E >= 64) out.push_back({RoutingMethod::kDeepseekV3, M, E, k, dt, 8, 4, true});
        }
      }
    }
  }
  return out;
}

// Device copies of RouteBuffers; outputs poisoned.
struct DeviceRoute {
  DeviceTensor logits, bias, forced, ids, weights, counts, replay;
  explicit DeviceRoute(const RouteBuffers& host)
      : logits(host.logits), ids(DType::kI32, host.ids.shape()), weights(DType::kF32, host.weights.shape()),
        counts(DType::kI32, host.counts.shape()), replay(DType::kI16, host.replay.shape()) {
    if (!host.bias.shape().empty()) bias = DeviceTensor(host.bias);
    if (!host.forced.shape().empty()) forced = DeviceTensor(host.forced);
    for (DeviceTensor* t : {&ids, &weights, &counts, &replay}) t->poison();
  }
  RoutingArgs args() const {
    RoutingArgs a;
    a.logits = logits.view();
    if (bias.data() != nullptr) a.score_bias = bias.view();
    if (forced.data() != nullptr) a.forced_ids = forced.view();
    a.topk_ids = ids.view();
    a.topk_weights = weights.view();
    a.expert_counts = counts.view();
    a.routing_replay_out = replay.view();
    return a;
  }
};

Status route_on_device(const RoutingConfig& cfg, const DeviceRoute& d) {
  MOEKIT_RETURN_IF_ERROR(cuda::route_cuda(cfg, d.args(), nullptr));
  if (cudaDeviceSynchronize() != cudaSuccess) return Internal("device error after routing");
  return Status::Ok();
}

std::string compare_weights(const std::vector<float>& got, const std::vector<double>& want, int k) {
  return routing_test::compare_weights(got, want, k, kAtol, kRtol);
}

class CudaRoutingGrid : public ::testing::TestWithParam<Case> {};

TEST_P(CudaRoutingGrid, MatchesReferenceAndCpu) {
  MOEKIT_REQUIRE_SM90();
  const Case c = GetParam();
  const RoutingConfig cfg = c.config();
  std::mt19937_64 rng(testing::seed_from({static_cast<int64_t>(c.method), c.M, c.E, c.k,
                                          static_cast<int64_t>(c.dtype), c.groups, c.topk_groups, c.bias, 90,
                                          c.renormalize ? 0 : 7}));
  std::vector<double> bias;
  HostTensor bias_t;
  if (c.bias) bias_t = testing::random_tensor(rng, DType::kF32, {c.E}, 0.1, &bias);
  std::vector<double> exact;
  HostTensor logits = routing_test::routing_logits(rng, cfg, c.dtype, c.M, c.E, kGap, bias, &exact);
  const moekit_ref::RoutingParams params = testing::ref_routing(cfg, bias);
  const moekit_ref::RoutingResult ref = moekit_ref::route(params, exact, c.M, c.E);

  RouteBuffers cpu(logits, c.k);
  if (c.bias) cpu.bias = bias_t;
  ASSERT_TRUE(route_cpu(cfg, cpu.args()).ok());

  DeviceRoute dev(cpu);
  const Status st = route_on_device(cfg, dev);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const HostTensor ids = dev.ids.download(), weights = dev.weights.download();
  const auto gids = copy_out<int32_t>(ids);
  const auto gw = copy_out<float>(weights);
  EXPECT_EQ(gids, ref.ids) << "device ids differ from the reference";
  EXPECT_EQ(gids, copy_out<int32_t>(cpu.ids)) << "device ids differ from route_cpu";
  EXPECT_EQ(compare_weights(gw, ref.weights, c.k), "");
  const auto cw = copy_out<float>(cpu.weights);
  EXPECT_EQ(compare_weights(gw, std::vector<double>(cw.begin(), cw.end()), c.k), "") << "vs route_cpu";
  EXPECT_EQ(copy_out<int32_t>(dev.counts.download()), ref.counts);
  const auto cap = copy_out<int16_t>(dev.replay.download());
  for (int64_t i = 0; i < c.M * c.k; ++i) ASSERT_EQ(cap[i], gids[i]) << "routing_replay_out element " << i;
  for (size_t i = c.M * c.k; i < cap.size(); ++i) ASSERT_EQ(cap[i], 0x7fff) << "routing_replay_out row past M written";

  // Forcing the device's own ids reproduces its weights bit for bit (spec §6).
  RouteBuffers again(logits, c.k);
  if (c.bias) again.bias = bias_t;
  again.forced = HostTensor(DType::kI32, {c.M, c.k});
  std::copy(gids.begin(), gids.end(), again.forced.data<int32_t>());
  DeviceRoute dev_again(again);
  ASSERT_TRUE(route_on_device(cfg, dev_again).ok());
  EXPECT_EQ(cuda_test::first_difference(dev_again.ids.download(), ids), "");
  EXPECT_EQ(cuda_test::first_difference(dev_again.weights.download(), weights), "") << "replayed weights differ";

  // Arbitrary forced ids: the method's weights at those ids.
  RouteBuffers forced(logits, c.k);
  if (c.bias) forced.bias = bias_t;
  forced.forced = HostTensor(DType::kI32, {c.M, c.k});
  const std::vector<int32_t> fids = routing_test::random_forced_ids(rng, c.M, c.E, c.k);
  std::copy(fids.begin(), fids.end(), forced.forced.data<int32_t>());
  DeviceRoute dev_forced(forced);
  ASSERT_TRUE(route_on_device(cfg, dev_forced).ok());
  const moekit_ref::RoutingResult fref = moekit_ref::route(params, exact, c.M, c.E, fids);
  EXPECT_EQ(copy_out<int32_t>(dev_forced.ids.download()), fids);
  EXPECT_EQ(compare_weights(copy_out<float>(dev_forced.weights.download()), fref.weights, c.k), "");
  EXPECT_EQ(copy_out<int32_t>(dev_forced.counts.download()), fref.counts);
}

INSTANTIATE_TEST_SUITE_P(Sm90, CudaRoutingGrid, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name(); });

// Routes f32 rows on both backends; returns the device ids.
std::vector<int32_t> route_both(const RoutingConfig& cfg, const std::vector<float>& rows, int64_t M, int64_t E,
                                std::vector<int32_t>* cpu_ids, std::vector<float>* dev_weights = nullptr,
                                std::vector<int16_t>* dev_replay = nullptr, std::vector<int32_t>* dev_counts = nullptr) {
  HostTensor logits(DType::kF32, {M, E});
  std::copy(rows.begin(), rows.end(), logits.data<float>());
  RouteBuffers cpu(logits, cfg.top_k);
  if (cpu_ids != nullptr) {
    EXPECT_TRUE(route_cpu(cfg, cpu.args()).ok());
    *cpu_ids = copy_out<int32_t>(cpu.ids);
  }
  DeviceRoute dev(cpu);
  const Status st = route_on_device(cfg, dev);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (dev_weights) *dev_weights = copy_out<float>(dev.weights.download());
  if (dev_replay) *dev_replay = copy_out<int16_t>(dev.replay.download());
  if (dev_counts) *dev_counts = copy_out<int32_t>(dev.counts.download());
  return copy_out<int32_t>(dev.ids.download());
}

RoutingConfig plain_cfg(RoutingMethod m, int k) {
  RoutingConfig c;
  c.method = m;
  c.top_k = k;
  return c;
}

TEST(CudaRouting, ExactTiesFollowTheIndexRule) {
  MOEKIT_REQUIRE_SM90();
  // Row 0: all equal -> 0, 1, 2. Row 1: 3 and 3 tie after the 5 -> 4 (5.0), then 1, 2.
  // Row 2: -0.0 and +0.0 are equal keys -> lower index first.
  const int64_t E = 6;
  const std::vector<float> rows = {1, 1, 1, 1, 1, 1,  //
                                   0, 3, 3, 2, 5, 3,  //
                                   -1, 0.0f, -0.0f, -2, -3, -4};
  for (RoutingMethod m : {RoutingMethod::kSoftmaxTopk, RoutingMethod::kRenormalize, RoutingMethod::kTopk,
                          RoutingMethod::kSigmoid}) {
    std::vector<int32_t> cpu_ids;
    const auto ids = route_both(plain_cfg(m, 3), rows, 3, E, &cpu_ids);
    EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 4, 1, 2, 1, 2, 0})) << routing_method_name(m);
    EXPECT_EQ(ids, cpu_ids) << routing_method_name(m);
  }
  // deepseek_v3 group ties: groups {0,1} {2,3} {4,5} with equal top-2 sums; keep 2 -> groups 0 and 1.
  RoutingConfig ds = plain_cfg(RoutingMethod::kDeepseekV3, 2);
  ds.num_groups = 3;
  ds.topk_groups = 2;
  std::vector<int32_t> cpu_ids;
  const auto ids = route_both(ds, {0.5f, 0.25f, 0.25f, 0.5f, 0.5f, 0.25f}, 1, E, &cpu_ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(ids, cpu_ids);
}

TEST(CudaRouting, BadLogitRowsFollowTheDeviceRule) {
  MOEKIT_REQUIRE_SM90();
  // docs/routing.md §7: a row with NaN/Inf gets id -1 and NaN weights in every
  // slot, its capture row is -1, and it adds nothing to the counts; other rows
  // are routed normally.
  const int64_t E = 8;
  std::vector<float> rows(4 * E);
  for (int64_t i = 0; i < 4 * E; ++i) rows[i] = static_cast<float>((i * 5) % E) * 0.25f;
  rows[1 * E + 3] = std::nanf("");
  rows[2 * E + 0] = INFINITY;
  rows[3 * E + 7] = -INFINITY;
  for (RoutingMethod m : {RoutingMethod::kSoftmaxTopk, RoutingMethod::kSigmoidRenorm, RoutingMethod::kDeepseekV3}) {
    RoutingConfig cfg = plain_cfg(m, 2);
    std::vector<float> w;
    std::vector<int16_t> cap;
    std::vector<int32_t> counts;
    const auto ids = route_both(cfg, rows, 4, E, nullptr, &w, &cap, &counts);
    for (int r = 1; r < 4; ++r) {
      for (int j = 0; j < 2; ++j) {
        EXPECT_EQ(ids[r * 2 + j], -1) << routing_method_name(m) << " row " << r;
        EXPECT_TRUE(std::isnan(w[r * 2 + j])) << routing_method_name(m) << " row " << r;
        EXPECT_EQ(cap[r * 2 + j], -1) << routing_method_name(m) << " row " << r;
      }
    }
    // Row 0 alone, on the CPU, is the truth for row 0.
    std::vector<int32_t> cpu0;
    const auto ids0 = route_both(cfg, std::vector<float>(rows.begin(), rows.begin() + E), 1, E, &cpu0);
    EXPECT_EQ(ids[0], cpu0[0]);
    EXPECT_EQ(ids[1], cpu0[1]);
    EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), 2) << "bad rows must not be counted";
  }
}

TEST(CudaRouting, RejectsBadArgumentsBeforeWriting) {
  MOEKIT_REQUIRE_SM90();
  HostTensor logits(DType::kF32, {4, 8});
  std::fill_n(logits.data<float>(), 32, 0.5f);
  RouteBuffers host(logits, 2);
  DeviceRoute dev(host);
  RoutingArgs a = dev.args();
  DeviceTensor wrong_ids(DType::kI32, {4, 3});
  a.topk_ids = wrong_ids.view();
  const Status st = cuda::route_cuda(plain_cfg(RoutingMethod::kSoftmaxTopk, 2), a, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("topk_ids"), std::string::npos) << st.message();
  // Host views are not device views.
  RoutingArgs h = host.args();
  EXPECT_FALSE(cuda::route_cuda(plain_cfg(RoutingMethod::kSoftmaxTopk, 2), h, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto w = copy_out<float>(dev.weights.download());
  for (float v : w) EXPECT_TRUE(std::isnan(v)) << "an output was written by a rejected call";
}

TEST(CudaRouting, ZeroRowsOnlyZeroesTheCounts) {
  MOEKIT_REQUIRE_SM90();
  HostTensor logits(DType::kF32, {0, 8});
  RouteBuffers host(logits, 2);
  DeviceRoute dev(host);
  ASSERT_TRUE(route_on_device(plain_cfg(RoutingMethod::kRenormalize, 2), dev).ok());
  EXPECT_EQ(copy_out<int32_t>(dev.counts.download()), std::vector<int32_t>(8, 0));
  const auto cap = copy_out<int16_t>(dev.replay.download());
  for (int16_t v : cap) EXPECT_EQ(v, 0x7fff);
}

}  // namespace
}  // namespace moekit

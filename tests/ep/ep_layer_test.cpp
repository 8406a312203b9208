// ExpertParallelLayer on the CPU backend over the loopback communicator: for
// N ranks, each with its own tokens, the outputs equal the single-rank layer's
// over the concatenated batch bit for bit (every routing method, both
// dispatch kinds, with and without EPLB), captured ids are identical, replay
// is bitwise, and bad input fails on every rank with a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <tuple>

#include "dispatch/ep_host_exchange.h"
#include "experts/cpu/cpu_gemm.h"
#include "ep/ep_test_util.h"
#include "moekit/capture.h"
#include "moekit/ep_layer.h"
#include "moekit/io.h"
#include "moekit/layer.h"
#include "moekit/oracle.h"
#include "reference/reference.h"
#include "util/reference_params.h"
#include "util/test_util.h"

namespace moekit {
namespace {

using testing::run_ranks;

constexpr int64_t kE = 16, kH = 32, kI = 16, kMaxPerRank = 6;
constexpr int kK = 4;

int64_t tokens_of(int rank) { return 3 + rank % 4; }  // uneven: 3..6 tokens per rank

MoeConfig base_config(RoutingMethod method, DType dtype) {
  MoeConfig c;
  c.num_experts = kE;
  c.hidden = kH;
  c.intermediate = kI;
  c.max_num_tokens = kMaxPerRank;
  c.logits_dtype = DType::kF32;
  c.quant.weight_dtype = dtype;
  c.quant.act_dtype = dtype;
  c.routing.method = method;
  c.routing.top_k = kK;
  if (method == RoutingMethod::kDeepseekV3) {
    c.routing.num_groups = 4;
    c.routing.topk_groups = 2;
    c.routing.routed_scaling_factor = 2.5f;
    c.routing.has_score_bias = true;
  }
  if (method == RoutingMethod::kLlama4) c.routing.top_k = 1;
  return c;
}

MoeConfig rank_config(MoeConfig c, int n, int r, All2AllBackend a2a) {
  c.parallel.ep_size = c.parallel.dp_size = n;
  c.parallel.ep_rank = c.parallel.dp_rank = r;
  c.parallel.all2all = a2a;
  return c;
}

// One group's tokens (all ranks' rows, rank 0's first) and the layer weights.
struct GroupInputs {
  int n = 0;
  int64_t total = 0;
  std::vector<int64_t> first;  // [n + 1] row offsets
  HostTensor w13, w2, bias, hidden, logits, custom_ids, custom_weights, w13_bias, w2_bias;
  HostTensor shared_w13, shared_w2, shared_gate;
  std::vector<double> w13_exact, w2_exact, hidden_exact, logits_exact;

  GroupInputs(const MoeConfig& c, int ranks, uint64_t seed) : n(ranks) {
    first.push_back(0);
    for (int r = 0; r < n; ++r) first.push_back(first.back() + tokens_of(r));
    total = first.back();
    std::mt19937_64 rng(seed);
    const DType dt = c.quant.weight_dtype;
    w13 = testing::random_tensor(rng, dt, {kE, 2 * kI, kH}, 1.0 / std::sqrt(double(kH)), &w13_exact);
    w2 = testing::random_tensor(rng, dt, {kE, kH, kI}, 1.0 / std::sqrt(double(kI)), &w2_exact);
    bias = testing::random_tensor(rng, DType::kF32, {kE}, 0.1);
    hidden = testing::random_tensor(rng, c.quant.act_dtype, {total, kH}, 1.0, &hidden_exact);
    logits = testing::tie_free_logits(rng, DType::kF32, total, kE, 1.0 / 32.0, &logits_exact);
    if (c.has_expert_bias) {
      // Each bias is f32 or the weight dtype on its own: the gate/up one in the weight dtype here.
      w13_bias = testing::random_tensor(rng, dt, {kE, 2 * kI}, 0.1);
      w2_bias = testing::random_tensor(rng, DType::kF32, {kE, kH}, 0.1);
    }
    if (const int64_t Is = c.shared_intermediate; Is > 0) {
      shared_w13 = testing::random_tensor(rng, dt, {2 * Is, kH}, 1.0 / std::sqrt(double(kH)));
      shared_w2 = testing::random_tensor(rng, dt, {kH, Is}, 1.0 / std::sqrt(double(Is)));
      if (c.has_shared_gate) shared_gate = testing::random_tensor(rng, DType::kF32, {kH}, 0.3);
    }
    // Custom routing: distinct ids per row, positive weights.
    const int k = c.top_k();
    custom_ids = HostTensor(DType::kI32, {total, k});
    custom_weights = HostTensor(DType::kF32, {total, k});
    for (int64_t t = 0; t < total; ++t) {
      std::vector<int32_t> perm(kE);
      for (int32_t e = 0; e < kE; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int j = 0; j < k; ++j) {
        custom_ids.data<int32_t>()[t * k + j] = perm[j];
        custom_weights.data<float>()[t * k + j] = 0.25f + 0.5f * static_cast<float>(rng() % 1000) / 1000.0f;
      }
    }
  }
  MoeWeights weights(const MoeConfig& c) const {
    MoeWeights w{w13.view(), w2.view(), c.routing.has_score_bias ? bias.view() : TensorView{}};
    if (c.has_expert_bias) {
      w.w13_bias = w13_bias.view();
      w.w2_bias = w2_bias.view();
    }
    if (c.shared_intermediate > 0) {
      w.shared_w13 = shared_w13.view();
      w.shared_w2 = shared_w2.view();
      if (c.has_shared_gate) w.shared_gate = shared_gate.view();
    }
    return w;
  }
};

// Rows [first[r], first[r+1]) of a [total, cols] tensor.
TensorView rows_of(const HostTensor& t, int64_t begin, int64_t end) {
  const int64_t cols = t.shape()[1];
  char* base = static_cast<char*>(t.view().data) + begin * cols * dtype_size(t.dtype());
  return TensorView::contiguous(base, t.dtype(), {end - begin, cols});
}

LayerForwardArgs forward_args(const MoeConfig& c, const GroupInputs& in, int64_t b, int64_t e, const HostTensor& out,
                              const HostTensor& ids_out) {
  LayerForwardArgs a;
  a.hidden = rows_of(in.hidden, b, e);
  a.out = rows_of(out, b, e);
  a.routing_replay_out = rows_of(ids_out, b, e);
  if (c.routing.method == RoutingMethod::kCustom) {
    a.topk_ids = rows_of(in.custom_ids, b, e);
    a.topk_weights = rows_of(in.custom_weights, b, e);
  } else {
    a.router_logits = rows_of(in.logits, b, e);
  }
  return a;
}

struct SingleRank {
  HostTensor out, ids;
  std::vector<int32_t> counts;
};

SingleRank run_single_rank(const MoeConfig& c, const GroupInputs& in) {
  MoeConfig one = c;
  one.max_num_tokens = in.total;
  SingleRank s{HostTensor(c.quant.act_dtype, {in.total, kH}), HostTensor(DType::kI16, {in.total, c.top_k()}),
               std::vector<int32_t>(kE)};
  auto layer = MoeLayer::create(one, in.weights(one), Device::cpu(), Platform::cpu_only());
  EXPECT_TRUE(layer.ok()) << layer.status().to_string();
  if (!layer.ok()) return s;
  LayerForwardArgs a = forward_args(one, in, 0, in.total, s.out, s.ids);
  HostTensor counts(DType::kI32, {kE});
  a.expert_counts = counts.view();
  const Status st = (*layer)->forward(a);
  EXPECT_TRUE(st.ok()) << st.to_string();
  std::memcpy(s.counts.data(), counts.data<void>(), kE * sizeof(int32_t));
  return s;
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data<void>(), b.data<void>(), a.nbytes()) == 0;
}

// The extra slots EPLB gets: one replica per rank beyond the contiguous layout.
int64_t eplb_slots(int n) { return (kE + n - 1) / n * n + n; }

struct EpCase {
  int ranks;
  RoutingMethod method;
  All2AllBackend a2a;
  bool eplb;
  DType dtype;
  bool expert_bias = false;
  int64_t shared = 0;  // > 0: a shared expert of this width
  bool shared_gate = false;
  bool batch_invariant = false;
};

std::string case_name(const EpCase& c) {
  return "ranks=" + std::to_string(c.ranks) + " " + routing_method_name(c.method) + " " + all2all_name(c.a2a) +
         (c.eplb ? " eplb" : "") + " " + dtype_name(c.dtype) + (c.expert_bias ? " expert-bias" : "") +
         (c.shared > 0 ? " shared" + std::string(c.shared_gate ? "+gate" : "") : "") +
         (c.batch_invariant ? " batch-invariant" : "");
}

// Runs the group's forward on c.ranks loopback ranks (twice with EPLB: once
// to count load, then after rebalancing), checks output and ids against the
// single-rank layer bit for bit, then replays the captured ids.
void check_equal_to_single_rank(const EpCase& ec) {
  SCOPED_TRACE(case_name(ec));
  MoeConfig c = base_config(ec.method, ec.dtype);
  c.has_expert_bias = ec.expert_bias;
  c.shared_intermediate = ec.shared;
  c.has_shared_gate = ec.shared_gate;
  c.batch_invariant = ec.batch_invariant;
  const GroupInputs in(c, ec.ranks, testing::seed_from({ec.ranks, static_cast<int>(ec.method),
                                                        static_cast<int>(ec.a2a), ec.eplb, static_cast<int>(ec.dtype),
                                                        ec.expert_bias, ec.shared, ec.shared_gate}));
  // The shared expert's sgemm sees one rank's rows here and every row there;
  // OpenBLAS picks its kernel by the row count, so outside batch-invariant
  // mode (fixed-order GEMMs) the CPU kernel tests' bound applies instead of bits.
  const bool bitwise = ec.shared == 0 || ec.batch_invariant;
  const SingleRank ref = run_single_rank(c, in);
  const double bound = c.quant.act_dtype == DType::kF32 ? 5e-6 : 0.00390625 * (1.0 + 5e-6) + 5e-6;
  const auto expect_matches = [&](const HostTensor& got, const char* what) {
    if (bitwise) {
      EXPECT_TRUE(same_bytes(got, ref.out)) << what << " differs from the single-rank layer";
    } else {
      EXPECT_LE(testing::rel_l2_error(testing::to_double(got.view()), testing::to_double(ref.out.view())), bound)
          << what;
    }
  };
  HostTensor out(c.quant.act_dtype, {in.total, kH}), ids(DType::kI16, {in.total, c.top_k()});
  HostTensor replay_out(c.quant.act_dtype, {in.total, kH}), replay_ids(DType::kI16, {in.total, c.top_k()});
  testing::poison(out);
  testing::poison(ids);
  testing::poison(replay_out);
  HostTensor out_eplb(c.quant.act_dtype, {in.total, kH}), ids_eplb(DType::kI16, {in.total, c.top_k()});
  testing::poison(out_eplb);
  std::vector<int64_t> group_load;
  std::vector<std::string> placements(ec.ranks);
  std::mutex mu;
  auto st = run_ranks(ec.ranks, [&](int r, Communicator& comm) -> Status {
    const MoeConfig rc = rank_config(c, ec.ranks, r, ec.a2a);
    MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rc, in.weights(rc), comm, nullptr,
                                                                    Platform::cpu_only()));
    const int64_t b = in.first[r], e = in.first[r + 1];
    MOEKIT_RETURN_IF_ERROR(layer->forward(forward_args(rc, in, b, e, out, ids)));
    MOEKIT_ASSIGN_OR_RETURN(std::vector<int64_t> load, layer->gather_expert_load());
    if (ec.eplb) {
      EplbOptions opt;
      opt.num_physical_slots = eplb_slots(ec.ranks);
      MOEKIT_ASSIGN_OR_RETURN(ExpertPlacement plan, plan_eplb(load, ec.ranks, opt));
      MOEKIT_RETURN_IF_ERROR(layer->rebalance(plan));
      MOEKIT_RETURN_IF_ERROR(layer->forward(forward_args(rc, in, b, e, out_eplb, ids_eplb)));
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (r == 0) group_load = load;
      placements[r] = layer->placement().to_string();
    }
    // Replay: the captured (logical) ids of this rank's rows, forced.
    if (rc.routing.method != RoutingMethod::kCustom) {
      HostTensor forced(DType::kI32, {e - b, rc.top_k()});
      for (int64_t i = 0; i < forced.numel(); ++i) {
        forced.data<int32_t>()[i] = ids.data<int16_t>()[b * rc.top_k() + i];
      }
      LayerForwardArgs a = forward_args(rc, in, b, e, replay_out, replay_ids);
      a.forced_ids = forced.view();
      MOEKIT_RETURN_IF_ERROR(layer->forward(a));
    }
    return Status::Ok();
  });
  for (int r = 0; r < ec.ranks; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
  expect_matches(out, "EP output");
  EXPECT_TRUE(same_bytes(ids, ref.ids)) << "captured ids differ from the single-rank layer's";
  if (ec.eplb) {
    EXPECT_TRUE(same_bytes(ids_eplb, ref.ids)) << "captured ids after EPLB differ";
    // NOTE: replicas split an expert's rows over ranks. The packed GEMMs
    // compute each row alone (ascending-k FMAs), so the bits cannot change;
    // OpenBLAS's sgemm picks its kernel by the row count (on AVX-512 the last
    // row of an odd block takes a different path), so there the bound of the
    // CPU kernel tests applies instead (docs/expert_parallel.md).
    if (cpu::cpu_gemm_path(c) != cpu::CpuGemmPath::kBlasF32) {
      expect_matches(out_eplb, "EP output after EPLB");
    } else {
      EXPECT_LE(testing::rel_l2_error(testing::to_double(out_eplb.view()), testing::to_double(ref.out.view())), bound);
    }
  }
  for (int64_t e = 0; e < kE; ++e) EXPECT_EQ(group_load[e], ref.counts[e]) << "expert " << e;
  for (int r = 1; r < ec.ranks; ++r) EXPECT_EQ(placements[r], placements[0]);
  if (c.routing.method != RoutingMethod::kCustom) {
    EXPECT_TRUE(same_bytes(replay_out, ec.eplb ? out_eplb : out)) << "replay through EP is not bitwise";
    EXPECT_TRUE(same_bytes(replay_ids, ids));
  }
}

class EpEqualsSingleRank : public ::testing::TestWithParam<std::tuple<int, RoutingMethod>> {};

TEST_P(EpEqualsSingleRank, EveryDispatchWithAndWithoutEplb) {
  const auto [ranks, method] = GetParam();
  for (All2AllBackend a2a : {All2AllBackend::kNccl, All2AllBackend::kAllgatherReducescatter}) {
    for (bool eplb : {false, true}) check_equal_to_single_rank({ranks, method, a2a, eplb, DType::kBF16});
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksAndMethods, EpEqualsSingleRank,
    ::testing::Combine(::testing::Values(2, 3, 4, 8),
                       ::testing::Values(RoutingMethod::kSoftmaxTopk, RoutingMethod::kRenormalize,
                                         RoutingMethod::kRenormalizeNaive, RoutingMethod::kTopk,
                                         RoutingMethod::kSigmoid, RoutingMethod::kSigmoidRenorm,
                                         RoutingMethod::kLlama4, RoutingMethod::kDeepseekV3,
                                         RoutingMethod::kCustom)),
    [](const auto& info) {
      return "ranks" + std::to_string(std::get<0>(info.param)) + "_" + routing_method_name(std::get<1>(info.param));
    });

TEST(EpEqualsSingleRankF32, TheBlasPathToo) {
  for (int ranks : {2, 3}) {
    for (bool eplb : {false, true}) {
      check_equal_to_single_rank({ranks, RoutingMethod::kRenormalize, All2AllBackend::kNccl, eplb, DType::kF32});
      check_equal_to_single_rank(
          {ranks, RoutingMethod::kDeepseekV3, All2AllBackend::kAllgatherReducescatter, eplb, DType::kF32});
    }
  }
}

// Capture through bind() on a Model of EP layers: each rank's capture of its
// own tokens (logical ids and router weights, every layer) equals, bit for
// bit, the single-rank Model's capture of the same rows; the replayer over
// the EP model then reproduces that rank's outputs bit for bit.
TEST(EpCapture, BindOnEpLayersCapturesWhatOneRankCaptures) {
  const int n = 3, kLayers = 2;
  const MoeConfig c = base_config(RoutingMethod::kDeepseekV3, DType::kBF16);
  const GroupInputs in(c, n, testing::seed_from({78}));
  const int k = c.top_k();
  const CapturerOptions with_weights{/*record_router_weights=*/true};
  auto run_step = [&](Model& model, RoutedExpertsCapturer& capturer, const std::string& request, int64_t b,
                      int64_t e, std::vector<HostTensor>* outs, RoutedExpertsReplayer* replayer) -> Status {
    MOEKIT_RETURN_IF_ERROR(capturer.begin_step({{{request, e - b}}}));
    if (replayer != nullptr) MOEKIT_RETURN_IF_ERROR(replayer->begin_step({{{request, e - b}}}));
    for (int l = 0; l < kLayers; ++l) {
      outs->emplace_back(c.quant.act_dtype, std::vector<int64_t>{e - b, kH});
      LayerForwardArgs a;
      a.hidden = rows_of(in.hidden, b, e);
      a.router_logits = rows_of(in.logits, b, e);
      a.out = outs->back().view();
      if (replayer != nullptr) a.forced_ids = replayer->forced_ids(l);
      MOEKIT_RETURN_IF_ERROR(model.layer(l).forward(a));
    }
    return capturer.end_step();
  };

  // One rank, every token.
  MoeConfig one = c;
  one.max_num_tokens = in.total;
  Model single;
  for (int l = 0; l < kLayers; ++l) {
    auto layer = MoeLayer::create(one, in.weights(one), Device::cpu(), Platform::cpu_only());
    ASSERT_TRUE(layer.ok()) << layer.status().to_string();
    ASSERT_TRUE(single.add_layer(std::move(layer).value(), 2 * l + 1).ok());
  }
  auto capturer = RoutedExpertsCapturer::create(kLayers, in.total, k, Device::cpu(), true, with_weights);
  ASSERT_TRUE(capturer.ok());
  ASSERT_TRUE(bind(single, **capturer).ok());
  ASSERT_TRUE((*capturer)->add_request("all").ok());
  std::vector<HostTensor> single_out;
  ASSERT_TRUE(run_step(single, **capturer, "all", 0, in.total, &single_out, nullptr).ok());
  auto ref = (*capturer)->snapshot();
  ASSERT_TRUE(ref.ok());
  const RequestCapture& all = ref->requests.at(0);
  ASSERT_EQ(all.router_weights.shape(), all.ids.shape());
  const size_t row = static_cast<size_t>(kLayers) * k;  // one token's ids (or weights), every layer

  std::vector<std::string> problems(n);
  auto st = run_ranks(n, [&](int r, Communicator& comm) -> Status {
    const MoeConfig rc = rank_config(c, n, r, All2AllBackend::kNccl);
    Model model;
    for (int l = 0; l < kLayers; ++l) {
      MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rc, in.weights(rc), comm, nullptr,
                                                                      Platform::cpu_only()));
      MOEKIT_RETURN_IF_ERROR(model.add_layer(std::move(layer), 2 * l + 1));
    }
    MOEKIT_ASSIGN_OR_RETURN(auto cap, RoutedExpertsCapturer::create(kLayers, kMaxPerRank, k, Device::cpu(), true,
                                                                    with_weights));
    MOEKIT_RETURN_IF_ERROR(bind(model, *cap));
    MOEKIT_RETURN_IF_ERROR(cap->add_request("r"));
    const int64_t b = in.first[r], e = in.first[r + 1];
    std::vector<HostTensor> outs;
    MOEKIT_RETURN_IF_ERROR(run_step(model, *cap, "r", b, e, &outs, nullptr));
    MOEKIT_ASSIGN_OR_RETURN(CaptureSet mine, cap->snapshot());
    const RequestCapture& got = mine.requests.at(0);
    std::string& why = problems[r];
    // The model's EP layers run one at a time: one experts workspace for all of them.
    if (model.workspace_bytes() != model.layer(0).workspace_bytes() ||
        model.layer(0).workspace_buffer() != model.layer(kLayers - 1).workspace_buffer()) {
      why += "workspace not shared; ";
    }
    if (got.num_tokens() != e - b) why += "token count; ";
    if (std::memcmp(got.ids.data<int16_t>(), all.ids.data<int16_t>() + b * row, (e - b) * row * sizeof(int16_t)) != 0) {
      why += "ids; ";
    }
    if (got.router_weights.shape() != got.ids.shape() ||
        std::memcmp(got.router_weights.data<float>(), all.router_weights.data<float>() + b * row,
                    (e - b) * row * sizeof(float)) != 0) {
      why += "router weights; ";
    }
    if (mine.info.backend.rfind("ep3/", 0) != 0) why += "producer " + mine.info.backend + "; ";
    // Replay the rank's own capture through the same EP model.
    MOEKIT_ASSIGN_OR_RETURN(auto replayer, RoutedExpertsReplayer::create(std::move(mine), model));
    MOEKIT_RETURN_IF_ERROR(cap->add_request("again"));
    std::vector<HostTensor> replayed;
    MOEKIT_RETURN_IF_ERROR(replayer->start_token("r", 0));
    MOEKIT_RETURN_IF_ERROR(cap->begin_step({{{"again", e - b}}}));
    for (int l = 0; l < kLayers; ++l) {
      replayed.emplace_back(c.quant.act_dtype, std::vector<int64_t>{e - b, kH});
    }
    MOEKIT_RETURN_IF_ERROR(replayer->begin_step({{{"r", e - b}}}));
    for (int l = 0; l < kLayers; ++l) {
      LayerForwardArgs a;
      a.hidden = rows_of(in.hidden, b, e);
      a.router_logits = rows_of(in.logits, b, e);
      a.out = replayed[l].view();
      a.forced_ids = replayer->forced_ids(l);
      MOEKIT_RETURN_IF_ERROR(model.layer(l).forward(a));
      if (!same_bytes(replayed[l], outs[l])) why += "replayed output of layer " + std::to_string(l) + "; ";
      if (std::memcmp(outs[l].data<void>(),
                      static_cast<const char*>(single_out[l].data<void>()) + b * kH * dtype_size(c.quant.act_dtype),
                      outs[l].nbytes()) != 0) {
        why += "output of layer " + std::to_string(l) + " vs one rank; ";
      }
    }
    return cap->end_step();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
    EXPECT_EQ(problems[r], "") << "rank " << r;
  }
}

// The EP output against the independent fp64 reference (not only against the
// single-rank layer): bf16 output rounding (2^-8) plus the fp32 part.
TEST(EpAgainstReference, NormalizedErrorWithinTheBf16Bound) {
  const int n = 3;
  MoeConfig c = base_config(RoutingMethod::kRenormalize, DType::kBF16);
  const GroupInputs in(c, n, testing::seed_from({77}));
  HostTensor out(DType::kBF16, {in.total, kH}), ids(DType::kI16, {in.total, kK});
  auto st = run_ranks(n, [&](int r, Communicator& comm) -> Status {
    const MoeConfig rc = rank_config(c, n, r, All2AllBackend::kAuto);
    MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rc, in.weights(rc), comm));
    return layer->forward(forward_args(rc, in, in.first[r], in.first[r + 1], out, ids));
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  const auto rr = moekit_ref::route(testing::ref_routing(c.routing), in.logits_exact, in.total, kE);
  const auto ref = moekit_ref::moe_layer(testing::ref_layer(c), in.hidden_exact, in.total, in.w13_exact, in.w2_exact,
                                         rr.ids, rr.weights, kK);
  // Same bound and reason as the CPU kernel tests: bf16 output rounding
  // (relative 2^-8 per element) plus a K-term fp32 worst case (K * 2^-24).
  const double bound = 0.00390625 * (1.0 + 5e-6) + 5e-6;
  EXPECT_LE(testing::rel_l2_error(testing::to_double(out.view()), ref), bound);
  std::vector<int32_t> got(in.total * kK);
  for (size_t i = 0; i < got.size(); ++i) got[i] = ids.data<int16_t>()[i];
  EXPECT_EQ(got, rr.ids);
}

TEST(EpOracle, AutoPicksByBatchSizeAndSaysWhy) {
  MoeConfig c = rank_config(base_config(RoutingMethod::kRenormalize, DType::kBF16), 4, 0, All2AllBackend::kAuto);
  auto small = choose_ep_dispatch(c);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->kind, All2AllBackend::kAllgatherReducescatter);
  EXPECT_NE(small->reason.find("24 tokens in the group"), std::string::npos) << small->reason;
  c.max_num_tokens = 4096;
  auto large = choose_ep_dispatch(c);
  ASSERT_TRUE(large.ok());
  EXPECT_EQ(large->kind, All2AllBackend::kNccl);
  EXPECT_NE(large->reason.find("16384 tokens"), std::string::npos) << large->reason;
  // The monolithic kernel keeps refusing dispatch across ranks, with its reason.
  auto res = select_backend(c, Platform::cpu_only());
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->kernel.name, "CpuModular");
  EXPECT_NE(res->report_string().find("all-to-all"), std::string::npos) << res->report_string();
}

TEST(EpOracle, MoeLayerStillRefusesEpAndNamesTheEpLayer) {
  MoeConfig c = rank_config(base_config(RoutingMethod::kRenormalize, DType::kBF16), 2, 0, All2AllBackend::kNccl);
  const GroupInputs in(c, 2, 1);
  auto layer = MoeLayer::create(c, in.weights(c), Platform::cpu_only());
  ASSERT_FALSE(layer.ok());
  EXPECT_NE(layer.status().message().find("ExpertParallelLayer"), std::string::npos) << layer.status().message();
}

// ---- bad input: every rank fails, with the problem named -----------------

TEST(EpBadInput, MismatchedConfigsAcrossRanks) {
  MoeConfig c = base_config(RoutingMethod::kRenormalize, DType::kBF16);
  const GroupInputs in(c, 2, 2);
  auto st = run_ranks(2, [&](int r, Communicator& comm) -> Status {
    MoeConfig rc = rank_config(c, 2, r, All2AllBackend::kNccl);
    if (r == 1) rc.routing.method = RoutingMethod::kSoftmaxTopk;
    return ExpertParallelLayer::create(rc, in.weights(rc), comm).status();
  });
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("the layer config differs between ranks"), std::string::npos) << s.message();
  }
}

// Expert biases travel with their slot (moved by EPLB too): bit for bit the single-rank layer.
TEST(EpExpertBias, EqualsTheSingleRankLayerWithAndWithoutEplb) {
  for (const int ranks : {2, 3}) {
    for (const All2AllBackend a2a : {All2AllBackend::kNccl, All2AllBackend::kAllgatherReducescatter}) {
      check_equal_to_single_rank({ranks, RoutingMethod::kRenormalize, a2a, /*eplb=*/true, DType::kBF16, true});
    }
  }
  check_equal_to_single_rank({2, RoutingMethod::kCustom, All2AllBackend::kNccl, false, DType::kF32, true});
}

// A shared expert on host ranks runs on each rank's own tokens after the
// combine: bit for bit the single-rank layer in batch-invariant mode (gated or
// not, both dispatches, with EPLB and custom routing), within the GEMM bound
// otherwise.
TEST(EpSharedExpert, EqualsTheSingleRankLayer) {
  for (const int ranks : {2, 3}) {
    for (const All2AllBackend a2a : {All2AllBackend::kNccl, All2AllBackend::kAllgatherReducescatter}) {
      for (const bool gate : {false, true}) {
        check_equal_to_single_rank({ranks, RoutingMethod::kRenormalize, a2a, /*eplb=*/true, DType::kBF16, false,
                                    /*shared=*/24, gate, /*batch_invariant=*/true});
      }
    }
  }
  check_equal_to_single_rank({2, RoutingMethod::kDeepseekV3, All2AllBackend::kNccl, false, DType::kBF16, true, 24,
                              false, true});
  check_equal_to_single_rank({2, RoutingMethod::kCustom, All2AllBackend::kNccl, false, DType::kF32, false, 24, true,
                              true});
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    check_equal_to_single_rank({3, RoutingMethod::kSoftmaxTopk, All2AllBackend::kNccl, false, dt, false, 24, true,
                                /*batch_invariant=*/false});
  }
}

// Quantized experts on host ranks: fp8 (block-128, per-tensor with static
// activation scales) and 4-bit weights travel with their slot, scales
// included (also when EPLB moves them), and the layer equals the single-rank
// layer bit for bit in batch-invariant mode (the quantized CPU path's GEMMs
// are sgemm, whose rounding depends on the row count, otherwise).
struct QuantizedLayer {
  MoeConfig config;
  HostTensor w13, w2, w13_scale, w2_scale, a13_scale, a2_scale, hidden, logits;
  MoeWeights weights() const {
    MoeWeights w{.w13 = w13.view(), .w2 = w2.view(), .w13_scale = w13_scale.view(), .w2_scale = w2_scale.view()};
    if (config.quant.act_scale == ActScale::kStatic) {
      w.a13_scale = a13_scale.view();
      w.a2_scale = a2_scale.view();
    }
    return w;
  }
};

QuantizedLayer quantized_layer(QuantMethod method, int64_t total, uint64_t seed) {
  constexpr int64_t H = 128, I = 64;  // the 4-bit groups and fp8 blocks need these multiples
  QuantizedLayer q;
  MoeConfig& c = q.config;
  c = base_config(RoutingMethod::kRenormalize, DType::kBF16);
  c.hidden = H;
  c.intermediate = I;
  c.batch_invariant = true;
  c.quant.method = method;
  c.quant.weight_dtype = default_weight_dtype(method);
  if (method == QuantMethod::kFp8PerTensor) c.quant.act_scale = ActScale::kStatic;
  std::mt19937_64 rng(seed);
  const HostTensor w13 = testing::random_tensor(rng, DType::kF32, {kE, 2 * I, H}, 1.0 / std::sqrt(double(H)));
  const HostTensor w2 = testing::random_tensor(rng, DType::kF32, {kE, H, I}, 1.0 / std::sqrt(double(I)));
  if (c.quant.is_weight4()) {
    StatusOr<io::Weight4Tensor> a = io::quantize_weight4_tensor(w13.view(), method, "w13");
    StatusOr<io::Weight4Tensor> b = io::quantize_weight4_tensor(w2.view(), method, "w2");
    EXPECT_TRUE(a.ok() && b.ok());
    q.w13 = std::move(a->packed), q.w13_scale = std::move(a->scale);
    q.w2 = std::move(b->packed), q.w2_scale = std::move(b->scale);
  } else {
    // Each expert's gate, up and down quantized on its own, as a checkpoint stores them.
    const bool block = method == QuantMethod::kFp8Block128;
    q.w13 = HostTensor(DType::kF8E4M3, {kE, 2 * I, H});
    q.w2 = HostTensor(DType::kF8E4M3, {kE, H, I});
    q.w13_scale = block ? HostTensor(DType::kF32, {kE, 2 * ((I + 127) / 128), H / 128})
                        : HostTensor(DType::kF32, {kE, 2});
    q.w2_scale = block ? HostTensor(DType::kF32, {kE, H / 128, (I + 127) / 128}) : HostTensor(DType::kF32, {kE});
    const auto put = [&](const HostTensor& src, HostTensor& dst, float* scale, int64_t row0, int64_t rows,
                         int64_t cols) {
      const TensorView m = TensorView::contiguous(const_cast<float*>(src.data<float>()) + row0 * cols, DType::kF32,
                                                  {rows, cols});
      StatusOr<io::Fp8Matrix> f = io::quantize_fp8(m, method, "w");
      ASSERT_TRUE(f.ok()) << f.status().to_string();
      std::memcpy(dst.data<uint8_t>() + row0 * cols, f->weight.data<uint8_t>(), rows * cols);
      std::memcpy(scale, f->scale.data<float>(), f->scale.nbytes());
    };
    const int64_t per13 = q.w13_scale.numel() / kE / 2, per2 = q.w2_scale.numel() / kE;
    for (int64_t e = 0; e < kE; ++e) {
      for (int64_t p = 0; p < 2; ++p) {
        put(w13, q.w13, q.w13_scale.data<float>() + (e * 2 + p) * per13, (e * 2 + p) * I, I, H);
      }
      put(w2, q.w2, q.w2_scale.data<float>() + e * per2, e * H, H, I);
    }
    q.a13_scale = testing::random_tensor(rng, DType::kF32, {kE}, 0.0);
    q.a2_scale = testing::random_tensor(rng, DType::kF32, {kE}, 0.0);
    for (int64_t e = 0; e < kE; ++e) q.a13_scale.data<float>()[e] = 4.0f / 448.0f, q.a2_scale.data<float>()[e] = 1.0f / 448.0f;
  }
  q.hidden = testing::random_tensor(rng, DType::kBF16, {total, H}, 1.0);
  q.logits = testing::tie_free_logits(rng, DType::kF32, total, kE, 1.0 / 32.0);
  return q;
}

TEST(EpQuantized, Fp8And4BitSlotsEqualTheSingleRankLayer) {
  for (QuantMethod method : {QuantMethod::kFp8Block128, QuantMethod::kFp8PerTensor, QuantMethod::kMxfp4,
                             QuantMethod::kInt4G32}) {
    for (const int ranks : {2, 3}) {
      SCOPED_TRACE(std::string(quant_method_name(method)) + " ranks=" + std::to_string(ranks));
      std::vector<int64_t> first{0};
      for (int r = 0; r < ranks; ++r) first.push_back(first.back() + tokens_of(r));
      const int64_t total = first.back();
      const QuantizedLayer q = quantized_layer(method, total, testing::seed_from({int64_t(method), ranks, 91}));
      ASSERT_TRUE(q.config.validate().ok()) << q.config.validate().to_string();
      const int64_t H = q.config.hidden;
      MoeConfig one = q.config;
      one.max_num_tokens = total;
      auto single = MoeLayer::create(one, q.weights(), Device::cpu(), Platform::cpu_only());
      ASSERT_TRUE(single.ok()) << single.status().to_string();
      HostTensor ref(DType::kBF16, {total, H}), out(DType::kBF16, {total, H}), out_eplb(DType::kBF16, {total, H});
      LayerForwardArgs a;
      a.hidden = q.hidden.view();
      a.router_logits = q.logits.view();
      a.out = ref.view();
      ASSERT_TRUE((*single)->forward(a).ok());
      testing::poison(out);
      testing::poison(out_eplb);
      auto st = run_ranks(ranks, [&](int r, Communicator& comm) -> Status {
        const MoeConfig rc = rank_config(q.config, ranks, r, All2AllBackend::kNccl);
        MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rc, q.weights(), comm, nullptr,
                                                                        Platform::cpu_only()));
        LayerForwardArgs f;
        f.hidden = rows_of(q.hidden, first[r], first[r + 1]);
        f.router_logits = rows_of(q.logits, first[r], first[r + 1]);
        f.out = rows_of(out, first[r], first[r + 1]);
        MOEKIT_RETURN_IF_ERROR(layer->forward(f));
        // EPLB moves the slots (and their scales) between ranks.
        MOEKIT_ASSIGN_OR_RETURN(std::vector<int64_t> load, layer->gather_expert_load());
        EplbOptions opt;
        opt.num_physical_slots = eplb_slots(ranks);
        MOEKIT_ASSIGN_OR_RETURN(ExpertPlacement plan, plan_eplb(load, ranks, opt));
        MOEKIT_RETURN_IF_ERROR(layer->rebalance(plan));
        f.out = rows_of(out_eplb, first[r], first[r + 1]);
        return layer->forward(f);
      });
      for (int r = 0; r < ranks; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
      EXPECT_TRUE(same_bytes(out, ref)) << "EP output differs from the single-rank layer";
      EXPECT_TRUE(same_bytes(out_eplb, ref)) << "EP output after EPLB differs from the single-rank layer";
    }
  }
}

TEST(EpQuantized, ADynamicPerTensorActivationScaleIsRefused) {
  MoeConfig c = rank_config(base_config(RoutingMethod::kRenormalize, DType::kBF16), 2, 0, All2AllBackend::kNccl);
  c.hidden = 128;
  c.quant.method = QuantMethod::kFp8PerTensor;
  c.quant.weight_dtype = DType::kF8E4M3;
  const Status st = c.validate();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("one amax over the batch"), std::string::npos) << st.message();
}

// A shared expert, expert biases and fp8 on EP ranks: the CPU and the GPU
// modular classes both serve them (GPU ranks run the shared expert on their own
// tokens: test_ep_extras_cuda runs them).
TEST(EpExtras, BothModularClassesServeThemForEpRanks) {
  MoeConfig shared = rank_config(base_config(RoutingMethod::kRenormalize, DType::kBF16), 2, 0, All2AllBackend::kNccl);
  shared.shared_intermediate = 32;
  shared.has_shared_gate = true;
  MoeConfig bias = rank_config(base_config(RoutingMethod::kRenormalize, DType::kBF16), 2, 0, All2AllBackend::kNccl);
  bias.has_expert_bias = true;
  MoeConfig fp8 = rank_config(base_config(RoutingMethod::kRenormalize, DType::kBF16), 2, 0, All2AllBackend::kNccl);
  fp8.hidden = 128;
  fp8.quant.method = QuantMethod::kFp8Block128;
  fp8.quant.weight_dtype = DType::kF8E4M3;
  for (const MoeConfig& c : {shared, bias, fp8}) {
    SCOPED_TRACE(c.to_string());
    ASSERT_TRUE(c.validate().ok()) << c.validate().to_string();
    StatusOr<Resolution> res = select_backend_on(c, Platform::cpu_only(), DeviceType::kCpu);
    ASSERT_TRUE(res.ok()) << res.status().to_string();
    EXPECT_EQ(res->kernel.name, "CpuModular");
#ifdef MOEKIT_WITH_CUDA
    StatusOr<Resolution> gpu = select_backend_on(c, testing::described_h200(), DeviceType::kCuda);
    ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
    EXPECT_EQ(gpu->kernel.name, "Sm90Modular");
#endif
  }
}

TEST(EpBadInput, ParallelConfigNotMatchingTheCommunicator) {
  MoeConfig c = base_config(RoutingMethod::kRenormalize, DType::kBF16);
  const GroupInputs in(c, 2, 3);
  auto st = run_ranks(2, [&](int r, Communicator& comm) -> Status {
    const MoeConfig rc = rank_config(c, 2, 1 - r, All2AllBackend::kNccl);  // ranks swapped
    return ExpertParallelLayer::create(rc, in.weights(rc), comm).status();
  });
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("ep_rank == dp_rank == communicator rank"), std::string::npos) << s.message();
  }
}

TEST(EpBadInput, ARankThatNeverCallsForwardTimesOut) {
  MoeConfig c = base_config(RoutingMethod::kRenormalize, DType::kBF16);
  const GroupInputs in(c, 2, 4);
  HostTensor out(DType::kBF16, {in.total, kH}), ids(DType::kI16, {in.total, kK});
  auto st = run_ranks(
      2,
      [&](int r, Communicator& comm) -> Status {
        const MoeConfig rc = rank_config(c, 2, r, All2AllBackend::kNccl);
        MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rc, in.weights(rc), comm));
        if (r == 1) return Status::Ok();  // leaves
        return layer->forward(forward_args(rc, in, in.first[r], in.first[r + 1], out, ids));
      },
      {std::chrono::milliseconds(300)});
  EXPECT_EQ(st[0].code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st[0].message().find("rank(s) 1, which never arrived"), std::string::npos) << st[0].message();
}

TEST(EpBadInput, BadForcedIdsOnOneRankFailEveryRankAndWriteNothing) {
  MoeConfig c = base_config(RoutingMethod::kRenormalize, DType::kBF16);
  const GroupInputs in(c, 2, 5);
  HostTensor out(DType::kBF16, {in.total, kH}), ids(DType::kI16, {in.total, kK});
  testing::poison(out);
  HostTensor before(DType::kBF16, {in.total, kH});
  std::memcpy(before.data<void>(), out.data<void>(), out.nbytes());
  auto st = run_ranks(2, [&](int r, Communicator& comm) -> Status {
    const MoeConfig rc = rank_config(c, 2, r, All2AllBackend::kNccl);
    MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rc, in.weights(rc), comm));
    const int64_t b = in.first[r], e = in.first[r + 1];
    HostTensor forced(DType::kI32, {e - b, kK});
    for (int64_t i = 0; i < forced.numel(); ++i) forced.data<int32_t>()[i] = static_cast<int32_t>(i % kK);
    if (r == 1) forced.data<int32_t>()[1] = kE;  // out of range
    LayerForwardArgs a = forward_args(rc, in, b, e, out, ids);
    a.forced_ids = forced.view();
    return layer->forward(a);
  });
  EXPECT_NE(st[1].message().find("forced"), std::string::npos) << st[1].message();
  EXPECT_NE(st[0].message().find("rank 1 rejected its input"), std::string::npos) << st[0].message();
  EXPECT_FALSE(st[0].ok());
  EXPECT_TRUE(same_bytes(out, before)) << "a rejected forward wrote its output";
}

TEST(EpBadInput, IdsOfAnExpertNoRankHoldsAreRejected) {
  // Three ranks over 16 experts: slots 16 and 17 (rank 2's tail) are empty.
  auto placement = ExpertPlacement::contiguous(kE, 3);
  ASSERT_TRUE(placement.ok());
  auto st = run_ranks(3, [&](int r, Communicator& comm) -> Status {
    dispatch::EpShape shape{4, kH, 2, placement->slots_per_rank, DType::kF32};
    MOEKIT_ASSIGN_OR_RETURN(auto pf, dispatch::make_all_to_all(comm, shape));
    std::vector<float> hidden(kH, 1.0f);
    std::vector<int32_t> phys = {0, r == 2 ? 17 : 1};
    return pf->prepare(TensorView::contiguous(hidden.data(), DType::kF32, {1, kH}), phys.data(), *placement).status();
  });
  EXPECT_EQ(st[2].code(), StatusCode::kOutOfRange);
  EXPECT_NE(st[2].message().find("physical expert 17, an empty slot of rank 2"), std::string::npos)
      << st[2].message();
  EXPECT_NE(st[0].message().find("rank 2 rejected its input"), std::string::npos) << st[0].message();
}

TEST(EpBadInput, AnEplbPlanNotCoveringEveryExpertIsRejectedAndNothingChanges) {
  MoeConfig c = base_config(RoutingMethod::kRenormalize, DType::kBF16);
  const GroupInputs in(c, 2, 6);
  HostTensor out(DType::kBF16, {in.total, kH}), ids(DType::kI16, {in.total, kK});
  const SingleRank ref = run_single_rank(c, in);
  auto st = run_ranks(2, [&](int r, Communicator& comm) -> Status {
    const MoeConfig rc = rank_config(c, 2, r, All2AllBackend::kNccl);
    MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rc, in.weights(rc), comm));
    ExpertPlacement bad = layer->placement();
    bad.physical_to_logical[5] = 6;  // expert 5 dropped, 6 twice
    const Status s = layer->rebalance(bad);
    if (s.code() != StatusCode::kInvalidArgument || s.message().find("logical expert 5 is held by no slot") ==
                                                        std::string::npos) {
      return Internal("rebalance accepted or misreported a bad plan: " + s.to_string());
    }
    return layer->forward(forward_args(rc, in, in.first[r], in.first[r + 1], out, ids));
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(same_bytes(out, ref.out));
}

TEST(EpWeights, UpdateWritesEveryReplica) {
  const int n = 2;
  MoeConfig c = base_config(RoutingMethod::kRenormalize, DType::kBF16);
  GroupInputs in(c, n, 8);
  GroupInputs fresh(c, n, 9);  // new weights for expert 3
  const int64_t hot = 3, n1 = 2 * kI;
  const size_t a = n1 * kH * 2, b = kH * kI * 2;
  // The single-rank layer with expert 3's weights replaced.
  GroupInputs updated(c, n, 8);
  std::memcpy(updated.w13.data<char>() + hot * a, fresh.w13.data<char>() + hot * a, a);
  std::memcpy(updated.w2.data<char>() + hot * b, fresh.w2.data<char>() + hot * b, b);
  const SingleRank ref = run_single_rank(c, updated);
  HostTensor out(DType::kBF16, {in.total, kH}), ids(DType::kI16, {in.total, kK});
  auto st = run_ranks(n, [&](int r, Communicator& comm) -> Status {
    const MoeConfig rc = rank_config(c, n, r, All2AllBackend::kNccl);
    MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rc, in.weights(rc), comm));
    // One replica of expert 3 on each rank.
    ExpertPlacement p = layer->placement();
    p.slots_per_rank += 1;
    p.physical_to_logical = {0, 1, 2, 3, 4, 5, 6, 7, 3, 8, 9, 10, 11, 12, 13, 14, 15, 3};
    MOEKIT_RETURN_IF_ERROR(layer->rebalance(p));
    const TensorView w13 = TensorView::contiguous(fresh.w13.data<char>() + hot * a, DType::kBF16, {n1, kH});
    const TensorView w2 = TensorView::contiguous(fresh.w2.data<char>() + hot * b, DType::kBF16, {kH, kI});
    MOEKIT_RETURN_IF_ERROR(layer->update_expert_weights(hot, w13, w2));
    return layer->forward(forward_args(rc, in, in.first[r], in.first[r + 1], out, ids));
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(same_bytes(out, ref.out)) << "a replica kept the old weights";
}

TEST(EpLayer, ARankWithoutTokensStillTakesPart) {
  const int n = 3;
  MoeConfig c = base_config(RoutingMethod::kSigmoidRenorm, DType::kBF16);
  const GroupInputs in(c, n, 10);
  // Ranks 0 and 2 take every token; rank 1 has none this step.
  const std::vector<int64_t> first = {0, in.first[2], in.first[2], in.total};
  const SingleRank ref = run_single_rank(c, in);
  HostTensor out(DType::kBF16, {in.total, kH}), ids(DType::kI16, {in.total, kK});
  c.max_num_tokens = in.total;
  auto st = run_ranks(n, [&](int r, Communicator& comm) -> Status {
    const MoeConfig rc = rank_config(c, n, r, All2AllBackend::kNccl);
    MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rc, in.weights(rc), comm));
    if (first[r] < first[r + 1]) return layer->forward(forward_args(rc, in, first[r], first[r + 1], out, ids));
    LayerForwardArgs none;  // [0, H] views, no data
    none.hidden = TensorView::contiguous(nullptr, DType::kBF16, {0, kH});
    none.out = TensorView::contiguous(nullptr, DType::kBF16, {0, kH});
    return layer->forward(none);
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(same_bytes(out, ref.out));
  EXPECT_TRUE(same_bytes(ids, ref.ids));
}

TEST(EpBadInput, NonFiniteLogitsOnOneRankFailEveryRank) {
  MoeConfig c = base_config(RoutingMethod::kRenormalize, DType::kBF16);
  GroupInputs in(c, 2, 11);
  in.logits.data<float>()[in.first[1] * kE + 3] = std::nanf("");
  HostTensor out(DType::kBF16, {in.total, kH}), ids(DType::kI16, {in.total, kK});
  auto st = run_ranks(2, [&](int r, Communicator& comm) -> Status {
    const MoeConfig rc = rank_config(c, 2, r, All2AllBackend::kAllgatherReducescatter);
    MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rc, in.weights(rc), comm));
    return layer->forward(forward_args(rc, in, in.first[r], in.first[r + 1], out, ids));
  });
  EXPECT_FALSE(st[1].ok());
  EXPECT_NE(st[0].message().find("rank 1 rejected its input"), std::string::npos) << st[0].message();
}

// A rank that loads only its own experts gets the same layer as one handed
// the full weights, for a placement with replicas; a wrong slot count is named.
TEST(EpLayer, CreateFromSlotsEqualsCreateFromFullWeights) {
  const int n = 3;
  MoeConfig c = base_config(RoutingMethod::kRenormalize, DType::kBF16);
  const GroupInputs in(c, n, 12);
  ExpertPlacement p;
  p.num_logical = kE;
  p.num_ranks = n;
  p.slots_per_rank = 7;  // 21 slots: every expert once, 0..4 twice, one empty slot
  p.physical_to_logical = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, -1};
  const int64_t n1 = 2 * kI;
  const size_t a = n1 * kH * 2, b = kH * kI * 2;
  HostTensor full_out(DType::kBF16, {in.total, kH}), slots_out(DType::kBF16, {in.total, kH});
  HostTensor ids(DType::kI16, {in.total, kK});
  auto st = run_ranks(n, [&](int r, Communicator& comm) -> Status {
    const MoeConfig rc = rank_config(c, n, r, All2AllBackend::kNccl);
    HostTensor w13(DType::kBF16, {p.slots_per_rank, n1, kH}), w2(DType::kBF16, {p.slots_per_rank, kH, kI});
    for (int64_t s = 0; s < p.slots_per_rank; ++s) {
      const int32_t e = p.physical_to_logical[r * p.slots_per_rank + s];
      if (e < 0) continue;
      std::memcpy(w13.data<char>() + s * a, in.w13.data<char>() + e * a, a);
      std::memcpy(w2.data<char>() + s * b, in.w2.data<char>() + e * b, b);
    }
    MOEKIT_ASSIGN_OR_RETURN(auto full, ExpertParallelLayer::create(rc, in.weights(rc), comm, &p));
    MOEKIT_ASSIGN_OR_RETURN(auto mine, ExpertParallelLayer::create_from_slots(rc, {w13.view(), w2.view(), {}}, comm, p));
    MOEKIT_RETURN_IF_ERROR(full->forward(forward_args(rc, in, in.first[r], in.first[r + 1], full_out, ids)));
    MOEKIT_RETURN_IF_ERROR(mine->forward(forward_args(rc, in, in.first[r], in.first[r + 1], slots_out, ids)));
    // Rank 1 passes one slot too few: every rank fails, rank 1 naming the tensor.
    HostTensor short_w13(DType::kBF16, {p.slots_per_rank - (r == 1), n1, kH});
    const Status bad =
        ExpertParallelLayer::create_from_slots(rc, {short_w13.view(), w2.view(), {}}, comm, p).status();
    if (bad.ok()) return Internal("a wrong slot count was accepted");
    const std::string want = r == 1 ? "w13 (this rank's slots)" : "rank 1 rejected its input";
    if (bad.message().find(want) == std::string::npos) return Internal("unexpected error: " + bad.to_string());
    return Status::Ok();
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(same_bytes(full_out, slots_out));
}

}  // namespace
}  // namespace moekit

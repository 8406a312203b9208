// Every scheme and extra on GPU expert-parallel ranks, on ONE GPU: N ranks as
// threads over a device-loopback communicator (cuda/device_loopback_comm.h).
// For each layer kind (expert biases, a shared expert with and without its
// gate, fp8 block-128 and per-tensor static, 4-bit int4_g128 with biases and
// mxfp4) on 2 and 3 ranks:
//   - the ids equal the single-GPU layer's exactly;
//   - the outputs equal its outputs within ep_bound (docs/expert_parallel.md
//     "GPU numerics": the shared expert is added where the single-GPU finalize
//     adds it, in the same fp32 sum, so the bound is unchanged);
//   - replaying the captured ids gives the same output bit for bit.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/device_loopback_comm.h"
#include "cuda/ep_gpu_test_util.h"
#include "util/fp8_test_layer.h"
#include "util/weight4_test_layer.h"

namespace moekit {
namespace {

using namespace ep_gpu_test;

enum class Kind { kExpertBias, kShared, kSharedGate, kFp8Block128, kFp8TensorStatic, kInt4G128Bias, kMxfp4 };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kExpertBias: return "expert_bias";
    case Kind::kShared: return "shared";
    case Kind::kSharedGate: return "shared_gate";
    case Kind::kFp8Block128: return "fp8_block128";
    case Kind::kFp8TensorStatic: return "fp8_tensor_static";
    case Kind::kInt4G128Bias: return "int4_g128_bias";
    case Kind::kMxfp4: return "mxfp4";
  }
  return "?";
}

// The bf16 DeepSeek-like layer of ep_gpu_test_util.h with its extras.
struct Bf16Extras : Inputs {
  HostTensor w13_bias, w2_bias, shared_w13, shared_w2, shared_gate;
  Bf16Extras(int n, Kind kind) : Inputs(n) {
    std::mt19937_64 rng(testing::seed_from({n, static_cast<int64_t>(kind), 907}));
    if (kind == Kind::kExpertBias) {
      w13_bias = testing::random_tensor(rng, DType::kF32, {kE, 2 * kI}, 0.1);
      w2_bias = testing::random_tensor(rng, DType::kF32, {kE, kH}, 0.1);
    } else {
      constexpr int64_t kIs = 64;
      shared_w13 = testing::random_tensor(rng, DType::kBF16, {2 * kIs, kH}, 1.0 / std::sqrt(double(kH)));
      shared_w2 = testing::random_tensor(rng, DType::kBF16, {kH, kIs}, 1.0 / std::sqrt(double(kIs)));
      if (kind == Kind::kSharedGate) shared_gate = testing::random_tensor(rng, DType::kF32, {kH}, 0.3);
    }
  }
};

// One layer kind over every token of the group: its config (one GPU, any
// max_num_tokens), weights, hidden [total, H] and logits [total, E].
struct ExtrasLayer {
  MoeConfig config;
  MoeWeights weights;
  HostTensor hidden, logits;
  std::shared_ptr<void> owner;  // what the weights' views point into
};

ExtrasLayer make_layer(Kind kind, int n) {
  ExtrasLayer L;
  const Inputs shape(n);
  const uint64_t seed = testing::seed_from({n, static_cast<int64_t>(kind), 513});
  switch (kind) {
    case Kind::kExpertBias:
    case Kind::kShared:
    case Kind::kSharedGate: {
      auto in = std::make_shared<Bf16Extras>(n, kind);
      L.config = layer_config(in->total);
      L.weights = in->weights();
      if (kind == Kind::kExpertBias) {
        L.config.has_expert_bias = true;
        L.weights.w13_bias = in->w13_bias.view();
        L.weights.w2_bias = in->w2_bias.view();
      } else {
        L.config.shared_intermediate = in->shared_w2.shape()[1];
        L.config.has_shared_gate = kind == Kind::kSharedGate;
        L.weights.shared_w13 = in->shared_w13.view();
        L.weights.shared_w2 = in->shared_w2.view();
        if (L.config.has_shared_gate) L.weights.shared_gate = in->shared_gate.view();
      }
      L.hidden = in->hidden;
      L.logits = in->logits;
      L.owner = in;
      break;
    }
    case Kind::kFp8Block128:
    case Kind::kFp8TensorStatic: {
      auto f = std::make_shared<testing::Fp8Layer>(
          testing::Fp8Shape{shape.total, kE, kK, kH, kI},
          kind == Kind::kFp8Block128 ? testing::Fp8Scheme::kBlock128 : testing::Fp8Scheme::kTensorStatic,
          Activation::kSiluGated, DType::kBF16, seed);
      L.config = f->config;
      L.weights = f->weights();
      L.hidden = f->hidden;
      L.logits = f->logits;
      L.owner = f;
      break;
    }
    case Kind::kInt4G128Bias:
    case Kind::kMxfp4: {
      const bool int4 = kind == Kind::kInt4G128Bias;
      auto w = std::make_shared<testing::Weight4Layer>(testing::Weight4Shape{shape.total, kE, kK, kH, kI},
                                                       int4 ? QuantMethod::kInt4G128 : QuantMethod::kMxfp4,
                                                       Activation::kSiluGated, /*biases=*/int4, DType::kBF16, seed);
      L.config = w->config;
      L.weights = w->weights();
      L.hidden = w->hidden;
      L.logits = w->logits;
      L.owner = w;
      break;
    }
  }
  return L;
}

class EpExtrasOneGpu : public ::testing::TestWithParam<std::tuple<Kind, int>> {};

TEST_P(EpExtrasOneGpu, EqualsTheSingleGpuLayerAndReplaysBitwise) {
  MOEKIT_REQUIRE_SM90();
  const auto [kind, n] = GetParam();
  const Inputs group(n);  // the token counts and row offsets of each rank
  const ExtrasLayer L = make_layer(kind, n);
  ASSERT_EQ(L.hidden.shape()[0], group.total);

  MoeConfig one = L.config;  // the single-GPU layer over every token
  one.max_num_tokens = n * kMaxPerRank;
  const Reference ref = single_gpu(one, L.weights, L.hidden, L.logits);
  ASSERT_GT(ref.out.numel(), 0);

  std::vector<RankResult> ep(n);
  auto st = cuda_test::run_device_loopback_ranks(n, [&](int r, Communicator& comm, cudaStream_t s) -> Status {
    MoeConfig rc = L.config;
    rc.max_num_tokens = kMaxPerRank;
    rc.parallel.ep_size = rc.parallel.dp_size = n;
    rc.parallel.ep_rank = rc.parallel.dp_rank = r;
    rc.parallel.all2all = All2AllBackend::kNccl;
    RankStep step(L.hidden, L.logits, group.first[r], group.first[r + 1]);
    return capture_then_replay(r, comm, s, rc, L.weights, step, nullptr, &ep[r]);
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
  expect_equals_single_gpu(group, ep, ref);
}

INSTANTIATE_TEST_SUITE_P(Kinds, EpExtrasOneGpu,
                         ::testing::Combine(::testing::Values(Kind::kExpertBias, Kind::kShared, Kind::kSharedGate,
                                                              Kind::kFp8Block128, Kind::kFp8TensorStatic,
                                                              Kind::kInt4G128Bias, Kind::kMxfp4),
                                            ::testing::Values(2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<Kind, int>>& p) {
                           return std::string(kind_name(std::get<0>(p.param))) + "_ep" +
                                  std::to_string(std::get<1>(p.param));
                         });

}  // namespace
}  // namespace moekit

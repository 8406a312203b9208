// The capture/replay/oracle commands as a user runs them: `moekit layer` on
// the three checkpoint namings (outputs vs the fp64 reference, ids exact,
// replay bit for bit), `moekit backends`, and `moekit run` + `moekit replay`.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "moekit/capture.h"
#include "moekit/io.h"
#include "reference/reference.h"
#include "util/cli_test_util.h"
#include "util/temp_dir.h"
#include "util/test_util.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;

using Result = testing::CommandResult;

Result run_cli(const std::string& args) { return testing::run_command(std::string(MOEKIT_CLI_PATH) + " " + args); }

class CaptureCli : public testing::TempDirTest {};

constexpr int64_t kE = 8, kH = 32, kI = 16, kM = 12, kK = 2;

// One layer's weights, bf16, as the reference sees them.
struct Weights {
  std::vector<HostTensor> gate, up, down;  // per expert [I, H], [I, H], [H, I]
  HostTensor router;                       // [E, H] f32
  std::vector<double> w13, w2;             // [E, 2I, H], [E, H, I]
};

Weights make_weights(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Weights w;
  w.w13.resize(kE * 2 * kI * kH);
  w.w2.resize(kE * kH * kI);
  for (int64_t e = 0; e < kE; ++e) {
    std::vector<double> g, u, d;
    w.gate.push_back(testing::random_tensor(rng, DType::kBF16, {kI, kH}, 0.2, &g));
    w.up.push_back(testing::random_tensor(rng, DType::kBF16, {kI, kH}, 0.2, &u));
    w.down.push_back(testing::random_tensor(rng, DType::kBF16, {kH, kI}, 0.2, &d));
    std::copy(g.begin(), g.end(), w.w13.begin() + e * 2 * kI * kH);
    std::copy(u.begin(), u.end(), w.w13.begin() + e * 2 * kI * kH + kI * kH);
    std::copy(d.begin(), d.end(), w.w2.begin() + e * kH * kI);
  }
  w.router = testing::random_tensor(rng, DType::kF32, {kE, kH}, 0.3);
  return w;
}

// Writes `w` under `prefix` in one of the namings.
void add_tensors(const Weights& w, const std::string& naming, const std::string& prefix,
                 std::vector<io::NamedTensor>* t, std::vector<HostTensor>* keep) {
  if (naming == "moekit") {
    HostTensor w13(DType::kBF16, {kE, 2 * kI, kH}), w2(DType::kBF16, {kE, kH, kI});
    for (int64_t e = 0; e < kE; ++e) {
      std::memcpy(w13.data<uint16_t>() + e * 2 * kI * kH, w.gate[e].data<uint16_t>(), w.gate[e].nbytes());
      std::memcpy(w13.data<uint16_t>() + e * 2 * kI * kH + kI * kH, w.up[e].data<uint16_t>(), w.up[e].nbytes());
      std::memcpy(w2.data<uint16_t>() + e * kH * kI, w.down[e].data<uint16_t>(), w.down[e].nbytes());
    }
    keep->push_back(std::move(w13));
    t->push_back({prefix + "w13", keep->back().view()});
    keep->push_back(std::move(w2));
    t->push_back({prefix + "w2", keep->back().view()});
    return;
  }
  const bool mixtral = naming == "mixtral";
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = prefix + "experts." + std::to_string(e) + ".";
    t->push_back({p + (mixtral ? "w1" : "gate_proj") + ".weight", w.gate[e].view()});
    t->push_back({p + (mixtral ? "w3" : "up_proj") + ".weight", w.up[e].view()});
    t->push_back({p + (mixtral ? "w2" : "down_proj") + ".weight", w.down[e].view()});
  }
  t->push_back({prefix + "gate.weight", w.router.view()});
}

TEST_F(CaptureCli, LayerReadsEveryNamingMatchesTheReferenceAndReplaysBitForBit) {
  const Weights w3 = make_weights(51), w5 = make_weights(52);
  std::mt19937_64 rng(53);
  std::vector<double> hidden_d, logits_d;
  HostTensor hidden = testing::random_tensor(rng, DType::kBF16, {kM, kH}, 1.0, &hidden_d);
  HostTensor logits = testing::tie_free_logits(rng, DType::kF32, kM, kE, 1.0 / 32, &logits_d);
  HostTensor hidden_f32 = io::convert(hidden.view(), DType::kF32).value();  // exact
  ASSERT_TRUE(io::write_npy(file("h.npy"), hidden_f32.view()).ok());
  ASSERT_TRUE(io::write_npy(file("l.npy"), logits.view()).ok());

  struct Naming {
    const char* naming;
    std::string prefix3, prefix5;
  } namings[] = {
      {"hf", "model.layers.3.mlp.", "model.layers.5.mlp."},
      {"mixtral", "model.layers.3.block_sparse_moe.", "model.layers.5.block_sparse_moe."},
      {"moekit", "layers.3.", "layers.5."},
  };
  std::vector<uint8_t> first_out;
  for (const Naming& n : namings) {
    std::vector<io::NamedTensor> t;
    std::vector<HostTensor> keep;
    keep.reserve(8);
    add_tensors(w3, n.naming, n.prefix3, &t, &keep);
    add_tensors(w5, n.naming, n.prefix5, &t, &keep);
    const std::string ckpt = file(std::string(n.naming) + ".safetensors");
    ASSERT_TRUE(io::write_safetensors(ckpt, t).ok());
    const std::string common = "layer --weights " + ckpt + " --hidden " + file("h.npy") + " --logits " +
                               file("l.npy") + " --method renormalize --top-k 2";

    // Two layers in the file: --layer is required.
    Result r = run_cli(common + " --out " + file("o.npy"));
    ASSERT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("--layer"), std::string::npos) << r.out;

    r = run_cli(common + " --layer 3 --out " + file("o.npy") + " --capture " + file("ids.npy"));
    ASSERT_EQ(r.code, 0) << r.out;
    auto out = io::read_npy(file("o.npy"));
    auto ids = io::read_npy(file("ids.npy"));
    ASSERT_TRUE(out.ok() && ids.ok());
    ASSERT_EQ(ids->shape(), (std::vector<int64_t>{kM, kK}));
    moekit_ref::RoutingParams rp;
    rp.method = "renormalize";
    rp.top_k = kK;
    const auto route = moekit_ref::route(rp, logits_d, kM, kE);
    for (int64_t i = 0; i < kM * kK; ++i) ASSERT_EQ(ids->data<int32_t>()[i], route.ids[i]) << n.naming << " " << i;
    moekit_ref::LayerParams lp;
    lp.activation = "silu";
    lp.E = kE;
    lp.H = kH;
    lp.I = kI;
    const auto ref = moekit_ref::moe_layer(lp, hidden_d, kM, w3.w13, w3.w2, route.ids, route.weights, kK);
    // bf16 weights/activations that the reference sees exactly, fp32 inside the
    // kernel, one bf16 rounding of the output (relative 2^-8 per element):
    // ||out - ref|| <= 2^-8 ||ref|| plus fp32 rounding (~K * 2^-24, K <= 32).
    EXPECT_LT(testing::rel_l2_error(testing::to_double(out->view()), ref), 0.00390625 + 1e-5) << n.naming;

    // The same layer from every naming gives the same bytes.
    std::vector<uint8_t> bytes(out->data<uint8_t>(), out->data<uint8_t>() + out->nbytes());
    if (first_out.empty()) first_out = bytes;
    EXPECT_EQ(bytes, first_out) << n.naming;

    // Replaying the captured ids on the same inputs reproduces the output bit for bit.
    r = run_cli(common + " --layer 3 --out " + file("o2.npy") + " --replay " + file("ids.npy"));
    ASSERT_EQ(r.code, 0) << r.out;
    auto out2 = io::read_npy(file("o2.npy"));
    ASSERT_TRUE(out2.ok());
    EXPECT_EQ(0, std::memcmp(out->data<uint8_t>(), out2->data<uint8_t>(), out->nbytes())) << n.naming;
  }
}

TEST_F(CaptureCli, LayerRejectsBadForcedIdsAndWritesNothing) {
  const Weights w = make_weights(54);
  std::vector<io::NamedTensor> t;
  std::vector<HostTensor> keep;
  add_tensors(w, "hf", "model.layers.0.mlp.", &t, &keep);
  ASSERT_TRUE(io::write_safetensors(file("c.safetensors"), t).ok());
  std::mt19937_64 rng(55);
  HostTensor hidden = testing::random_tensor(rng, DType::kF32, {kM, kH}, 1.0);
  ASSERT_TRUE(io::write_npy(file("h.npy"), hidden.view()).ok());
  HostTensor ids(DType::kI32, {kM, kK});
  for (int64_t i = 0; i < kM * kK; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>(i % kK);
  ids.data<int32_t>()[5] = static_cast<int32_t>(kE);  // out of range
  ASSERT_TRUE(io::write_npy(file("bad.npy"), ids.view()).ok());
  // No --logits: the router gate.weight of the checkpoint makes them.
  const Result r = run_cli("layer --weights " + file("c.safetensors") + " --hidden " + file("h.npy") + " --out " +
                           file("o.npy") + " --replay " + file("bad.npy") + " --method softmax_topk --top-k 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("forced_ids[2, 1] = 8"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(file("o.npy")));
}

TEST_F(CaptureCli, BackendsPrintsTheReportAndForcedFailures) {
  // --cpu-only: the same answer on a machine with a GPU (where cuda_sm90 would serve).
  Result r = run_cli("backends --cpu-only --method custom --top-k 2 --experts 16");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rejected: custom routing needs a modular kernel"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resolved: cpu / CpuModular"), std::string::npos) << r.out;
  r = run_cli("backends --backend no_such_backend");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("available:"), std::string::npos) << r.out;
}

TEST_F(CaptureCli, RunWritesACaptureThatReplayChecksOnItsOwn) {
  const std::string cap = file("run.safetensors");
  // --backend cpu: the capture records the backend, checked below, and a
  // machine with a GPU would otherwise serve the run there.
  const std::string small =
      "run --backend cpu --layers 2 --experts 16 --top-k 4 --num-groups 4 --topk-groups 2 --hidden 64 "
      "--intermediate 32 --tokens 90 --requests 3 --decode 4 --max-batch-tokens 32 --capture " + cap;
  Result r = run_cli(small);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("outputs matched bit for bit"), std::string::npos) << r.out;
  auto set = read_capture_file(cap);
  ASSERT_TRUE(set.ok()) << set.status().to_string();
  ASSERT_EQ(set->requests.size(), 3u);
  int64_t tokens = 0;
  for (const auto& q : set->requests) tokens += q.num_tokens();
  EXPECT_EQ(tokens, 90 + 3 * 4);
  for (const auto& q : set->requests) EXPECT_GE(q.first_generated_token, 1) << q.request;
  EXPECT_EQ(set->info.backend.rfind("cpu/", 0), 0u) << set->info.backend;
  r = run_cli("replay --captures " + cap);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("outputs matched bit for bit"), std::string::npos) << r.out;
  r = run_cli("capture check " + cap);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ok: no findings"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("backend cpu/"), std::string::npos) << r.out;

  // A changed id: the replay finds the step whose output differs.
  CaptureSet changed = *set;
  int16_t* row = changed.requests[1].ids.data<int16_t>();  // token 0, layer 0
  for (int16_t e = 0; e < 16; ++e) {
    if (std::find(row, row + 4, e) == row + 4) {
      row[0] = e;
      break;
    }
  }
  ASSERT_TRUE(write_capture_file(file("changed.safetensors"), changed).ok());
  r = run_cli("replay --captures " + file("changed.safetensors"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("replay differs from the recorded run at step"), std::string::npos) << r.out;

  // The validator names the planted duplicate by request, token and layer, and exits 2.
  CaptureSet dup = *set;
  int16_t* first = dup.requests[2].ids.data<int16_t>() + 4;  // token 0, MoE layer 1
  first[3] = first[1];
  ASSERT_TRUE(write_capture_file(file("dup.safetensors"), dup).ok());
  const std::string name = dup.requests[2].request;
  r = run_cli("capture check " + file("dup.safetensors"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("duplicate: request '" + name + "', token 0, MoE layer 1 (model layer 3), slot 3"),
            std::string::npos) << r.out;
  r = run_cli("capture check --json " + file("dup.safetensors"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("\"kind\": \"duplicate\""), std::string::npos) << r.out;
  r = run_cli("capture check --expect-tokens ghost=3 " + file("dup.safetensors"));
  EXPECT_EQ(r.code, 2) << r.out;  // a request the capture lacks is a finding, not "ok"
  EXPECT_NE(r.out.find("token_count: request 'ghost': the request is not in the capture"), std::string::npos) << r.out;
  r = run_cli("capture check --expect-tokens nonsense " + cap);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--expect-tokens: expected REQUEST=N"), std::string::npos) << r.out;

  r = run_cli(small.substr(0, small.find(" --capture")) + " --no-capture --capture " + file("none.safetensors"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(file("none.safetensors")));
}

}  // namespace
}  // namespace moekit

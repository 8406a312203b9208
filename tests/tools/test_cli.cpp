// `moekit route` and `moekit run` as a user runs them: outputs checked against
// the fp64 reference, every bad input answered with exit code 2 and a message
// naming the problem, and no output file left behind on error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

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

class Cli : public testing::TempDirTest {};

TEST_F(Cli, RouteMatchesTheFp64Reference) {
  struct Case {
    const char* method;
    int top_k, groups, topk_groups;
    double scaling;
    bool bias;
    DType dtype;
  };
  const Case cases[] = {
      {"deepseek_v3", 8, 8, 4, 2.5, true, DType::kF32}, {"renormalize", 2, 1, 1, 1.0, false, DType::kBF16},
      {"softmax_topk", 4, 1, 1, 1.0, false, DType::kF32}, {"sigmoid_renorm", 6, 1, 1, 1.0, false, DType::kBF16},
  };
  const int64_t M = 37, E = 64;
  int index = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.method);
    std::mt19937_64 rng(testing::seed_from({index++, M, E, c.top_k}));
    std::vector<double> exact;
    // Tie-free after rounding to the stored dtype, so the ids compare exactly.
    const HostTensor logits = testing::tie_free_logits(rng, c.dtype, M, E, 1e-2, &exact);
    ASSERT_TRUE(io::write_npy(file("logits.npy"), logits.view(), {io::Bf16Storage::kRaw}).ok());
    moekit_ref::RoutingParams p;
    p.method = c.method;
    p.top_k = c.top_k;
    std::ostringstream args;
    args << "route --method " << c.method << " --top-k " << c.top_k << " --logits " << file("logits.npy")
         << " --out-ids " << file("ids.npy") << " --out-weights " << file("w.npy") << " --out-counts "
         << file("counts.npy");
    if (std::string(c.method) == "deepseek_v3") {
      p.num_groups = c.groups;
      p.topk_groups = c.topk_groups;
      p.scaling = c.scaling;
      args << " --num-groups " << c.groups << " --topk-groups " << c.topk_groups << " --scaling " << c.scaling;
    }
    if (c.bias) {
      HostTensor bias(DType::kF32, {E});
      // 0 or 1: sigmoid scores lie in (0, 1), so a bias of 1 lifts whole sets of
      // experts without creating near-ties between biased and unbiased scores.
      for (int64_t e = 0; e < E; ++e) bias.data<float>()[e] = (e * 7) % 3 == 0 ? 1.0f : 0.0f;
      for (int64_t e = 0; e < E; ++e) p.bias.push_back(bias.data<float>()[e]);
      ASSERT_TRUE(io::write_npy(file("bias.npy"), bias.view()).ok());
      args << " --bias " << file("bias.npy");
    }
    const Result r = run_cli(args.str());
    ASSERT_EQ(r.code, 0) << r.out;
    const moekit_ref::RoutingResult ref = moekit_ref::route(p, exact, M, E);
    auto ids = io::read_npy(file("ids.npy"));
    auto w = io::read_npy(file("w.npy"));
    auto counts = io::read_npy(file("counts.npy"));
    ASSERT_TRUE(ids.ok() && w.ok() && counts.ok());
    ASSERT_EQ(ids->dtype(), DType::kI32);
    ASSERT_EQ(ids->shape(), (std::vector<int64_t>{M, c.top_k}));
    ASSERT_EQ(w->dtype(), DType::kF32);
    ASSERT_EQ(counts->shape(), (std::vector<int64_t>{E}));
    for (int64_t i = 0; i < M * c.top_k; ++i) {
      ASSERT_EQ(ids->data<int32_t>()[i], ref.ids[i]) << "slot " << i;
      // fp32 scores vs fp64: a few ulps of exp/sigmoid and one division, well
      // inside 1e-5 relative + 1e-6 absolute for weights in [0, scaling].
      EXPECT_NEAR(w->data<float>()[i], ref.weights[i], 1e-6 + 1e-5 * std::abs(ref.weights[i])) << "slot " << i;
    }
    for (int64_t e = 0; e < E; ++e) EXPECT_EQ(counts->data<int32_t>()[e], ref.counts[e]) << "expert " << e;
  }
}

TEST_F(Cli, RouteRejectsBadInputWithExitCode2AndWritesNothing) {
  std::mt19937_64 rng(testing::seed_from({7, 16, 8}));
  const HostTensor logits = testing::tie_free_logits(rng, DType::kF32, 16, 8, 1e-2);
  ASSERT_TRUE(io::write_npy(file("logits.npy"), logits.view()).ok());
  HostTensor nan = logits;
  nan.data<float>()[19] = std::nanf("");
  ASSERT_TRUE(io::write_npy(file("nan.npy"), nan.view()).ok());
  HostTensor rank3(DType::kF32, {2, 4, 8});
  ASSERT_TRUE(io::write_npy(file("rank3.npy"), rank3.view()).ok());
  HostTensor ints(DType::kI32, {16, 8});
  ASSERT_TRUE(io::write_npy(file("ints.npy"), ints.view()).ok());
  HostTensor bias4(DType::kF32, {4});
  ASSERT_TRUE(io::write_npy(file("bias4.npy"), bias4.view()).ok());
  {
    auto full = io::encode_npy(logits.view());
    ASSERT_TRUE(full.ok());
    std::ofstream f(file("cut.npy"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(full->data()), static_cast<std::streamsize>(full->size() - 5));
  }
  const std::string out = " --out-ids " + file("ids.npy") + " --out-weights " + file("w.npy");
  struct Bad {
    std::string args;
    std::string needle;
  };
  const std::string L = " --logits " + file("logits.npy");
  const Bad bad[] = {
      {"route --method renormalize --top-k 2 --logits " + file("cut.npy"), "needs 512 data bytes, the file has 507"},
      {"route --method renormalize --top-k 2 --logits " + file("missing.npy"), "NotFound"},
      {"route --method renormalize --top-k 2 --logits " + file("rank3.npy"), "must be [M, E]"},
      {"route --method renormalize --top-k 2 --logits " + file("ints.npy"), "f32 or bf16"},
      {"route --method renormalize --top-k 2 --logits " + file("nan.npy"), "NaN"},
      {"route --method renormalize --top-k 9" + L, "top_k"},
      {"route --method renormalize --top-k 0" + L, "top_k"},
      {"route --method deepseek_v3 --top-k 2 --num-groups 3" + L, "num_groups"},
      {"route --method deepseek_v3 --top-k 2 --num-groups 4 --topk-groups 5" + L, "topk_groups"},
      {"route --method deepseek_v3 --top-k 2 --num-groups 4 --topk-groups 2 --bias " + file("bias4.npy") + L,
       "bias must be [8]"},
      {"route --method renormalize --top-k 2 --bias " + file("bias4.npy") + L, "deepseek_v3 only"},
      {"route --method renormalize --top-k 2 --num-groups 2" + L, "deepseek_v3 only"},
      {"route --method bogus --top-k 2" + L, "unknown routing method 'bogus'"},
      {"route --method renormalize" + L, "--top-k is required"},
      {"route --method renormalize --top-k two" + L, "--top-k"},
  };
  for (const Bad& b : bad) {
    const Result r = run_cli(b.args + out);
    EXPECT_EQ(r.code, 2) << b.args << "\n" << r.out;
    EXPECT_NE(r.out.find(b.needle), std::string::npos) << b.args << "\n" << r.out;
    EXPECT_FALSE(fs::exists(file("ids.npy"))) << b.args;
    EXPECT_FALSE(fs::exists(file("w.npy"))) << b.args;
  }
  // An output folder that does not exist: an error, and no partial outputs.
  const Result r = run_cli("route --method renormalize --top-k 2" + L + " --out-ids " + file("ids.npy") +
                           " --out-weights " + file("no/such/w.npy"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_FALSE(fs::exists(file("ids.npy")));
}

// quantize, then layer on the fp8 file: the output against the fp64
// reference's fp8 emulation on the file's own bytes and scales (bound as in
// tests/experts/test_cpu_fp8.cpp: fp32 arithmetic plus at most one e4m3 step
// at GEMM2's input), and against the BF16 layer (fp8 rounding: 0.1).
TEST_F(Cli, QuantizeThenLayerMatchesTheFp8Reference) {
  const int64_t M = 9, E = 6, H = 160, I = 72, k = 2;  // partial 128-blocks on both axes
  std::mt19937_64 rng(testing::seed_from({M, E, H, I, 12}));
  std::vector<io::NamedTensor> named;
  std::vector<HostTensor> keep;
  std::vector<std::string> names;
  const std::string prefix = "model.layers.0.mlp.experts.";
  for (int64_t e = 0; e < E; ++e) {
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      const bool down = std::string(proj) == "down_proj";
      names.push_back(prefix + std::to_string(e) + "." + proj + ".weight");
      keep.push_back(testing::random_tensor(rng, DType::kBF16, {down ? H : I, down ? I : H},
                                            1.0 / std::sqrt(double(down ? I : H))));
    }
  }
  for (size_t i = 0; i < keep.size(); ++i) named.push_back({names[i], keep[i].view()});
  ASSERT_TRUE(io::write_safetensors(file("bf16.safetensors"), named).ok());
  // The same layer in the stacked naming (w13 = gate rows then up rows, w2).
  HostTensor w13(DType::kBF16, {E, 2 * I, H}), w2(DType::kBF16, {E, H, I});
  for (int64_t e = 0; e < E; ++e) {
    std::memcpy(w13.data<uint16_t>() + e * 2 * I * H, keep[e * 3].data<uint16_t>(), I * H * 2);
    std::memcpy(w13.data<uint16_t>() + (e * 2 + 1) * I * H, keep[e * 3 + 1].data<uint16_t>(), I * H * 2);
    std::memcpy(w2.data<uint16_t>() + e * H * I, keep[e * 3 + 2].data<uint16_t>(), H * I * 2);
  }
  ASSERT_TRUE(io::write_safetensors(file("stacked.safetensors"), {{"w13", w13.view()}, {"w2", w2.view()}}).ok());
  std::vector<double> hidden_exact, logits_exact;
  ASSERT_TRUE(io::write_npy(file("hidden.npy"), testing::random_tensor(rng, DType::kF32, {M, H}, 1.0, &hidden_exact).view()).ok());
  ASSERT_TRUE(io::write_npy(file("logits.npy"), testing::tie_free_logits(rng, DType::kF32, M, E, 1.0 / 32.0, &logits_exact).view()).ok());
  const std::string layer_args = " --hidden " + file("hidden.npy") + " --logits " + file("logits.npy") +
                                 " --method renormalize --top-k 2 --dtype f32 --out ";
  Result r = run_cli("layer --weights " + file("bf16.safetensors") + layer_args + file("out_bf16.npy"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<double> out_bf16 = testing::to_double(io::read_npy(file("out_bf16.npy")).value().view());

  moekit_ref::RoutingParams rp;
  rp.method = "renormalize";
  rp.top_k = k;
  const moekit_ref::RoutingResult rr = moekit_ref::route(rp, logits_exact, M, E);
  moekit_ref::LayerParams lp;
  lp.activation = "silu";
  lp.E = E;
  lp.H = H;
  lp.I = I;
  for (const char* scheme : {"fp8_block128", "fp8_per_tensor"}) {
    SCOPED_TRACE(scheme);
    const bool block = std::string(scheme) == "fp8_block128";
    const std::string q = file(std::string(scheme) + ".safetensors");
    r = run_cli(std::string("quantize --scheme ") + scheme + " --weights " + file("bf16.safetensors") + " --out " + q);
    ASSERT_EQ(r.code, 0) << r.out;
    r = run_cli("layer --weights " + q + layer_args + file("out.npy"));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(block ? "method=fp8_block128" : "method=fp8_per_tensor"), std::string::npos) << r.out;
    // The file in the checkpoint convention; the reference reads its bytes and scales.
    io::SafetensorsFile f = io::SafetensorsFile::open(q).value();
    std::vector<uint8_t> w13, w2;
    std::vector<double> s13, s2;
    for (int64_t e = 0; e < E; ++e) {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        const std::string base = prefix + std::to_string(e) + "." + proj;
        const HostTensor w = f.read(base + ".weight").value();
        ASSERT_EQ(w.dtype(), DType::kF8E4M3);
        const HostTensor sc = f.read(base + (block ? ".weight_scale_inv" : ".weight_scale")).value();
        const bool down = std::string(proj) == "down_proj";
        const std::vector<int64_t> want_shape =
            block ? std::vector<int64_t>{down ? 2 : 1, down ? 1 : 2} : std::vector<int64_t>{1};
        EXPECT_EQ(sc.shape(), want_shape);
        std::vector<uint8_t>& wd = down ? w2 : w13;
        wd.insert(wd.end(), w.data<uint8_t>(), w.data<uint8_t>() + w.numel());
        const std::vector<double> sv = testing::to_double(sc.view());
        (down ? s2 : s13).insert((down ? s2 : s13).end(), sv.begin(), sv.end());
      }
    }
    moekit_ref::Fp8Params fp;
    fp.scheme = block ? "block128" : "per_tensor";
    const std::vector<double> ref = moekit_ref::moe_layer_fp8(lp, fp, hidden_exact, M, w13, s13, w2, s2, rr.ids,
                                                              rr.weights, static_cast<int>(k));
    const std::vector<double> out = testing::to_double(io::read_npy(file("out.npy")).value().view());
    EXPECT_LE(testing::rel_l2_error(out, ref), 2e-5 + 1e-3) << "vs the reference's fp8 emulation";
    EXPECT_LE(testing::rel_l2_error(out, out_bf16), 0.1) << "vs the BF16 layer";
    // The stacked naming quantizes part by part into the same bytes and scales: the same output, bit for bit.
    const std::string qs = file(std::string(scheme) + "_stacked.safetensors");
    r = run_cli(std::string("quantize --scheme ") + scheme + " --weights " + file("stacked.safetensors") + " --out " + qs);
    ASSERT_EQ(r.code, 0) << r.out;
    r = run_cli("layer --weights " + qs + layer_args + file("out_stacked.npy"));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(testing::to_double(io::read_npy(file("out_stacked.npy")).value().view()), out);
  }
}

TEST_F(Cli, RunServesASmallModelDeterministically) {
  const std::string small =
      "run --layers 2 --experts 16 --top-k 4 --num-groups 4 --topk-groups 2 --hidden 64 --intermediate 32 "
      "--tokens 50 --requests 3 --decode 3 --max-batch-tokens 24";
  const Result a = run_cli(small + " --seed 5");
  ASSERT_EQ(a.code, 0) << a.out;
  for (const char* want : {"backend:", "CpuMonolithic", "tokens/s", "layer 0:", "layer 1:", "output digest:"}) {
    EXPECT_NE(a.out.find(want), std::string::npos) << want << "\n" << a.out;
  }
  // 50 prompt tokens + 3 requests x 3 decode tokens, in steps of <= 24 rows.
  EXPECT_NE(a.out.find(", 59 tokens"), std::string::npos) << a.out;
  // Every token-slot lands on some expert: per layer the mean is 59 x 4 / 16.
  EXPECT_NE(a.out.find("mean    14.8"), std::string::npos) << a.out;
  const Result b = run_cli(small + " --seed 5");
  ASSERT_EQ(b.code, 0) << b.out;
  auto digest = [](const std::string& s) { return s.substr(s.find("output digest:"), 32); };
  EXPECT_EQ(digest(a.out), digest(b.out));
  const Result c = run_cli(small + " --seed 6");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(digest(a.out), digest(c.out));
}

// `capture stats` of the file a run wrote prints, layer by layer, the load
// lines the run printed (min, max, mean, bar): the same ids, counted again.
TEST_F(Cli, CaptureStatsCountsWhatTheRunRouted) {
  const Result run = run_cli("run --layers 2 --experts 16 --top-k 4 --num-groups 4 --topk-groups 2 --hidden 64 "
                             "--intermediate 32 --tokens 50 --requests 3 --decode 3 --capture " + file("c.safetensors"));
  ASSERT_EQ(run.code, 0) << run.out;
  const Result stats = run_cli("capture stats " + file("c.safetensors"));
  ASSERT_EQ(stats.code, 0) << stats.out;
  EXPECT_NE(stats.out.find("3 requests, 59 tokens, 2 MoE layers x top-4 of E=16"), std::string::npos) << stats.out;
  for (int l = 0; l < 2; ++l) {
    const std::string key = "layer " + std::to_string(l) + ": ";
    const size_t at = run.out.find(key);
    ASSERT_NE(at, std::string::npos) << run.out;
    const std::string line = run.out.substr(at + key.size(), run.out.find('\n', at) - at - key.size());
    const std::string named = "model layer " + std::to_string(2 * l + 1) + ": " + line;
    EXPECT_NE(stats.out.find(named), std::string::npos) << named << "\n" << stats.out;
  }
  const Result missing = run_cli("capture stats " + file("none.safetensors"));
  EXPECT_EQ(missing.code, 2) << missing.out;
}

TEST_F(Cli, RunRejectsBadFlagsWithExitCode2) {
  const std::pair<const char*, const char*> bad[] = {
      {"run --experts 60", "num_groups"},       {"run --layers 0", "--layers"},
      {"run --tokens 4 --requests 8", "--tokens"}, {"run --top-k 100", "top_k"},
      {"run --hidden 0", "hidden"},             {"run --bogus", "--bogus"},
      {"frobnicate", "unknown command 'frobnicate'"},
  };
  for (const auto& [args, needle] : bad) {
    const Result r = run_cli(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << args << "\n" << r.out;
  }
}

}  // namespace
}  // namespace moekit

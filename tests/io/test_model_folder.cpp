// load_checkpoint_layer on small synthetic model folders: each naming lands in
// moekit's layout (values checked element by element against the source
// tensors), the config's fields become the MoeConfig, and every bad folder
// gets an error naming the real problem. The families' real folders, written
// by transformers, are checked against transformers itself in
// python/tests/test_checkpoints.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "moekit/checkpoint.h"
#include "moekit/io.h"
#include "util/temp_dir.h"
#include "util/test_util.h"

namespace moekit {
namespace {

using testing::random_tensor;

constexpr int64_t kE = 4, kH = 16, kI = 6;  // 2I != H: fused orientations are told apart by shape

class ModelFolder : public testing::TempDirTest {
 protected:
  void write_config(const std::string& json) {
    std::ofstream(file("config.json")) << json;
  }
  // Tensors of the model in one safetensors file.
  void write_weights(const std::vector<std::pair<std::string, HostTensor>>& tensors) {
    std::vector<io::NamedTensor> named;
    for (const auto& [name, t] : tensors) named.push_back({name, t.view()});
    ASSERT_TRUE(io::write_safetensors(file("model.safetensors"), named).ok());
  }
  HostTensor rand(std::vector<int64_t> shape) { return random_tensor(rng_, DType::kF32, std::move(shape), 1.0); }
  StatusOr<CheckpointLayer> load(int layer) { return load_checkpoint_layer(dir_.path().string(), layer); }
  std::mt19937_64 rng_{testing::seed_from({kE, kH, kI, 2026})};
};

std::string qwen3_config(const std::string& extra = "", const std::string& act = "silu") {
  return R"({"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 16, "num_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": 6, "intermediate_size": 32,
             "norm_topk_prob": true, "hidden_act": ")" + act + "\"" + extra + "}";
}

float at(const HostTensor& t, std::vector<int64_t> idx) {
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) off = off * t.shape()[d] + idx[d];
  return t.data<float>()[off];
}

// ck's w13 [E, 2I, H] and w2 [E, H, I] are gpt-oss's gu [E, H, 2I] and dn [E, I, H] transposed, element for element.
void expect_transposed(const CheckpointLayer& ck, const HostTensor& gu, const HostTensor& dn) {
  const int64_t E = gu.shape()[0], H = gu.shape()[1], I2 = gu.shape()[2], I = dn.shape()[1];
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < I2; ++r) {
      for (int64_t h = 0; h < H; ++h) ASSERT_EQ(at(ck.w13, {e, r, h}), at(gu, {e, h, r}));  // rows stay interleaved
    }
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < I; ++i) ASSERT_EQ(at(ck.w2, {e, h, i}), at(dn, {e, i, h}));
    }
  }
}

TEST_F(ModelFolder, PerExpertNamingStacksGateThenUp) {
  write_config(qwen3_config());
  std::vector<std::pair<std::string, HostTensor>> w;
  for (int e = 0; e < kE; ++e) {
    const std::string p = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
    w.emplace_back(p + "gate_proj.weight", rand({kI, kH}));
    w.emplace_back(p + "up_proj.weight", rand({kI, kH}));
    w.emplace_back(p + "down_proj.weight", rand({kH, kI}));
  }
  w.emplace_back("model.layers.1.mlp.gate.weight", rand({kE, kH}));
  write_weights(w);
  auto ck = load(1);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->prefix, "model.layers.1.mlp.");
  EXPECT_EQ(ck->config.routing.method, RoutingMethod::kRenormalizeNaive);
  EXPECT_EQ(ck->config.routing.top_k, 2);
  EXPECT_EQ(ck->w13.shape(), (std::vector<int64_t>{kE, 2 * kI, kH}));
  for (int e = 0; e < kE; ++e) {
    const HostTensor& gate = w[3 * e].second;
    const HostTensor& up = w[3 * e + 1].second;
    const HostTensor& down = w[3 * e + 2].second;
    for (int64_t i = 0; i < kI; ++i) {
      for (int64_t h = 0; h < kH; ++h) {
        ASSERT_EQ(at(ck->w13, {e, i, h}), at(gate, {i, h}));
        ASSERT_EQ(at(ck->w13, {e, kI + i, h}), at(up, {i, h}));
        ASSERT_EQ(at(ck->w2, {e, h, i}), at(down, {h, i}));
      }
    }
  }
  // Router logits: hidden . W^T in fp32.
  HostTensor x = rand({3, kH});
  auto logits = checkpoint_router_logits(*ck, x.view());
  ASSERT_TRUE(logits.ok());
  const HostTensor& router = w.back().second;
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t e = 0; e < kE; ++e) {
      double s = 0;
      for (int64_t h = 0; h < kH; ++h) s += double(at(x, {t, h})) * at(router, {e, h});
      EXPECT_NEAR(at(*logits, {t, e}), s, 1e-5 * (1 + std::abs(s)));
    }
  }
}

// gpt-oss: fused, transposed, interleaved, with biases and a router bias.
TEST_F(ModelFolder, GptOssFusedTransposedWithBiases) {
  write_config(R"({"model_type": "gpt_oss", "num_hidden_layers": 1, "hidden_size": 16, "num_local_experts": 4,
                   "num_experts_per_tok": 2, "intermediate_size": 6, "swiglu_limit": 5.0})");
  HostTensor gu = rand({kE, kH, 2 * kI}), dn = rand({kE, kI, kH});
  write_weights({{"model.layers.0.mlp.experts.gate_up_proj", gu},
                 {"model.layers.0.mlp.experts.gate_up_proj_bias", rand({kE, 2 * kI})},
                 {"model.layers.0.mlp.experts.down_proj", dn},
                 {"model.layers.0.mlp.experts.down_proj_bias", rand({kE, kH})},
                 {"model.layers.0.mlp.router.weight", rand({kE, kH})},
                 {"model.layers.0.mlp.router.bias", rand({kE})}});
  auto ck = load(0);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->config.activation.kind, Activation::kSwigluOai);
  EXPECT_EQ(ck->config.activation.swiglu_limit, 5.0f);
  EXPECT_EQ(ck->config.routing.method, RoutingMethod::kRenormalize);
  EXPECT_TRUE(ck->config.has_expert_bias);
  EXPECT_EQ(ck->router_bias.shape(), (std::vector<int64_t>{kE}));
  expect_transposed(*ck, gu, dn);
}

// The transposed fused tensors of layer sizes that cross the transpose's 64-square tiles
// (H = 96, 2I = 144: whole and partial tiles both ways), element for element.
TEST_F(ModelFolder, GptOssTransposeAcrossTiles) {
  constexpr int64_t H = 96, I = 72;
  write_config(R"({"model_type": "gpt_oss", "num_hidden_layers": 1, "hidden_size": 96, "num_local_experts": 4,
                   "num_experts_per_tok": 2, "intermediate_size": 72, "swiglu_limit": 7.0})");
  HostTensor gu = rand({kE, H, 2 * I}), dn = rand({kE, I, H});
  write_weights({{"model.layers.0.mlp.experts.gate_up_proj", gu},
                 {"model.layers.0.mlp.experts.gate_up_proj_bias", rand({kE, 2 * I})},
                 {"model.layers.0.mlp.experts.down_proj", dn},
                 {"model.layers.0.mlp.experts.down_proj_bias", rand({kE, H})},
                 {"model.layers.0.mlp.router.weight", rand({kE, H})},
                 {"model.layers.0.mlp.router.bias", rand({kE})}});
  auto ck = load(0);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  expect_transposed(*ck, gu, dn);
}

// DeepSeek-V3: fused in moekit's orientation, selection bias, shared experts, dense first layer.
TEST_F(ModelFolder, DeepseekFusedSharedAndDenseLayer) {
  write_config(R"({"model_type": "deepseek_v3", "num_hidden_layers": 3, "hidden_size": 16, "n_routed_experts": 4,
                   "num_experts_per_tok": 2, "moe_intermediate_size": 6, "intermediate_size": 32,
                   "n_shared_experts": 2, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
                   "norm_topk_prob": false, "first_k_dense_replace": 1, "scoring_func": "sigmoid",
                   "topk_method": "noaux_tc", "hidden_act": "silu"})");
  write_weights({{"model.layers.0.mlp.gate_proj.weight", rand({32, kH})},
                 {"model.layers.1.mlp.experts.gate_up_proj", rand({kE, 2 * kI, kH})},
                 {"model.layers.1.mlp.experts.down_proj", rand({kE, kH, kI})},
                 {"model.layers.1.mlp.gate.weight", rand({kE, kH})},
                 {"model.layers.1.mlp.gate.e_score_correction_bias", rand({kE})},
                 {"model.layers.1.mlp.shared_experts.gate_proj.weight", rand({2 * kI, kH})},
                 {"model.layers.1.mlp.shared_experts.up_proj.weight", rand({2 * kI, kH})},
                 {"model.layers.1.mlp.shared_experts.down_proj.weight", rand({kH, 2 * kI})}});
  auto ck = load(1);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const MoeConfig& c = ck->config;
  EXPECT_EQ(c.routing.method, RoutingMethod::kDeepseekV3);
  EXPECT_EQ(c.routing.num_groups, 2);
  EXPECT_EQ(c.routing.topk_groups, 1);
  EXPECT_FALSE(c.routing.renormalize);
  EXPECT_TRUE(c.routing.has_score_bias);
  EXPECT_EQ(c.shared_intermediate, 2 * kI);
  EXPECT_FALSE(c.has_shared_gate);
  EXPECT_EQ(ck->shared_w13.shape(), (std::vector<int64_t>{4 * kI, kH}));

  auto dense = load(0);
  ASSERT_FALSE(dense.ok());
  EXPECT_NE(dense.status().message().find("layer 0 is a dense (non-MoE) layer: first_k_dense_replace = 1"),
            std::string::npos)
      << dense.status().message();
  auto past = load(3);
  EXPECT_NE(past.status().message().find("layer 3: the model has 3 layers (0..2"), std::string::npos)
      << past.status().message();
  auto empty = load(2);
  EXPECT_NE(empty.status().message().find("no tensor under 'layers.2.'"), std::string::npos)
      << empty.status().message();
}

// An fp8 checkpoint as DeepSeek-V3 ships one (per-expert F8_E4M3 weights with
// weight_scale_inv, "quantization_config" block-128) loads with its scheme and
// every scale in the MoeWeights layout; the same tensors as a layer file (no
// config.json) load to the same bytes: one reader serves both.
TEST_F(ModelFolder, Fp8BlockFolderAndLayerFileReadAlike) {
  write_config(qwen3_config(R"(, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic", "weight_block_size": [128, 128]})"));
  std::vector<std::pair<std::string, HostTensor>> w;
  std::vector<float> scales;  // per expert: gate, up, down (one block each: H, I <= 128)
  for (int e = 0; e < kE; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    const std::pair<const char*, std::vector<int64_t>> parts[3] = {
        {"gate_proj", {kI, kH}}, {"up_proj", {kI, kH}}, {"down_proj", {kH, kI}}};
    for (const auto& [name, shape] : parts) {
      const HostTensor x = rand(shape);
      auto q = io::quantize_fp8(x.view(), QuantMethod::kFp8Block128, name);
      ASSERT_TRUE(q.ok()) << q.status().to_string();
      scales.push_back(q->scale.data<float>()[0]);
      w.emplace_back(p + name + ".weight", std::move(q->weight));
      w.emplace_back(p + name + ".weight_scale_inv", std::move(q->scale));
    }
  }
  w.emplace_back("model.layers.0.mlp.gate.weight", rand({kE, kH}));
  write_weights(w);
  auto ck = load(0);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->config.quant.method, QuantMethod::kFp8Block128);
  EXPECT_EQ(ck->config.quant.weight_dtype, DType::kF8E4M3);
  EXPECT_EQ(ck->config.quant.act_dtype, DType::kBF16);
  ASSERT_EQ(ck->w13_scale.shape(), (std::vector<int64_t>{kE, 2, 1}));
  ASSERT_EQ(ck->w2_scale.shape(), (std::vector<int64_t>{kE, 1, 1}));
  for (int e = 0; e < kE; ++e) {
    EXPECT_EQ(ck->w13_scale.data<float>()[2 * e], scales[3 * e]);
    EXPECT_EQ(ck->w13_scale.data<float>()[2 * e + 1], scales[3 * e + 1]);
    EXPECT_EQ(ck->w2_scale.data<float>()[e], scales[3 * e + 2]);
    for (int64_t i = 0; i < kI * kH; ++i) {
      ASSERT_EQ(ck->w13.data<uint8_t>()[e * 2 * kI * kH + i], w[6 * e].second.data<uint8_t>()[i]);
      ASSERT_EQ(ck->w13.data<uint8_t>()[(e * 2 + 1) * kI * kH + i], w[6 * e + 2].second.data<uint8_t>()[i]);
    }
  }
  EXPECT_NE(ck->summary().find("fp8"), std::string::npos) << ck->summary();

  auto file = io::SafetensorsFile::open(this->file("model.safetensors"));
  ASSERT_TRUE(file.ok());
  auto lf = load_layer_file(std::move(*file), std::nullopt);
  ASSERT_TRUE(lf.ok()) << lf.status().to_string();
  EXPECT_EQ(lf->prefix, ck->prefix);
  EXPECT_EQ(lf->config.num_experts, kE);
  EXPECT_EQ(lf->config.hidden, kH);
  EXPECT_EQ(lf->config.intermediate, kI);
  EXPECT_EQ(lf->config.quant.method, QuantMethod::kFp8Block128);
  const std::pair<const HostTensor*, const HostTensor*> same[] = {
      {&lf->w13, &ck->w13}, {&lf->w2, &ck->w2}, {&lf->w13_scale, &ck->w13_scale},
      {&lf->w2_scale, &ck->w2_scale}, {&lf->router_weight, &ck->router_weight}};
  for (const auto& [a, b] : same) {
    ASSERT_EQ(a->shape(), b->shape());
    ASSERT_EQ(a->nbytes(), b->nbytes());
    EXPECT_EQ(std::memcmp(a->data<uint8_t>(), b->data<uint8_t>(), a->nbytes()), 0);
  }
}

// A layer file carries its shared expert (Qwen2-MoE's, gated): read, sized
// from its tensors; a stray tensor under the block is refused by name.
TEST_F(ModelFolder, LayerFileReadsSharedExpertAndRefusesStrays) {
  std::vector<std::pair<std::string, HostTensor>> w;
  for (int e = 0; e < kE; ++e) {
    const std::string p = "mlp.experts." + std::to_string(e) + ".";
    w.emplace_back(p + "gate_proj.weight", rand({kI, kH}));
    w.emplace_back(p + "up_proj.weight", rand({kI, kH}));
    w.emplace_back(p + "down_proj.weight", rand({kH, kI}));
  }
  w.emplace_back("mlp.shared_expert.gate_proj.weight", rand({10, kH}));
  w.emplace_back("mlp.shared_expert.up_proj.weight", rand({10, kH}));
  w.emplace_back("mlp.shared_expert.down_proj.weight", rand({kH, 10}));
  w.emplace_back("mlp.shared_expert_gate.weight", rand({1, kH}));
  write_weights(w);
  auto file = io::SafetensorsFile::open(this->file("model.safetensors"));
  ASSERT_TRUE(file.ok());
  auto lf = load_layer_file(std::move(*file), std::nullopt);
  ASSERT_TRUE(lf.ok()) << lf.status().to_string();
  EXPECT_EQ(lf->config.shared_intermediate, 10);
  EXPECT_TRUE(lf->config.has_shared_gate);
  EXPECT_EQ(lf->shared_w13.shape(), (std::vector<int64_t>{20, kH}));
  EXPECT_EQ(lf->shared_prefix, "mlp.shared_expert.");

  w.emplace_back("mlp.experts.0.gate_proj.weight_scale", rand({1}));
  write_weights(w);
  file = io::SafetensorsFile::open(this->file("model.safetensors"));
  ASSERT_TRUE(file.ok());
  lf = load_layer_file(std::move(*file), std::nullopt);
  ASSERT_FALSE(lf.ok());
  EXPECT_NE(lf.status().message().find("mlp.experts.0.gate_proj.weight_scale: a scale for "
                                       "mlp.experts.0.gate_proj.weight, which is F32, not F8_E4M3"),
            std::string::npos)
      << lf.status().message();
  w.pop_back();
  w.emplace_back("mlp.norm.weight", rand({kH}));
  write_weights(w);
  file = io::SafetensorsFile::open(this->file("model.safetensors"));
  ASSERT_TRUE(file.ok());
  lf = load_layer_file(std::move(*file), std::nullopt);
  ASSERT_FALSE(lf.ok());
  EXPECT_NE(lf.status().message().find("(mlp.norm.weight); refused rather than ignored"), std::string::npos)
      << lf.status().message();
}

// gpt-oss's MXFP4 experts (blocks [E, rows, K/32, 16] u8, scales [E, rows, K/32]
// u8, "quantization_config" mxfp4) load dequantized to bf16, each element equal to
// an independent decode: e2m1(nibble) * 2^(scale - 127), low nibble first.
TEST_F(ModelFolder, GptOssMxfp4ExpertsDecodeExactly) {
  constexpr int64_t E = 2, H = 64, I = 32;  // H, I multiples of 32
  const std::string config = R"({"model_type": "gpt_oss", "num_hidden_layers": 1, "hidden_size": 64,
      "num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size": 32,
      "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}})";
  write_config(config);
  std::mt19937 rng(7);
  auto bytes = [&](std::vector<int64_t> shape, int lo, int hi) {
    HostTensor t(DType::kU8, std::move(shape));
    std::uniform_int_distribution<int> d(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(d(rng));
    return t;
  };
  const HostTensor gu_b = bytes({E, 2 * I, H / 32, 16}, 0, 255), gu_s = bytes({E, 2 * I, H / 32}, 120, 130);
  const HostTensor dn_b = bytes({E, H, I / 32, 16}, 0, 255), dn_s = bytes({E, H, I / 32}, 120, 130);
  const std::string p = "model.layers.0.mlp.";
  write_weights({{p + "experts.gate_up_proj_blocks", gu_b}, {p + "experts.gate_up_proj_scales", gu_s},
                 {p + "experts.gate_up_proj_bias", rand({E, 2 * I})}, {p + "experts.down_proj_blocks", dn_b},
                 {p + "experts.down_proj_scales", dn_s}, {p + "experts.down_proj_bias", rand({E, H})},
                 {p + "router.weight", rand({E, H})}, {p + "router.bias", rand({E})}});
  auto ck = load(0);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->config.quant.weight_dtype, DType::kBF16);
  EXPECT_TRUE(ck->config.has_expert_bias);
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  auto check = [&](const HostTensor& got, const HostTensor& blocks, const HostTensor& scales, int64_t rows, int64_t K) {
    ASSERT_EQ(got.shape(), (std::vector<int64_t>{E, rows, K}));
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < K; ++c) {
          const int64_t g = (e * rows + r) * (K / 32) + c / 32;
          const uint8_t byte = blocks.data<uint8_t>()[g * 16 + (c % 32) / 2];
          const float want = e2m1[c % 2 == 0 ? byte & 0xF : byte >> 4] *
                             std::ldexp(1.0f, static_cast<int>(scales.data<uint8_t>()[g]) - 127);
          ASSERT_EQ(bf16_bits_to_f32(got.data<uint16_t>()[(e * rows + r) * K + c]), want) << e << " " << r << " " << c;
        }
      }
    }
  };
  check(ck->w13, gu_b, gu_s, 2 * I, H);
  check(ck->w2, dn_b, dn_s, H, I);

  // Bad inputs name the tensor.
  HostTensor nan_scale = gu_s;
  nan_scale.data<uint8_t>()[5] = 255;
  write_weights({{p + "experts.gate_up_proj_blocks", gu_b}, {p + "experts.gate_up_proj_scales", nan_scale},
                 {p + "experts.gate_up_proj_bias", rand({E, 2 * I})}, {p + "experts.down_proj_blocks", dn_b},
                 {p + "experts.down_proj_scales", dn_s}, {p + "experts.down_proj_bias", rand({E, H})}});
  auto bad = load(0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("gate_up_proj_scales: element 5 is 255, the E8M0 code of NaN"),
            std::string::npos) << bad.status().message();
  write_weights({{p + "experts.gate_up_proj_blocks", bytes({E, 2 * I, H / 32, 8}, 0, 255)},
                 {p + "experts.gate_up_proj_scales", gu_s}, {p + "experts.down_proj_blocks", dn_b},
                 {p + "experts.down_proj_scales", dn_s}, {p + "experts.gate_up_proj_bias", rand({E, 2 * I})},
                 {p + "experts.down_proj_bias", rand({E, H})}});
  bad = load(0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("gate_up_proj_blocks: shape [2, 64, 2, 8], expected [2, 64, 2, 16]"),
            std::string::npos) << bad.status().message();
  write_config(R"({"model_type": "gpt_oss", "num_hidden_layers": 1, "hidden_size": 64, "num_local_experts": 2,
                   "num_experts_per_tok": 1, "intermediate_size": 32})");
  bad = load(0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("MXFP4 experts, but no \"quantization_config\" says"), std::string::npos)
      << bad.status().message();
}

// A folder inside the test's temporary folder (removed with it).
struct Subfolder {
  std::string dir;
  Subfolder(const testing::ScopedTempDir& parent, const std::string& name) : dir(parent.file(name)) {
    std::filesystem::create_directories(dir);
  }
  std::string file(const std::string& name) const { return dir + "/" + name; }
};

struct BadFolder {
  const char* what;
  std::string config;
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  const char* message;
};

TEST_F(ModelFolder, ErrorsNameTheProblem) {
  auto experts = [](int count, std::vector<int64_t> down = {kH, kI}) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> t;
    for (int e = 0; e < count; ++e) {
      const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
      t.push_back({p + "gate_proj.weight", {kI, kH}});
      t.push_back({p + "up_proj.weight", {kI, kH}});
      t.push_back({p + "down_proj.weight", down});
    }
    return t;
  };
  auto with = [](std::vector<std::pair<std::string, std::vector<int64_t>>> t,
                 std::pair<std::string, std::vector<int64_t>> more) {
    t.push_back(std::move(more));
    return t;
  };
  const BadFolder cases[] = {
      {"misshapen", qwen3_config(), experts(4, {kI, kH}),
       "model.layers.0.mlp.experts.0.down_proj.weight: shape [6, 16], expected [16, 6] from config.json"},
      {"missing expert", qwen3_config(), experts(3), "model.layers.0.mlp.experts.3: expert missing"},
      {"extra expert", qwen3_config(), experts(5), "model.layers.0.mlp.experts.4.gate_proj.weight: an expert past"},
      {"expert 10 of 4", qwen3_config(), with(experts(4), {"model.layers.0.mlp.experts.10.up_proj.weight", {kI, kH}}),
       "model.layers.0.mlp.experts.10.up_proj.weight: an expert past the 4 of config.json"},
      {"unknown naming", qwen3_config(),
       {{"model.layers.0.mlp.experts.fc1", {kE, kH}}, {"model.layers.0.self_attn.q_proj.weight", {kH, kH}}},
       "no expert naming recognised under 'model.layers.0.mlp.experts.'; names found there: "
       "model.layers.0.mlp.experts.fc1"},
      {"no experts", qwen3_config(),
       {{"model.layers.0.mlp.fc1.weight", {kE, kH}}, {"model.layers.0.self_attn.q_proj.weight", {kH, kH}}},
       "no MoE naming recognised under 'layers.0.' (docs/layer_files.md lists them); names found there besides "
       "attention and norms: model.layers.0.mlp.fc1.weight"},
      {"shared not in config", qwen3_config(),
       with(experts(4), {"model.layers.0.mlp.shared_expert.gate_proj.weight", {kI, kH}}),
       "model.layers.0.mlp.shared_expert.*: shared expert tensors, but config.json sets no shared expert"},
      {"family", R"({"model_type": "llama", "num_hidden_layers": 2})", experts(4),
       "model_type \"llama\" is not an MoE family moekit loads"},
      {"activation", qwen3_config("", "relu"), experts(4), "\"hidden_act\" = \"relu\""},
      {"missing field", R"({"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 16})", experts(4),
       "\"num_local_experts\" or \"num_experts\" or \"n_routed_experts\" is missing"},
      {"fp8 config, bf16 tensors", qwen3_config(R"(, "quantization_config": {"quant_method": "fp8"})"), experts(4),
       "\"quantization_config\" says fp8_per_tensor, but the experts under 'model.layers.0.mlp.' are f32"},
      {"another quantization", qwen3_config(R"(, "quantization_config": {"quant_method": "gptq", "bits": 4})"),
       experts(4), "quant_method \"gptq\"; moekit loads \"fp8\" checkpoints"},
      {"another fp8 block", qwen3_config(R"(, "quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]})"),
       experts(4), "weight_block_size [64,64]; moekit's block scheme is [128, 128]"},
      {"stray tensor under the block", qwen3_config(),
       with(experts(4), {"model.layers.0.mlp.experts.0.gate_proj.bias", {kI}}),
       "1 tensor of the MoE block 'model.layers.0.mlp.' that the layer does not use "
       "(model.layers.0.mlp.experts.0.gate_proj.bias); refused rather than ignored"},
      {"mlp only layer", qwen3_config(R"(, "mlp_only_layers": [0])"), experts(4),
       "layer 0 is a dense (non-MoE) layer: it is in mlp_only_layers"},
  };
  for (const BadFolder& c : cases) {
    const Subfolder sub(dir_, c.what);
    std::ofstream(sub.file("config.json")) << c.config;
    std::vector<HostTensor> keep;
    std::vector<io::NamedTensor> named;
    for (const auto& [name, shape] : c.tensors) keep.push_back(rand(shape));
    for (size_t i = 0; i < keep.size(); ++i) named.push_back({c.tensors[i].first, keep[i].view()});
    ASSERT_TRUE(io::write_safetensors(sub.file("model.safetensors"), named).ok());
    auto ck = load_checkpoint_layer(sub.dir, 0);
    ASSERT_FALSE(ck.ok()) << c.what;
    EXPECT_NE(ck.status().message().find(c.message), std::string::npos) << c.what << ": " << ck.status().message();
  }
}

TEST_F(ModelFolder, NoConfigNoWeights) {
  auto none = load(0);
  EXPECT_NE(none.status().message().find("no config.json"), std::string::npos) << none.status().message();
  write_config(qwen3_config());
  auto no_weights = load(0);
  EXPECT_NE(no_weights.status().message().find("no model.safetensors or model.safetensors.index.json"),
            std::string::npos)
      << no_weights.status().message();
}

}  // namespace
}  // namespace moekit

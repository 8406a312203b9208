// 4-bit expert weights through the readers and `moekit quantize`
// (docs/weights_4bit.md): gpt-oss's MXFP4 folders kept packed, compressed-tensors
// INT4 folders (Kimi-K2's pack-quantized layout), the stacked 4-bit layer files
// quantize writes, and every bad input refused by name.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/weight4.h"
#include "moekit/checkpoint.h"
#include "moekit/dtype.h"
#include "moekit/io.h"
#include "util/cli_test_util.h"
#include "util/temp_dir.h"

namespace moekit {
namespace {

// The tensors of a folder or layer file, by name, owned here.
struct Tensors {
  std::vector<std::pair<std::string, HostTensor>> owned;
  std::vector<std::pair<std::string, std::vector<int64_t>>> i64;  // weight_shape as I64: name -> values

  void add(const std::string& name, HostTensor t) { owned.emplace_back(name, std::move(t)); }
  HostTensor& at(const std::string& name) {
    for (auto& [n, t] : owned) {
      if (n == name) return t;
    }
    ADD_FAILURE() << "no tensor " << name;
    return owned.front().second;
  }
  void erase(const std::string& name) {
    std::erase_if(owned, [&](const auto& p) { return p.first == name; });
    std::erase_if(i64, [&](const auto& p) { return p.first == name; });
  }
  Status write(const std::string& path) const {
    std::vector<io::NamedTensor> named;
    for (const auto& [n, t] : owned) named.push_back({n, t.view(), "", std::nullopt});
    for (const auto& [n, v] : i64) {
      io::NamedTensor nt;
      nt.name = n;
      nt.tensor = TensorView::contiguous(const_cast<int64_t*>(v.data()), DType::kU8,
                                         {static_cast<int64_t>(v.size() * sizeof(int64_t))});
      nt.stored_dtype = "I64";
      nt.stored_shape = std::vector<int64_t>{static_cast<int64_t>(v.size())};
      named.push_back(std::move(nt));
    }
    return io::write_safetensors(path, named);
  }
};

HostTensor random_f32(std::mt19937_64& rng, std::vector<int64_t> shape, float scale = 1.0f) {
  HostTensor t(DType::kF32, std::move(shape));
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

HostTensor random_bf16(std::mt19937_64& rng, std::vector<int64_t> shape) {
  HostTensor t(DType::kBF16, std::move(shape));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<uint16_t>()[i] = f32_to_bf16_bits(d(rng));
  return t;
}

// w [rows, cols] in f32, the whole tensor dequantized (core/weight4.h).
std::vector<float> dequantized(QuantMethod m, const HostTensor& packed, const HostTensor& scale) {
  const int64_t cols = packed.shape().back() * 2, rows = packed.numel() * 2 / cols;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  dequantize_weight4(m, packed.data<uint8_t>(), scale.data<unsigned char>(), rows, cols, out.data());
  return out;
}

std::vector<float> widened(const HostTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    out[i] = t.dtype() == DType::kF32 ? t.data<float>()[i] : bf16_bits_to_f32(t.data<uint16_t>()[i]);
  }
  return out;
}

// Bit for bit (-0 and +0 told apart).
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    ASSERT_EQ(a, b) << what << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

class Weight4Io : public testing::TempDirTest {
 protected:
  void write_config(const std::string& json) { std::ofstream(file("config.json")) << json; }
  void write_weights(const Tensors& t) { ASSERT_TRUE(t.write(file("model.safetensors")).ok()); }
  StatusOr<CheckpointLayer> load(bool packed = false) {
    CheckpointLoadOptions o;
    o.keep_packed_weights = packed;
    return load_checkpoint_layer(dir_.path().string(), 0, o);
  }
  // The load fails with a message holding `needle`.
  void expect_refused(const std::string& needle, bool packed = false) {
    auto r = load(packed);
    ASSERT_FALSE(r.ok()) << "loaded, expected: " << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
  std::mt19937_64 rng_{20260};
};

// ------------------------------------------------------------ gpt-oss MXFP4

constexpr int64_t kOssE = 2, kOssH = 64, kOssI = 32;
const char* const kOssConfig = R"({"model_type": "gpt_oss", "num_hidden_layers": 1, "hidden_size": 64,
    "num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size": 32,
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}})";

Tensors gpt_oss_mxfp4(std::mt19937_64& rng) {
  auto bytes = [&](std::vector<int64_t> shape, int lo, int hi) {
    HostTensor t(DType::kU8, std::move(shape));
    std::uniform_int_distribution<int> d(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(d(rng));
    return t;
  };
  const int64_t E = kOssE, H = kOssH, I = kOssI;
  const std::string p = "model.layers.0.mlp.";
  Tensors t;
  t.add(p + "experts.gate_up_proj_blocks", bytes({E, 2 * I, H / 32, 16}, 0, 255));
  t.add(p + "experts.gate_up_proj_scales", bytes({E, 2 * I, H / 32}, 118, 132));
  t.add(p + "experts.gate_up_proj_bias", random_f32(rng, {E, 2 * I}));
  t.add(p + "experts.down_proj_blocks", bytes({E, H, I / 32, 16}, 0, 255));
  t.add(p + "experts.down_proj_scales", bytes({E, H, I / 32}, 118, 132));
  t.add(p + "experts.down_proj_bias", random_f32(rng, {E, H}));
  t.add(p + "router.weight", random_f32(rng, {E, H}));
  t.add(p + "router.bias", random_f32(rng, {E}));
  return t;
}

// Kept packed, the experts decode (core/weight4.h) to exactly what the default
// load dequantizes them to, and everything else loads the same.
TEST_F(Weight4Io, GptOssMxfp4KeptPackedDecodesToTheDefaultLoad) {
  write_config(kOssConfig);
  const Tensors t = gpt_oss_mxfp4(rng_);
  write_weights(t);
  auto bf16 = load(false);
  auto packed = load(true);
  ASSERT_TRUE(bf16.ok()) << bf16.status().to_string();
  ASSERT_TRUE(packed.ok()) << packed.status().to_string();
  EXPECT_EQ(bf16->config.quant.method, QuantMethod::kNone);
  EXPECT_EQ(bf16->config.quant.weight_dtype, DType::kBF16);
  const QuantScheme& q = packed->config.quant;
  EXPECT_EQ(q.method, QuantMethod::kMxfp4);
  EXPECT_EQ(q.weight_dtype, DType::kU8);
  EXPECT_EQ(q.act_dtype, DType::kBF16);
  EXPECT_TRUE(packed->config.validate().ok()) << packed->config.validate().to_string();
  const int64_t E = kOssE, H = kOssH, I = kOssI;
  EXPECT_EQ(packed->w13.shape(), (std::vector<int64_t>{E, 2 * I, H / 2}));
  EXPECT_EQ(packed->w2.shape(), (std::vector<int64_t>{E, H, I / 2}));
  EXPECT_EQ(packed->w13_scale.shape(), (std::vector<int64_t>{E, 2 * I, H / 32}));
  EXPECT_EQ(packed->w2_scale.shape(), (std::vector<int64_t>{E, H, I / 32}));
  EXPECT_EQ(packed->w13_scale.dtype(), DType::kU8);
  expect_same_bits(dequantized(QuantMethod::kMxfp4, packed->w13, packed->w13_scale), widened(bf16->w13), "w13");
  expect_same_bits(dequantized(QuantMethod::kMxfp4, packed->w2, packed->w2_scale), widened(bf16->w2), "w2");
  const std::pair<const HostTensor*, const HostTensor*> same[] = {{&packed->w13_bias, &bf16->w13_bias},
                                                                  {&packed->w2_bias, &bf16->w2_bias},
                                                                  {&packed->router_weight, &bf16->router_weight},
                                                                  {&packed->router_bias, &bf16->router_bias}};
  for (const auto& [a, b] : same) {
    ASSERT_EQ(a->shape(), b->shape());
    EXPECT_EQ(std::memcmp(a->data<uint8_t>(), b->data<uint8_t>(), a->nbytes()), 0);
  }
  EXPECT_TRUE(packed->config.has_expert_bias);
  EXPECT_NE(packed->naming.find("kept packed"), std::string::npos) << packed->naming;
  EXPECT_NE(packed->summary().find("mxfp4"), std::string::npos) << packed->summary();

  // The same through the in-memory loader.
  auto image = io::SafetensorsFile::open(file("model.safetensors"));
  ASSERT_TRUE(image.ok());
  CheckpointLoadOptions o;
  o.keep_packed_weights = true;
  auto mem = load_checkpoint_layer_in_memory(kOssConfig, std::move(*image), 0, o);
  ASSERT_TRUE(mem.ok()) << mem.status().to_string();
  EXPECT_EQ(mem->config.quant.method, QuantMethod::kMxfp4);
  ASSERT_EQ(mem->w13.nbytes(), packed->w13.nbytes());
  EXPECT_EQ(std::memcmp(mem->w13.data<uint8_t>(), packed->w13.data<uint8_t>(), mem->w13.nbytes()), 0);
}

TEST_F(Weight4Io, GptOssMxfp4KeptPackedRefusesNanScalesAndBadShapes) {
  write_config(kOssConfig);
  Tensors t = gpt_oss_mxfp4(rng_);
  t.at("model.layers.0.mlp.experts.down_proj_scales").data<uint8_t>()[7] = kE8M0Nan;
  write_weights(t);
  expect_refused("model.layers.0.mlp.experts.down_proj_scales: element 7 is 255, the E8M0 code of NaN", true);
  // Code 254 (2^127) passes alone, but times e2m1 6.0 it is infinite: refused kept packed, as dequantized.
  t = gpt_oss_mxfp4(rng_);
  t.at("model.layers.0.mlp.experts.down_proj_scales").data<uint8_t>()[7] = 254;
  std::memset(t.at("model.layers.0.mlp.experts.down_proj_blocks").data<uint8_t>() + 7 * 16, 0x77, 16);
  write_weights(t);
  expect_refused("model.layers.0.mlp.experts.down_proj_blocks: a value 6 times its scale "
                 "model.layers.0.mlp.experts.down_proj_scales[0, 7, 0] = 2^127 leaves f32's range",
                 true);
  expect_refused("model.layers.0.mlp.experts.down_proj_scales: element 7 (exponent 127) takes a weight past bf16's range");
  t = gpt_oss_mxfp4(rng_);
  t.at("model.layers.0.mlp.experts.gate_up_proj_scales") = HostTensor(DType::kU8, {kOssE, 2 * kOssI, 1});
  write_weights(t);
  expect_refused("model.layers.0.mlp.experts.gate_up_proj_scales: shape [2, 64, 1], expected [2, 64, 2]", true);
}

// ------------------------------------------------------------ compressed-tensors INT4

// A compressed-tensors config as llm-compressor writes one, with `edits`
// (text -> replacement) applied.
std::string ct_config(int64_t H, int64_t I, int group = 32,
                      const std::vector<std::pair<std::string, std::string>>& edits = {}) {
  std::string s = R"({"model_type": "qwen3_moe", "num_hidden_layers": 1, "hidden_size": )" + std::to_string(H) +
                  R"(, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": )" + std::to_string(I) +
                  R"(, "hidden_act": "silu", "quantization_config": {"quant_method": "compressed-tensors",
         "format": "pack-quantized", "quantization_status": "compressed", "kv_cache_scheme": null,
         "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp.gate$"],
         "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null, "output_activations": null,
         "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": )" +
                  std::to_string(group) + R"(, "dynamic": false, "actorder": null, "observer": "minmax",
         "observer_kwargs": {}}}}}})";
  for (const auto& [from, to] : edits) {
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) s.replace(at, from.size(), to);
  }
  return s;
}

// One projection's values as the test knows them: q [N, K] in [-8, 7], scale [N, K/g].
struct Int4Matrix {
  std::vector<int> q;
  std::vector<float> scale;  // the f32 value of each stored bf16/f16 scale
};

// An INT4 compressed-tensors folder of E = 2 experts: per projection the
// packed words (value q + 8, eight a word, the first in the lowest bits), the
// scales in `scale_dtype`, and the shape (I64 for the gate, I32 otherwise, as
// checkpoints carry either).
struct Int4Folder {
  int64_t E = 2, H, I, g;
  Tensors tensors;
  std::vector<std::array<Int4Matrix, 3>> experts;  // [e][gate, up, down]

  Int4Folder(std::mt19937_64& rng, int64_t h, int64_t i, int64_t group, DType scale_dtype) : H(h), I(i), g(group) {
    const char* proj[3] = {"gate_proj", "up_proj", "down_proj"};
    std::uniform_int_distribution<int> qd(-8, 7);
    std::uniform_real_distribution<float> sd(0.002f, 0.05f);
    experts.resize(E);
    for (int64_t e = 0; e < E; ++e) {
      for (int p = 0; p < 3; ++p) {
        const int64_t N = p == 2 ? H : I, K = p == 2 ? I : H;
        Int4Matrix& m = experts[e][p];
        HostTensor words(DType::kI32, {N, K / 8});
        for (int64_t r = 0; r < N; ++r) {
          for (int64_t w = 0; w < K / 8; ++w) {
            uint32_t word = 0;
            for (int j = 0; j < 8; ++j) {
              const int q = qd(rng);
              m.q.push_back(q);
              word |= static_cast<uint32_t>(q + 8) << (4 * j);
            }
            std::memcpy(words.data<int32_t>() + r * (K / 8) + w, &word, 4);
          }
        }
        HostTensor scale(scale_dtype, {N, K / g});
        for (int64_t s = 0; s < N * (K / g); ++s) {
          const float v = sd(rng);
          if (scale_dtype == DType::kBF16) {
            scale.data<uint16_t>()[s] = f32_to_bf16_bits(v);
            m.scale.push_back(bf16_bits_to_f32(scale.data<uint16_t>()[s]));
          } else {
            scale.data<uint16_t>()[s] = f32_to_f16_bits(v);
            m.scale.push_back(f16_bits_to_f32(scale.data<uint16_t>()[s]));
          }
        }
        const std::string base = name(e, proj[p]);
        tensors.add(base + ".weight_packed", std::move(words));
        tensors.add(base + ".weight_scale", std::move(scale));
        if (p == 0) {
          tensors.i64.push_back({base + ".weight_shape", {N, K}});
        } else {
          HostTensor shape(DType::kI32, {2});
          shape.data<int32_t>()[0] = static_cast<int32_t>(N);
          shape.data<int32_t>()[1] = static_cast<int32_t>(K);
          tensors.add(base + ".weight_shape", std::move(shape));
        }
      }
    }
    tensors.add("model.layers.0.mlp.gate.weight", random_bf16(rng, {E, H}));
  }
  static std::string name(int64_t e, const char* proj) {
    return "model.layers.0.mlp.experts." + std::to_string(e) + "." + proj;
  }
  // value [r, c] of expert e's projection p, computed from q and the scale alone.
  float value(int64_t e, int p, int64_t r, int64_t c) const {
    const int64_t K = p == 2 ? I : H;
    const Int4Matrix& m = experts[e][p];
    return static_cast<float>(m.q[r * K + c]) * m.scale[r * (K / g) + c / g];
  }
};

void expect_int4_layout(const CheckpointLayer& ck, const Int4Folder& f, QuantMethod method) {
  const int64_t E = f.E, H = f.H, I = f.I, g = f.g;
  EXPECT_EQ(ck.config.quant.method, method);
  EXPECT_EQ(ck.config.quant.weight_dtype, DType::kU8);
  EXPECT_EQ(ck.config.quant.act_dtype, DType::kBF16);
  ASSERT_EQ(ck.w13.shape(), (std::vector<int64_t>{E, 2 * I, H / 2}));
  ASSERT_EQ(ck.w2.shape(), (std::vector<int64_t>{E, H, I / 2}));
  ASSERT_EQ(ck.w13_scale.shape(), (std::vector<int64_t>{E, 2 * I, H / g}));
  ASSERT_EQ(ck.w2_scale.shape(), (std::vector<int64_t>{E, H, I / g}));
  ASSERT_EQ(ck.w13_scale.dtype(), DType::kF32);
  const std::vector<float> w13 = dequantized(method, ck.w13, ck.w13_scale);
  const std::vector<float> w2 = dequantized(method, ck.w2, ck.w2_scale);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < I; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_EQ(w13[(e * 2 * I + i) * H + h], f.value(e, 0, i, h)) << "gate " << e << " " << i << " " << h;
        ASSERT_EQ(w13[(e * 2 * I + I + i) * H + h], f.value(e, 1, i, h)) << "up " << e << " " << i << " " << h;
        ASSERT_EQ(w2[(e * H + h) * I + i], f.value(e, 2, h, i)) << "down " << e << " " << h << " " << i;
      }
    }
  }
}

// Both groups, both scale dtypes: the values land exactly, gate rows then up
// rows, and the router loads as in a bf16 folder.
TEST_F(Weight4Io, Int4CompressedTensorsFolderLoadsExactly) {
  struct Case {
    int64_t H, I, g;
    DType scale;
    QuantMethod method;
  };
  for (const Case c : {Case{64, 32, 32, DType::kBF16, QuantMethod::kInt4G32},
                       Case{128, 256, 128, DType::kF16, QuantMethod::kInt4G128}}) {
    SCOPED_TRACE(quant_method_name(c.method));
    write_config(ct_config(c.H, c.I, static_cast<int>(c.g)));
    const Int4Folder f(rng_, c.H, c.I, c.g, c.scale);
    write_weights(f.tensors);
    for (bool packed : {false, true}) {  // compressed-tensors INT4 is read packed either way
      auto ck = load(packed);
      ASSERT_TRUE(ck.ok()) << ck.status().to_string();
      expect_int4_layout(*ck, f, c.method);
      EXPECT_NE(ck->naming.find("weight_packed"), std::string::npos) << ck->naming;
      ASSERT_EQ(ck->router_weight.shape(), (std::vector<int64_t>{2, c.H}));
      const std::vector<float> router = widened(f.tensors.owned.back().second);
      for (int64_t i = 0; i < 2 * c.H; ++i) ASSERT_EQ(ck->router_weight.data<float>()[i], router[i]);
      EXPECT_TRUE(ck->config.validate().ok()) << ck->config.validate().to_string();
    }
  }
}

TEST_F(Weight4Io, Int4CompressedTensorsBadInputsNameTheProblem) {
  constexpr int64_t H = 64, I = 32;
  const std::string e0 = Int4Folder::name(0, "gate_proj"), up1 = Int4Folder::name(1, "up_proj");
  const std::string dn0 = Int4Folder::name(0, "down_proj");
  struct Case {
    const char* what;
    std::string config;
    std::function<void(Tensors&)> edit;
    std::string needle;
  };
  const auto none = [](Tensors&) {};
  const std::vector<Case> cases = {
      {"weight_shape disagrees", ct_config(H, I),
       [&](Tensors& t) { t.at(up1 + ".weight_shape").data<int32_t>()[1] = H + 8; },
       up1 + ".weight_shape: (32, 72), but the weight is [32, 64] from config.json"},
      {"I64 weight_shape disagrees", ct_config(H, I), [&](Tensors& t) { t.i64[0].second[0] = 7; },
       e0 + ".weight_shape: (7, 64), but the weight is [32, 64]"},
      {"weight_shape missing", ct_config(H, I), [&](Tensors& t) { t.erase(dn0 + ".weight_shape"); },
       dn0 + ".weight_shape is missing"},
      {"f32 scales", ct_config(H, I),
       [&](Tensors& t) { t.at(dn0 + ".weight_scale") = HostTensor(DType::kF32, {H, I / 32}); },
       dn0 + ".weight_scale: dtype F32, expected BF16 or F16"},
      {"scale shape", ct_config(H, I),
       [&](Tensors& t) { t.at(e0 + ".weight_scale") = HostTensor(DType::kBF16, {I, 1}); },
       e0 + ".weight_scale: shape [32, 1], expected [32, 2] (int4_g32: a scale per 32 columns)"},
      {"zero scale", ct_config(H, I), [&](Tensors& t) { t.at(up1 + ".weight_scale").data<uint16_t>()[3] = 0; },
       up1 + ".weight_scale: element 3 is 0.000000; int4 scales must be finite and > 0"},
      {"scale overflows a weight", ct_config(H, I),
       [&](Tensors& t) {
         t.at(up1 + ".weight_scale").data<uint16_t>()[3] = f32_to_bf16_bits(3e38f);  // finite, > FLT_MAX / 8
         HostTensor& w = t.at(up1 + ".weight_packed");
         std::memset(w.data<uint8_t>(), 0, w.nbytes());  // every value q = -8
       },
       up1 + ".weight_packed: a value -8 times its scale " + up1 + ".weight_scale[1, 1] = 3.00406e+38 leaves"},
      {"packed shape", ct_config(H, I),
       [&](Tensors& t) { t.at(up1 + ".weight_packed") = HostTensor(DType::kI32, {I, H / 4}); },
       up1 + ".weight_packed: shape [32, 16], expected [32, 8] (eight values a word)"},
      {"packed dtype", ct_config(H, I),
       [&](Tensors& t) { t.at(dn0 + ".weight_packed") = HostTensor(DType::kU8, {H, I / 2}); },
       dn0 + ".weight_packed: dtype U8, expected I32"},
      {"packed missing", ct_config(H, I), [&](Tensors& t) { t.erase(dn0 + ".weight_packed"); },
       "model.layers.0.mlp.experts.0.down_proj.weight_packed is missing"},
      {"zero point", ct_config(H, I),
       [&](Tensors& t) { t.add(e0 + ".weight_zero_point", HostTensor(DType::kI32, {4, 2})); },
       e0 + ".weight_zero_point: a zero point (asymmetric int4)"},
      {"g_idx", ct_config(H, I), [&](Tensors& t) { t.add(up1 + ".weight_g_idx", HostTensor(DType::kI32, {H})); },
       up1 + ".weight_g_idx: activation reordering"},
      {"a stray beside", ct_config(H, I),
       [&](Tensors& t) { t.add(e0 + ".input_scale", HostTensor(DType::kF32, {1})); },
       e0 + ".input_scale); refused rather than ignored"},
      {"group 64", ct_config(H, I, 64), none, "\"group_size\" = 64; moekit reads groups of 32"},
      {"asymmetric", ct_config(H, I, 32, {{R"("symmetric": true)", R"("symmetric": false)"}}), none,
       "\"symmetric\" = false; moekit reads symmetric int4"},
      {"8 bits", ct_config(H, I, 32, {{R"("num_bits": 4)", R"("num_bits": 8)"}}), none,
       "\"num_bits\" = 8; moekit reads 4-bit weights"},
      {"actorder", ct_config(H, I, 32, {{R"("actorder": null)", R"("actorder": "group")"}}), none,
       "\"actorder\" = \"group\": activation reordering (g_idx) is not read"},
      {"float type", ct_config(H, I, 32, {{R"("type": "int")", R"("type": "float")"}}), none,
       "\"type\" = \"float\""},
      {"input activations", ct_config(H, I, 32, {{R"("input_activations": null)",
                                                 R"("input_activations": {"num_bits": 8})"}}),
       none, "\"input_activations\" = {\"num_bits\":8}: moekit reads weight-only int4 (W4A16)"},
      {"sparsity", ct_config(H, I, 32, {{R"("kv_cache_scheme": null)",
                                         R"("kv_cache_scheme": null, "sparsity_config": {"format": "sparse-24"})"}}),
       none, "\"sparsity_config\" = {\"format\":\"sparse-24\"}: moekit reads dense weights"},
      {"no format", ct_config(H, I, 32, {{R"("format": "pack-quantized", )", ""}}), none,
       "no \"format\"; moekit reads compressed-tensors \"pack-quantized\""},
      {"another format", ct_config(H, I, 32, {{R"("format": "pack-quantized")", R"("format": "int-quantized")"}}),
       none, "format \"int-quantized\"; moekit reads compressed-tensors \"pack-quantized\""},
      {"two groups", ct_config(H, I, 32, {{R"("config_groups": {)", R"("config_groups": {"group_1": {},)"}}), none,
       "\"config_groups\" must hold exactly one group"},
      {"unknown key", ct_config(H, I, 32, {{R"("dynamic": false)", R"("dynamic": false, "rounding": "stochastic")"}}),
       none, ".weights: \"rounding\" is not a setting moekit reads"},
      {"no config", R"({"model_type": "qwen3_moe", "num_hidden_layers": 1, "hidden_size": 64, "num_experts": 2,
          "num_experts_per_tok": 1, "moe_intermediate_size": 32})",
       none, e0 + ".weight_packed: INT4 packed experts, but no \"quantization_config\" says quant_method "
             "\"compressed-tensors\""},
      {"H not a multiple of the group", ct_config(H, I, 128), none,
       "int4_g128 needs H and I to be multiples of 128, got H = 64, I = 32"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    write_config(c.config);
    Int4Folder f(rng_, H, I, 32, DType::kBF16);
    c.edit(f.tensors);
    write_weights(f.tensors);
    expect_refused(c.needle);
  }
  // A config that says int4 over bf16 experts.
  write_config(ct_config(H, I));
  Tensors bf16;
  for (int e = 0; e < 2; ++e) {
    bf16.add(Int4Folder::name(e, "gate_proj") + ".weight", random_bf16(rng_, {I, H}));
    bf16.add(Int4Folder::name(e, "up_proj") + ".weight", random_bf16(rng_, {I, H}));
    bf16.add(Int4Folder::name(e, "down_proj") + ".weight", random_bf16(rng_, {H, I}));
  }
  write_weights(bf16);
  expect_refused("\"quantization_config\" says compressed-tensors int4_g32, but the experts under "
                 "'model.layers.0.mlp.' are bf16");
  // Packed names in a layer file (no config to give the scheme).
  const Int4Folder f(rng_, H, I, 32, DType::kBF16);
  ASSERT_TRUE(f.tensors.write(file("layer.safetensors")).ok());
  auto lf = io::SafetensorsFile::open(file("layer.safetensors"));
  ASSERT_TRUE(lf.ok());
  auto r = load_layer_file(std::move(*lf), std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(".weight_packed: compressed-tensors INT4 experts are read from a model folder"),
            std::string::npos)
      << r.status().message();
}

// ------------------------------------------------------------ moekit quantize, 4-bit

testing::CommandResult run_cli(const std::string& args) {
  return testing::run_command_split(std::string(MOEKIT_CLI_PATH) + " " + args);
}

// A bf16 per-expert layer file -> quantize -> the layer-file reader: the
// stacked U8 weights and scales are exactly quantize_weight4 of the input
// (gate rows, then up rows), and decode to dequantize_weight4 of that.
TEST_F(Weight4Io, QuantizePerExpertFileRoundTrips) {
  constexpr int64_t E = 3, H = 128, I = 256;
  Tensors in;
  for (int e = 0; e < E; ++e) {
    const std::string p = "mlp.experts." + std::to_string(e) + ".";
    in.add(p + "gate_proj.weight", random_bf16(rng_, {I, H}));
    in.add(p + "up_proj.weight", random_bf16(rng_, {I, H}));
    in.add(p + "down_proj.weight", random_bf16(rng_, {H, I}));
  }
  in.add("mlp.gate.weight", random_bf16(rng_, {E, H}));
  ASSERT_TRUE(in.write(file("bf16.safetensors")).ok());
  for (const QuantMethod m : {QuantMethod::kInt4G128, QuantMethod::kInt4G32, QuantMethod::kMxfp4}) {
    SCOPED_TRACE(quant_method_name(m));
    const std::string out = file(std::string(quant_method_name(m)) + ".safetensors");
    const auto r = run_cli(std::string("quantize --scheme ") + quant_method_name(m) + " --weights " +
                           file("bf16.safetensors") + " --out " + out);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    auto f = io::SafetensorsFile::open(out);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ(f->metadata().at("moekit.quant"), quant_method_name(m));
    EXPECT_TRUE(f->contains("mlp.w13_scale") && f->contains("mlp.w2_scale") && f->contains("mlp.gate.weight"));
    EXPECT_FALSE(f->contains("mlp.experts.0.gate_proj.weight"));
    auto ck = load_layer_file(std::move(*f), std::nullopt);
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    EXPECT_EQ(ck->config.quant.method, m);
    EXPECT_EQ(ck->config.quant.weight_dtype, DType::kU8);
    EXPECT_EQ(ck->config.intermediate, I);
    EXPECT_EQ(ck->config.hidden, H);
    const int64_t g = weight4_group(m);
    ASSERT_EQ(ck->w13.shape(), (std::vector<int64_t>{E, 2 * I, H / 2}));
    ASSERT_EQ(ck->w13_scale.shape(), (std::vector<int64_t>{E, 2 * I, H / g}));
    ASSERT_EQ(ck->w2.shape(), (std::vector<int64_t>{E, H, I / 2}));
    ASSERT_EQ(ck->w2_scale.shape(), (std::vector<int64_t>{E, H, I / g}));
    const size_t sz = dtype_size(weight4_scale_dtype(m));
    for (int64_t e = 0; e < E; ++e) {
      for (int p = 0; p < 3; ++p) {
        const std::vector<float> x = widened(in.owned[3 * e + p].second);
        const int64_t N = p == 2 ? H : I, K = p == 2 ? I : H;
        std::vector<uint8_t> packed(static_cast<size_t>(N * K / 2));
        std::vector<uint8_t> scale(static_cast<size_t>(N * (K / g)) * sz);
        quantize_weight4(m, x.data(), N, K, packed.data(), scale.data());
        std::vector<float> want(static_cast<size_t>(N * K));
        dequantize_weight4(m, packed.data(), scale.data(), N, K, want.data());
        const HostTensor& w = p == 2 ? ck->w2 : ck->w13;
        const HostTensor& s = p == 2 ? ck->w2_scale : ck->w13_scale;
        const int64_t row0 = p == 2 ? e * H : (2 * e + p) * I;
        ASSERT_EQ(std::memcmp(w.data<uint8_t>() + row0 * K / 2, packed.data(), packed.size()), 0) << e << " " << p;
        ASSERT_EQ(std::memcmp(s.data<uint8_t>() + row0 * (K / g) * sz, scale.data(), scale.size()), 0) << e << " " << p;
        const std::vector<float> got = dequantized(m, w, s);
        expect_same_bits(std::vector<float>(got.begin() + row0 * K, got.begin() + (row0 + N) * K), want,
                         "expert " + std::to_string(e) + " part " + std::to_string(p));
      }
    }
    const std::vector<float> router = widened(in.owned.back().second);
    for (int64_t i = 0; i < E * H; ++i) ASSERT_EQ(ck->router_weight.data<float>()[i], router[i]);
  }
}

// The stacked naming in, the same stacked naming out; a layer whose I is not a
// multiple of the group is refused and nothing is written.
TEST_F(Weight4Io, QuantizeStackedFileAndRefusals) {
  constexpr int64_t E = 2, H = 64, I = 96;  // I: a multiple of 32, not of 128
  Tensors in;
  in.add("layers.3.mlp.w13", random_f32(rng_, {E, 2 * I, H}, 0.1f));
  in.add("layers.3.mlp.w2", random_f32(rng_, {E, H, I}, 0.1f));
  in.add("layers.3.mlp.gate.bias", random_f32(rng_, {E}));
  ASSERT_TRUE(in.write(file("stacked.safetensors")).ok());
  const std::string out = file("q.safetensors");
  auto r = run_cli("quantize --scheme mxfp4 --weights " + file("stacked.safetensors") + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto f = io::SafetensorsFile::open(out);
  ASSERT_TRUE(f.ok());
  auto ck = load_layer_file(std::move(*f), 3);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->config.quant.method, QuantMethod::kMxfp4);
  EXPECT_EQ(ck->naming, "w13/w2 (stacked, mxfp4)");
  for (const auto& [got, scale, src] : {std::tuple{&ck->w13, &ck->w13_scale, &in.owned[0].second},
                                        std::tuple{&ck->w2, &ck->w2_scale, &in.owned[1].second}}) {
    const int64_t K = src->shape().back(), rows = src->numel() / K;
    std::vector<uint8_t> packed(static_cast<size_t>(rows * K / 2)), sc(static_cast<size_t>(rows * K / 32));
    quantize_weight4(QuantMethod::kMxfp4, src->data<float>(), rows, K, packed.data(), sc.data());
    std::vector<float> want(static_cast<size_t>(rows * K));
    dequantize_weight4(QuantMethod::kMxfp4, packed.data(), sc.data(), rows, K, want.data());
    expect_same_bits(dequantized(QuantMethod::kMxfp4, *got, *scale), want, "stacked");
  }

  std::filesystem::remove(out);
  r = run_cli("quantize --scheme int4_g128 --weights " + file("stacked.safetensors") + " --out " + out);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("layers.3.mlp.w13: H = 64, I = 96; int4_g128 needs both to be multiples of its group of 128"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));

  // A shared expert: a 4-bit layer would not load, so nothing is written.
  Tensors shared = in;
  shared.add("layers.3.mlp.shared_experts.gate_proj.weight", random_f32(rng_, {32, H}));
  shared.add("layers.3.mlp.shared_experts.up_proj.weight", random_f32(rng_, {32, H}));
  shared.add("layers.3.mlp.shared_experts.down_proj.weight", random_f32(rng_, {H, 32}));
  ASSERT_TRUE(shared.write(file("shared.safetensors")).ok());
  r = run_cli("quantize --scheme int4_g32 --weights " + file("shared.safetensors") + " --out " + out);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("layers.3.mlp.shared_experts.*: a shared expert"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));

  // Quantizing a 4-bit file again.
  ASSERT_EQ(run_cli("quantize --scheme int4_g32 --weights " + file("stacked.safetensors") + " --out " + out).code, 0);
  const std::string again = file("again.safetensors");
  r = run_cli("quantize --scheme int4_g32 --weights " + out + " --out " + again);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("layers.3.mlp.w13: already int4_g32"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(again));
}

// A stacked 4-bit layer file whose scales disagree is refused by name.
TEST_F(Weight4Io, StackedWeight4LayerFileBadScales) {
  constexpr int64_t E = 2, H = 64, I = 32;
  const auto q13 = io::quantize_weight4_tensor(random_f32(rng_, {E, 2 * I, H}).view(), QuantMethod::kInt4G32, "w13");
  const auto q2 = io::quantize_weight4_tensor(random_f32(rng_, {E, H, I}).view(), QuantMethod::kInt4G32, "w2");
  ASSERT_TRUE(q13.ok() && q2.ok());
  struct Case {
    const char* what;
    HostTensor s13, s2;
    std::string needle;
  };
  HostTensor nan_scale = q2->scale;
  nan_scale.data<float>()[4] = std::nanf("");
  HostTensor u8_scale(DType::kU8, {E, H, I / 32});
  HostTensor huge_scale = q13->scale;  // finite, but no nonzero weight times it is
  for (int64_t i = 0; i < huge_scale.numel(); ++i) huge_scale.data<float>()[i] = 3e38f;
  const Case cases[] = {
      {"nan", q13->scale, nan_scale, "mlp.w2_scale: element 4 is nan; int4 scales must be finite and > 0"},
      {"overflow", huge_scale, q2->scale, "times its scale mlp.w13_scale[0, 0, 0] = 3e+38 leaves f32's range"},
      {"dtypes differ", q13->scale, u8_scale, "mlp.w13_scale / mlp.w2_scale: dtypes F32 / U8"},
      {"group 16", HostTensor(DType::kF32, {E, 2 * I, 4}), q2->scale,
       "mlp.w13_scale: F32 [2, 64, 4] makes groups of 16 columns"},
      {"w2_scale shape", q13->scale, HostTensor(DType::kF32, {E, H, 2}),
       "mlp.w2_scale: shape [2, 64, 2], expected [2, 64, 1] (int4_g32)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Tensors t;
    t.add("mlp.w13", q13->packed);
    t.add("mlp.w13_scale", c.s13);
    t.add("mlp.w2", q2->packed);
    t.add("mlp.w2_scale", c.s2);
    ASSERT_TRUE(t.write(file("l.safetensors")).ok());
    auto f = io::SafetensorsFile::open(file("l.safetensors"));
    ASSERT_TRUE(f.ok());
    auto r = load_layer_file(std::move(*f), std::nullopt);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace moekit

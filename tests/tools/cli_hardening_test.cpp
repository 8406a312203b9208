// Bad input a user can give the command line, found by a bad-input battery:
// outputs naming a model folder's own files, empty and oversized model folders,
// long output names, quantize edge cases, shared experts in a layer file, stray
// expert names, NaN weights and the expert-parallel run's flags. Each case runs
// the real binary; a refusal is exit code 2 with one line naming the problem,
// and leaves every file as it was.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "moekit/io.h"
#include "util/cli_test_util.h"
#include "util/temp_dir.h"
#include "util/test_util.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using Result = testing::CommandResult;

constexpr int64_t kM = 6, kE = 4, kH = 16, kI = 8;

Result run_cli(const std::string& args) {
  return testing::run_command_split(std::string(MOEKIT_CLI_PATH) + " " + args);
}

Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string q(const std::string& s) { return "'" + s + "'"; }

// Every file under `dir` with its bytes.
std::map<std::string, Bytes> listing(const fs::path& dir) {
  std::map<std::string, Bytes> s;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    s[e.path().string()] = e.is_regular_file() ? read_bytes(e.path().string()) : Bytes();
  }
  return s;
}

// A refusal: exit 2, one line on stderr, naming `needle`.
void expect_refused(const Result& r, const std::string& needle, const std::string& what) {
  EXPECT_EQ(r.code, 2) << what << "\n" << r.out << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << ": " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << what << ": wanted '" << needle << "' in: " << r.err;
}

struct Tensors {
  std::vector<std::pair<std::string, HostTensor>> list;
  void add(const std::string& name, HostTensor t) { list.emplace_back(name, std::move(t)); }
  Status write(const std::string& path, const std::map<std::string, std::string>& meta = {}) const {
    std::vector<io::NamedTensor> named;
    for (const auto& [name, t] : list) named.push_back({name, t.view(), {}});
    return io::write_safetensors(path, named, meta);
  }
};

// Per-expert tensors of one layer under `prefix` (intermediate size I), bf16.
Tensors expert_tensors(const std::string& prefix, std::mt19937_64& rng, int64_t E = kE, int64_t I = kI) {
  Tensors t;
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = prefix + "experts." + std::to_string(e) + ".";
    t.add(p + "gate_proj.weight", testing::random_tensor(rng, DType::kBF16, {I, kH}, 0.2));
    t.add(p + "up_proj.weight", testing::random_tensor(rng, DType::kBF16, {I, kH}, 0.2));
    t.add(p + "down_proj.weight", testing::random_tensor(rng, DType::kBF16, {kH, I}, 0.2));
  }
  t.add(prefix + "gate.weight", testing::random_tensor(rng, DType::kBF16, {E, kH}, 0.3));
  return t;
}

std::string qwen3_config() {
  return R"({"model_type": "qwen3_moe", "num_hidden_layers": 1, "hidden_size": 16, "num_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": 8, "intermediate_size": 32,
             "norm_topk_prob": true, "hidden_act": "silu"})";
}

class CliHardening : public testing::TempDirTest {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(testing::seed_from({kM, kE, kH, kI, 77}));
    ASSERT_TRUE(io::write_npy(file("hidden.npy"), testing::random_tensor(rng, DType::kF32, {kM, kH}, 1.0).view()).ok());
  }
  // A model folder: config.json and model.safetensors, or sharded with an index.
  std::string model_folder(const std::string& name, bool sharded) {
    const std::string dir = file(name);
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json") << qwen3_config();
    std::mt19937_64 rng(testing::seed_from({kE, kH, 5}));
    Tensors t = expert_tensors("model.layers.0.mlp.", rng);
    if (!sharded) {
      EXPECT_TRUE(t.write(dir + "/model.safetensors").ok());
      return dir;
    }
    Tensors a, b;
    std::string map;
    for (size_t i = 0; i < t.list.size(); ++i) {
      const bool first = i < t.list.size() / 2;
      (first ? a : b).add(t.list[i].first, std::move(t.list[i].second));
      map += std::string(map.empty() ? "" : ", ") + "\"" + t.list[i].first + "\": \"" +
             (first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors") + "\"";
    }
    EXPECT_TRUE(a.write(dir + "/model-00001-of-00002.safetensors").ok());
    EXPECT_TRUE(b.write(dir + "/model-00002-of-00002.safetensors").ok());
    std::ofstream(dir + "/model.safetensors.index.json") << "{\"metadata\": {}, \"weight_map\": {" << map << "}}";
    return dir;
  }
};

// ------------------------------------------------- item 1: outputs onto inputs

TEST_F(CliHardening, LayerRefusesAnOutputThatIsOneOfTheModelFoldersFiles) {
  const std::string one = model_folder("one", false), two = model_folder("two", true);
  ASSERT_EQ(::link((two + "/model-00002-of-00002.safetensors").c_str(), file("linked.safetensors").c_str()), 0);
  const auto before = listing(dir_.path());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {one, one + "/config.json"},
      {one, one + "/model.safetensors"},
      {one, one + "/../one/config.json"},
      {two, two + "/model.safetensors.index.json"},
      {two, two + "/model-00001-of-00002.safetensors"},
      {two, file("linked.safetensors")},  // a hard link to a shard
  };
  for (const auto& [dir, out] : cases) {
    for (const char* flag : {"--out", "--capture"}) {
      const std::string other = std::string(flag) == "--out" ? " --capture " + file("c.npy") : " --out " + file("o.npy");
      const Result r = run_cli("layer --model " + q(dir) + " --layer 0 --hidden " + file("hidden.npy") + " " + flag +
                               " " + q(out) + other);
      expect_refused(r, std::string(flag) + " names the input of --model", out);
      EXPECT_TRUE(listing(dir_.path()) == before) << "files changed: " << out;
    }
  }
  // The folder itself is still fine to run from, with an output beside it.
  const Result ok = run_cli("layer --model " + one + " --layer 0 --hidden " + file("hidden.npy") + " --out " +
                            file("o.npy"));
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
}

// ------------------------------------------------- item 6: --model "" and memory

TEST_F(CliHardening, EmptyModelOptionIsNamedAsEmpty) {
  const Result r = run_cli("layer --model '' --layer 0 --hidden " + file("hidden.npy") + " --out " + file("o.npy"));
  expect_refused(r, "--model: the option is empty", "--model ''");
  const Result r2 = run_cli("replay --captures ''");
  expect_refused(r2, "--captures: the option is empty", "--captures ''");
}

TEST_F(CliHardening, ModelMemoryIsCheckedFromTheHeadersBeforeLoading) {
  // A model whose experts take far more than any test machine has, in a
  // sparse shard: refused from the sizes alone, naming how much it needs.
  const std::string dir = file("huge");
  fs::create_directories(dir);
  const int64_t E = 64, H = 8192, I = 65536;
  std::ofstream(dir + "/config.json")
      << R"({"model_type": "qwen3_moe", "num_hidden_layers": 1, "hidden_size": 8192, "num_experts": 64,
             "num_experts_per_tok": 2, "moe_intermediate_size": 65536, "intermediate_size": 32,
             "norm_topk_prob": true, "hidden_act": "silu"})";
  std::string header = "{";
  uint64_t offset = 0;
  const uint64_t part = static_cast<uint64_t>(I) * H * 2;
  for (int64_t e = 0; e < E; ++e) {
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      const bool down = std::string(p) == "down_proj";
      header += std::string(header.size() > 1 ? "," : "") + "\"model.layers.0.mlp.experts." + std::to_string(e) + "." +
                p + ".weight\":{\"dtype\":\"BF16\",\"shape\":[" + std::to_string(down ? H : I) + "," +
                std::to_string(down ? I : H) + "],\"data_offsets\":[" + std::to_string(offset) + "," +
                std::to_string(offset + part) + "]}";
      offset += part;
    }
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  {
    std::ofstream f(dir + "/model.safetensors", std::ios::binary);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
  }
  if (::truncate((dir + "/model.safetensors").c_str(), static_cast<off_t>(8 + header.size() + offset)) != 0) {
    GTEST_SKIP() << "this file system cannot hold a sparse file of " << offset << " bytes";
  }
  HostTensor hidden(DType::kF32, {1, H});
  std::memset(hidden.data<float>(), 0, hidden.nbytes());
  ASSERT_TRUE(io::write_npy(file("h.npy"), hidden.view()).ok());
  const Result r = run_cli("layer --model " + dir + " --layer 0 --hidden " + file("h.npy") + " --logits " +
                           file("h.npy") + " --out " + file("o.npy"));
  expect_refused(r, "layer needs about", "huge model");
  EXPECT_NE(r.err.find("GiB"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(file("o.npy")));
}

// ------------------------------------------------- item 7: long output names

TEST_F(CliHardening, OutputNamesUpToTheFileSystemsLimitAreWritten) {
  std::mt19937_64 rng(testing::seed_from({kM, kE, 3}));
  ASSERT_TRUE(io::write_npy(file("logits.npy"), testing::tie_free_logits(rng, DType::kF32, kM, 8, 1e-2).view()).ok());
  for (size_t len : {243u, 250u, 255u}) {
    const fs::path sub = dir_.path() / ("n" + std::to_string(len));
    fs::create_directories(sub);
    const std::string ids = (sub / (std::string(len - 4, 'i') + ".npy")).string();
    const std::string w = (sub / (std::string(len - 4, 'w') + ".npy")).string();
    const Result r = run_cli("route --top-k 2 --logits " + file("logits.npy") + " --out-ids " + ids +
                             " --out-weights " + w);
    ASSERT_EQ(r.code, 0) << len << ": " << r.out << r.err;
    EXPECT_TRUE(fs::exists(ids) && fs::exists(w)) << len;
    // Written again over the existing files (the backup names must fit too).
    const Result again = run_cli("route --top-k 2 --logits " + file("logits.npy") + " --out-ids " + ids +
                                 " --out-weights " + w);
    ASSERT_EQ(again.code, 0) << len << ": " << again.out << again.err;
    size_t files = 0;
    for (const auto& e : fs::directory_iterator(sub)) files += e.is_regular_file();
    EXPECT_EQ(files, 2u) << "a temporary or backup file was left behind";
  }
}

// ------------------------------------------------- item 8: NaN expert weights

// Sets byte(s) of tensor `name` in a safetensors file, at element `index`.
void poke(const std::string& path, const std::string& name, int64_t index, const Bytes& value) {
  uint64_t at = 0;
  {
    auto f = io::SafetensorsFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const io::SafetensorsEntry* e = f->find(name);
    ASSERT_NE(e, nullptr) << name;
    Bytes head = read_bytes(path);
    uint64_t header = 0;
    std::memcpy(&header, head.data(), 8);
    at = 8 + header + e->offset + static_cast<uint64_t>(index) * value.size();
  }
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
}

TEST_F(CliHardening, NanExpertWeightsAreRefusedNamingTheTensorAndIndex) {
  std::mt19937_64 rng(testing::seed_from({kE, kH, 8}));
  const std::string layer = file("w.safetensors");
  ASSERT_TRUE(expert_tensors("model.layers.0.mlp.", rng).write(layer).ok());
  const std::string run = " --top-k 2 --hidden " + file("hidden.npy") + " --out " + file("o.npy");
  // bf16: a NaN in expert 2's up_proj (w13 rows I..2I), and +Inf in expert 1's down_proj.
  const std::string nan_file = file("nan.safetensors");
  fs::copy_file(layer, nan_file);
  poke(nan_file, "model.layers.0.mlp.experts.2.up_proj.weight", 3 * kH + 5, {0xc1, 0x7f});
  Result r = run_cli("layer --backend cpu --weights " + nan_file + run);
  expect_refused(r, "w13: element [2, " + std::to_string(kI + 3) + ", 5]", "bf16 NaN");
  EXPECT_NE(r.err.find("NaN"), std::string::npos) << r.err;
  const std::string inf_file = file("inf.safetensors");
  fs::copy_file(layer, inf_file);
  poke(inf_file, "model.layers.0.mlp.experts.1.down_proj.weight", 7, {0x80, 0x7f});
  r = run_cli("layer --backend cpu --weights " + inf_file + run);
  expect_refused(r, "w2: element [1, 0, 7]", "bf16 Inf");
  // fp8 e4m3: the NaN codes 0x7F and 0xFF.
  ASSERT_EQ(run_cli("quantize --scheme fp8_per_tensor --weights " + layer + " --out " + file("fp8.safetensors")).code, 0);
  for (uint8_t code : {uint8_t{0x7f}, uint8_t{0xff}}) {
    const std::string f8 = file("fp8_" + std::to_string(code) + ".safetensors");
    fs::copy_file(file("fp8.safetensors"), f8);
    poke(f8, "model.layers.0.mlp.experts.3.gate_proj.weight", kH + 2, {code});
    r = run_cli("layer --backend cpu --weights " + f8 + run);
    expect_refused(r, "w13: element [3, 1, 2]", "e4m3 NaN code " + std::to_string(code));
  }
  EXPECT_FALSE(fs::exists(file("o.npy")));
  // The clean file still runs.
  r = run_cli("layer --backend cpu --weights " + layer + run);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

// ------------------------------------------------- item 3: quantize

TEST_F(CliHardening, QuantizeRefusesZeroSizesAndMismatchedStackedLayers) {
  std::mt19937_64 rng(testing::seed_from({kE, kH, 9}));
  const auto stacked = [&](const std::string& name, std::vector<int64_t> w13, std::vector<int64_t> w2) {
    Tensors t;
    t.add("w13", testing::random_tensor(rng, DType::kBF16, std::move(w13), 0.2));
    t.add("w2", testing::random_tensor(rng, DType::kBF16, std::move(w2), 0.2));
    EXPECT_TRUE(t.write(file(name)).ok());
    return file(name);
  };
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"I = 0", stacked("i0.safetensors", {kE, 0, kH}, {kE, kH, 0}), "a size of 0"},
      {"E = 0", stacked("e0.safetensors", {0, 2 * kI, kH}, {0, kH, kI}), "a size of 0"},
      {"H = 0", stacked("h0.safetensors", {kE, 2 * kI, 0}, {kE, 0, kI}), "a size of 0"},
      {"E differs", stacked("e.safetensors", {kE, 2 * kI, kH}, {kE + 1, kH, kI}), "disagree on E or H"},
      {"H differs", stacked("h.safetensors", {kE, 2 * kI, kH}, {kE, kH + 1, kI}), "disagree on E or H"},
  };
  for (const auto& [what, in, needle] : cases) {
    for (const char* scheme : {"fp8_block128", "fp8_per_tensor"}) {
      const Result r = run_cli(std::string("quantize --scheme ") + scheme + " --weights " + in + " --out " + file("q.safetensors"));
      expect_refused(r, needle, what);
      EXPECT_FALSE(fs::exists(file("q.safetensors"))) << what;
    }
  }
  // A per-expert matrix of zero rows too.
  Tensors t = expert_tensors("model.layers.0.mlp.", rng);
  t.list[0].second = HostTensor(DType::kBF16, {0, kH});
  ASSERT_TRUE(t.write(file("pe0.safetensors")).ok());
  expect_refused(run_cli("quantize --scheme fp8_block128 --weights " + file("pe0.safetensors") + " --out " +
                         file("q.safetensors")),
                 "experts.0.gate_proj.weight: a size of 0", "per-expert zero rows");
}

TEST_F(CliHardening, QuantizeCopiesTensorsOfEveryDtypeUnchanged) {
  // An extra I64 tensor (and an unaligned U8 one) beside the experts: copied
  // byte for byte with their dtype and shape, as docs/fp8.md promises.
  std::mt19937_64 rng(testing::seed_from({kE, kH, 10}));
  const Tensors t = expert_tensors("model.layers.0.mlp.", rng);
  std::vector<io::NamedTensor> named;
  for (const auto& [name, x] : t.list) named.push_back({name, x.view(), {}});
  std::vector<uint8_t> i64(3 * 5 * 8);
  for (size_t i = 0; i < i64.size(); ++i) i64[i] = static_cast<uint8_t>(i * 7 + 1);
  io::NamedTensor extra;
  extra.name = "model.layers.0.mlp.token_counts";
  extra.tensor = TensorView::contiguous(i64.data(), DType::kU8, {static_cast<int64_t>(i64.size())});
  extra.stored_dtype = "I64";
  extra.stored_shape = std::vector<int64_t>{3, 5};
  named.push_back(extra);
  HostTensor odd(DType::kU8, {3});
  for (int i = 0; i < 3; ++i) odd.data<uint8_t>()[i] = static_cast<uint8_t>(200 + i);
  named.push_back({"model.layers.0.mlp.flags", odd.view(), {}});
  ASSERT_TRUE(io::write_safetensors(file("in.safetensors"), named).ok());
  const Result r = run_cli("quantize --scheme fp8_block128 --weights " + file("in.safetensors") + " --out " +
                           file("q.safetensors"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto q = io::SafetensorsFile::open(file("q.safetensors"));
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  const io::SafetensorsEntry* e = q->find("model.layers.0.mlp.token_counts");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype_name, "I64");
  EXPECT_EQ(e->shape, (std::vector<int64_t>{3, 5}));
  auto bytes = q->copy_bytes(e->name);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, i64);
  auto flags = q->read("model.layers.0.mlp.flags");
  ASSERT_TRUE(flags.ok());
  EXPECT_EQ(flags->data<uint8_t>()[2], 202);
  EXPECT_EQ(q->find("model.layers.0.mlp.experts.0.gate_proj.weight")->dtype_name, "F8_E4M3");
  // The router is copied as it was.
  auto router = q->read("model.layers.0.mlp.gate.weight");
  ASSERT_TRUE(router.ok());
  EXPECT_EQ(std::memcmp(router->data<uint8_t>(), t.list.back().second.data<uint8_t>(), router->nbytes()), 0);
}

// ------------------------------------------------- item 5: shared experts, stray names

TEST_F(CliHardening, SharedExpertsOfALayerFileRunAsTheModelFoldersDo) {
  struct Family {
    std::string name, config, shared, method;
    bool gate;
  };
  const std::vector<Family> families = {
      {"qwen2_moe",
       R"({"model_type": "qwen2_moe", "num_hidden_layers": 1, "hidden_size": 16, "num_experts": 4,
           "num_experts_per_tok": 2, "moe_intermediate_size": 8, "intermediate_size": 32,
           "shared_expert_intermediate_size": 12, "norm_topk_prob": false, "hidden_act": "silu"})",
       "shared_expert.", "softmax_topk", true},
      {"deepseek_v3",
       R"({"model_type": "deepseek_v3", "num_hidden_layers": 1, "hidden_size": 16, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "moe_intermediate_size": 6, "intermediate_size": 32, "n_shared_experts": 2,
           "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": true,
           "scoring_func": "sigmoid", "topk_method": "noaux_tc", "hidden_act": "silu"})",
       "shared_experts.", "deepseek_v3", false},
  };
  for (const Family& f : families) {
    SCOPED_TRACE(f.name);
    const std::string dir = file(f.name);
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json") << f.config;
    const int64_t I = f.name == "qwen2_moe" ? kI : 6, Is = 12;
    std::mt19937_64 rng(testing::seed_from({kE, kH, I, 11}));
    const std::string p = "model.layers.0.mlp.";
    Tensors t = expert_tensors(p, rng, kE, I);
    t.add(p + f.shared + "gate_proj.weight", testing::random_tensor(rng, DType::kBF16, {Is, kH}, 0.2));
    t.add(p + f.shared + "up_proj.weight", testing::random_tensor(rng, DType::kBF16, {Is, kH}, 0.2));
    t.add(p + f.shared + "down_proj.weight", testing::random_tensor(rng, DType::kBF16, {kH, Is}, 0.2));
    if (f.gate) t.add(p + "shared_expert_gate.weight", testing::random_tensor(rng, DType::kBF16, {1, kH}, 0.3));
    ASSERT_TRUE(t.write(dir + "/model.safetensors").ok());
    const std::string common = " --backend cpu --hidden " + file("hidden.npy");
    const Result m = run_cli("layer --model " + dir + " --layer 0" + common + " --out " + file(f.name + "_m.npy"));
    ASSERT_EQ(m.code, 0) << m.out << m.err;
    const Result w = run_cli("layer --weights " + dir + "/model.safetensors --method " + f.method + " --top-k 2" +
                             common + " --out " + file(f.name + "_w.npy"));
    ASSERT_EQ(w.code, 0) << w.out << w.err;
    EXPECT_NE(w.out.find("shared:"), std::string::npos) << w.out;
    EXPECT_EQ(read_bytes(file(f.name + "_m.npy")), read_bytes(file(f.name + "_w.npy")))
        << "--weights and --model disagree: the shared expert was not run";
  }
}

TEST_F(CliHardening, StrayExpertNamesAreRefusedByTheModelFolderLoaderToo) {
  for (const std::string stray : {"experts.03.gate_proj.weight", "experts.1234567.up_proj.weight",
                                  "experts.4.down_proj.weight"}) {
    SCOPED_TRACE(stray);
    const std::string dir = file("stray");
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json") << qwen3_config();
    std::mt19937_64 rng(testing::seed_from({kE, kH, 12}));
    Tensors t = expert_tensors("model.layers.0.mlp.", rng);
    t.add("model.layers.0.mlp." + stray, testing::random_tensor(rng, DType::kBF16, {kI, kH}, 0.2));
    ASSERT_TRUE(t.write(dir + "/model.safetensors").ok());
    const std::string out = " --hidden " + file("hidden.npy") + " --out " + file("o.npy");
    expect_refused(run_cli("layer --model " + dir + " --layer 0" + out), stray.substr(0, stray.find('.', 8)),
                   "--model");
    expect_refused(run_cli("layer --weights " + dir + "/model.safetensors --top-k 2" + out), "", "--weights");
    EXPECT_FALSE(fs::exists(file("o.npy")));
  }
}

// ------------------------------------------------- item 2: run --ep

const std::string kSmallRun = " --layers 2 --experts 16 --top-k 2 --hidden 32 --intermediate 16 --tokens 64 "
                              "--requests 4 --decode 4 --backend cpu";

std::string digest_of(const std::string& out) {
  std::smatch m;
  return std::regex_search(out, m, std::regex("output digest: ([0-9a-f]{16})")) ? m[1].str() : "";
}

TEST_F(CliHardening, ExpertParallelRunWritesItsCaptureAndPrintsTheSingleRankDigest) {
  const Result one = run_cli("run" + kSmallRun + " --capture " + file("one.st"));
  ASSERT_EQ(one.code, 0) << one.out << one.err;
  const std::string digest = digest_of(one.out);
  ASSERT_FALSE(digest.empty()) << one.out;
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    const std::string cap = file("ep" + std::to_string(n) + ".st");
    const Result r = run_cli("run --ep " + std::to_string(n) + kSmallRun + " --capture " + cap);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_EQ(digest_of(r.out), digest) << "EP digest differs from the single-rank run's: " << r.out;
    ASSERT_TRUE(fs::exists(cap)) << "--capture not written under --ep";
    // The single-rank replay of the EP capture reproduces the recorded step digests.
    const Result replay = run_cli("replay --captures " + cap);
    EXPECT_EQ(replay.code, 0) << replay.out << replay.err;
  }
  // --no-capture is accepted under --ep and writes nothing.
  const Result nc = run_cli("run --ep 2" + kSmallRun + " --no-capture --capture " + file("none.st"));
  EXPECT_EQ(nc.code, 0) << nc.out << nc.err;
  EXPECT_EQ(digest_of(nc.out), digest);
  EXPECT_FALSE(fs::exists(file("none.st")));
}

TEST_F(CliHardening, ExpertParallelFlagsAreBoundChecked) {
  const std::string small = " --layers 1 --experts 16 --tokens 32 --requests 2 --decode 1 --no-capture";
  expect_refused(run_cli("run --ep 2 --eplb-redundant 100000000000" + small), "--eplb-redundant must be in [0, 16]",
                 "huge");
  expect_refused(run_cli("run --ep 2 --eplb-redundant -3" + small), "--eplb-redundant must be in [0, 16]", "negative");
  expect_refused(run_cli("run --eplb-redundant 2" + small), "--eplb-redundant applies to an expert-parallel run",
                 "without --ep");
  expect_refused(run_cli("run --ep 2 --backend nope" + small), "--backend nope with --ep 2", "unknown backend");
  const Result ok = run_cli("run --ep 2 --eplb-redundant 2 --backend cpu" + small);
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
}

// ------------------------------------------------- round 3, item 6: MXFP4 scales past f32

// A stacked mxfp4 layer file whose w2 group 0 has code 254 (2^127) and e2m1
// 6.0: every scale is valid, the weight is not. Refused, nothing written.
TEST_F(CliHardening, Mxfp4LayerFileWhoseWeightOverflowsF32IsRefused) {
  constexpr int64_t H = 32, I = 32, M = 3;
  std::mt19937_64 rng(testing::seed_from({kE, H, I, 6}));
  const auto bytes = [&](std::vector<int64_t> shape, int lo, int hi) {
    HostTensor t(DType::kU8, std::move(shape));
    std::uniform_int_distribution<int> d(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(d(rng));
    return t;
  };
  Tensors t;
  t.add("w13", bytes({kE, 2 * I, H / 2}, 0, 255));
  t.add("w13_scale", bytes({kE, 2 * I, H / 32}, 120, 124));
  t.add("w2", bytes({kE, H, I / 2}, 0, 255));
  t.add("w2_scale", bytes({kE, H, I / 32}, 120, 124));
  ASSERT_TRUE(t.write(file("ok.safetensors"), {{"moekit.quant", "mxfp4"}}).ok());
  std::memset(t.list[2].second.data<uint8_t>(), 0x77, 16);  // w2 row 0: every value 6.0
  t.list[3].second.data<uint8_t>()[0] = 254;
  ASSERT_TRUE(t.write(file("bad.safetensors"), {{"moekit.quant", "mxfp4"}}).ok());
  ASSERT_TRUE(io::write_npy(file("h32.npy"), testing::random_tensor(rng, DType::kF32, {M, H}, 1.0).view()).ok());
  ASSERT_TRUE(io::write_npy(file("l32.npy"), testing::tie_free_logits(rng, DType::kF32, M, kE, 1e-2).view()).ok());
  const std::string run = " --backend cpu --top-k 2 --hidden " + file("h32.npy") + " --logits " + file("l32.npy") +
                          " --out " + file("o.npy");
  const Result ok = run_cli("layer --weights " + file("ok.safetensors") + run);
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  fs::remove(file("o.npy"));
  const Result r = run_cli("layer --weights " + file("bad.safetensors") + run);
  expect_refused(r, "w2: a value 6 times its scale w2_scale[0, 0, 0] = 2^127 leaves f32's range", "code 254");
  EXPECT_FALSE(fs::exists(file("o.npy")));
}

// ------------------------------------------------- round 3, item 7: run --model --capture

TEST_F(CliHardening, RunRefusesACaptureThatIsOneOfTheModelFoldersFiles) {
  const std::string one = model_folder("one", false), two = model_folder("two", true);
  const auto before = listing(dir_.path());
  const std::string run = " --requests 2 --tokens 4 --decode 1 --backend cpu";
  for (const auto& [dir, out] : std::vector<std::pair<std::string, std::string>>{
           {one, one + "/config.json"},
           {one, one + "/model.safetensors"},
           {two, two + "/model.safetensors.index.json"},
           {two, two + "/model-00002-of-00002.safetensors"}}) {
    const Result r = run_cli("run --model " + q(dir) + run + " --capture " + q(out));
    expect_refused(r, "--capture names the input of --model", out);
    EXPECT_TRUE(listing(dir_.path()) == before) << "files changed: " << out;
  }
  const Result ok = run_cli("run --model " + one + run + " --capture " + file("c.safetensors"));
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  EXPECT_TRUE(fs::exists(file("c.safetensors")));
}

// ------------------------------------------------- round 3: wrong or unclear answers

TEST_F(CliHardening, BadMoekitNumThreadsIsRefusedNamingTheVariable) {
  std::mt19937_64 rng(testing::seed_from({kM, kE, 31}));
  ASSERT_TRUE(io::write_npy(file("logits.npy"), testing::tie_free_logits(rng, DType::kF32, kM, 8, 1e-2).view()).ok());
  const std::string route = " route --top-k 2 --logits " + file("logits.npy") + " --out-ids " + file("i.npy") +
                            " --out-weights " + file("w.npy");
  for (const char* bad : {"abc", "0", "-4", "2x", "99999", ""}) {
    SCOPED_TRACE(bad);
    const Result r =
        testing::run_command_split("MOEKIT_NUM_THREADS='" + std::string(bad) + "' " + MOEKIT_CLI_PATH + route);
    expect_refused(r, "MOEKIT_NUM_THREADS='" + std::string(bad) + "': must be an integer in [1, 1024]", bad);
    EXPECT_FALSE(fs::exists(file("i.npy")));
  }
  const Result ok = testing::run_command_split(std::string("MOEKIT_NUM_THREADS=3 ") + MOEKIT_CLI_PATH + route);
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
}

TEST_F(CliHardening, VersionPrintsTheProjectVersion) {
  const Result r = run_cli("--version");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(std::regex_match(r.out, std::regex("moekit [0-9]+\\.[0-9]+\\.[0-9]+\n"))) << r.out;
}

TEST_F(CliHardening, RoutePrintsAOneLineSummary) {
  std::mt19937_64 rng(testing::seed_from({kM, kE, 32}));
  ASSERT_TRUE(io::write_npy(file("logits.npy"), testing::tie_free_logits(rng, DType::kF32, kM, 8, 1e-2).view()).ok());
  const Result r = run_cli("route --method renormalize --top-k 2 --logits " + file("logits.npy") + " --out-ids " +
                           file("i.npy") + " --out-weights " + file("w.npy"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^moekit route: 6 tokens, renormalize top-2 of 8 experts \\([0-9]+ "
                                                  "used; busiest: expert [0-9]+ with [0-9]+ tokens\\); wrote .*i\\.npy, "
                                                  ".*w\\.npy\n$")))
      << r.out;
}

TEST_F(CliHardening, BackendsLayerFlagsSayWhatIsWrong) {
  expect_refused(run_cli("backends --layer 1"), "--layer goes with --model DIR", "--layer without --model");
  const std::string dir = model_folder("m", false);
  expect_refused(run_cli("backends --model " + dir + " --layer -1"), "--layer: must be an integer in [0, ", "-1");
  expect_refused(run_cli("backends --model " + dir), "--layer N is required with --model", "no --layer");
  const Result ok = run_cli("backends --model " + dir + " --layer 0");
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
}

TEST_F(CliHardening, ReplayOfAFolderWhoseTopKChangedNamesK) {
  const std::string dir = model_folder("m", false);
  const std::string cap = file("c.safetensors");
  const Result run = run_cli("run --model " + dir + " --requests 2 --tokens 4 --decode 1 --backend cpu --capture " + cap);
  ASSERT_EQ(run.code, 0) << run.out << run.err;
  std::string config = qwen3_config();
  config.replace(config.find("\"num_experts_per_tok\": 2"), 24, "\"num_experts_per_tok\": 3");
  std::ofstream(dir + "/config.json") << config;
  const Result r = run_cli("replay --captures " + cap);
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("1 MoE layers (E = 4, k = 2, H = 16, I = 8), but the folder now describes 1 MoE layers (E = 4, "
                       "k = 3, H = 16, I = 8)"),
            std::string::npos)
      << r.err;
}

TEST_F(CliHardening, CaptureStatsAndCheckListTheRequestNames) {
  const std::string cap = file("c.safetensors");
  const Result run = run_cli("run" + kSmallRun + " --capture " + cap);
  ASSERT_EQ(run.code, 0) << run.out << run.err;
  for (const char* sub : {"stats", "check"}) {
    SCOPED_TRACE(sub);
    const Result r = run_cli(std::string("capture ") + sub + " " + cap);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_TRUE(std::regex_search(r.out, std::regex("\nrequests: request-0 \\([0-9]+ tokens\\), request-1 \\([0-9]+ "
                                                    "tokens\\), request-2 \\([0-9]+ tokens\\), request-3 \\([0-9]+ "
                                                    "tokens\\)\n")))
        << r.out;
  }
  const Result j = run_cli("capture check --json " + cap);
  ASSERT_EQ(j.code, 0) << j.out << j.err;
  EXPECT_NE(j.out.find("\"request\": \"request-3\""), std::string::npos) << j.out;
}

// Without as many GPUs as ranks the answer is a sentence, not a CUDA error code.
TEST_F(CliHardening, BenchWithoutTheGpusItNeedsSaysSo) {
  const Result r = run_cli("bench --ep 2");
  if (r.code == 0) GTEST_SKIP() << "this machine has the GPUs";
  expect_refused(r, "Unsupported: ", "bench --ep 2");
  EXPECT_EQ(r.err.find("Internal"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("cudaGetDeviceCount"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moekit

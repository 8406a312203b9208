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

// Per-expert tensors of one layer under `prefix`, bf16.
Tensors expert_tensors(const std::string& prefix, std::mt19937_64& rng, int64_t E = kE) {
  Tensors t;
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = prefix + "experts." + std::to_string(e) + ".";
    t.add(p + "gate_proj.weight", testing::random_tensor(rng, DType::kBF16, {kI, kH}, 0.2));
    t.add(p + "up_proj.weight", testing::random_tensor(rng, DType::kBF16, {kI, kH}, 0.2));
    t.add(p + "down_proj.weight", testing::random_tensor(rng, DType::kBF16, {kH, kI}, 0.2));
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

}  // namespace
}  // namespace moekit

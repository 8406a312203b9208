// A safetensors file truncated while moekit has it open (mapped): every read
// path answers with DataLoss naming the file instead of dying of SIGBUS. The
// readers copy through pread(); view() and bytes() re-check the size with
// fstat() before handing out a pointer (the gap after that check is the
// documented residual race, include/moekit/io.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "moekit/checkpoint.h"
#include "moekit/io.h"
#include "util/temp_dir.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;

class Truncation : public testing::TempDirTest {
 protected:
  // Two f32 tensors of 4096 elements each (several pages), named a and b.
  std::string write_file(const std::string& name) {
    HostTensor a(DType::kF32, {64, 64}), b(DType::kF32, {64, 64});
    for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = b.data<float>()[i] = 0.5f;
    const std::string path = file(name);
    EXPECT_TRUE(io::write_safetensors(path, {{"a", a.view(), {}}, {"b", b.view(), {}}}).ok());
    return path;
  }
};

TEST_F(Truncation, ReadsOfATruncatedMappedFileAreErrorsNotSigbus) {
  const std::string path = write_file("t.safetensors");
  auto f = io::SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE(f->read("b").ok());
  ASSERT_EQ(::truncate(path.c_str(), 64), 0);  // inside the header: every tensor's pages are gone
  for (const char* name : {"a", "b"}) {
    SCOPED_TRACE(name);
    const auto r = f->read(name);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().to_string();
    const auto v = f->view(name);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), StatusCode::kDataLoss) << v.status().to_string();
    EXPECT_FALSE(f->bytes(name).ok());
    EXPECT_FALSE(f->copy_bytes(name).ok());
  }
}

// Cut between mapping and parsing (detail::open_safetensors' seam): inside the
// length field, inside a header of several pages (its later pages would raise
// SIGBUS if it were parsed from the mapping), and inside the data section.
TEST_F(Truncation, AFileTruncatedBeforeItsHeaderIsParsedIsDataLossNotSigbus) {
  HostTensor a(DType::kF32, {64, 64});
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = 0.5f;
  const std::string path = file("big_header.safetensors");
  const std::map<std::string, std::string> meta = {{"note", std::string(3 * 4096, 'x')}};
  ASSERT_TRUE(io::write_safetensors(path, {{"a", a.view(), {}}}, meta).ok());
  const auto full = static_cast<off_t>(fs::file_size(path));
  ASSERT_TRUE(io::detail::open_safetensors(path, nullptr).ok());
  for (const off_t cut : {off_t{4}, off_t{64}, full - 100}) {
    SCOPED_TRACE(cut);
    const std::string copy = file("cut.safetensors");
    fs::copy_file(path, copy, fs::copy_options::overwrite_existing);
    const auto r = io::detail::open_safetensors(copy, [&] { EXPECT_EQ(::truncate(copy.c_str(), cut), 0); });
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
    EXPECT_NE(r.status().message().find(copy), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().message().find("truncated while moekit had it open"), std::string::npos)
        << r.status().to_string();
  }
}

TEST_F(Truncation, AShardTruncatedAfterItsHeaderWasParsedFailsTheModelFolderLoad) {
  std::ofstream(file("config.json")) << R"({"model_type": "qwen3_moe", "num_hidden_layers": 1, "hidden_size": 64,
      "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32, "intermediate_size": 32,
      "norm_topk_prob": true, "hidden_act": "silu"})";
  std::vector<HostTensor> owned;
  std::vector<io::NamedTensor> named;
  for (int e = 0; e < 2; ++e) {
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      const bool down = std::string(p) == "down_proj";
      owned.emplace_back(DType::kF32, std::vector<int64_t>{down ? 64 : 32, down ? 32 : 64});
    }
  }
  int i = 0;
  for (int e = 0; e < 2; ++e) {
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      for (int64_t j = 0; j < owned[i].numel(); ++j) owned[i].data<float>()[j] = 0.25f;
      named.push_back({"model.layers.0.mlp.experts." + std::to_string(e) + "." + p + ".weight", owned[i].view(), {}});
      ++i;
    }
  }
  const std::string shard = file("model.safetensors");
  ASSERT_TRUE(io::write_safetensors(shard, named).ok());
  // The size check runs once every header is parsed and the shards mapped,
  // before any tensor is read: the moment to cut the shard.
  const auto cut = [&](const CheckpointLayerSize&) {
    EXPECT_EQ(::truncate(shard.c_str(), 4096), 0);
    return Status::Ok();
  };
  const auto r = load_checkpoint_layer(dir_.path().string(), 0, cut);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("model.safetensors"), std::string::npos) << r.status().to_string();
}

}  // namespace
}  // namespace moekit

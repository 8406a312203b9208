// Capture format version 2: the sentinel stored as the all-ones value of u8/u16,
// first_generated_token, router weights (f32/bf16), the producing backend, a
// lenient read for the validator, and version-1 files still read.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <unistd.h>

#include "moekit/capture.h"
#include "moekit/io.h"
#include "util/test_util.h"

namespace moekit {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "moekit_capture_v2_" + std::to_string(::getpid()) + "_" + name;
}

CaptureSet make_capture(int64_t E, int k, int layers, const std::vector<int64_t>& tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  CaptureSet set;
  set.info.num_experts = E;
  set.info.routing.method = RoutingMethod::kSigmoidRenorm;
  set.info.routing.top_k = k;
  set.info.backend = "cpu/CpuModular";
  for (int l = 0; l < layers; ++l) set.info.model_layers.push_back(1 + l);
  std::vector<int16_t> pool(static_cast<size_t>(E));
  for (int64_t i = 0; i < E; ++i) pool[i] = static_cast<int16_t>(i);
  for (size_t r = 0; r < tokens.size(); ++r) {
    RequestCapture rc;
    rc.request = "r" + std::to_string(r);
    rc.first_token = static_cast<int64_t>(r);
    rc.first_generated_token = r % 2 ? -1 : rc.first_token + tokens[r] / 2;
    rc.ids = HostTensor(DType::kI16, {tokens[r], layers, k});
    for (int64_t row = 0; row < tokens[r] * layers; ++row) {
      std::shuffle(pool.begin(), pool.end(), rng);
      std::copy_n(pool.begin(), k, rc.ids.data<int16_t>() + row * k);
    }
    set.requests.push_back(std::move(rc));
  }
  return set;
}

void expect_same_ids(const CaptureSet& a, const CaptureSet& b) {
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const RequestCapture &x = a.requests[i], &y = b.requests[i];
    EXPECT_EQ(x.request, y.request);
    EXPECT_EQ(x.first_token, y.first_token);
    EXPECT_EQ(x.first_generated_token, y.first_generated_token) << x.request;
    ASSERT_EQ(x.ids.shape(), y.ids.shape());
    for (int64_t e = 0; e < x.ids.numel(); ++e) ASSERT_EQ(x.ids.data<int16_t>()[e], y.ids.data<int16_t>()[e]) << e;
  }
}

class SentinelRoundTrip : public ::testing::TestWithParam<int64_t> {};

// The sentinel -1 survives a round trip as 255 (u8, E <= 255) or 65535 (u16),
// and the largest id E - 1 is never mistaken for it.
TEST_P(SentinelRoundTrip, SentinelAndLargestIdSurvive) {
  const int64_t E = GetParam();
  CaptureSet set = make_capture(E, 4, 2, {6, 3}, testing::seed_from({41, E}));
  int16_t* ids = set.requests[0].ids.data<int16_t>();
  for (int j = 0; j < 4; ++j) ids[8 + j] = kUnwrittenExpertId;  // token 1, layer 0: never captured
  ids[0] = static_cast<int16_t>(E - 1);
  const std::string path = temp_path("sentinel_" + std::to_string(E));
  ASSERT_TRUE(write_capture_file(path, set).ok());
  auto file = io::SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->find("routed_experts.0")->dtype_name, E <= 255 ? "U8" : "U16");
  auto back = read_capture_file(path);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->info.format_version, 2);
  EXPECT_EQ(back->info.backend, "cpu/CpuModular");
  expect_same_ids(set, *back);
  EXPECT_EQ(back->requests[0].ids.data<int16_t>()[8], kUnwrittenExpertId);
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Widths, SentinelRoundTrip, ::testing::Values(16, 255, 256, 32767));

TEST(CaptureFormatV2, RouterWeightsRoundTripF32AndBf16) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    CaptureSet set = make_capture(64, 3, 2, {5, 2, 0}, 42);
    set.info.router_weights_dtype = dt;
    std::mt19937_64 rng(43);
    for (RequestCapture& r : set.requests) {
      r.router_weights = testing::random_tensor(rng, dt, r.ids.shape(), 1.0);
    }
    const std::string path = temp_path(std::string("weights_") + dtype_name(dt));
    ASSERT_TRUE(write_capture_file(path, set).ok());
    auto back = read_capture_file(path);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    ASSERT_EQ(back->info.router_weights_dtype, dt);
    for (size_t i = 0; i < set.requests.size(); ++i) {
      const HostTensor &a = set.requests[i].router_weights, &b = back->requests[i].router_weights;
      ASSERT_EQ(b.dtype(), dt);
      ASSERT_EQ(a.shape(), b.shape());
      EXPECT_EQ(0, a.nbytes() ? std::memcmp(a.data<void>(), b.data<void>(), a.nbytes()) : 0);
    }
    std::remove(path.c_str());
    // Weights of the wrong shape or without the dtype set are refused, and no file appears.
    set.requests[0].router_weights = HostTensor(dt, {1, 2, 3});
    EXPECT_NE(write_capture_file(path, set).message().find("router weights must be"), std::string::npos);
    set.info.router_weights_dtype.reset();
    EXPECT_NE(write_capture_file(path, set).message().find("router_weights_dtype is not set"), std::string::npos);
    EXPECT_FALSE(io::SafetensorsFile::open(path).ok());
  }
}

// A version-1 file (u8 when E <= 256 else i16, no sentinel, no backend) still reads.
TEST(CaptureFormatV2, ReadsVersion1Files) {
  for (int64_t E : {256, 300}) {
    const CaptureSet set = make_capture(E, 2, 1, {4}, 44);
    HostTensor stored(E <= 256 ? DType::kU8 : DType::kI16, set.requests[0].ids.shape());
    for (int64_t e = 0; e < stored.numel(); ++e) {
      const int16_t v = set.requests[0].ids.data<int16_t>()[e];
      if (E <= 256) stored.data<uint8_t>()[e] = static_cast<uint8_t>(v);
      else stored.data<int16_t>()[e] = v;
    }
    if (E <= 256) stored.data<uint8_t>()[0] = 255;  // expert 255 is a valid id in v1 at E = 256 (no sentinel)
    std::map<std::string, std::string> meta = {
        {"format", "moekit.routed_experts"}, {"format_version", "1"}, {"routing_spec_version", "1"},
        {"routing", R"({"method":"sigmoid_renorm","top_k":2,"num_groups":1,"topk_groups":1,"routed_scaling_factor":1.0,"score_bias":false})"},
        {"num_experts", std::to_string(E)}, {"top_k", "2"}, {"num_moe_layers", "1"}, {"model_layers", "[1]"},
        {"id_space", "logical"}, {"id_order", "score_desc_index_asc"}, {"id_dtype", E <= 256 ? "u8" : "i16"},
        {"layout", "[num_tokens, num_moe_layers, top_k]"},
        {"requests", R"([{"request":"r0","tensor":"routed_experts.0","first_token":0,"num_tokens":4}])"}};
    const std::string path = temp_path("v1_" + std::to_string(E));
    ASSERT_TRUE(io::write_safetensors(path, {{"routed_experts.0", stored.view()}}, meta).ok());
    auto back = read_capture_file(path);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->info.format_version, 1);
    EXPECT_EQ(back->requests[0].first_generated_token, -1);
    EXPECT_TRUE(back->info.backend.empty());
    EXPECT_EQ(back->requests[0].ids.data<int16_t>()[0], E <= 256 ? 255 : set.requests[0].ids.data<int16_t>()[0]);
    // Re-writing a version-1 capture gives version 2.
    ASSERT_TRUE(write_capture_file(path, *back).ok());
    EXPECT_EQ(read_capture_file(path)->info.format_version, 2);
    std::remove(path.c_str());
  }
}

// The validator's read keeps ids out of range; the strict read names them.
TEST(CaptureFormatV2, LenientReadKeepsBadIdsForTheValidator) {
  CaptureSet set = make_capture(16, 2, 1, {3}, 45);
  const std::string path = temp_path("lenient");
  ASSERT_TRUE(write_capture_file(path, set).ok());
  auto file = io::SafetensorsFile::open(path);
  HostTensor ids = *file->read("routed_experts.0");
  ids.data<uint8_t>()[1] = 40;  // out of range, not the sentinel
  ASSERT_TRUE(io::write_safetensors(path, {{"routed_experts.0", ids.view()}}, file->metadata()).ok());
  auto strict = read_capture_file(path);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("id 40 outside [0, 16) (and not the sentinel 255)"), std::string::npos);
  CaptureReadOptions lenient;
  lenient.check_ids = false;
  auto back = read_capture_file(path, lenient);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->requests[0].ids.data<int16_t>()[1], 40);
  std::remove(path.c_str());
}

TEST(CaptureFormatV2, ReadRejectsInconsistentVersion2Metadata) {
  struct Case {
    const char* key;
    const char* value;
    const char* want;
  } cases[] = {
      {"id_dtype", "u16", "id_dtype \"u16\" but E = 16 stores ids as u8"},
      {"id_sentinel", "65535", "id_sentinel 65535, expected 255"},
      {"router_weights", "f16", "router_weights must be \"none\", \"f32\" or \"bf16\""},
      {"requests", R"([{"request":"r0","tensor":"routed_experts.0","first_token":0,"num_tokens":3}])",
       "missing field \"first_generated_token\""},
      {"requests",
       R"([{"request":"r0","tensor":"routed_experts.0","first_token":2,"num_tokens":3,"first_generated_token":1}])",
       "field \"first_generated_token\" must be an integer in [2, "},
  };
  for (const Case& c : cases) {
    const CaptureSet set = make_capture(16, 2, 1, {3}, 46);
    const std::string path = temp_path(std::string("meta_") + c.key);
    ASSERT_TRUE(write_capture_file(path, set).ok());
    auto file = io::SafetensorsFile::open(path);
    std::map<std::string, std::string> meta = file->metadata();
    meta[c.key] = c.value;
    HostTensor ids = *file->read("routed_experts.0");
    ASSERT_TRUE(io::write_safetensors(path, {{"routed_experts.0", ids.view()}}, meta).ok());
    auto r = read_capture_file(path);
    ASSERT_FALSE(r.ok()) << c.key;
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status().message();
    std::remove(path.c_str());
  }
}

TEST(CaptureFormatV2, WriteRejectsIdsThatAreNeitherExpertsNorTheSentinel) {
  CaptureSet set = make_capture(16, 2, 1, {3}, 47);
  set.requests[0].ids.data<int16_t>()[2] = -2;
  const std::string path = temp_path("bad_ids");
  const Status st = write_capture_file(path, set);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("id -2 outside [0, 16) (and not the sentinel -1)"), std::string::npos);
  set = make_capture(16, 2, 1, {3}, 47);
  set.requests[0].first_generated_token = -5;
  EXPECT_NE(write_capture_file(path, set).message().find("first_generated_token -5"), std::string::npos);
  EXPECT_FALSE(io::SafetensorsFile::open(path).ok());
}

}  // namespace
}  // namespace moekit

// The capture file: round trips (u8 ids when E <= 256, i16 above), the
// self-describing metadata, and clear errors for files that are not captures,
// of another version, inconsistent or truncated.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <unistd.h>

#include "moekit/capture.h"
#include "moekit/io.h"
#include "util/test_util.h"

namespace moekit {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "moekit_capture_" + std::to_string(::getpid()) + "_" + name;
}

// A capture of `requests` requests with random distinct ids per row.
CaptureSet random_capture(int64_t E, int k, int layers, uint64_t seed) {
  std::mt19937_64 rng(seed);
  CaptureSet set;
  set.info.num_experts = E;
  set.info.routing.method = RoutingMethod::kRenormalize;
  set.info.routing.top_k = k;
  for (int l = 0; l < layers; ++l) set.info.model_layers.push_back(3 + 2 * l);
  const int64_t tokens[] = {5, 1, 0, 17};
  const int64_t first[] = {0, 2, 0, 4};
  for (int r = 0; r < 4; ++r) {
    RequestCapture rc;
    rc.request = "req-" + std::to_string(r) + (r == 3 ? " with spaces/and \"quotes\"" : "");
    rc.first_token = first[r];
    rc.ids = HostTensor(DType::kI16, {tokens[r], layers, k});
    std::vector<int16_t> pool(static_cast<size_t>(E));
    for (int64_t i = 0; i < E; ++i) pool[i] = static_cast<int16_t>(i);
    for (int64_t row = 0; row < tokens[r] * layers; ++row) {
      std::shuffle(pool.begin(), pool.end(), rng);
      std::copy_n(pool.begin(), k, rc.ids.data<int16_t>() + row * k);
    }
    set.requests.push_back(std::move(rc));
  }
  return set;
}

void expect_equal(const CaptureSet& a, const CaptureSet& b) {
  EXPECT_EQ(a.info.format_version, b.info.format_version);
  EXPECT_EQ(a.info.routing_spec_version, b.info.routing_spec_version);
  EXPECT_EQ(a.info.routing.to_string(), b.info.routing.to_string());
  EXPECT_EQ(a.info.num_experts, b.info.num_experts);
  EXPECT_EQ(a.info.model_layers, b.info.model_layers);
  EXPECT_EQ(a.info.id_space, b.info.id_space);
  EXPECT_EQ(a.info.id_order, b.info.id_order);
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].request, b.requests[i].request);
    EXPECT_EQ(a.requests[i].first_token, b.requests[i].first_token);
    ASSERT_EQ(a.requests[i].ids.shape(), b.requests[i].ids.shape());
    ASSERT_EQ(a.requests[i].ids.dtype(), DType::kI16);
    ASSERT_EQ(b.requests[i].ids.dtype(), DType::kI16);
    // std::equal, not memcmp: a request of 0 tokens has no storage (a null pointer).
    const int16_t* x = a.requests[i].ids.data<int16_t>();
    EXPECT_TRUE(std::equal(x, x + a.requests[i].ids.numel(), b.requests[i].ids.data<int16_t>()))
        << a.requests[i].request;
  }
}

class CaptureFileRoundTrip : public ::testing::TestWithParam<int64_t> {};

TEST_P(CaptureFileRoundTrip, WriteThenReadGivesTheSameCapture) {
  const int64_t E = GetParam();
  const CaptureSet set = random_capture(E, 8, 3, testing::seed_from({21, E}));
  const std::string path = temp_path("rt_" + std::to_string(E) + ".safetensors");
  ASSERT_TRUE(write_capture_file(path, set).ok());
  auto back = read_capture_file(path);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_equal(set, *back);

  // The file describes itself to any safetensors reader.
  auto file = io::SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  const auto& meta = file->metadata();
  EXPECT_EQ(meta.at("format"), "moekit.routed_experts");
  EXPECT_EQ(meta.at("format_version"), "1");
  EXPECT_EQ(meta.at("num_experts"), std::to_string(E));
  EXPECT_EQ(meta.at("top_k"), "8");
  EXPECT_EQ(meta.at("model_layers"), "[3,5,7]");
  EXPECT_EQ(meta.at("id_space"), "logical");
  EXPECT_EQ(meta.at("id_order"), "score_desc_index_asc");
  EXPECT_NE(meta.at("routing").find("\"method\":\"renormalize\""), std::string::npos);
  const char* want_dtype = E <= 256 ? "U8" : "I16";
  ASSERT_EQ(file->entries().size(), 4u);
  for (const auto& e : file->entries()) EXPECT_EQ(e.dtype_name, want_dtype) << e.name;
  EXPECT_EQ(meta.at("id_dtype"), E <= 256 ? "u8" : "i16");
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(ExpertCounts, CaptureFileRoundTrip, ::testing::Values(8, 256, 257, 384));

TEST(CaptureFile, ExtraMetadataRoundTripsAndCannotShadowTheFormat) {
  CaptureSet set = random_capture(16, 2, 1, 26);
  set.extra_metadata["made_by"] = R"({"tool":"test","seed":26})";
  const std::string path = temp_path("extra.safetensors");
  ASSERT_TRUE(write_capture_file(path, set).ok());
  auto back = read_capture_file(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->extra_metadata, set.extra_metadata);
  std::remove(path.c_str());
  set.extra_metadata["top_k"] = "3";
  EXPECT_NE(write_capture_file(path, set).message().find("format's own keys"), std::string::npos);
}

TEST(CaptureFile, RoutingParametersRoundTrip) {
  CaptureSet set = random_capture(64, 6, 2, 22);
  set.info.routing.method = RoutingMethod::kDeepseekV3;
  set.info.routing.num_groups = 8;
  set.info.routing.topk_groups = 3;
  set.info.routing.routed_scaling_factor = 2.827f;
  set.info.routing.has_score_bias = true;
  set.info.routing.renormalize = false;  // norm_topk_prob = false
  const std::string path = temp_path("dsv3.safetensors");
  ASSERT_TRUE(write_capture_file(path, set).ok());
  auto back = read_capture_file(path);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->info.routing.routed_scaling_factor, 2.827f);
  EXPECT_EQ(back->info.routing.num_groups, 8);
  EXPECT_EQ(back->info.routing.topk_groups, 3);
  EXPECT_TRUE(back->info.routing.has_score_bias);
  EXPECT_FALSE(back->info.routing.renormalize);
  std::remove(path.c_str());
}

TEST(CaptureFile, WriteRejectsBadCapturesAndLeavesNoFile) {
  const std::string path = temp_path("bad_write.safetensors");
  CaptureSet set = random_capture(16, 4, 2, 23);
  set.requests[0].ids.data<int16_t>()[3] = 16;  // out of range
  Status st = write_capture_file(path, set);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("req-0"), std::string::npos);
  set = random_capture(16, 4, 2, 23);
  set.requests[1].request = set.requests[0].request;
  EXPECT_NE(write_capture_file(path, set).message().find("twice"), std::string::npos);
  set = random_capture(16, 4, 2, 23);
  set.requests[2].ids = HostTensor(DType::kI16, {1, 2, 5});
  EXPECT_FALSE(write_capture_file(path, set).ok());
  EXPECT_FALSE(std::ifstream(path).good());
}

// Writes a file with the metadata of a valid capture changed by `edit`.
template <typename Edit>
std::string write_edited(const std::string& name, Edit edit) {
  const CaptureSet set = random_capture(16, 4, 2, 24);
  const std::string good = temp_path(name + "_good.safetensors");
  EXPECT_TRUE(write_capture_file(good, set).ok());
  auto file = io::SafetensorsFile::open(good);
  std::map<std::string, std::string> meta = file->metadata();
  std::vector<HostTensor> keep;
  std::vector<io::NamedTensor> tensors;
  for (const auto& e : file->entries()) {
    keep.push_back(*file->read(e.name));
  }
  for (size_t i = 0; i < keep.size(); ++i) tensors.push_back({file->entries()[i].name, keep[i].view()});
  edit(meta, tensors, keep);
  const std::string path = temp_path(name + ".safetensors");
  EXPECT_TRUE(io::write_safetensors(path, tensors, meta).ok());
  std::remove(good.c_str());
  return path;
}

using Meta = std::map<std::string, std::string>;
using Tensors = std::vector<io::NamedTensor>;
using Keep = std::vector<HostTensor>;

TEST(CaptureFile, ReadRejectsWhatIsNotAValidCapture) {
  struct Case {
    const char* name;
    void (*edit)(Meta&, Tensors&, Keep&);
    const char* want;
  } cases[] = {
      {"format", [](Meta& m, Tensors&, Keep&) { m["format"] = "something.else"; }, "not a moekit capture file"},
      {"version", [](Meta& m, Tensors&, Keep&) { m["format_version"] = "2"; }, "capture format version 2"},
      {"missing", [](Meta& m, Tensors&, Keep&) { m.erase("model_layers"); }, "lacks \"model_layers\""},
      {"json", [](Meta& m, Tensors&, Keep&) { m["requests"] = "[{"; }, "\"requests\" is not valid JSON"},
      {"method", [](Meta& m, Tensors&, Keep&) { m["routing"] = R"({"method":"magic"})"; }, "unknown routing method"},
      {"topk", [](Meta& m, Tensors&, Keep&) { m["top_k"] = "5"; }, "disagrees"},
      {"space", [](Meta& m, Tensors&, Keep&) { m["id_space"] = "physical"; }, "id_space must be \"logical\""},
      {"order", [](Meta& m, Tensors&, Keep&) { m["id_order"] = "unsorted"; }, "id order"},
      {"tensor", [](Meta& m, Tensors& t, Keep&) { t.pop_back(); }, "is not in the file"},
      {"shape",
       [](Meta& m, Tensors& t, Keep& k) {
         k[0] = HostTensor(DType::kU8, {5, 2, 3});
         t[0].tensor = k[0].view();
       },
       "must be u8 [5,2,4]"},
      {"range",
       [](Meta& m, Tensors& t, Keep& k) { k[0].data<uint8_t>()[0] = 200; },
       "id 200 outside [0, 16)"},
  };
  for (const Case& c : cases) {
    const std::string path = write_edited(c.name, c.edit);
    auto r = read_capture_file(path);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << c.name << ": " << r.status().message();
    std::remove(path.c_str());
  }
}

// Numbers outside their type are errors, never truncated (4294967297 as an
// int is 1), and a metadata value with a key twice is ambiguous.
TEST(CaptureFile, ReadRefusesNumbersOutOfRangeAndAmbiguousMetadata) {
  const std::string routing = R"({"method":"renormalize","top_k":4,"num_groups":1,"topk_groups":1,)"
                              R"("routed_scaling_factor":1.0,"score_bias":false})";
  auto routing_with = [&](const std::string& field, const std::string& value) {
    std::string r = routing;
    const size_t at = r.find("\"" + field + "\":") + field.size() + 3;
    return r.substr(0, at) + value + r.substr(r.find_first_of(",}", at));
  };
  struct Case {
    std::string name;
    std::string key, value;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"version", "format_version", "4294967297", "capture format version 4294967297"},
      {"version_text", "format_version", "\"1\"", "capture format version \"1\""},
      {"top_k", "top_k", "4294967300", "\"top_k\" must be an integer in [1, 2147483647], got 4294967300"},
      {"layers", "num_moe_layers", "4294967298", "\"num_moe_layers\" must be an integer in [1, 2147483647]"},
      {"experts", "num_experts", "16.0", "\"num_experts\" must be an integer"},
      {"spec", "routing_spec_version", "-1", "\"routing_spec_version\" must be an integer in [0, "},
      {"model_layers", "model_layers", "[3, 4294967301]", "model_layers must be a JSON array of integers in [0, "},
      {"routing_k", "routing", routing_with("top_k", "4294967300"), "field \"top_k\" must be an integer in [0, 2147483647]"},
      {"scaling", "routing", routing_with("routed_scaling_factor", "1e39"),
       "field \"routed_scaling_factor\" must be a finite number (f32)"},
      {"dup_key", "routing", routing_with("method", "\"topk\",\"method\":\"renormalize\""), "key 'method' appears twice"},
      {"renormalize", "routing", routing.substr(0, routing.size() - 1) + R"(,"renormalize":1})",
       "field \"renormalize\" must be a boolean"},
      {"first", "requests",
       R"([{"request":"a","tensor":"routed_experts.0","first_token":-1,"num_tokens":5}])",
       "field \"first_token\" must be an integer in [0, "},
      {"shared", "requests",
       R"([{"request":"a","tensor":"routed_experts.1","first_token":0,"num_tokens":1},)"
       R"({"request":"b","tensor":"routed_experts.1","first_token":0,"num_tokens":1}])",
       "tensor \"routed_experts.1\" belongs to an earlier request too"},
  };
  for (const Case& c : cases) {
    const std::string path = write_edited(c.name, [&](Meta& m, Tensors&, Keep&) { m[c.key] = c.value; });
    auto r = read_capture_file(path);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << c.name << ": " << r.status().message();
    std::remove(path.c_str());
  }
}

TEST(CaptureFile, TruncatedAndMissingFilesAreErrors) {
  const CaptureSet set = random_capture(16, 4, 2, 25);
  const std::string path = temp_path("trunc.safetensors");
  ASSERT_TRUE(write_capture_file(path, set).ok());
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size() - 7);
  EXPECT_FALSE(read_capture_file(path).ok());
  std::remove(path.c_str());
  EXPECT_EQ(read_capture_file(path).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace moekit

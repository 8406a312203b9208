// check_capture: one planted fault per finding kind on an otherwise clean
// capture; each is found, named by request, token, MoE layer, model layer and
// slot, and nothing else is reported.
#include <gtest/gtest.h>

#include <random>

#include "moekit/capture_check.h"
#include "util/test_util.h"

namespace moekit {
namespace {

constexpr int64_t kE = 32;
constexpr int kK = 4, kLayers = 3;

CaptureSet clean_capture(uint64_t seed) {
  std::mt19937_64 rng(seed);
  CaptureSet set;
  set.info.num_experts = kE;
  set.info.routing.method = RoutingMethod::kRenormalize;
  set.info.routing.top_k = kK;
  set.info.model_layers = {1, 3, 5};
  std::vector<int16_t> pool(kE);
  for (int i = 0; i < kE; ++i) pool[i] = static_cast<int16_t>(i);
  for (int r = 0; r < 2; ++r) {
    RequestCapture rc;
    rc.request = r == 0 ? "a" : "b";
    rc.first_token = r * 3;
    rc.first_generated_token = rc.first_token + 6;
    rc.ids = HostTensor(DType::kI16, {10, kLayers, kK});
    for (int64_t row = 0; row < 10 * kLayers; ++row) {
      std::shuffle(pool.begin(), pool.end(), rng);
      std::copy_n(pool.begin(), kK, rc.ids.data<int16_t>() + row * kK);
    }
    set.requests.push_back(std::move(rc));
  }
  return set;
}

int16_t* row(CaptureSet& s, int request, int64_t t, int layer) {
  return s.requests[request].ids.data<int16_t>() + (t * kLayers + layer) * kK;
}

TEST(CaptureCheck, CleanCaptureHasNoFindings) {
  const CaptureCheckReport r = check_capture(clean_capture(51));
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.findings.empty());
}

TEST(CaptureCheck, EachPlantedFaultIsNamed) {
  struct Case {
    const char* name;
    void (*plant)(CaptureSet&, CaptureCheckOptions&);
    CaptureFindingKind kind;
    std::string want;  // a substring of the one finding's message
  } cases[] = {
      {"unwritten", [](CaptureSet& s, CaptureCheckOptions&) { std::fill_n(row(s, 1, 2, 1), kK, int16_t{-1}); },
       CaptureFindingKind::kUnwritten, "request 'b', token 5, MoE layer 1 (model layer 3): the row holds the sentinel -1"},
      {"range", [](CaptureSet& s, CaptureCheckOptions&) { row(s, 0, 7, 2)[3] = 40; }, CaptureFindingKind::kOutOfRange,
       "request 'a', token 7, MoE layer 2 (model layer 5), slot 3: id 40 outside [0, 32)"},
      {"physical",
       [](CaptureSet& s, CaptureCheckOptions& o) {
         o.num_physical_experts = 48;
         row(s, 0, 1, 0)[0] = 40;
       },
       CaptureFindingKind::kPhysicalId, "request 'a', token 1, MoE layer 0 (model layer 1), slot 0: id 40 is outside the 32 logical"},
      {"duplicate", [](CaptureSet& s, CaptureCheckOptions&) { row(s, 1, 0, 0)[2] = row(s, 1, 0, 0)[0]; },
       CaptureFindingKind::kDuplicate, "request 'b', token 3, MoE layer 0 (model layer 1), slot 2: id"},
      {"zero_padding", [](CaptureSet& s, CaptureCheckOptions&) { std::fill_n(row(s, 0, 9, 1), kK, int16_t{0}); },
       CaptureFindingKind::kZeroPadding, "request 'a', token 9, MoE layer 1 (model layer 3): the row is all expert 0"},
      {"constant",
       [](CaptureSet& s, CaptureCheckOptions&) {
         for (int64_t t = 1; t < 10; ++t) std::copy_n(row(s, 0, 0, 2), kK, row(s, 0, t, 2));
       },
       CaptureFindingKind::kConstantLayer, "request 'a', MoE layer 2 (model layer 5): all 10 tokens have the ids"},
      {"dense", [](CaptureSet&, CaptureCheckOptions& o) { o.dense_layers = {0, 3}; }, CaptureFindingKind::kDenseLayer,
       "MoE layer 1 (model layer 3): model layer 3 is dense"},
      {"tokens", [](CaptureSet&, CaptureCheckOptions& o) { o.expected_tokens["b"] = 11; },
       CaptureFindingKind::kTokenCount, "request 'b': 10 rows, expected 11 tokens"},
      {"missing", [](CaptureSet&, CaptureCheckOptions& o) { o.expected_tokens["ghost"] = 3; },
       CaptureFindingKind::kTokenCount, "request 'ghost': the request is not in the capture (expected 3 tokens)"},
      {"prompt", [](CaptureSet& s, CaptureCheckOptions&) { s.requests[0].first_generated_token = 12; },
       CaptureFindingKind::kPromptBoundary, "request 'a': first_generated_token 12 outside the captured tokens [0, 10]"},
  };
  for (const Case& c : cases) {
    CaptureSet set = clean_capture(52);
    CaptureCheckOptions options;
    c.plant(set, options);
    const CaptureCheckReport r = check_capture(set, options);
    ASSERT_EQ(r.findings.size(), 1u) << c.name << ": " << (r.findings.empty() ? "" : r.findings[0].message);
    EXPECT_EQ(r.findings[0].kind, c.kind) << c.name;
    EXPECT_EQ(r.counts.at(c.kind), 1) << c.name;
    EXPECT_NE(r.findings[0].message.find(c.want), std::string::npos) << c.name << ": " << r.findings[0].message;
  }
}

// k = 1 cannot tell one expert-0 row from padding; a trailing run of zero tokens is padding.
TEST(CaptureCheck, TopOneZeroTailIsPaddingButOneZeroIsNot) {
  CaptureSet set;
  set.info.num_experts = 8;
  set.info.routing.method = RoutingMethod::kTopk;
  set.info.routing.top_k = 1;
  set.info.model_layers = {0};
  RequestCapture rc;
  rc.request = "z";
  rc.ids = HostTensor(DType::kI16, {6, 1, 1});
  const int16_t ids[] = {3, 0, 5, 1, 0, 0};
  std::copy_n(ids, 6, rc.ids.data<int16_t>());
  set.requests.push_back(rc);
  CaptureCheckReport r = check_capture(set);
  ASSERT_EQ(r.counts[CaptureFindingKind::kZeroPadding], 2);
  EXPECT_EQ(r.findings[0].token, 4);
  EXPECT_EQ(r.findings[1].token, 5);
  EXPECT_EQ(r.total(), 2);
}

TEST(CaptureCheck, FindingsAreCappedPerKindButAllCounted) {
  CaptureSet set = clean_capture(53);
  for (int64_t t = 0; t < 10; ++t) {
    for (int l = 0; l < kLayers; ++l) std::fill_n(row(set, 0, t, l), kK, int16_t{-1});
  }
  CaptureCheckOptions o;
  o.max_findings_per_kind = 5;
  const CaptureCheckReport r = check_capture(set, o);
  EXPECT_EQ(r.counts.at(CaptureFindingKind::kUnwritten), 30);
  EXPECT_EQ(r.findings.size(), 5u);
  EXPECT_EQ(r.total(), 30);  // a never-written layer is not also "constant"
}

}  // namespace
}  // namespace moekit

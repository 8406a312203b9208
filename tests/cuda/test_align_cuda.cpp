// align_by_expert (experts/cuda/align.h) against a host stable counting sort,
// exactly: group starts and sizes, every pair's row and every row's token, for
// pair counts on both sides of the one-launch limit (1024), chunk counts up to
// the maximum, expert counts below and above the scan's slicing, and ids outside
// [0, E) mixed in.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "experts/cuda/align.h"

namespace moekit {
namespace {

using cuda_test::DeviceBytes;

struct AlignCase {
  int64_t M, k, E;
};

class CudaAlign : public ::testing::TestWithParam<AlignCase> {};

TEST_P(CudaAlign, EqualsAStableCountingSort) {
  MOEKIT_REQUIRE_SM90();
  const AlignCase c = GetParam();
  const int64_t pairs = c.M * c.k;
  std::mt19937_64 rng(static_cast<uint64_t>(c.M * 1000003 + c.k * 1009 + c.E));
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.E) - 1);
  std::vector<int32_t> ids(pairs);
  for (int64_t p = 0; p < pairs; ++p) {
    ids[p] = id(rng);
    if (p % 97 == 5) ids[p] = -1;                              // no expert
    if (p % 89 == 7) ids[p] = static_cast<int32_t>(c.E);       // out of range
  }
  // Host: rows in expert order, pairs ascending within an expert.
  std::vector<int32_t> rows(c.E, 0), start(c.E, 0), pair_row(pairs, -1), row_token(pairs, -1);
  for (int32_t e : ids) if (e >= 0 && e < c.E) ++rows[e];
  for (int64_t e = 1; e < c.E; ++e) start[e] = start[e - 1] + rows[e - 1];
  std::vector<int32_t> next = start;
  int64_t valid = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = ids[p];
    if (e < 0 || e >= c.E) continue;
    pair_row[p] = next[e]++;
    row_token[pair_row[p]] = static_cast<int32_t>(p / c.k);
    ++valid;
  }

  DeviceBytes d_ids(pairs * 4), d_start(c.E * 4), d_rows(c.E * 4), d_counts(c.E * 4), d_pair_row(pairs * 4),
      d_row_token(pairs * 4), d_ws(std::max<size_t>(256, cuda::align_workspace_size(pairs, c.E)));
  ASSERT_CUDA_OK(cudaMemcpy(d_ids.data(), ids.data(), pairs * 4, cudaMemcpyHostToDevice));
  for (DeviceBytes* b : {&d_start, &d_rows, &d_counts, &d_pair_row, &d_row_token}) {
    ASSERT_CUDA_OK(cudaMemset(b->data(), 0x7f, b->bytes()));  // poison
  }
  cuda::AlignArgs a;
  a.topk_ids = static_cast<const int32_t*>(d_ids.data());
  a.group_start = static_cast<int32_t*>(d_start.data());
  a.group_rows = static_cast<int32_t*>(d_rows.data());
  a.expert_counts = static_cast<int32_t*>(d_counts.data());
  a.pair_row = static_cast<int32_t*>(d_pair_row.data());
  a.row_token = static_cast<int32_t*>(d_row_token.data());
  a.workspace = d_ws.data();
  const Status st = cuda::align_by_expert(cuda::AlignProblem{c.M, c.k, c.E}, a, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  auto download = [](const DeviceBytes& b, size_t n) {
    std::vector<int32_t> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), b.data(), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  };
  EXPECT_EQ(download(d_rows, c.E), rows);
  EXPECT_EQ(download(d_counts, c.E), rows);
  EXPECT_EQ(download(d_start, c.E), start);
  EXPECT_EQ(download(d_pair_row, pairs), pair_row);
  std::vector<int32_t> got_token = download(d_row_token, pairs);
  got_token.resize(valid);  // rows past the valid count are undefined
  row_token.resize(valid);
  EXPECT_EQ(got_token, row_token);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CudaAlign,
                         ::testing::Values(AlignCase{1, 8, 128}, AlignCase{128, 8, 128},     // one launch
                                           AlignCase{129, 8, 128}, AlignCase{1000, 8, 256},  // the chunked path
                                           AlignCase{4096, 8, 128}, AlignCase{16384, 8, 128},
                                           AlignCase{5000, 1, 7}, AlignCase{3000, 4, 2000},
                                           AlignCase{40000, 2, 1}, AlignCase{20000, 6, 3000}),
                         [](const ::testing::TestParamInfo<AlignCase>& i) {
                           return "M" + std::to_string(i.param.M) + "_k" + std::to_string(i.param.k) + "_E" +
                                  std::to_string(i.param.E);
                         });

}  // namespace
}  // namespace moekit

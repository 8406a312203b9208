// parallel_for (include/moekit/parallel_for.h): every index exactly once, nested and
// concurrent calls, and the inline path for small n.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "moekit/parallel_for.h"

namespace moekit {
namespace {

TEST(ParallelFor, CoversEveryIndexOnce) {
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    for (int64_t grain : {1, 16, 4096}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, grain, [&](int64_t b, int64_t e) {
        ASSERT_LE(0, b);
        ASSERT_LT(b, e);
        ASSERT_LE(e, n);
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain << " i=" << i;
    }
  }
}

TEST(ParallelFor, SmallRangeRunsInline) {
  int calls = 0;
  parallel_for(10, 10, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_GE(parallel_num_threads(), 1);
}

TEST(ParallelFor, NestedAndConcurrentCallsFinish) {
  std::atomic<int64_t> total{0};
  auto work = [&] {
    parallel_for(64, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        parallel_for(100, 1, [&](int64_t b2, int64_t e2) { total.fetch_add(e2 - b2); });
      }
    });
  };
  std::thread other(work);
  work();
  other.join();
  EXPECT_EQ(total.load(), 2 * 64 * 100);
}

}  // namespace
}  // namespace moekit

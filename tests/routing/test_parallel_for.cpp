// parallel_for (include/moekit/parallel_for.h): every index exactly once, nested and
// concurrent calls, and the inline path for small n.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
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

// An OpenMP runtime the process loaded (libgomp, as a torch process has it) runs the
// chunks on its threads: each index once, on more than one thread, nested calls
// inline; a library not loaded or without GOMP_parallel is refused, keeping the pool.
TEST(ParallelFor, RunsOnALoadedOpenMpRuntime) {
  EXPECT_FALSE(use_openmp_runtime("libmoekit-no-such-runtime.so").ok());
  void* gomp = dlopen("libgomp.so.1", RTLD_NOW);
  if (gomp == nullptr) GTEST_SKIP() << "libgomp.so.1 is not installed here";
  const Status no_entry = use_openmp_runtime("libdl.so.2");
  EXPECT_FALSE(no_entry.ok());
  EXPECT_EQ(openmp_runtime(), "");
  ASSERT_TRUE(set_parallel_num_threads(2).ok());
  ASSERT_TRUE(use_openmp_runtime("libgomp.so.1").ok());
  EXPECT_EQ(openmp_runtime(), "libgomp.so.1");
  const int64_t n = 100003;
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::atomic<int64_t> nested{0}, calls{0};
  parallel_for(n, 1, [&](int64_t b, int64_t e) {
    {
      std::lock_guard<std::mutex> lk(mu);
      threads.insert(std::this_thread::get_id());
    }
    for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    calls.fetch_add(1);
    parallel_for(10, 1, [&](int64_t b2, int64_t e2) { nested.fetch_add(e2 - b2); });
    // Long enough chunks that both threads of the team take some.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  });
  ASSERT_TRUE(use_openmp_runtime("").ok());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  EXPECT_EQ(threads.size(), 2u);
  EXPECT_EQ(nested.load(), 10 * calls.load());  // each nested call covered its range, inline
}

}  // namespace
}  // namespace moekit

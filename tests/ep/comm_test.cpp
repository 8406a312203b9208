// The loopback communicator: every collective against a direct computation,
// and its failures (a rank that never joins or never arrives, mismatched calls).
#include <gtest/gtest.h>

#include <mutex>
#include <numeric>

#include "ep/ep_test_util.h"

namespace moekit {
namespace {

using testing::run_ranks;

TEST(LoopbackComm, AllGatherPutsEveryRankAtItsOffset) {
  for (int n : {1, 2, 3, 8}) {
    auto st = run_ranks(n, [&](int r, Communicator& c) -> Status {
      const int64_t mine[2] = {r * 10, r * 10 + 1};
      std::vector<int64_t> all(2 * n, -1);
      MOEKIT_RETURN_IF_ERROR(c.all_gather(mine, all.data(), sizeof(mine)));
      for (int s = 0; s < n; ++s) {
        if (all[2 * s] != s * 10 || all[2 * s + 1] != s * 10 + 1) return Internal("wrong block " + std::to_string(s));
      }
      return Status::Ok();
    });
    for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << "n=" << n << " rank " << r << ": " << st[r].to_string();
  }
}

TEST(LoopbackComm, ReduceScatterSumsInRankOrder) {
  const int n = 4;
  const size_t count = 3;
  auto value = [](int r, size_t i) { return 0.1f * static_cast<float>(r + 1) + static_cast<float>(i); };
  auto st = run_ranks(n, [&](int r, Communicator& c) -> Status {
    std::vector<float> send(n * count), recv(count, -1.0f);
    for (size_t i = 0; i < send.size(); ++i) send[i] = value(r, i);
    MOEKIT_RETURN_IF_ERROR(c.reduce_scatter_sum_f32(send.data(), recv.data(), count));
    for (size_t i = 0; i < count; ++i) {
      float expect = 0.0f;
      for (int s = 0; s < n; ++s) expect += value(s, r * count + i);
      if (recv[i] != expect) return Internal("element " + std::to_string(i) + " differs");
    }
    return Status::Ok();
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << st[r].to_string();
}

TEST(LoopbackComm, AllToAllVMovesOnlyTheCountedRows) {
  const int n = 3;
  const int64_t max_rows = 4;
  // Rank s sends (s + d) % (max_rows + 1) rows to rank d; row i holds s*100 + d*10 + i.
  auto rows = [&](int s, int d) { return (s + d) % (max_rows + 1); };
  auto st = run_ranks(n, [&](int r, Communicator& c) -> Status {
    std::vector<int32_t> send(n * max_rows, -7), recv(n * max_rows, -9), sc(n), rc(n, -1);
    for (int d = 0; d < n; ++d) {
      sc[d] = rows(r, d);
      for (int i = 0; i < sc[d]; ++i) send[d * max_rows + i] = r * 100 + d * 10 + i;
    }
    MOEKIT_RETURN_IF_ERROR(c.all_to_all_v(send.data(), sc.data(), recv.data(), rc.data(), max_rows, sizeof(int32_t)));
    for (int s = 0; s < n; ++s) {
      if (rc[s] != rows(s, r)) return Internal("count from " + std::to_string(s));
      for (int i = 0; i < rc[s]; ++i) {
        if (recv[s * max_rows + i] != s * 100 + r * 10 + i) return Internal("row from " + std::to_string(s));
      }
      for (int i = rc[s]; i < max_rows; ++i) {
        if (recv[s * max_rows + i] != -9) return Internal("wrote past the count");
      }
    }
    return Status::Ok();
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << st[r].to_string();
}

TEST(LoopbackComm, ACountAboveMaxRowsFailsOnEveryRank) {
  auto st = run_ranks(2, [&](int r, Communicator& c) -> Status {
    std::vector<int32_t> send(4), recv(4), sc = {r == 1 ? 3 : 1, 1}, rc(2);
    return c.all_to_all_v(send.data(), sc.data(), recv.data(), rc.data(), 2, sizeof(int32_t));
  });
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
    EXPECT_NE(s.message().find("rank 1 sends 3 rows to rank 0"), std::string::npos) << s.message();
  }
}

TEST(LoopbackComm, ARankThatNeverJoinsTimesOutWithAClearError) {
  const CommUniqueId id = loopback_unique_id();
  auto comm = create_loopback_communicator(id, 3, 0, {std::chrono::milliseconds(150)});
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(comm.status().message().find("rank(s) 1, 2 never joined within 150 ms"), std::string::npos)
      << comm.status().message();
}

TEST(LoopbackComm, ARankThatNeverArrivesTimesOutAndBreaksTheGroup) {
  auto st = run_ranks(
      2,
      [&](int r, Communicator& c) -> Status {
        if (r == 1) return Status::Ok();  // leaves without the barrier
        Status first = c.barrier();
        Status second = c.barrier();
        if (second.code() != StatusCode::kDeadlineExceeded) return Internal("a broken group served a call");
        return first;
      },
      {std::chrono::milliseconds(150)});
  EXPECT_EQ(st[0].code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st[0].message().find("for rank(s) 1, which never arrived"), std::string::npos) << st[0].message();
  EXPECT_TRUE(st[1].ok());
}

TEST(LoopbackComm, MismatchedCollectivesFailOnEveryRank) {
  auto st = run_ranks(2, [&](int r, Communicator& c) -> Status {
    int64_t x = r, all[2];
    if (r == 0) return c.all_gather(&x, all, sizeof(x));
    return c.barrier();
  });
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("rank 0 called all_gather(bytes=8), rank 1 called barrier"), std::string::npos)
        << s.message();
  }
}

TEST(LoopbackComm, RanksMustAgreeOnTheSize) {
  const CommUniqueId id = loopback_unique_id();
  StatusOr<std::unique_ptr<Communicator>> a = InvalidArgument("unset"), b = InvalidArgument("unset");
  std::thread t([&] { a = create_loopback_communicator(id, 2, 0, {std::chrono::milliseconds(300)}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  b = create_loopback_communicator(id, 3, 1, {std::chrono::milliseconds(300)});
  t.join();
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("joins with size 3 but the group was made with size 2"), std::string::npos)
      << b.status().message();
  EXPECT_EQ(a.status().code(), StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace moekit

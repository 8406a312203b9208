// `moekit run --ep N` as a user runs it: per-rank load before and after EPLB,
// EPLB changing neither outputs nor ids, replay bit for bit; bad flags exit 2.
#include <gtest/gtest.h>

#include <string>

#include "util/cli_test_util.h"

namespace moekit {
namespace {

const std::string kSmall =
    " --layers 2 --experts 16 --top-k 4 --hidden 64 --intermediate 32 --num-groups 4 --topk-groups 2"
    " --tokens 600 --requests 4 --decode 3 --threads 1";

TEST(EpCli, RunReportsLoadBeforeAndAfterEplbAndReplaysBitForBit) {
  for (int ranks : {2, 4}) {
    // Group tokens per step: 64 (<= the oracle's allgather limit of 256) at 2 ranks, 512 (above) at 4.
    const auto r = testing::run_command(std::string(MOEKIT_CLI_PATH) + " run --ep " + std::to_string(ranks) + kSmall +
                                        " --max-batch-tokens " + std::to_string(ranks == 2 ? 64 : 512));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("load before"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("load after"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rank" + std::to_string(ranks - 1) + " "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(ranks == 2 ? "dispatch: allgather_reduce_scatter" : "dispatch: all_to_all"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("captured logical ids identical"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("replay:   "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("outputs matched bit for bit"), std::string::npos) << r.out;
  }
}

TEST(EpCli, BadEplbSlotsAreNamed) {
  const auto r = testing::run_command_split(std::string(MOEKIT_CLI_PATH) + " run --ep 3 --eplb-redundant 4" + kSmall);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("num_physical_slots (20) must be >= num_logical (16) and a multiple of num_ranks (3)"),
            std::string::npos)
      << r.err;
}

TEST(EpCli, BackendsSaysHowAnEpLayerMovesTokensAndWhy) {
  const std::string base = std::string(MOEKIT_CLI_PATH) + " backends --cpu-only --ep 8 --dp 8 --all2all auto";
  const auto large = testing::run_command(base + " --max-tokens 4096");
  ASSERT_EQ(large.code, 0) << large.out;
  EXPECT_NE(large.out.find("rejected: monolithic kernels cannot dispatch tokens across ranks"), std::string::npos)
      << large.out;
  EXPECT_NE(large.out.find("ep dispatch: all-to-all: up to 32768 tokens in the group"), std::string::npos) << large.out;
  const auto small = testing::run_command(base + " --max-tokens 16");
  ASSERT_EQ(small.code, 0) << small.out;
  EXPECT_NE(small.out.find("ep dispatch: allgather + reduce-scatter: at most 128 tokens"), std::string::npos)
      << small.out;
}

}  // namespace
}  // namespace moekit

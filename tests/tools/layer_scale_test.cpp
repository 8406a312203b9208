// `moekit layer` on a per-expert checkpoint with E = 32767 experts (the most
// that int16 ids hold): 98301 tensors found by name. Finding each one by a
// linear search made loading quadratic (27.6 s at this E, 0.75 s at 4096).
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "moekit/io.h"
#include "util/cli_test_util.h"
#include "util/temp_dir.h"
#include "util/test_util.h"

namespace moekit {
namespace {

class LayerScale : public testing::TempDirTest {};

TEST_F(LayerScale, PerExpertCheckpointOf32767ExpertsLoadsInSeconds) {
  constexpr int64_t E = 32767, H = 8, I = 4, M = 3;
  std::mt19937_64 rng(testing::seed_from({91, E}));
  // One set of projections, shared by every expert's names (the reader copies each).
  const HostTensor gate = testing::random_tensor(rng, DType::kBF16, {I, H}, 0.2);
  const HostTensor up = testing::random_tensor(rng, DType::kBF16, {I, H}, 0.2);
  const HostTensor down = testing::random_tensor(rng, DType::kBF16, {H, I}, 0.2);
  const HostTensor router = testing::random_tensor(rng, DType::kF32, {E, H}, 0.3);
  std::vector<io::NamedTensor> tensors;
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "model.layers.5.mlp.experts." + std::to_string(e) + ".";
    tensors.push_back({p + "gate_proj.weight", gate.view()});
    tensors.push_back({p + "up_proj.weight", up.view()});
    tensors.push_back({p + "down_proj.weight", down.view()});
  }
  tensors.push_back({"model.layers.5.mlp.gate.weight", router.view()});
  ASSERT_TRUE(io::write_safetensors(file("w.safetensors"), tensors).ok());
  ASSERT_TRUE(io::write_npy(file("h.npy"), testing::random_tensor(rng, DType::kF32, {M, H}, 1.0).view()).ok());

  const auto t0 = std::chrono::steady_clock::now();
  const testing::CommandResult r = testing::run_command(
      std::string(MOEKIT_CLI_PATH) + " layer --weights " + file("w.safetensors") + " --hidden " + file("h.npy") +
      " --out " + file("o.npy") + " --capture " + file("ids.npy") + " --method softmax_topk --top-k 2");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("E=32767"), std::string::npos) << r.out;
  auto ids = io::read_npy(file("ids.npy"));
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->shape(), (std::vector<int64_t>{M, 2}));
  // NOTE: ~1.5 s in a release build, ~6 s under the sanitizers on 2 busy
  // cores; the quadratic search took 33 s in a release build.
  EXPECT_LT(s, 20.0) << "moekit layer took " << s << " s for E = " << E;
  std::printf("moekit layer, E = %lld per-expert tensors: %.2f s\n", static_cast<long long>(E), s);
}

}  // namespace
}  // namespace moekit

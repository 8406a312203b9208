// `moekit replay --captures FILE`: replays a capture written by `moekit run`
// on its own — rebuilds the model and schedule the file describes, forces the
// captured experts in every layer, and checks the outputs match bit for bit.
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "moekit/platform.h"
#include "run_capture.h"

namespace moekit::tools {
namespace {

Status run_replay(const std::string& path) {
  if (path.empty()) return InvalidArgument("--captures: the option is empty; give the capture file");
  std::printf("moekit replay: %s\n", path.c_str());
  std::fflush(stdout);
  RunDescription run;
  MOEKIT_ASSIGN_OR_RETURN(ReplayOutcome r, replay_capture_file(path, Platform::probe(), &run));
  std::printf("model:    %d MoE layers%s%s, E=%" PRId64 ", k=%d, H=%" PRId64 ", I=%" PRId64 ", seed %" PRIu64 "\n",
              run.spec.num_layers, run.model_dir.empty() ? "" : " of ", run.model_dir.c_str(), run.spec.num_experts,
              run.spec.top_k, run.spec.hidden, run.spec.intermediate, run.spec.seed);
  if (!r.matched) return DataLoss("replay differs from the recorded run at " + r.mismatch);
  std::printf("replay:   %zu steps with the captured experts forced in every layer, %.3f s: outputs matched bit for bit\n",
              r.steps, r.seconds);
  return Status::Ok();
}

}  // namespace

void add_replay_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Replay a capture file written by `moekit run` and check the outputs match bit for bit");
  cmd->add_option("--captures", *path, "capture file (docs/capture.md)")->required();
  cmd->callback([path] {
    const Status st = run_replay(*path);
    finish(st.ok() ? kExitOk : report_error("replay", st));
  });
}

}  // namespace moekit::tools

// The `moekit` command line: one subcommand per job (tools/commands.h).
// Exit codes: 0 ok, 1 internal error, 2 bad input (flags, files, shapes).
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "cli_util.h"
#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"moekit: the Mixture-of-Experts layer of large language models, on CPUs and NVIDIA GPUs"};
  app.require_subcommand(1);
  moekit::tools::add_route_command(app);
  moekit::tools::add_run_command(app);
  moekit::tools::add_backends_command(app);
  moekit::tools::add_layer_command(app);
  moekit::tools::add_replay_command(app);
  moekit::tools::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a subcommand failed and has said why
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the parse error and a hint
    return code == 0 ? moekit::tools::kExitOk : moekit::tools::kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "moekit: internal error: " << e.what() << "\n";
    return moekit::tools::kExitInternal;
  }
  return moekit::tools::kExitOk;
}

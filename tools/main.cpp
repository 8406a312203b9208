// The `moekit` command line: one subcommand per job (tools/commands.h).
// Exit codes: 0 ok, 1 internal error, 2 bad input (flags, files, shapes).
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "alloc_report.h"
#include "cli_util.h"
#include "memory_budget.h"
#include "commands.h"
#include "moekit/parallel_for.h"

int main(int argc, char** argv) {
  CLI::App app{"moekit: the Mixture-of-Experts layer of large language models, on CPUs and NVIDIA GPUs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moekit " MOEKIT_VERSION, "print the version and exit");
  moekit::tools::add_route_command(app);
  moekit::tools::add_run_command(app);
  moekit::tools::add_backends_command(app);
  moekit::tools::add_layer_command(app);
  moekit::tools::add_replay_command(app);
  moekit::tools::add_bench_command(app);
  moekit::tools::add_capture_command(app);
  moekit::tools::add_quantize_command(app);
  // NOTE: every bad command line is answered with one line on stderr and exit
  // code 2; help (--help) is the only multi-line answer.
  if (const std::string unknown = moekit::tools::unknown_command(app, argc, argv); !unknown.empty()) {
    std::cerr << "moekit: error: " << unknown << "\n";
    return moekit::tools::kExitBadInput;
  }
  // The CPU pool cannot fail later: a bad thread count is refused before any work.
  if (const moekit::Status st = moekit::check_num_threads_env(); !st.ok()) {
    std::cerr << "moekit: error: " << moekit::tools::one_line(st.to_string()) << "\n";
    return moekit::tools::kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a subcommand failed and has said why
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "moekit" << moekit::tools::command_of(app) << ": error: " << moekit::tools::one_line(e.what())
              << " (--help lists the flags)\n";
    return moekit::tools::kExitBadInput;
  } catch (const std::bad_alloc&) {
    // The commands check sizes before they allocate; this is the last resort.
    const size_t bytes = moekit::tools::last_failed_allocation_bytes();
    std::cerr << "moekit" << moekit::tools::command_of(app) << ": error: ResourceExhausted: out of memory ("
              << (bytes > 0 ? "an allocation of " + moekit::tools::format_bytes(static_cast<double>(bytes)) +
                                  " failed; " + moekit::tools::format_bytes(moekit::tools::available_memory_bytes()) +
                                  " available"
                            : std::string("an allocation failed"))
              << ")\n";
    return moekit::tools::kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "moekit: internal error: " << moekit::tools::one_line(e.what()) << "\n";
    return moekit::tools::kExitInternal;
  }
  return moekit::tools::kExitOk;
}

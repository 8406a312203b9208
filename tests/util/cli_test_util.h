// Runs the `moekit` command line as a user runs it: one command line in, its
// exit code and output back (tests/util/temp_dir.h gives each test a folder).
#pragma once

#include <string>

namespace moekit::testing {

struct CommandResult {
  int code = -1;    // exit status; 128 + signal number when killed by a signal
  std::string out;  // stdout and stderr together (run_command), stdout alone (run_command_split)
  std::string err;  // stderr (run_command_split only)
};

// Runs `command_line` through the shell, stderr merged into stdout.
CommandResult run_command(const std::string& command_line);
// The same with stderr kept apart, to check what a failure says and how.
CommandResult run_command_split(const std::string& command_line);

}  // namespace moekit::testing

// Helpers for tests that run the `moekit` command line as a user runs it: one
// command line in, its exit code and output back; a fresh folder per test.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace moekit::testing {

struct CommandResult {
  int code = -1;    // exit status; 128 + signal number when killed by a signal
  std::string out;  // stdout and stderr together
};

// Runs `command_line` through the shell, stderr merged into stdout.
CommandResult run_command(const std::string& command_line);

// A fixture that gives each test its own empty folder under the system's
// temporary directory, named after the suite, the test and the process, and
// removes it afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  // The path of `name` inside this test's folder.
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

}  // namespace moekit::testing

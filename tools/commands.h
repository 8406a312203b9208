// The subcommands of the `moekit` command line, one file each. Each adds its
// options and callback to the app; a callback that fails throws
// CLI::RuntimeError(exit code) after printing its message (tools/main.cpp).
#pragma once

#include <CLI/CLI.hpp>

namespace moekit::tools {

void add_route_command(CLI::App& app);  // tools/cmd_route.cpp
void add_run_command(CLI::App& app);    // tools/cmd_run.cpp

}  // namespace moekit::tools

// The subcommands of the `moekit` command line, one file each. Each adds its
// options and callback to the app; a callback that fails throws
// CLI::RuntimeError(exit code) after printing its message (tools/main.cpp).
#pragma once

#include <CLI/CLI.hpp>

namespace moekit::tools {

void add_route_command(CLI::App& app);  // tools/cmd_route.cpp
void add_run_command(CLI::App& app);    // tools/cmd_run.cpp
void add_backends_command(CLI::App& app);  // tools/cmd_backends.cpp
void add_layer_command(CLI::App& app);     // tools/cmd_layer.cpp
void add_replay_command(CLI::App& app);    // tools/cmd_replay.cpp
void add_bench_command(CLI::App& app);     // tools/cmd_bench.cpp
void add_capture_command(CLI::App& app);   // tools/cmd_capture.cpp
void add_quantize_command(CLI::App& app);  // tools/cmd_quantize.cpp

}  // namespace moekit::tools

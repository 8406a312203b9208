// Helpers shared by the subcommands: exit codes, error reporting, and the
// routing flags every command that routes accepts.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;  // a bug or a device error
inline constexpr int kExitBadInput = 2;  // bad flags, files, shapes or values

// `text` on one line: control characters (newlines from file names or file
// contents included) written as \xNN.
std::string one_line(std::string_view text);

// Prints "moekit <command>: error: <Status>" (one line) to stderr and returns the exit code
// for it (kExitInternal for kInternal, kExitBadInput otherwise).
int report_error(std::string_view command, const Status& status);

// The message for a first argument that names no command ("unknown command
// 'frobnicate' (one of route, run, ...)", also for none at all); empty when
// the command line starts well (a command, or a flag such as --help).
std::string unknown_command(const CLI::App& app, int argc, const char* const* argv);
// " <command>" of the subcommand being parsed, or "" before one is known.
std::string command_of(const CLI::App& app);

// Ends a subcommand's callback with `code` (0: nothing is thrown).
void finish(int code);

// --method, --top-k, --num-groups, --topk-groups, --scaling, --no-renormalize.
struct RoutingFlags {
  std::string method = "softmax_topk";
  int top_k = 0;  // 0: required flag not given (checked by CLI11)
  int num_groups = 1;
  int topk_groups = 1;
  float scaling = 1.0f;
  bool no_renormalize = false;  // deepseek_v3: weights not divided by their sum (norm_topk_prob = false)
  // The deepseek_v3-only options, to refuse them with another method.
  std::vector<CLI::Option*> deepseek_only;
};
// `top_k_required`: the flag must be given (route) or has a default (run).
void add_routing_flags(CLI::App* cmd, RoutingFlags* flags, bool top_k_required);
// The RoutingConfig the flags describe, validated against num_experts.
StatusOr<RoutingConfig> routing_config_from(const RoutingFlags& flags, int64_t num_experts, bool has_bias);

// Prints "gemm plan (<kernel>):" and, for a few M up to max_tokens (1, 16, 256,
// 4096, max_tokens), the GEMM paths a forward of M tokens takes and why.
void print_gemm_plan(const MoeKernel& kernel, int64_t max_tokens);

// "softmax_topk|renormalize|..." for help texts.
std::string routing_method_list();

}  // namespace moekit::tools

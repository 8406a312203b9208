#include "util/cli_test_util.h"

#include <sys/wait.h>

#include <cstdio>

namespace moekit::testing {

CommandResult run_command(const std::string& command_line) {
  const std::string cmd = command_line + " 2>&1";
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return r;
}

}  // namespace moekit::testing

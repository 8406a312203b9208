#include "util/cli_test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

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

CommandResult run_command_split(const std::string& command_line) {
  char err_path[] = "/tmp/moekit_stderr_XXXXXX";
  const int fd = ::mkstemp(err_path);
  if (fd < 0) return {};
  ::close(fd);
  CommandResult r = run_command("( (" + command_line + ") 2>" + err_path + " )");
  std::ifstream f(err_path, std::ios::binary);
  r.err.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  std::remove(err_path);
  return r;
}

}  // namespace moekit::testing

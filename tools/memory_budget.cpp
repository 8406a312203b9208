#include "memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace moekit::tools {
namespace {

// The first number of a one-line file ("max" or missing: none).
double read_limit(const char* path) {
  std::ifstream f(path);
  std::string word;
  if (!(f >> word) || word == "max") return -1.0;
  try {
    return std::stod(word);
  } catch (...) {
    return -1.0;
  }
}

double mem_available_kib() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string key;
    double kib = 0;
    if (is >> key >> kib && key == "MemAvailable:") return kib;
  }
  return -1.0;
}

}  // namespace

double available_memory_bytes() {
  double avail = mem_available_kib() * 1024.0;
  if (avail <= 0) avail = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  const double limit = read_limit("/sys/fs/cgroup/memory.max");
  const double used = read_limit("/sys/fs/cgroup/memory.current");
  if (limit > 0 && used >= 0 && limit - used < avail) avail = limit - used;
  return avail;
}

std::string format_bytes(double bytes) {
  char buf[48];
  const double gib = bytes / (1024.0 * 1024.0 * 1024.0);
  if (gib >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.1e GiB", gib);
  } else if (gib >= 1.0) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", gib);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  }
  return buf;
}

Status check_memory(std::string_view what, double bytes) {
  const double avail = available_memory_bytes();
  // NOTE: 90%: the estimates count the big buffers only; the rest (code, small
  // tables, the allocator's own overhead) needs some room too.
  if (avail > 0 && bytes > 0.9 * avail) {
    return ResourceExhausted(std::string(what) + " needs about " + format_bytes(bytes) + " of memory, this machine has " +
                             format_bytes(avail) + " available");
  }
  return Status::Ok();
}

double run_memory_bytes(const SyntheticModelSpec& s, int64_t num_requests, int64_t prompt_tokens,
                        int64_t decode_tokens, bool capture) {
  const double L = s.num_layers, E = static_cast<double>(s.num_experts), H = static_cast<double>(s.hidden),
               I = static_cast<double>(s.intermediate), k = s.top_k, Mmax = static_cast<double>(s.max_num_tokens);
  const double R = static_cast<double>(num_requests);
  const double tokens = static_cast<double>(prompt_tokens) + R * static_cast<double>(decode_tokens);
  // Weights: bf16 checkpoint + f32 kernel copy of W13 [E, 2I, H] and W2 [E, H, I];
  // the f32 router gate [E, H] stays resident.
  const double weights = L * E * 3.0 * H * I * (2.0 + 4.0) + L * E * H * 4.0;
  // Schedule: a step holds at least one token, or fills the budget while prompts remain;
  // each decode token is a slice of its own. Step and slice records and one digest per step.
  const double steps = tokens / std::max(Mmax, 1.0) + static_cast<double>(decode_tokens) + R + 1.0;
  const double slices = R * (static_cast<double>(decode_tokens) + 1.0) + steps;
  const double schedule = steps * (32.0 + 8.0) + slices * 32.0 + R * 128.0;
  // Step buffers: h f32, x bf16, logits f32, out bf16, and the kernel's workspace.
  const double step = Mmax * (H * 4.0 + H * 2.0 + E * 4.0 + H * 2.0) + Mmax * k * (2.0 * H + 2.0 * I) * 4.0;
  // Ids per token and layer: held by the capturer, its snapshot, the stored
  // copy and the file bytes, and the copy read back for the replay (i16 each).
  const double ids = capture ? tokens * L * k * 2.0 * 5.0 : 0.0;
  return weights + 2.0 * schedule + step + ids;  // run and replay each build the schedule
}

}  // namespace moekit::tools

// What a command will allocate, against what the machine has: each command
// adds up its big buffers from the sizes it is about to use, before it
// allocates them, and fails with ResourceExhausted (exit 2) naming how much it
// needed, instead of an allocation failing half way.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "moekit/status.h"
#include "synthetic_model.h"

namespace moekit::tools {

// Bytes this process can still get: MemAvailable from /proc/meminfo (else the
// physical memory), capped by a cgroup v2 memory limit when one is set.
double available_memory_bytes();

// ResourceExhausted "<what> needs about 12.3 GiB of memory, this machine has
// 8.0 GiB available" when `bytes` exceeds 90% of available_memory_bytes().
Status check_memory(std::string_view what, double bytes);

// What `moekit run` (and `moekit replay` of its capture) holds at its peak:
// the layers' weights (bf16 checkpoint plus the kernels' f32 copies), the
// schedule, the step buffers and, with capture, the ids of every token
// (captured, snapshot, file bytes and the copy read back for the replay).
double run_memory_bytes(const SyntheticModelSpec& spec, int64_t num_requests, int64_t prompt_tokens,
                        int64_t decode_tokens, bool capture);

// "12.3 GiB", "512.0 MiB", "3.2e+07 GiB".
std::string format_bytes(double bytes);

}  // namespace moekit::tools

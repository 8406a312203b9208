// KernelOptions (config.h): the names each path knob takes, and the one place
// the environment's overrides are read.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

#include "core/kernel_instances.h"
#include "moekit/config.h"

namespace moekit {

namespace {

struct Knob {
  std::string KernelOptions::*field;
  const char* name;  // the field's name
  const char* env;   // the variable that overrides it
  // The values validate() accepts; empty: an instance name (kInstanceKnobs).
  std::array<const char*, 4> values;
};

constexpr std::array<Knob, 11> kKnobs = {{
    {&KernelOptions::sm90_gemm, "sm90_gemm", "MOEKIT_SM90_GEMM", {"reference", "streaming", "cutlass"}},
    {&KernelOptions::sm90_stream, "sm90_stream", "MOEKIT_SM90_STREAM", {}},
    {&KernelOptions::sm90_cutlass, "sm90_cutlass", "MOEKIT_SM90_CUTLASS", {}},
    {&KernelOptions::sm90_fp8_gemm, "sm90_fp8_gemm", "MOEKIT_SM90_FP8_GEMM", {"mma_sync", "cutlass", "streaming"}},
    {&KernelOptions::sm90_fp8_stream, "sm90_fp8_stream", "MOEKIT_SM90_FP8_STREAM", {}},
    {&KernelOptions::sm90_fp8_tile, "sm90_fp8_tile", "MOEKIT_SM90_FP8_TILE", {"m128n128", "m64n128", "m32n128"}},
    {&KernelOptions::sm80_fp8_mma, "sm80_fp8_mma", "MOEKIT_SM80_FP8_MMA", {"e4m3", "f16"}},
    {&KernelOptions::sm90_w4_gemm, "sm90_w4_gemm", "MOEKIT_SM90_W4_GEMM", {"streaming", "mixed", "dequant"}},
    {&KernelOptions::sm90_w4_stream, "sm90_w4_stream", "MOEKIT_SM90_W4_STREAM", {}},
    {&KernelOptions::sm90_w4_tile, "sm90_w4_tile", "MOEKIT_SM90_W4_TILE", {"n128", "n256"}},
    {&KernelOptions::cpu_gemm, "cpu_gemm", "MOEKIT_CPU_GEMM", {"blas", "packed", "packed_bf16"}},
}};

// The knobs that name a kernel instance, checked against the built tables
// (core/kernel_instances.h), so a typo is refused on any machine, not only
// where the CUDA backend is asked.
struct InstanceKnob {
  std::string KernelOptions::*field;
  const char* const* names;
  size_t count;
  const char* also;  // one more accepted value ("off"), or nullptr
};

template <size_t N>
constexpr InstanceKnob instance_knob(std::string KernelOptions::*field, const std::array<const char*, N>& names,
                                     const char* also = nullptr) {
  return {field, names.data(), N, also};
}

constexpr std::array<InstanceKnob, 4> kInstanceKnobs = {{
    instance_knob(&KernelOptions::sm90_stream, kSm90StreamNames),
    instance_knob(&KernelOptions::sm90_cutlass, kSm90CutlassNames),
    instance_knob(&KernelOptions::sm90_fp8_stream, kSm90Fp8StreamNames, "off"),
    instance_knob(&KernelOptions::sm90_w4_stream, kSm90W4StreamNames),
}};

// "" when `v` is one of the knob's names, else the list a message shows.
std::string unknown_instance(const InstanceKnob& k, const std::string& v) {
  std::string list = k.also != nullptr ? k.also : "";
  if (k.also != nullptr && v == k.also) return "";
  for (size_t i = 0; i < k.count; ++i) {
    if (v == k.names[i]) return "";
    list += (list.empty() ? "" : ", ") + std::string(k.names[i]);
  }
  return list;
}

KernelOptions read_environment() {
  KernelOptions env;
  for (const Knob& k : kKnobs) {
    if (const char* v = std::getenv(k.env); v != nullptr) env.*k.field = v;
  }
  return env;
}

std::mutex& environment_mutex() {
  static std::mutex m;
  return m;
}

KernelOptions& environment() {
  static KernelOptions env = read_environment();
  return env;
}

std::atomic<uint64_t> generation{0};

}  // namespace

bool KernelOptions::empty() const {
  for (const Knob& k : kKnobs) {
    if (!(this->*k.field).empty()) return false;
  }
  return true;
}

Status KernelOptions::set(std::string_view name, std::string value) {
  std::string names;
  for (const Knob& k : kKnobs) {
    if (name == k.name) {
      this->*k.field = std::move(value);
      return Status::Ok();
    }
    names += (names.empty() ? "" : ", ") + std::string(k.name);
  }
  return InvalidArgument("kernel option '" + std::string(name) + "': unknown (options: " + names + ")");
}

Status KernelOptions::validate() const {
  for (const Knob& k : kKnobs) {
    const std::string& v = this->*k.field;
    if (v.empty() || k.values[0] == nullptr) continue;
    std::string expected;
    for (const char* allowed : k.values) {
      if (allowed == nullptr) break;
      if (v == allowed) {
        expected.clear();
        break;
      }
      expected += expected.empty() ? allowed : std::string(", ") + allowed;
    }
    if (!expected.empty()) {
      return InvalidArgument(std::string("config.kernel.") + k.name + " (or " + k.env + "): '" + v +
                             "' is not one of " + expected);
    }
  }
  for (const InstanceKnob& ik : kInstanceKnobs) {
    const std::string& v = this->*ik.field;
    if (v.empty()) continue;
    if (const std::string names = unknown_instance(ik, v); !names.empty()) {
      const Knob& k = *std::find_if(kKnobs.begin(), kKnobs.end(), [&](const Knob& x) { return x.field == ik.field; });
      return InvalidArgument(std::string("config.kernel.") + k.name + " (or " + k.env + "): '" + v +
                             "' is not one of the built instances: " + names);
    }
  }
  return Status::Ok();
}

std::string KernelOptions::to_string() const {
  std::string out;
  for (const Knob& k : kKnobs) {
    const std::string& v = this->*k.field;
    if (!v.empty()) out += (out.empty() ? "" : ", ") + std::string(k.name) + "=" + v;
  }
  return out;
}

const KernelOptions& kernel_options_environment() {
  const std::lock_guard<std::mutex> lock(environment_mutex());
  return environment();
}

const KernelOptions& kernel_options_or_environment(const KernelOptions* in_effect) {
  return in_effect != nullptr ? *in_effect : kernel_options_environment();
}

const std::string& kernel_option_in_effect(const KernelOptions& config, std::string KernelOptions::*field) {
  const std::string& env = kernel_options_environment().*field;
  return env.empty() ? config.*field : env;
}

KernelOptions kernel_options_in_effect(const KernelOptions& config) {
  KernelOptions out = config;
  const std::lock_guard<std::mutex> lock(environment_mutex());
  const KernelOptions& env = environment();
  for (const Knob& k : kKnobs) {
    if (!(env.*k.field).empty()) out.*k.field = env.*k.field;
  }
  return out;
}

void reload_kernel_options_environment() {
  const std::lock_guard<std::mutex> lock(environment_mutex());
  environment() = read_environment();
  generation.fetch_add(1, std::memory_order_release);
}

uint64_t kernel_options_environment_generation() { return generation.load(std::memory_order_acquire); }

}  // namespace moekit

// Fuzz target: the capture-file reader (read_capture over a parsed
// safetensors file). What it accepts must be a consistent capture: ids in
// [0, E) or the sentinel -1, each request's tensor [tokens, layers, k], router
// weights (when present) of the same shape, first_generated_token -1 or >= first_token.
#include <cstddef>
#include <cstdint>

#include "capture/capture_file.h"
#include "moekit/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moekit;
  StatusOr<io::SafetensorsFile> f = io::SafetensorsFile::parse(data, size, "fuzz.safetensors");
  if (!f.ok()) return 0;
  StatusOr<CaptureSet> set = read_capture(*f);
  if (!set.ok()) return 0;
  const CaptureInfo& info = set->info;
  if (info.num_moe_layers() < 1 || info.top_k() < 1 || info.num_experts < info.top_k()) __builtin_trap();
  for (const RequestCapture& r : set->requests) {
    const std::vector<int64_t> want = {r.num_tokens(), info.num_moe_layers(), info.top_k()};
    if (r.ids.dtype() != DType::kI16 || r.ids.shape() != want || r.first_token < 0) __builtin_trap();
    if (r.first_generated_token != -1 && r.first_generated_token < r.first_token) __builtin_trap();
    if (info.router_weights_dtype.has_value() != !r.router_weights.shape().empty()) __builtin_trap();
    if (info.router_weights_dtype && (r.router_weights.shape() != want || r.router_weights.dtype() != *info.router_weights_dtype)) {
      __builtin_trap();
    }
    const int16_t* ids = r.ids.data<int16_t>();
    for (int64_t i = 0; i < r.ids.numel(); ++i) {
      if (ids[i] != kUnwrittenExpertId && (ids[i] < 0 || ids[i] >= info.num_experts)) __builtin_trap();
    }
  }
  return 0;
}

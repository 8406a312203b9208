// The capture-file reader over a safetensors file already open (or parsed
// from memory): what read_capture_file() does after opening, shared with the
// fuzz target (fuzz/fuzz_capture_file.cpp).
#pragma once

#include "moekit/capture.h"
#include "moekit/io.h"

namespace moekit {

StatusOr<CaptureSet> read_capture(const io::SafetensorsFile& file, const CaptureReadOptions& options = {});

}  // namespace moekit

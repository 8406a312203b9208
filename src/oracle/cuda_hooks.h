// The seam between the backend registry and the CUDA backend. Only declared in
// CUDA builds; defined in src/oracle/cuda_hooks.cpp.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <vector>

#include "moekit/oracle.h"

namespace moekit::cuda {

// Appends the CUDA backends this platform can run, highest priority first
// (e.g. "cuda_sm90" = [Sm90Monolithic, Sm90Modular] when an sm_90 device is
// present). Called by backend_registry() before "cpu" is appended.
void append_backends(const Platform& platform, std::vector<Backend>* registry);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

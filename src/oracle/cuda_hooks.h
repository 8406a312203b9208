// The seam between the backend-neutral code (oracle, layer) and the CUDA
// backend. Only declared in CUDA builds; the CUDA backend defines these in
// src/oracle/cuda_hooks.cpp.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <vector>

#include "moekit/oracle.h"
#include "moekit/routing.h"

namespace moekit::cuda {

// Appends the CUDA backends this platform can run, highest priority first
// (e.g. "cuda_sm90" = [Sm90Monolithic, Sm90Modular] when an sm_90 device is
// present). Called by backend_registry() before "cpu" is appended.
void append_backends(const Platform& platform, std::vector<Backend>* registry);

// Routing for modular kernels whose device is a CUDA device: the same contract
// as route_cpu() (validate first, then write), enqueued on `stream`.
Status route(const RoutingConfig& config, const RoutingArgs& args, Stream stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

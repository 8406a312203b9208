// A test-only Communicator whose N ranks are threads sharing ONE CUDA device:
// the GPU expert-parallel path (ExpertParallelLayer over device buffers) runs
// on a single GPU, without NCCL. Each collective waits for the caller's
// stream, meets the other ranks on the host, and copies device to device on
// the caller's stream (whole max_rows blocks, as the NCCL communicator does).
// Eager only: its host waits cannot be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <vector>

#include "moekit/comm.h"
#include "moekit/status.h"

namespace moekit::cuda_test {

class DeviceLoopbackGroup;

// One group of `size` ranks on cuda:`device`; make_rank(r) once per rank (any thread).
std::shared_ptr<DeviceLoopbackGroup> make_device_loopback_group(int size, int device);
std::unique_ptr<Communicator> make_device_loopback_rank(const std::shared_ptr<DeviceLoopbackGroup>& group, int rank);

// Runs body(rank, comm, stream) for n ranks, each in its own thread on cuda:0
// with its own device-loopback communicator and non-blocking stream; each
// rank's status.
std::vector<Status> run_device_loopback_ranks(int n,
                                              const std::function<Status(int, Communicator&, cudaStream_t)>& body);

}  // namespace moekit::cuda_test

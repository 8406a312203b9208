// all_gather of host memory over any Communicator: direct for a host
// (loopback) group, staged through device memory for a GPU (NCCL) group.
// For the rare host-side agreements (configs, verdicts, load counters), not
// for a forward: on a GPU group it waits for the collective (bounded by the
// communicator's timeout through barrier()).
#pragma once

#include <cstddef>

#include "moekit/comm.h"
#include "moekit/status.h"

namespace moekit::dispatch {

// recv [size() * bytes] (host): rank r's `bytes` from its `send` (host) land at r * bytes. Collective.
Status all_gather_host(Communicator& comm, const void* send, void* recv, size_t bytes);

}  // namespace moekit::dispatch

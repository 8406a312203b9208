// Runs N ranks as threads over one loopback communicator.
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "moekit/comm.h"

namespace moekit::testing {

// Calls body(rank, comm) on N threads joined by one loopback group; returns
// when every thread has. A rank that fails to join records the status.
inline std::vector<Status> run_ranks(int n, const std::function<Status(int, Communicator&)>& body,
                                     CommOptions options = {std::chrono::milliseconds(20000)}) {
  const CommUniqueId id = loopback_unique_id();
  std::vector<Status> result(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      StatusOr<std::unique_ptr<Communicator>> comm = create_loopback_communicator(id, n, r, options);
      result[r] = comm.ok() ? body(r, **comm) : comm.status();
    });
  }
  for (auto& t : threads) t.join();
  return result;
}

}  // namespace moekit::testing

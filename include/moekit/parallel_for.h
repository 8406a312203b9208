// parallel_for: split [0, n) into chunks and run them on a persistent pool of
// CPU threads (the caller's thread works too). Used by every CPU kernel.
//
//   parallel_for(n, grain, [&](int64_t begin, int64_t end) { ... });
//
// - f(begin, end) is called on disjoint chunks that cover [0, n) exactly once;
//   each chunk has at least `grain` items (except the last). Work per item must
//   not depend on which chunk it lands in if the result is to be deterministic.
// - Returns when every chunk is done. f must not throw.
// - Runs inline (one call f(0, n)) when n <= grain, when the pool has a single
//   thread, or when called from inside another parallel_for (no nested pools,
//   no deadlock). Concurrent calls from independent threads take turns.
// - Pool size: MOEKIT_NUM_THREADS if set (in [1, 1024]), else std::thread::hardware_concurrency().
// - The pool is moekit's own threads, or (use_openmp_runtime) the threads of an
//   OpenMP runtime the process already runs, e.g. torch's.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "moekit/status.h"

namespace moekit {

// Threads parallel_for may use, the caller's included.
int parallel_num_threads();
// MOEKIT_NUM_THREADS, when set, must be an integer in [1, 1024]; anything
// else ("abc", "0", "-4", "2x", "99999") is InvalidArgument naming it. The
// pool falls back to the hardware count on such a value, so the CLI and the
// CPU backend's prepare check it first.
Status check_num_threads_env();
// Remakes the pool with this many threads (in [1, 1024]), after the
// parallel_for calls in flight; not from inside one.
Status set_parallel_num_threads(int num_threads);

// Runs parallel_for's chunks on the worker threads of an OpenMP runtime that is
// already loaded in this process (`library`: its file name or path, as the
// process loaded it; any runtime with libgomp's GOMP_parallel entry: GNU
// libgomp, LLVM's and Intel's libomp). Inside a program whose own work is
// OpenMP (torch's CPU ops), one set of threads then runs both: moekit's
// chunks do not wait behind the other pool's threads spinning on the same
// cores, nor they behind moekit's. The thread count stays
// parallel_num_threads(). An empty `library` goes back to moekit's own pool.
// NotFound when the library is not loaded, InvalidArgument when it has no
// GOMP_parallel; the pool in use is then unchanged. Not from inside a parallel_for.
Status use_openmp_runtime(const std::string& library);
// The library use_openmp_runtime bound, or "" for moekit's own pool.
std::string openmp_runtime();

namespace detail {
using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end);
void parallel_for_impl(int64_t n, int64_t grain, ChunkFn fn, void* ctx);
}  // namespace detail

template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  using Fn = std::remove_reference_t<F>;
  detail::parallel_for_impl(
      n, grain < 1 ? 1 : grain,
      [](void* ctx, int64_t begin, int64_t end) { (*static_cast<Fn*>(ctx))(begin, end); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace moekit

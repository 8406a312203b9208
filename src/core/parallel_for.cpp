#include "moekit/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <dlfcn.h>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/printable.h"

namespace moekit {
namespace {

// One parallel_for call in flight. Lives on the caller's stack; the caller
// waits until no worker touches it any more.
struct Job {
  detail::ChunkFn fn = nullptr;
  void* ctx = nullptr;
  int64_t n = 0;
  int64_t chunk = 0;
  int64_t num_chunks = 0;
  std::atomic<int64_t> next{0};  // next chunk to hand out
  std::atomic<int64_t> done{0};  // chunks finished
  int workers_in = 0;            // workers holding a pointer to this job (guarded by Pool::mu_)
};

// True on pool workers and on a caller while its parallel_for runs: a nested
// call then runs inline.
thread_local bool t_in_parallel = false;

void run_chunks(Job& job) {
  for (int64_t c = job.next.fetch_add(1); c < job.num_chunks; c = job.next.fetch_add(1)) {
    const int64_t begin = c * job.chunk;
    const int64_t end = std::min(job.n, begin + job.chunk);
    job.fn(job.ctx, begin, end);
    job.done.fetch_add(1);
  }
}

// libgomp's ABI for `#pragma omp parallel` (GCC emits calls to it; LLVM's and
// Intel's runtimes export it too): fn(data) on num_threads threads, the caller
// one of them, returning after all have.
using GompParallel = void (*)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);

struct OpenMpRuntime {
  std::string library;
  GompParallel parallel = nullptr;
};

void run_chunks_on_omp_thread(void* job) {
  const bool outer = t_in_parallel;
  t_in_parallel = true;
  run_chunks(*static_cast<Job*>(job));
  t_in_parallel = outer;
}

// NOTE: the same bound as `moekit run --threads` (tools/cmd_run.cpp): more
// threads than this is a typo, not a machine.
constexpr long kMaxThreads = 1024;

// MOEKIT_NUM_THREADS: 0 when unset, its count when it is one, -1 otherwise.
long threads_in_env() {
  const char* s = std::getenv("MOEKIT_NUM_THREADS");
  if (s == nullptr) return 0;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);  // atoi's overflow is undefined; strtol's is not
  return end != s && *end == '\0' && errno == 0 && v >= 1 && v <= kMaxThreads ? v : -1;
}

// A bad value falls back to the hardware count here (parallel_for cannot
// fail); check_num_threads_env() refuses it where a Status can be returned.
int threads_from_env() {
  if (const long v = threads_in_env(); v > 0) return static_cast<int>(v);
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

class Pool {
 public:
  explicit Pool(int num_threads) : num_threads_(num_threads) {
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int num_threads() const { return num_threads_; }

  void run(Job& job) {
    std::lock_guard<std::mutex> turn(caller_mu_);  // one job at a time
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = &job;
      ++generation_;
    }
    work_cv_.notify_all();
    run_chunks(job);
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return job.done.load() == job.num_chunks && job.workers_in == 0; });
    job_ = nullptr;  // late-waking workers find nothing to do
  }

 private:
  void worker_loop() {
    t_in_parallel = true;
    uint64_t seen = 0;
    for (;;) {
      Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lk(mu_);
        work_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
        if (job == nullptr) continue;
        ++job->workers_in;
      }
      run_chunks(*job);
      {
        std::lock_guard<std::mutex> lk(mu_);
        --job->workers_in;
      }
      done_cv_.notify_all();
    }
  }

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex caller_mu_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // bumped per job (guarded by mu_)
  Job* job_ = nullptr;       // guarded by mu_
  bool stop_ = false;        // guarded by mu_
};

// The pool, made on first use and remade by set_parallel_num_threads, and the
// OpenMP runtime that runs its jobs instead when one is bound (the pool then
// only says how many threads): parallel_for holds the lock shared for its job,
// a change holds it alone.
std::shared_mutex g_pool_mu;
std::unique_ptr<Pool> g_pool;
OpenMpRuntime g_runtime;

// The pool made if need be, held (shared) as long as the lock lives.
std::shared_lock<std::shared_mutex> lock_pool() {
  {
    std::shared_lock<std::shared_mutex> lk(g_pool_mu);
    if (g_pool != nullptr) return lk;
  }
  {
    std::unique_lock<std::shared_mutex> lk(g_pool_mu);
    if (g_pool == nullptr) g_pool = std::make_unique<Pool>(threads_from_env());
  }
  return std::shared_lock<std::shared_mutex>(g_pool_mu);
}

}  // namespace

Status check_num_threads_env() {
  if (threads_in_env() >= 0) return Status::Ok();
  return InvalidArgument("MOEKIT_NUM_THREADS='" + printable(std::getenv("MOEKIT_NUM_THREADS"), 40) +
                         "': must be an integer in [1, " + std::to_string(kMaxThreads) +
                         "] (unset, every hardware thread)");
}

int parallel_num_threads() {
  const auto lk = lock_pool();
  return g_pool->num_threads();
}

Status set_parallel_num_threads(int num_threads) {
  if (num_threads < 1 || num_threads > kMaxThreads) {
    return InvalidArgument("num_threads: must be in [1, " + std::to_string(kMaxThreads) + "], got " +
                           std::to_string(num_threads));
  }
  if (t_in_parallel) return FailedPrecondition("num_threads: cannot be changed from inside a parallel_for");
  std::unique_lock<std::shared_mutex> lk(g_pool_mu);  // waits for the jobs in flight
  if (g_pool == nullptr || g_pool->num_threads() != num_threads) g_pool = std::make_unique<Pool>(num_threads);
  return Status::Ok();
}

Status use_openmp_runtime(const std::string& library) {
  if (t_in_parallel) return FailedPrecondition("openmp runtime: cannot be changed from inside a parallel_for");
  OpenMpRuntime runtime{library, nullptr};
  if (!library.empty()) {
    // RTLD_NOLOAD: the process's own copy or nothing (a second copy would be a second pool).
    void* handle = dlopen(library.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) {
      return NotFound("openmp runtime '" + printable(library, 200) + "': not loaded in this process");
    }
    runtime.parallel = reinterpret_cast<GompParallel>(dlsym(handle, "GOMP_parallel"));
    dlclose(handle);  // it stays loaded: the process had it before, and holds it
    if (runtime.parallel == nullptr) {
      return InvalidArgument("openmp runtime '" + printable(library, 200) +
                             "': has no GOMP_parallel (not an OpenMP runtime with libgomp's interface)");
    }
  }
  std::unique_lock<std::shared_mutex> lk(g_pool_mu);  // waits for the jobs in flight
  g_runtime = std::move(runtime);
  return Status::Ok();
}

std::string openmp_runtime() {
  std::shared_lock<std::shared_mutex> lk(g_pool_mu);
  return g_runtime.library;
}

namespace detail {

void parallel_for_impl(int64_t n, int64_t grain, ChunkFn fn, void* ctx) {
  if (n <= grain || t_in_parallel) {
    fn(ctx, 0, n);
    return;
  }
  const auto lk = lock_pool();
  Pool& p = *g_pool;
  if (p.num_threads() == 1) {
    fn(ctx, 0, n);
    return;
  }
  // A few chunks per thread balance uneven rows; never below `grain`.
  const int64_t target_chunks = static_cast<int64_t>(p.num_threads()) * 4;
  const int64_t chunk = std::max(grain, (n + target_chunks - 1) / target_chunks);
  Job job;
  job.fn = fn;
  job.ctx = ctx;
  job.n = n;
  job.chunk = chunk;
  job.num_chunks = (n + chunk - 1) / chunk;
  if (g_runtime.parallel != nullptr) {
    g_runtime.parallel(run_chunks_on_omp_thread, &job, static_cast<unsigned>(p.num_threads()), 0);
    return;
  }
  t_in_parallel = true;
  p.run(job);
  t_in_parallel = false;
}

}  // namespace detail
}  // namespace moekit

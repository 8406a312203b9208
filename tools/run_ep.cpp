#include "run_ep.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "batch_schedule.h"
#include "run_capture.h"
#include "moekit/capture.h"
#include "moekit/comm.h"
#include "moekit/device_buffer.h"
#include "moekit/ep_layer.h"
#include "moekit/eplb.h"
#include "moekit/layer.h"
#include "moekit/platform.h"

namespace moekit::tools {
namespace {

using Clock = std::chrono::steady_clock;

// Rows [first, end) of a step that one rank holds.
struct RankRows {
  int64_t first = 0, end = 0;
};
RankRows rows_of_rank(int64_t m, int ranks, int r) { return {m * r / ranks, m * (r + 1) / ranks}; }

// (request, position) of every row of a step.
std::vector<std::pair<int, int64_t>> row_tokens(const Step& step) {
  std::vector<std::pair<int, int64_t>> rows;
  for (const StepSlice& s : step.slices) {
    for (int64_t t = 0; t < s.num_tokens; ++t) rows.emplace_back(s.request, s.first_position + t);
  }
  return rows;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// The output digest of the single-rank run (cmd_run.cpp), over N ranks: FNV-1a
// of the last layer's bf16 outputs in row order, step after step. A step's rows
// are split over the ranks in order, so the ranks add their rows in turn
// (rank 0's, then rank 1's, ...) without gathering them.
class DigestChain {
 public:
  DigestChain(int ranks, size_t steps) : ranks_(ranks), steps_(steps, 0xcbf29ce484222325ull) {}
  // Rank `rank`'s rows of step `step`; waits for the ranks before it.
  Status add(size_t step, int rank, const void* data, size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t turn = static_cast<uint64_t>(step) * ranks_ + rank;
    cv_.wait(lock, [&] { return aborted_ || next_ == turn; });
    if (aborted_) return DeadlineExceeded("rank " + std::to_string(rank) + ": another rank failed before its turn");
    total_ = fnv(total_, data, n);
    steps_[step] = fnv(steps_[step], data, n);
    ++next_;
    cv_.notify_all();
    return Status::Ok();
  }
  void abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }
  uint64_t total() const { return total_; }
  const std::vector<uint64_t>& steps() const { return steps_; }

 private:
  static uint64_t fnv(uint64_t h, const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  const int ranks_;
  uint64_t next_ = 0;
  bool aborted_ = false;
  uint64_t total_ = 0xcbf29ce484222325ull;
  std::vector<uint64_t> steps_;  // per step, from the offset basis (output_digest's definition)
};

// What one pass of the job leaves per rank.
struct PassResult {
  std::vector<uint64_t> step_digests;               // per step: FNV-1a of this rank's last-layer bf16 outputs
  std::vector<std::vector<int16_t>> captured;       // per (step, layer): this rank's [rows, k] logical ids
  std::vector<int64_t> computed_pairs;              // per rank, summed over layers (gathered)
  double seconds = 0;
};

// One rank's state: its layers (also as a Model: one experts workspace for all) and step buffers.
struct Rank {
  int rank = 0;
  Device device = Device::cpu();  // the communicator's: a GPU rank's layer takes device tensors
  std::vector<std::shared_ptr<ExpertParallelLayer>> layers;
  std::unique_ptr<Model> model;
  std::vector<float> h;  // [max_rows, H] residual stream
  HostTensor x, logits, out, ids;
  DeviceBuffer dx, dlogits, dout, dids;  // GPU ranks: the same four on the device
};

// The buffer a layer reads or writes: the host tensor, or its device twin on a GPU rank.
void* layer_side(const Rank& me, const HostTensor& host, const DeviceBuffer& dev) {
  return me.device.type == DeviceType::kCuda ? dev.data() : const_cast<void*>(host.view().data);
}

Status to_layer_side(const Rank& me, const HostTensor& host, const DeviceBuffer& dev, size_t bytes) {
  if (me.device.type != DeviceType::kCuda || bytes == 0) return Status::Ok();
  return DeviceBuffer::copy_bytes(dev.data(), me.device, host.view().data, Device::cpu(), bytes);
}

Status from_layer_side(const Rank& me, HostTensor& host, const DeviceBuffer& dev, size_t bytes) {
  if (me.device.type != DeviceType::kCuda || bytes == 0) return Status::Ok();
  return DeviceBuffer::copy_bytes(host.view().data, Device::cpu(), dev.data(), me.device, bytes);
}

// The rank's layers as a Model (MoE layers at 2l + 1, as in the synthetic model).
Status into_model(Rank& me) {
  me.model = std::make_unique<Model>();
  for (size_t l = 0; l < me.layers.size(); ++l) {
    MOEKIT_RETURN_IF_ERROR(me.model->add_layer(me.layers[l], static_cast<int>(2 * l + 1)));
  }
  return Status::Ok();
}

// One pass over every step. `forced`: per (step, layer) ids to replay, or null.
Status run_pass(const SyntheticModelSpec& spec, const std::vector<SyntheticLayer>& model, const std::vector<Step>& steps,
                int ranks, Rank& me, const std::vector<std::vector<int16_t>>* forced, PassResult& result,
                DigestChain* chain = nullptr) {
  const int64_t H = spec.hidden, E = spec.num_experts, k = spec.top_k;
  const int L = static_cast<int>(model.size());
  for (auto& l : me.layers) l->reset_load();
  const auto t0 = Clock::now();
  for (size_t si = 0; si < steps.size(); ++si) {
    const auto tokens = row_tokens(steps[si]);
    const RankRows rr = rows_of_rank(steps[si].num_tokens, ranks, me.rank);
    const int64_t m = rr.end - rr.first;
    for (int64_t t = 0; t < m; ++t) {
      embed_token(spec, tokens[rr.first + t].first, tokens[rr.first + t].second, &me.h[t * H]);
    }
    for (int l = 0; l < L; ++l) {
      LayerForwardArgs a;
      a.hidden = TensorView::contiguous(layer_side(me, me.x, me.dx), DType::kBF16, {m, H}, me.device);
      a.out = TensorView::contiguous(layer_side(me, me.out, me.dout), DType::kBF16, {m, H}, me.device);
      HostTensor forced_i32;
      if (m > 0) {
        rmsnorm_to_bf16(me.h.data(), m, H, me.x.data<uint16_t>());
        router_logits(me.x.data<uint16_t>(), model[l].gate.data<float>(), m, E, H, me.logits.data<float>());
        MOEKIT_RETURN_IF_ERROR(to_layer_side(me, me.x, me.dx, m * H * 2));
        MOEKIT_RETURN_IF_ERROR(to_layer_side(me, me.logits, me.dlogits, m * E * 4));
        a.router_logits = TensorView::contiguous(layer_side(me, me.logits, me.dlogits), DType::kF32, {m, E}, me.device);
        a.routing_replay_out = TensorView::contiguous(layer_side(me, me.ids, me.dids), DType::kI16, {m, k}, me.device);
        if (forced != nullptr) {
          const std::vector<int16_t>& f = (*forced)[si * L + l];
          forced_i32 = HostTensor(DType::kI32, {m, k});
          for (int64_t i = 0; i < m * k; ++i) forced_i32.data<int32_t>()[i] = f[i];
          a.forced_ids = forced_i32.view();
        }
      }
      MOEKIT_RETURN_IF_ERROR(me.layers[l]->forward(a));
      MOEKIT_RETURN_IF_ERROR(from_layer_side(me, me.out, me.dout, m * H * 2));
      MOEKIT_RETURN_IF_ERROR(from_layer_side(me, me.ids, me.dids, m * k * 2));
      const int16_t* ids = me.ids.data<int16_t>();
      result.captured.emplace_back(ids, ids + m * k);
      const uint16_t* out = me.out.data<uint16_t>();
      for (int64_t i = 0; i < m * H; ++i) me.h[i] += bf16_bits_to_f32(out[i]);
    }
    result.step_digests.push_back(fnv1a(0xcbf29ce484222325ull, me.out.data<uint16_t>(), m * H * 2));
    if (chain != nullptr) MOEKIT_RETURN_IF_ERROR(chain->add(si, me.rank, me.out.data<uint16_t>(), m * H * 2));
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  result.computed_pairs.assign(ranks, 0);
  for (auto& l : me.layers) {
    MOEKIT_ASSIGN_OR_RETURN(std::vector<int64_t> pairs, l->gather_computed_pairs());
    for (int r = 0; r < ranks; ++r) result.computed_pairs[r] += pairs[r];
  }
  return Status::Ok();
}

void print_rank_load(const char* when, const std::vector<int64_t>& pairs) {
  int64_t mx = 0, sum = 0;
  for (int64_t p : pairs) mx = std::max(mx, p), sum += p;
  const double mean = static_cast<double>(sum) / static_cast<double>(pairs.size());
  std::printf("load %-7s (token-slots computed per rank, all layers):", when);
  for (size_t r = 0; r < pairs.size(); ++r) std::printf(" rank%zu %" PRId64, r, pairs[r]);
  std::printf("  max/mean %.3f\n", mean > 0 ? static_cast<double>(mx) / mean : 0.0);
}

}  // namespace

Status run_expert_parallel(const EpRunOptions& o) {
  const SyntheticModelSpec& spec = o.spec;
  const int N = o.ranks;
  if (N < 2) return InvalidArgument("--ep must be >= 2 for an expert-parallel run, got " + std::to_string(N));
  if (spec.num_experts < N) {
    return InvalidArgument("--ep " + std::to_string(N) + " ranks need at least as many experts (--experts " +
                           std::to_string(spec.num_experts) + ")");
  }
  const int64_t per_rank = (spec.max_num_tokens + N - 1) / N;
  // One GPU per rank over NCCL when the machine has them; else host ranks.
  const Platform& platform = Platform::probe();
  const bool on_gpus = o.backend != "cpu" && nccl_built() && platform.has_sm90() &&
                       static_cast<int>(platform.cuda_devices.size()) >= N;
  if (!on_gpus && o.backend != "auto" && o.backend != "cpu") {
    return InvalidArgument("--backend " + o.backend + " with --ep " + std::to_string(N) + ": the ranks run on the host " +
                           "(loopback, the cpu backend) here; device ranks need " + std::to_string(N) +
                           " sm_90 GPUs and a build with NCCL. Give --backend cpu or auto");
  }
  MoeConfig config = synthetic_config(spec, on_gpus ? o.backend : "cpu");
  config.max_num_tokens = per_rank;
  config.parallel.ep_size = config.parallel.dp_size = N;
  config.parallel.all2all = All2AllBackend::kAuto;
  config.parallel.enable_eplb = true;
  config.needs_capture = config.needs_replay = true;
  MOEKIT_RETURN_IF_ERROR(config.validate());
  const int64_t slots = o.redundant_slots < 0 ? (spec.num_experts + N - 1) / N * N + N
                                              : spec.num_experts + o.redundant_slots;

  const std::vector<Request> requests = make_requests(o.num_requests, o.prompt_tokens, o.decode_tokens, spec.seed);
  const std::vector<Step> steps = schedule(requests, spec.max_num_tokens);
  int64_t total_tokens = 0;
  for (const Step& s : steps) total_tokens += s.num_tokens;
  std::printf("moekit run --ep %d: synthetic MoE model, seed %" PRIu64 ", %d %s\n", N, spec.seed, N,
              on_gpus ? "GPU ranks (threads, one GPU each, NCCL)" : "loopback ranks (threads, host memory)");
  std::printf("config:   %d MoE layers, %s\n", spec.num_layers, config.to_string().c_str());
  std::printf("batch:    %d requests, %zu steps of <= %" PRId64 " tokens (<= %" PRId64 " per rank), %" PRId64
              " tokens\n",
              o.num_requests, steps.size(), spec.max_num_tokens, per_rank, total_tokens);
  std::fflush(stdout);
  std::vector<SyntheticLayer> model;
  for (int l = 0; l < spec.num_layers; ++l) model.push_back(build_synthetic_layer(spec, l));

  std::vector<PassResult> before(N), after(N), replayed(N);
  std::vector<Status> status(N);
  std::string dispatch, placement_after;
  size_t layer_workspace = 0, model_workspace = 0;  // rank 0's, after EPLB
  std::mutex mu;
  CommUniqueId id = loopback_unique_id();
  if (on_gpus) {
    MOEKIT_ASSIGN_OR_RETURN(id, nccl_unique_id());
  }
  DigestChain chain(N, steps.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r) {
    threads.emplace_back([&, r] {
      // Nothing may leave a rank's thread: an exception there would end the
      // process (std::terminate); it becomes that rank's error instead.
      try {
      status[r] = [&]() -> Status {
        Rank me;
        me.rank = r;
        std::unique_ptr<Communicator> comm;
        if (on_gpus) {
          me.device = Device::cuda(r);
          MOEKIT_RETURN_IF_ERROR(set_current_cuda_device(r));
          MOEKIT_ASSIGN_OR_RETURN(comm, create_nccl_communicator(id, N, r, me.device));
        } else {
          MOEKIT_ASSIGN_OR_RETURN(comm, create_loopback_communicator(id, N, r));
        }
        MoeConfig rc = config;
        rc.parallel.ep_rank = rc.parallel.dp_rank = r;
        for (int l = 0; l < spec.num_layers; ++l) {
          MOEKIT_ASSIGN_OR_RETURN(auto layer, ExpertParallelLayer::create(rc, model[l].weights(), *comm));
          me.layers.push_back(std::move(layer));
        }
        MOEKIT_RETURN_IF_ERROR(into_model(me));
        me.h.resize(per_rank * spec.hidden);
        me.x = HostTensor(DType::kBF16, {per_rank, spec.hidden});
        me.logits = HostTensor(DType::kF32, {per_rank, spec.num_experts});
        me.out = HostTensor(DType::kBF16, {per_rank, spec.hidden});
        me.ids = HostTensor(DType::kI16, {per_rank, spec.top_k});
        if (on_gpus) {
          for (auto [buf, host] : {std::pair{&me.dx, &me.x}, std::pair{&me.dlogits, &me.logits},
                                   std::pair{&me.dout, &me.out}, std::pair{&me.dids, &me.ids}}) {
            MOEKIT_ASSIGN_OR_RETURN(*buf, DeviceBuffer::allocate(me.device, host->view().nbytes()));
          }
        }
        MOEKIT_RETURN_IF_ERROR(run_pass(spec, model, steps, N, me, nullptr, before[r]));
        // EPLB: plan every layer from the group's measured load, move the weights
        // (GPU ranks: a layer created on the plan, and the model's layers share one
        // workspace again; the plan has more slots per rank, so rebalance() would
        // rebuild each layer's experts stage with a workspace of its own).
        for (int l = 0; l < spec.num_layers; ++l) {
          MOEKIT_ASSIGN_OR_RETURN(std::vector<int64_t> load, me.layers[l]->gather_expert_load());
          EplbOptions opt;
          opt.num_physical_slots = slots;
          opt.num_groups = spec.num_groups;
          MOEKIT_ASSIGN_OR_RETURN(ExpertPlacement plan, plan_eplb(load, N, opt));
          if (on_gpus) {
            MOEKIT_ASSIGN_OR_RETURN(me.layers[l], ExpertParallelLayer::create(rc, model[l].weights(), *comm, &plan));
          } else {
            MOEKIT_RETURN_IF_ERROR(me.layers[l]->rebalance(plan));
          }
        }
        if (on_gpus) MOEKIT_RETURN_IF_ERROR(into_model(me));  // the new layers share a workspace again
        MOEKIT_RETURN_IF_ERROR(run_pass(spec, model, steps, N, me, nullptr, after[r], &chain));
        MOEKIT_RETURN_IF_ERROR(run_pass(spec, model, steps, N, me, &after[r].captured, replayed[r]));
        if (r == 0) {
          std::lock_guard<std::mutex> lock(mu);
          layer_workspace = me.model->layer(0).workspace_bytes();
          model_workspace = me.model->workspace_bytes();
          dispatch = std::string(me.layers[0]->dispatch_name()) + " (" + me.layers[0]->dispatch_reason() + ")";
          placement_after = me.layers[0]->placement().to_string();
        }
        return Status::Ok();
      }();
      } catch (const std::bad_alloc&) {
        status[r] = ResourceExhausted("rank " + std::to_string(r) + ": out of memory (an allocation failed)");
      } catch (const std::exception& e) {
        status[r] = Internal("rank " + std::to_string(r) + ": " + e.what());
      } catch (...) {
        status[r] = Internal("rank " + std::to_string(r) + ": an unknown exception");
      }
      if (!status[r].ok()) chain.abort();
    });
  }
  for (auto& t : threads) t.join();
  // The first rank's own failure, before the others' consequences of it
  // (a collective that timed out waiting for it, an aborted digest).
  for (const bool consequences : {false, true}) {
    for (int r = 0; r < N; ++r) {
      const StatusCode c = status[r].code();
      const bool follows = c == StatusCode::kDeadlineExceeded;
      if (!status[r].ok() && follows == consequences) {
        return Status(c, "--ep rank " + std::to_string(r) + ": " + status[r].message());
      }
    }
  }
  std::printf("dispatch: %s\n", dispatch.c_str());
  std::printf("workspace: %.1f MiB per layer, %.1f MiB for rank 0's %d layers (they share one)\n",
              static_cast<double>(layer_workspace) / (1 << 20), static_cast<double>(model_workspace) / (1 << 20),
              spec.num_layers);
  std::printf("run:      contiguous placement %.3f s; after EPLB %.3f s; replay %.3f s (%" PRId64 " tokens x %d layers)\n",
              before[0].seconds, after[0].seconds, replayed[0].seconds, total_tokens, spec.num_layers);
  print_rank_load("before", before[0].computed_pairs);
  print_rank_load("after", after[0].computed_pairs);
  std::printf("eplb:     %" PRId64 " physical slots for %" PRId64 " experts; layer 0 after: %s\n", slots,
              spec.num_experts, placement_after.c_str());
  bool same_out = true, same_ids = true, replay_out = true, replay_ids = true, first_layer_ids = true;
  int64_t ids_equal = 0, ids_total = 0;
  const size_t L = static_cast<size_t>(spec.num_layers);
  for (int r = 0; r < N; ++r) {
    same_out &= before[r].step_digests == after[r].step_digests;
    same_ids &= before[r].captured == after[r].captured;
    replay_out &= replayed[r].step_digests == after[r].step_digests;
    replay_ids &= replayed[r].captured == after[r].captured;
    for (size_t i = 0; i < after[r].captured.size(); ++i) {
      const std::vector<int16_t>& a = before[r].captured[i];
      const std::vector<int16_t>& b = after[r].captured[i];
      if (i % L == 0) first_layer_ids &= a == b;
      for (size_t j = 0; j < std::min(a.size(), b.size()); ++j) ids_equal += a[j] == b[j];
      ids_total += static_cast<int64_t>(b.size());
    }
  }
  const uint64_t digest = chain.total();
  std::printf("output digest: %016" PRIx64 " (FNV-1a of the last layer's bf16 outputs, rows of every rank in order: "
              "the single-rank run's digest)\n", digest);
  std::printf("eplb:     outputs %s, captured logical ids %s (%.4f of them equal)\n",
              same_out ? "bit for bit equal to the contiguous placement's" : "DIFFER from the contiguous placement's",
              same_ids ? "identical" : "DIFFER", ids_total > 0 ? static_cast<double>(ids_equal) / ids_total : 1.0);
  if (!replay_out || !replay_ids) return DataLoss("replay through EP differs from the run it replays");
  std::printf("replay:   %zu steps with the captured experts forced in every layer: outputs matched bit for bit\n",
              steps.size());
  // Host ranks reduce every pair in slot order: EPLB leaves the bits alone.
  // GPU ranks sum per-rank partials rounded to bf16, so a new placement moves
  // outputs within the EP bound (docs/expert_parallel.md) and later layers'
  // routing may follow; the first layer's input does not depend on it.
  if (!on_gpus && !same_ids) return DataLoss("EPLB changed the captured logical ids");
  if (on_gpus && !first_layer_ids) return DataLoss("EPLB changed the first layer's captured logical ids");
  if (o.capture_path.empty()) return Status::Ok();
  // The capture of the pass after EPLB, as `moekit run` writes it: per request
  // [tokens, layers, k] logical ids, and the run's description with the
  // single-rank step digests (`moekit replay` reruns it on one rank).
  CaptureSet captures;
  captures.info.routing = config.routing;
  captures.info.num_experts = spec.num_experts;
  // The synthetic model's model-layer indices (synthetic_model.cpp: MoE layers at 2l + 1).
  for (int l = 0; l < spec.num_layers; ++l) captures.info.model_layers.push_back(2 * l + 1);
  captures.info.backend = std::string(on_gpus ? "ep-nccl/" : "ep-loopback/") + dispatch;
  const int64_t k = spec.top_k;
  std::vector<HostTensor> ids;
  for (const Request& q : requests) {
    ids.emplace_back(DType::kI16, std::vector<int64_t>{q.prompt_tokens + q.decode_tokens, spec.num_layers, k});
    std::fill_n(ids.back().data<int16_t>(), ids.back().numel(), kUnwrittenExpertId);
  }
  for (size_t si = 0; si < steps.size(); ++si) {
    const auto tokens = row_tokens(steps[si]);
    for (int r = 0; r < N; ++r) {
      const RankRows rr = rows_of_rank(steps[si].num_tokens, N, r);
      for (size_t l = 0; l < L; ++l) {
        const std::vector<int16_t>& got = after[r].captured[si * L + l];
        for (int64_t t = 0; t < rr.end - rr.first; ++t) {
          const auto [req, pos] = tokens[rr.first + t];
          int16_t* dst = ids[req].data<int16_t>() + (pos * spec.num_layers + static_cast<int64_t>(l)) * k;
          std::copy_n(got.data() + t * k, k, dst);
        }
      }
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    RequestCapture rc;
    rc.request = request_name(requests[i].id);
    rc.ids = std::move(ids[i]);
    rc.first_generated_token = requests[i].prompt_tokens;
    captures.requests.push_back(std::move(rc));
  }
  RunDescription described{spec, {}, on_gpus ? o.backend : "cpu", o.num_requests, o.prompt_tokens, o.decode_tokens,
                           chain.steps()};
  captures.extra_metadata[kRunMetadataKey] = encode_run_description(described);
  MOEKIT_RETURN_IF_ERROR(write_capture_file(o.capture_path, captures));
  std::printf("capture:  %zu requests x %d MoE layers x top-%d logical expert ids -> %s\n", captures.requests.size(),
              spec.num_layers, spec.top_k, o.capture_path.c_str());
  return Status::Ok();
}

}  // namespace moekit::tools

// The GPU path of ExpertParallelLayer: see ep_layer_device.h.
#include "layer/ep_layer_device.h"

#include <string>

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>

#include "core/cuda_check.h"
#include "dispatch/ep_device_all_to_all.h"
#include "moekit/device_buffer.h"
#include "moekit/routing.h"

namespace moekit {

struct EpLayerDevicePath::Impl {
  MoeConfig config;
  Communicator* comm = nullptr;
  Device device;
  std::unique_ptr<MoeKernel> experts;                  // the oracle's modular kernel over the received rows
  std::vector<CandidateReport> report;
  DeviceBuffer workspace;                              // experts->workspace_size(N·T)
  std::unique_ptr<dispatch::EpDeviceAllToAll> a2a;
  DeviceBuffer topk_ids;      // [T, k] i32: the router's logical ids
  DeviceBuffer topk_weights;  // [T, k] f32
  DeviceBuffer forced_ids;    // [T, k] i32: forced ids uploaded from the host
  DeviceBuffer counts;        // [E] i32: this forward's tokens per logical expert
  DeviceBuffer load;          // [E] i64: counts summed since the last reset
  DeviceBuffer score_bias;    // [E] f32, deepseek_v3 with a bias only
  // Phase timing (benchmarks): events before dispatch, after dispatch, after the experts, after combine.
  cudaEvent_t phase[4] = {nullptr, nullptr, nullptr, nullptr};
  bool phase_recorded = false;  // the last forward recorded them
  ~Impl() {
    for (cudaEvent_t e : phase) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  // Records phase event i on s when timing is on and s is not being captured.
  Status mark(int i, cudaStream_t s) {
    if (phase[0] == nullptr) return Status::Ok();
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    MOEKIT_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) return Status::Ok();
    MOEKIT_CUDA_CHECK(cudaEventRecord(phase[i], s));
    if (i == 3) phase_recorded = true;
    return Status::Ok();
  }
};

namespace {

// The config of the kernel on the received rows: this rank's slots as the
// experts, N·T rows, k' = min(k, S) local slots per row, caller routing.
MoeConfig received_rows_config(const MoeConfig& c, int64_t slots, int ranks) {
  MoeConfig local = c;
  local.num_experts = slots;
  local.max_num_tokens = ranks * c.max_num_tokens;
  local.routing = RoutingConfig{};
  local.routing.method = RoutingMethod::kCustom;
  local.routing.top_k = static_cast<int>(std::min<int64_t>(c.top_k(), slots));
  local.parallel = ParallelConfig{};
  local.needs_capture = false;
  local.needs_replay = false;
  return local;
}

template <typename T>
T* ptr(const DeviceBuffer& b) {
  return static_cast<T*>(b.data());
}

Status alloc(DeviceBuffer* b, Device dev, size_t bytes) {
  MOEKIT_ASSIGN_OR_RETURN(*b, DeviceBuffer::allocate(dev, bytes));
  return Status::Ok();
}

MoeWeights slot_views(const eplb::SlotWeights& w) {
  MoeWeights mw;
  mw.w13 = w.w13_view();
  mw.w2 = w.w2_view();
  return mw;
}

}  // namespace

EpLayerDevicePath::~EpLayerDevicePath() = default;

StatusOr<std::unique_ptr<EpLayerDevicePath>> EpLayerDevicePath::create(const MoeConfig& c,
                                                                       const eplb::SlotWeights& weights,
                                                                       const ExpertPlacement& placement,
                                                                       const std::vector<float>& bias,
                                                                       Communicator& comm, const Platform& platform) {
  const Device dev = comm.device();
  if (c.quant.method != QuantMethod::kNone || c.quant.act_dtype != DType::kBF16 ||
      c.quant.weight_dtype != DType::kBF16) {
    // TODO(ep): fp8 (the fp8 finalize does not skip ids yet) and other dtypes on the GPU path.
    return Unsupported("expert parallel on GPUs: serves bf16 weights and activations without quantization; got " +
                       c.quant.to_string());
  }
  int current = -1;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&current));
  if (current != dev.index) {
    return InvalidArgument("expert parallel: the communicator is on " + dev.to_string() +
                           " but the current CUDA device is cuda:" + std::to_string(current));
  }
  const int n = comm.size();
  const MoeConfig local = received_rows_config(c, placement.slots_per_rank, n);
  MOEKIT_ASSIGN_OR_RETURN(Resolution res, select_backend_on(local, platform, DeviceType::kCuda));
  if (res.kernel.monolithic) {
    return Internal("expert parallel: the oracle chose the monolithic " + res.kernel.name + " for caller routing");
  }
  std::unique_ptr<EpLayerDevicePath> path(new EpLayerDevicePath());
  path->impl_ = std::make_unique<Impl>();
  Impl& im = *path->impl_;
  im.config = c;
  im.comm = &comm;
  im.device = dev;
  MOEKIT_ASSIGN_OR_RETURN(im.experts, res.kernel.create(local, platform));
  MOEKIT_RETURN_IF_ERROR(im.experts->prepare_weights(slot_views(weights)));
  im.report = std::move(res.report);
  MOEKIT_RETURN_IF_ERROR(alloc(&im.workspace, dev, im.experts->workspace_size(local.max_num_tokens)));

  dispatch::cuda::EpDeviceShape shape;
  shape.ranks = n;
  shape.rank = comm.rank();
  shape.max_tokens = c.max_num_tokens;
  shape.hidden = c.hidden;
  shape.top_k = c.top_k();
  shape.num_logical = c.num_experts;
  shape.slots_per_rank = placement.slots_per_rank;
  MOEKIT_ASSIGN_OR_RETURN(im.a2a, dispatch::EpDeviceAllToAll::create(comm, shape, placement.replicas()));

  const size_t pairs = static_cast<size_t>(c.max_num_tokens * c.top_k()), E = static_cast<size_t>(c.num_experts);
  MOEKIT_RETURN_IF_ERROR(alloc(&im.topk_ids, dev, pairs * sizeof(int32_t)));
  MOEKIT_RETURN_IF_ERROR(alloc(&im.topk_weights, dev, pairs * sizeof(float)));
  if (c.routing.method != RoutingMethod::kCustom) {
    MOEKIT_RETURN_IF_ERROR(alloc(&im.forced_ids, dev, pairs * sizeof(int32_t)));
  }
  MOEKIT_RETURN_IF_ERROR(alloc(&im.counts, dev, E * sizeof(int32_t)));
  MOEKIT_RETURN_IF_ERROR(alloc(&im.load, dev, E * sizeof(int64_t)));
  MOEKIT_RETURN_IF_ERROR(path->reset_load());
  if (!bias.empty()) {
    MOEKIT_ASSIGN_OR_RETURN(im.score_bias, DeviceBuffer::copy_of(dev, TensorView::contiguous(
        const_cast<float*>(bias.data()), DType::kF32, {static_cast<int64_t>(bias.size())})));
  }
  return path;
}

Status EpLayerDevicePath::forward(const LayerForwardArgs& args, const TensorView& capture_target,
                                  const TensorView& router_weights_target, const Status& verdict, Stream stream) {
  Impl& im = *impl_;
  const MoeConfig& c = im.config;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t m = verdict.ok() ? args.hidden.dim(0) : 0, k = c.top_k(), E = c.num_experts;
  const Device dev = im.device;
  // This forward's ids target, as on the host path: the call's, else the bound capture target.
  const TensorView ids_target = args.routing_replay_out.defined() ? args.routing_replay_out : capture_target;

  // 1. Route this rank's tokens (logical ids).
  dispatch::EpDeviceTokens tokens;
  tokens.num_tokens = m;
  tokens.hidden = m > 0 ? args.hidden.ptr<const uint16_t>() : nullptr;
  tokens.topk_ids = ptr<const int32_t>(im.topk_ids);
  tokens.topk_weights = ptr<const float>(im.topk_weights);
  if (m == 0) {
    MOEKIT_CUDA_CHECK(cudaMemsetAsync(im.counts.data(), 0, E * sizeof(int32_t), s));
  } else if (c.routing.method == RoutingMethod::kCustom) {
    tokens.topk_ids = args.topk_ids.ptr<const int32_t>();
    tokens.topk_weights = args.topk_weights.ptr<const float>();
    tokens.expert_counts = ptr<int32_t>(im.counts);  // counted and captured where the dispatch reads them
    tokens.ids_out = ids_target.defined() ? ids_target.ptr<int16_t>() : nullptr;
  } else {
    RoutingArgs r;
    r.logits = args.router_logits;
    if (im.score_bias.data() != nullptr) {
      r.score_bias = TensorView::contiguous(im.score_bias.data(), DType::kF32, {E}, dev);
    }
    if (args.forced_ids.defined()) {
      MOEKIT_CUDA_CHECK(cudaMemcpyAsync(im.forced_ids.data(), args.forced_ids.data, args.forced_ids.nbytes(),
                                        cudaMemcpyHostToDevice, s));
      r.forced_ids = TensorView::contiguous(im.forced_ids.data(), DType::kI32, {m, k}, dev);
    }
    r.topk_ids = TensorView::contiguous(im.topk_ids.data(), DType::kI32, {m, k}, dev);
    r.topk_weights = TensorView::contiguous(im.topk_weights.data(), DType::kF32, {m, k}, dev);
    r.expert_counts = TensorView::contiguous(im.counts.data(), DType::kI32, {E}, dev);
    r.routing_replay_out = ids_target;
    MOEKIT_RETURN_IF_ERROR(route(c.routing, r, stream));
  }

  if (m > 0 && router_weights_target.defined()) {
    MOEKIT_CUDA_CHECK(cudaMemcpyAsync(router_weights_target.data, tokens.topk_weights, m * k * sizeof(float),
                                      cudaMemcpyDeviceToDevice, s));
  }

  // 2. Dispatch: replica choice, pack, all-to-all, unpack.
  im.phase_recorded = false;
  MOEKIT_RETURN_IF_ERROR(im.mark(0, s));
  MOEKIT_ASSIGN_OR_RETURN(dispatch::EpExpertsInputs x, im.a2a->prepare(tokens, s));
  MOEKIT_RETURN_IF_ERROR(im.mark(1, s));
  MOEKIT_RETURN_IF_ERROR(dispatch::cuda::ep_accumulate_load(ptr<const int32_t>(im.counts), ptr<int64_t>(im.load), E, s));
  if (m > 0 && args.expert_counts.defined()) {
    MOEKIT_CUDA_CHECK(cudaMemcpyAsync(args.expert_counts.data, im.counts.data(), E * sizeof(int32_t),
                                      cudaMemcpyDeviceToDevice, s));
  }

  // 3. This rank's experts on every received row: its weighted partial sum.
  MoeRunArgs run;
  run.hidden = x.hidden;
  run.out = x.out;
  run.topk_ids = x.topk_ids;
  run.topk_weights = x.topk_weights;
  run.skip_negative_ids = true;
  MOEKIT_RETURN_IF_ERROR(im.experts->run(run, Workspace{im.workspace.data(), im.workspace.bytes()}, stream));
  MOEKIT_RETURN_IF_ERROR(im.mark(2, s));

  // 4. Combine: partials back to their source, summed in rank order.
  MOEKIT_RETURN_IF_ERROR(im.a2a->finalize(tokens.topk_ids, m > 0 ? args.out.ptr<uint16_t>() : nullptr, s));
  MOEKIT_RETURN_IF_ERROR(im.mark(3, s));
  if (m > 0 && args.routing_replay_out.defined() && capture_target.defined()) {
    MOEKIT_CUDA_CHECK(cudaMemcpyAsync(capture_target.data, args.routing_replay_out.data, m * k * sizeof(int16_t),
                                      cudaMemcpyDeviceToDevice, s));
  }
  return verdict;
}

Status EpLayerDevicePath::read_load(std::vector<int64_t>* expert_load, int64_t* computed_pairs) const {
  const Impl& im = *impl_;
  MOEKIT_ASSIGN_OR_RETURN(*computed_pairs, im.a2a->computed_pairs());  // waits for the device
  expert_load->resize(static_cast<size_t>(im.config.num_experts));
  MOEKIT_CUDA_CHECK(cudaMemcpy(expert_load->data(), im.load.data(), im.load.bytes(), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status EpLayerDevicePath::reset_load() {
  Impl& im = *impl_;
  MOEKIT_RETURN_IF_ERROR(im.a2a->reset_computed_pairs());  // waits for the device
  MOEKIT_CUDA_CHECK(cudaMemset(im.load.data(), 0, im.load.bytes()));
  MOEKIT_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

Status EpLayerDevicePath::update_weights(const eplb::SlotWeights& weights) {
  MOEKIT_CUDA_CHECK(cudaDeviceSynchronize());  // no forward may still read the old weights
  return impl_->experts->prepare_weights(slot_views(weights));
}

Status EpLayerDevicePath::set_phase_timing(bool on) {
  Impl& im = *impl_;
  for (cudaEvent_t& e : im.phase) {
    if (on && e == nullptr) MOEKIT_CUDA_CHECK(cudaEventCreate(&e));
    if (!on && e != nullptr) {
      MOEKIT_CUDA_CHECK(cudaEventDestroy(e));
      e = nullptr;
    }
  }
  im.phase_recorded = false;
  return Status::Ok();
}

Status EpLayerDevicePath::last_phase_times(double* dispatch_us, double* experts_us, double* combine_us) const {
  const Impl& im = *impl_;
  if (!im.phase_recorded) {
    return FailedPrecondition("phase times: none recorded (set_phase_timing(true), then an eager forward)");
  }
  MOEKIT_CUDA_CHECK(cudaEventSynchronize(im.phase[3]));
  float ms[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) MOEKIT_CUDA_CHECK(cudaEventElapsedTime(&ms[i], im.phase[i], im.phase[i + 1]));
  *dispatch_us = 1000.0 * ms[0];
  *experts_us = 1000.0 * ms[1];
  *combine_us = 1000.0 * ms[2];
  return Status::Ok();
}

const std::vector<CandidateReport>& EpLayerDevicePath::experts_report() const { return impl_->report; }

}  // namespace moekit

#else  // !MOEKIT_WITH_CUDA

namespace moekit {

struct EpLayerDevicePath::Impl {
  std::vector<CandidateReport> report;
};

EpLayerDevicePath::~EpLayerDevicePath() = default;

StatusOr<std::unique_ptr<EpLayerDevicePath>> EpLayerDevicePath::create(const MoeConfig&, const eplb::SlotWeights&,
                                                                       const ExpertPlacement&,
                                                                       const std::vector<float>&, Communicator& comm,
                                                                       const Platform&) {
  return Unsupported(std::string("expert parallel: the ") + comm.name() + " communicator is on " +
                     comm.device().to_string() + ", and this build has no CUDA support");
}

Status EpLayerDevicePath::forward(const LayerForwardArgs&, const TensorView&, const TensorView&, const Status&, Stream) {
  return Unsupported("expert parallel on GPUs: this build has no CUDA support");
}
Status EpLayerDevicePath::read_load(std::vector<int64_t>*, int64_t*) const {
  return Unsupported("expert parallel on GPUs: this build has no CUDA support");
}
Status EpLayerDevicePath::reset_load() { return Unsupported("expert parallel on GPUs: this build has no CUDA support"); }
Status EpLayerDevicePath::update_weights(const eplb::SlotWeights&) {
  return Unsupported("expert parallel on GPUs: this build has no CUDA support");
}
Status EpLayerDevicePath::set_phase_timing(bool) {
  return Unsupported("expert parallel on GPUs: this build has no CUDA support");
}
Status EpLayerDevicePath::last_phase_times(double*, double*, double*) const {
  return Unsupported("expert parallel on GPUs: this build has no CUDA support");
}
const std::vector<CandidateReport>& EpLayerDevicePath::experts_report() const { return impl_->report; }

}  // namespace moekit

#endif  // MOEKIT_WITH_CUDA

// ExpertParallelLayer: routing (logical ids) -> replica choice -> EP
// prepare (dispatch) -> this rank's experts through the modular kernel ->
// EP finalize (combine + slot-order reduce). Host ranks run it here; GPU
// ranks run it through EpLayerDevicePath (ep_layer_device.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dispatch/ep_prepare_finalize.h"
#include "dispatch/host_all_gather.h"
#include "eplb/slot_weights.h"
#include "layer/ep_layer_device.h"
#include "layer/forward_checks.h"
#include "moekit/ep_layer.h"
#include "moekit/routing.h"

namespace moekit {

struct ExpertParallelLayer::State {
  Platform platform;
  std::unique_ptr<MoeKernel> experts;               // this rank's slots: modular, custom routing, k = 1, f32 acts
  std::vector<char> workspace;                      // experts->workspace_size(max_pairs)
  eplb::SlotWeights weights;                        // this rank's slots, checkpoint dtype
  std::unique_ptr<dispatch::EpPrepareFinalize> pf;  // all-to-all or allgather + reduce-scatter
  std::vector<std::vector<int32_t>> replicas;       // logical -> physical slots
  std::vector<int32_t> topk_ids;                    // [max_tokens, k] logical
  std::vector<float> topk_weights;                  // [max_tokens, k]
  std::vector<int32_t> physical_ids;                // [max_tokens, k]
  std::vector<int32_t> counts;                      // [E] this forward's tokens per logical expert
  std::vector<float> ones;                          // [max_pairs] the k = 1 weight of each pair
  std::vector<float> score_bias;                    // [E] deepseek_v3 bias, when given
  std::unique_ptr<EpLayerDevicePath> device;        // GPU ranks: everything above but weights lives here
};

namespace {

// The config of the kernel that runs one rank's experts: its slots as the
// experts, every pair a token with k = 1 and weight 1 (its output unweighted),
// fp32 activations (the pair outputs stay fp32 until the final reduce).
MoeConfig slot_kernel_config(const MoeConfig& c, int64_t slots, int64_t max_pairs) {
  MoeConfig local = c;
  local.num_experts = slots;
  local.max_num_tokens = std::max<int64_t>(max_pairs, 1);
  local.quant.act_dtype = DType::kF32;
  local.routing = RoutingConfig{};
  local.routing.method = RoutingMethod::kCustom;
  local.routing.top_k = 1;
  local.parallel = ParallelConfig{};
  local.needs_capture = false;
  local.needs_replay = false;
  return local;
}

// The config with the rank fields cleared: what every rank must agree on.
std::string group_fingerprint(const MoeConfig& c, const ExpertPlacement& p) {
  MoeConfig g = c;
  g.parallel.ep_rank = g.parallel.dp_rank = g.parallel.tp_rank = 0;
  return g.to_string() + " placement " + p.to_string();
}

// Every rank's fingerprint equals rank 0's, else an error showing both. Ranks
// exchange a hash of the whole string and its first kShown bytes (to print).
Status check_same_on_every_rank(Communicator& comm, const std::string& mine, const char* what) {
  constexpr size_t kShown = 4088, kBytes = kShown + sizeof(uint64_t);
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : mine) hash = (hash ^ c) * 0x100000001b3ull;
  std::vector<char> buf(kBytes, 0), all(kBytes * comm.size());
  std::memcpy(buf.data(), &hash, sizeof hash);
  std::memcpy(buf.data() + sizeof hash, mine.data(), std::min(mine.size(), kShown - 1));
  MOEKIT_RETURN_IF_ERROR(dispatch::all_gather_host(comm, buf.data(), all.data(), kBytes));
  for (int r = 1; r < comm.size(); ++r) {
    if (std::memcmp(all.data(), all.data() + r * kBytes, sizeof hash) != 0) {
      return InvalidArgument(std::string("expert parallel: ") + what + " differs between ranks: rank 0 has " +
                             std::string(all.data() + sizeof hash) + "; rank " + std::to_string(r) + " has " +
                             std::string(all.data() + r * kBytes + sizeof hash));
    }
  }
  return Status::Ok();
}

struct SlotKernel {
  std::unique_ptr<MoeKernel> kernel;
  std::vector<char> workspace;
  std::vector<CandidateReport> report;
};

// The kernel for one rank's slots, chosen by the oracle among CPU backends,
// with `weights` prepared.
StatusOr<SlotKernel> make_slot_kernel(const MoeConfig& c, const eplb::SlotWeights& weights, int64_t max_pairs,
                                      const Platform& platform) {
  const MoeConfig local = slot_kernel_config(c, weights.slots, max_pairs);
  MOEKIT_ASSIGN_OR_RETURN(Resolution res, select_backend_on(local, platform, DeviceType::kCpu));
  SlotKernel k;
  MOEKIT_ASSIGN_OR_RETURN(k.kernel, res.kernel.create(local, platform));
  MoeWeights w;
  w.w13 = weights.w13_view();
  w.w2 = weights.w2_view();
  MOEKIT_RETURN_IF_ERROR(k.kernel->prepare_weights(w));
  k.workspace.resize(k.kernel->workspace_size(local.max_num_tokens) + 64);
  k.report = std::move(res.report);
  return k;
}

StatusOr<std::unique_ptr<dispatch::EpPrepareFinalize>> make_prepare_finalize(Communicator& comm, const MoeConfig& c,
                                                                             All2AllBackend kind, int64_t slots) {
  dispatch::EpShape shape{c.max_num_tokens, c.hidden, c.top_k(), slots, c.quant.act_dtype};
  if (kind == All2AllBackend::kAllgatherReducescatter) return dispatch::make_allgather_reduce_scatter(comm, shape);
  return dispatch::make_all_to_all(comm, shape);
}

}  // namespace

ExpertParallelLayer::~ExpertParallelLayer() = default;

StatusOr<std::unique_ptr<ExpertParallelLayer>> ExpertParallelLayer::create(const MoeConfig& config,
                                                                           const MoeWeights& weights,
                                                                           Communicator& comm,
                                                                           const ExpertPlacement* placement,
                                                                           const Platform& platform) {
  return create_impl(config, weights, /*weights_are_slots=*/false, comm, placement, platform);
}

StatusOr<std::unique_ptr<ExpertParallelLayer>> ExpertParallelLayer::create_from_slots(
    const MoeConfig& config, const MoeWeights& slot_weights, Communicator& comm, const ExpertPlacement& placement,
    const Platform& platform) {
  return create_impl(config, slot_weights, /*weights_are_slots=*/true, comm, &placement, platform);
}

StatusOr<std::unique_ptr<ExpertParallelLayer>> ExpertParallelLayer::create_impl(const MoeConfig& config,
                                                                                const MoeWeights& weights,
                                                                                bool weights_are_slots,
                                                                                Communicator& comm,
                                                                                const ExpertPlacement* placement,
                                                                                const Platform& platform) {
  const bool on_gpu = comm.device().type != DeviceType::kCpu;
  // Local checks first, then one agreement so that a rank with a bad config
  // does not leave the others waiting.
  const ParallelConfig& par = config.parallel;
  Status local = config.validate();
  if (local.ok() && (par.ep_size != comm.size() || par.ep_rank != comm.rank() || par.dp_size != par.ep_size ||
                     par.dp_rank != par.ep_rank || par.tp_size != 1)) {
    local = InvalidArgument("expert parallel: parallel config " + par.to_string() + " (ep_rank " +
                            std::to_string(par.ep_rank) + ", dp_rank " + std::to_string(par.dp_rank) + ") must have ep_size == dp_size == communicator size (" +
                            std::to_string(comm.size()) + "), ep_rank == dp_rank == communicator rank (" +
                            std::to_string(comm.rank()) + ") and tp_size 1");
  }
  if (local.ok() && weights.score_bias.defined() != config.routing.has_score_bias) {
    local = InvalidArgument("weights.score_bias: given iff routing.has_score_bias is set");
  }
  if (local.ok() && (config.has_expert_bias || config.shared_intermediate > 0)) {
    // TODO(ep): biases travel with their expert's slot; the shared MLP runs once per token on its own rank.
    local = Unsupported(std::string("expert parallel: ") +
                        (config.has_expert_bias ? "expert biases are" : "a shared expert is") +
                        " not placed on ranks yet; run this layer with ep_size 1");
  }
  ExpertPlacement chosen;
  if (local.ok()) {
    if (placement != nullptr) {
      chosen = *placement;
    } else {
      StatusOr<ExpertPlacement> p = ExpertPlacement::contiguous(config.num_experts, comm.size());
      if (p.ok()) chosen = *p; else local = p.status();
    }
  }
  if (local.ok()) local = chosen.validate();
  if (local.ok() && (chosen.num_logical != config.num_experts || chosen.num_ranks != comm.size())) {
    local = InvalidArgument("placement: made for " + std::to_string(chosen.num_logical) + " experts on " +
                            std::to_string(chosen.num_ranks) + " ranks; the layer has " +
                            std::to_string(config.num_experts) + " experts on " + std::to_string(comm.size()));
  }
  StatusOr<EpDispatchChoice> choice = local.ok() ? choose_ep_dispatch(config) : StatusOr<EpDispatchChoice>(local);
  if (local.ok()) local = choice.status();
  if (local.ok() && on_gpu && choice->kind == All2AllBackend::kAllgatherReducescatter) {
    // TODO(ep): allgather + reduce-scatter on the device (decode sizes).
    if (config.parallel.all2all == All2AllBackend::kAllgatherReducescatter) {
      local = Unsupported("expert parallel on GPUs: only the all-to-all dispatch runs on the device; "
                          "parallel.all2all = allgather_reducescatter asks for the other");
    } else {
      choice->kind = All2AllBackend::kNccl;
      choice->reason = "all-to-all: the only dispatch the GPU path has (the oracle would otherwise pick " +
                       choice->reason + ")";
    }
  }
  MOEKIT_RETURN_IF_ERROR(dispatch::agree(comm, local));
  MOEKIT_RETURN_IF_ERROR(check_same_on_every_rank(comm, group_fingerprint(config, chosen), "the layer config"));

  // The modular kernel class the oracle picks for the whole layer (a
  // monolithic one refuses dispatch across ranks and says why in the report).
  Status built = Status::Ok();
  std::unique_ptr<ExpertParallelLayer> layer(new ExpertParallelLayer());
  layer->config_ = config;
  layer->comm_ = &comm;
  layer->placement_ = chosen;
  layer->dispatch_reason_ = choice->reason;
  layer->expert_load_.assign(config.num_experts, 0);
  layer->state_ = std::make_unique<State>();
  State& st = *layer->state_;
  st.platform = platform;
  StatusOr<Resolution> whole = select_backend_on(config, platform, comm.device().type);
  if (!whole.ok()) {
    built = whole.status();
  } else if (whole->kernel.monolithic) {
    built = Internal("expert parallel: the oracle chose the monolithic " + whole->kernel.name + " for ep > 1");
  }
  const int64_t n1 = config.activation.gated() ? 2 * config.intermediate : config.intermediate;  // w13 rows
  if (built.ok()) {
    StatusOr<eplb::SlotWeights> w =
        weights_are_slots
            ? eplb::slot_weights_from_local(weights, chosen, comm.rank(), config.quant.weight_dtype, n1,
                                            config.hidden, config.intermediate)
            : eplb::slot_weights_from_logical(weights, chosen, comm.rank(), config.quant.weight_dtype, n1,
                                              config.hidden, config.intermediate);
    if (w.ok()) st.weights = std::move(*w); else built = w.status();
  }
  const int64_t max_pairs = dispatch::EpShape{config.max_num_tokens, config.hidden, config.top_k(),
                                              chosen.slots_per_rank, config.quant.act_dtype}
                                .max_pairs(comm.size());
  if (built.ok() && config.routing.has_score_bias) {
    built = check_tensor(weights.score_bias, "weights.score_bias", {DType::kF32}, {config.num_experts}, Device::cpu());
    if (built.ok()) st.score_bias.assign(weights.score_bias.ptr<const float>(),
                                         weights.score_bias.ptr<const float>() + config.num_experts);
  }
  if (built.ok() && on_gpu) {
    StatusOr<std::unique_ptr<EpLayerDevicePath>> d =
        EpLayerDevicePath::create(config, st.weights, chosen, st.score_bias, comm, platform);
    if (d.ok()) {
      st.device = std::move(*d);
      layer->report_ = std::move(whole->report);
    } else {
      built = d.status();
    }
  }
  if (built.ok() && !on_gpu) {
    StatusOr<SlotKernel> k = make_slot_kernel(config, st.weights, max_pairs, platform);
    if (k.ok()) {
      st.experts = std::move(k->kernel);
      st.workspace = std::move(k->workspace);
      layer->report_ = std::move(whole->report);
    } else {
      built = k.status();
    }
  }
  if (built.ok() && !on_gpu) {
    StatusOr<std::unique_ptr<dispatch::EpPrepareFinalize>> pf =
        make_prepare_finalize(comm, config, choice->kind, chosen.slots_per_rank);
    if (pf.ok()) st.pf = std::move(*pf); else built = pf.status();
  }
  MOEKIT_RETURN_IF_ERROR(dispatch::agree(comm, built));
  st.replicas = chosen.replicas();
  if (on_gpu) return layer;  // the routing buffers live on the device (EpLayerDevicePath)
  const int64_t rows = config.max_num_tokens * config.top_k();
  st.topk_ids.resize(rows);
  st.topk_weights.resize(rows);
  st.physical_ids.resize(rows);
  st.counts.resize(config.num_experts);
  st.ones.assign(std::max<int64_t>(max_pairs, 1), 1.0f);
  return layer;
}

const char* ExpertParallelLayer::dispatch_name() const {
  return state_->device != nullptr ? "all_to_all" : state_->pf->name();
}

// GPU ranks: the counters live on the device. A failed read leaves the last
// values (the CUDA error then fails the next forward).
const std::vector<int64_t>& ExpertParallelLayer::expert_load() const {
  if (state_->device != nullptr) (void)state_->device->read_load(&expert_load_, &computed_pairs_);
  return expert_load_;
}

int64_t ExpertParallelLayer::computed_pairs() const {
  if (state_->device != nullptr) (void)state_->device->read_load(&expert_load_, &computed_pairs_);
  return computed_pairs_;
}

void ExpertParallelLayer::reset_load() {
  std::fill(expert_load_.begin(), expert_load_.end(), 0);
  computed_pairs_ = 0;
  if (state_->device != nullptr) (void)state_->device->reset_load();
}

StatusOr<std::vector<int64_t>> ExpertParallelLayer::gather_expert_load() {
  const int n = comm_->size();
  const int64_t E = config_.num_experts;
  std::vector<int64_t> all(n * E), sum(E, 0);
  if (state_->device != nullptr) MOEKIT_RETURN_IF_ERROR(state_->device->read_load(&expert_load_, &computed_pairs_));
  MOEKIT_RETURN_IF_ERROR(dispatch::all_gather_host(*comm_, expert_load_.data(), all.data(), E * sizeof(int64_t)));
  for (int r = 0; r < n; ++r) {
    for (int64_t e = 0; e < E; ++e) sum[e] += all[r * E + e];
  }
  return sum;
}

Status ExpertParallelLayer::set_phase_timing(bool on) {
  if (state_->device == nullptr) return Unsupported("phase timing: GPU ranks only (this layer runs on host ranks)");
  return state_->device->set_phase_timing(on);
}

StatusOr<ExpertParallelLayer::PhaseTimes> ExpertParallelLayer::last_phase_times() const {
  if (state_->device == nullptr) return Unsupported("phase timing: GPU ranks only (this layer runs on host ranks)");
  PhaseTimes t;
  MOEKIT_RETURN_IF_ERROR(state_->device->last_phase_times(&t.dispatch_us, &t.experts_us, &t.combine_us));
  return t;
}

StatusOr<std::vector<int64_t>> ExpertParallelLayer::gather_computed_pairs() {
  std::vector<int64_t> all(comm_->size());
  if (state_->device != nullptr) MOEKIT_RETURN_IF_ERROR(state_->device->read_load(&expert_load_, &computed_pairs_));
  MOEKIT_RETURN_IF_ERROR(dispatch::all_gather_host(*comm_, &computed_pairs_, all.data(), sizeof(int64_t)));
  return all;
}

Device ExpertParallelLayer::device() const { return comm_->device(); }

std::string ExpertParallelLayer::producer() const {
  std::string experts = "experts";
  for (const CandidateReport& c : report_) {
    if (c.chosen) experts = c.backend + "/" + c.kernel;
  }
  return "ep" + std::to_string(comm_->size()) + "/" + experts;
}

Status ExpertParallelLayer::set_capture_target(const TensorView& target, const TensorView& router_weights) {
  if (!target.defined()) {
    if (router_weights.defined()) return InvalidArgument("capture router weights: given without an ids target");
    capture_target_ = {};
    router_weights_target_ = {};
    return Status::Ok();
  }
  MOEKIT_RETURN_IF_ERROR(check_ids_rows(target, "capture target", config_.max_num_tokens, "max_num_tokens",
                                        config_.top_k(), comm_->device()));
  if (router_weights.defined()) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(router_weights, "capture router weights", {DType::kF32},
                                        {target.dim(0), config_.top_k()}, comm_->device()));
  }
  capture_target_ = target;
  router_weights_target_ = router_weights;
  return Status::Ok();
}

Status ExpertParallelLayer::validate(const LayerForwardArgs& a) const {
  // Tensors live on the communicator's device; forced ids on the host. What
  // only the device can see (logits, caller ids on a GPU) follows the device
  // rule of docs/routing.md instead: the token's output row is NaN.
  const Device dev = comm_->device();
  const bool on_host = dev.type == DeviceType::kCpu;
  const int64_t H = config_.hidden;
  if (a.hidden.rank == 2 && a.hidden.dim(0) == 0) {
    // A rank with no tokens this step still takes part in the collectives.
    if (a.hidden.dim(1) != H || a.out.rank != 2 || a.out.dim(0) != 0) {
      return InvalidArgument("hidden/out: a rank without tokens passes [0, H] views for both");
    }
    return Status::Ok();
  }
  MOEKIT_RETURN_IF_ERROR(check_forward_args(config_, a, dev));
  if (!on_host && (reinterpret_cast<uintptr_t>(a.hidden.data) % 16 != 0 ||
                   reinterpret_cast<uintptr_t>(a.out.data) % 16 != 0)) {
    return InvalidArgument("hidden/out: the GPU path reads and writes rows in 16-byte pieces; both must be "
                           "16-byte aligned");
  }
  if (on_host && config_.routing.method != RoutingMethod::kCustom) {
    MOEKIT_RETURN_IF_ERROR(check_logits_finite(a.router_logits));
  }
  return Status::Ok();
}

Status ExpertParallelLayer::forward(const LayerForwardArgs& args, Stream stream) {
  if (state_->device != nullptr) {
    // No agreement round on GPU ranks (it would wait on the host): a rank with
    // bad arguments runs with no tokens so that no other rank is left waiting.
    return state_->device->forward(args, capture_target_, router_weights_target_, validate(args), stream);
  }
  return forward_on_host(args);
}

Status ExpertParallelLayer::forward_on_host(const LayerForwardArgs& args) {
  MOEKIT_RETURN_IF_ERROR(dispatch::agree(*comm_, validate(args)));
  State& st = *state_;
  const int64_t m = args.hidden.dim(0), k = config_.top_k(), E = config_.num_experts;
  // 1. Route this rank's tokens (logical ids; the capture target gets them).
  const int32_t* ids = st.topk_ids.data();
  const float* weights = st.topk_weights.data();
  const TensorView ids_target = args.routing_replay_out.defined() ? args.routing_replay_out : capture_target_;
  if (m == 0) {
    std::fill(st.counts.begin(), st.counts.end(), 0);
  } else if (config_.routing.method == RoutingMethod::kCustom) {
    ids = args.topk_ids.ptr<const int32_t>();
    weights = args.topk_weights.ptr<const float>();
    std::fill(st.counts.begin(), st.counts.end(), 0);
    for (int64_t i = 0; i < m * k; ++i) ++st.counts[ids[i]];
    if (ids_target.defined()) {
      for (int64_t i = 0; i < m * k; ++i) ids_target.ptr<int16_t>()[i] = static_cast<int16_t>(ids[i]);
    }
  } else {
    RoutingArgs r;
    r.logits = args.router_logits;
    if (!st.score_bias.empty()) {
      r.score_bias = TensorView::contiguous(st.score_bias.data(), DType::kF32, {E});
    }
    r.forced_ids = args.forced_ids;
    r.topk_ids = TensorView::contiguous(st.topk_ids.data(), DType::kI32, {m, k});
    r.topk_weights = TensorView::contiguous(st.topk_weights.data(), DType::kF32, {m, k});
    r.expert_counts = TensorView::contiguous(st.counts.data(), DType::kI32, {E});
    r.routing_replay_out = ids_target;
    MOEKIT_RETURN_IF_ERROR(route_cpu(config_.routing, r));  // inputs validated above: cannot fail on one rank only
  }
  if (m > 0 && args.routing_replay_out.defined() && capture_target_.defined()) {
    std::memcpy(capture_target_.data, args.routing_replay_out.data, m * k * sizeof(int16_t));
  }
  if (m > 0 && router_weights_target_.defined()) {
    std::memcpy(router_weights_target_.data, weights, m * k * sizeof(float));
  }
  for (int64_t e = 0; e < E; ++e) expert_load_[e] += st.counts[e];
  if (m > 0 && args.expert_counts.defined()) std::memcpy(args.expert_counts.data, st.counts.data(), E * sizeof(int32_t));

  // 2. Replica of every (token, slot): a function of the token's position alone.
  const int64_t token_key0 = static_cast<int64_t>(comm_->rank()) * config_.max_num_tokens;
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      st.physical_ids[t * k + j] = replica_for_token(st.replicas, ids[t * k + j], token_key0 + t);
    }
  }

  // 3. Dispatch, this rank's experts (pair outputs unweighted), combine.
  MOEKIT_ASSIGN_OR_RETURN(dispatch::EpPairs pairs, st.pf->prepare(args.hidden, st.physical_ids.data(), placement_));
  computed_pairs_ += pairs.num_pairs;
  Status ran = Status::Ok();
  if (pairs.num_pairs > 0) {
    const int64_t P = pairs.num_pairs, H = config_.hidden;
    MoeRunArgs run;
    run.hidden = TensorView::contiguous(const_cast<float*>(pairs.x), DType::kF32, {P, H});
    run.out = TensorView::contiguous(pairs.y, DType::kF32, {P, H});
    run.topk_ids = TensorView::contiguous(const_cast<int32_t*>(pairs.local_slot), DType::kI32, {P, 1});
    run.topk_weights = TensorView::contiguous(st.ones.data(), DType::kF32, {P, 1});
    ran = st.experts->run(run, Workspace{st.workspace.data(), st.workspace.size()}, nullptr);
  }
  MOEKIT_RETURN_IF_ERROR(dispatch::agree(*comm_, ran));
  return st.pf->finalize(weights, args.out);
}

Status ExpertParallelLayer::rebalance(const ExpertPlacement& next) {
  Status local = next.validate();
  if (local.ok() && state_->device != nullptr) {
    // TODO(ep): move slot weights between GPUs (move_slot_weights stages through host memory,
    // which an NCCL communicator cannot send). Until then: create the layer again with the plan.
    local = Unsupported("rebalance: not implemented for GPU ranks yet; create the layer again with the new "
                        "placement (ExpertParallelLayer::create(config, weights, comm, &placement))");
  }
  if (local.ok() && (next.num_logical != config_.num_experts || next.num_ranks != comm_->size())) {
    local = InvalidArgument("rebalance: the placement is for " + std::to_string(next.num_logical) + " experts on " +
                            std::to_string(next.num_ranks) + " ranks; the layer has " +
                            std::to_string(config_.num_experts) + " on " + std::to_string(comm_->size()));
  }
  MOEKIT_RETURN_IF_ERROR(dispatch::agree(*comm_, local));
  MOEKIT_RETURN_IF_ERROR(check_same_on_every_rank(*comm_, next.to_string(), "the new placement"));
  State& st = *state_;
  // Build everything new first; swap only when every rank succeeded.
  StatusOr<eplb::SlotWeights> moved_or = eplb::move_slot_weights(*comm_, st.weights, placement_, next);
  MOEKIT_RETURN_IF_ERROR(dispatch::agree(*comm_, moved_or.status()));
  eplb::SlotWeights moved = std::move(*moved_or);
  const int64_t max_pairs = dispatch::EpShape{config_.max_num_tokens, config_.hidden, config_.top_k(),
                                              next.slots_per_rank, config_.quant.act_dtype}
                                .max_pairs(comm_->size());
  StatusOr<SlotKernel> k = make_slot_kernel(config_, moved, max_pairs, st.platform);
  StatusOr<EpDispatchChoice> choice = choose_ep_dispatch(config_);
  StatusOr<std::unique_ptr<dispatch::EpPrepareFinalize>> pf =
      k.ok() && choice.ok() ? make_prepare_finalize(*comm_, config_, choice->kind, next.slots_per_rank)
                            : StatusOr<std::unique_ptr<dispatch::EpPrepareFinalize>>(
                                  !k.ok() ? k.status() : choice.status());
  MOEKIT_RETURN_IF_ERROR(dispatch::agree(*comm_, pf.status()));
  st.weights = std::move(moved);
  st.experts = std::move(k->kernel);
  st.workspace = std::move(k->workspace);
  st.pf = std::move(*pf);
  st.ones.assign(std::max<int64_t>(max_pairs, 1), 1.0f);
  placement_ = next;
  st.replicas = next.replicas();
  return Status::Ok();
}

Status ExpertParallelLayer::update_expert_weights(int64_t logical, const TensorView& w13, const TensorView& w2) {
  State& st = *state_;
  const eplb::SlotWeights& w = st.weights;
  if (logical < 0 || logical >= config_.num_experts) {
    return OutOfRange("update_expert_weights: expert " + std::to_string(logical) + " not in [0, " +
                      std::to_string(config_.num_experts) + ")");
  }
  MOEKIT_RETURN_IF_ERROR(check_tensor(w13, "w13", {w.dtype}, {w.n1, w.hidden}, Device::cpu()));
  MOEKIT_RETURN_IF_ERROR(check_tensor(w2, "w2", {w.dtype}, {w.hidden, w.intermediate}, Device::cpu()));
  eplb::SlotWeights next = w;
  const int me = comm_->rank();
  for (int64_t s = 0; s < placement_.slots_per_rank; ++s) {
    if (placement_.physical_to_logical[me * placement_.slots_per_rank + s] != logical) continue;
    std::memcpy(next.w13.data() + s * w.w13_bytes(), w13.data, w.w13_bytes());
    std::memcpy(next.w2.data() + s * w.w2_bytes(), w2.data, w.w2_bytes());
  }
  // The kernel keeps its own prepared copy: re-prepare it from every slot.
  if (st.device != nullptr) {
    MOEKIT_RETURN_IF_ERROR(st.device->update_weights(next));
  } else {
    MoeWeights mw;
    mw.w13 = next.w13_view();
    mw.w2 = next.w2_view();
    MOEKIT_RETURN_IF_ERROR(st.experts->prepare_weights(mw));
  }
  st.weights = std::move(next);
  return Status::Ok();
}

}  // namespace moekit

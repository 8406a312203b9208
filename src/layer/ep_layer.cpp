// ExpertParallelLayer: the layer pipeline (layer/pipeline.h) with an
// expert-parallel prepare/finalize: routing (logical ids) -> replica choice and
// dispatch -> this rank's experts through the oracle's modular kernel ->
// combine and reduce. Host ranks and GPU ranks differ only in the
// PrepareFinalize (host or device) and the experts stage's config.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dispatch/host_all_gather.h"
#include "dispatch/local_prepare_finalize.h"
#include "dispatch/prepare_finalize.h"
#include "eplb/slot_weights.h"
#include "experts/cpu/shared_expert.h"
#include "experts/cuda/sm90_shared_expert.h"
#include "layer/forward_checks.h"
#include "layer/pipeline.h"
#include "moekit/device_buffer.h"
#include "moekit/ep_layer.h"
#include "moekit/routing.h"

namespace moekit {

struct ExpertParallelLayer::State {
  Platform platform;
  KernelClass experts_class;       // the oracle's modular class for the layer, run on this rank's slots
  All2AllBackend dispatch_kind = All2AllBackend::kNccl;  // host ranks: all-to-all or allgather + reduce-scatter
  eplb::SlotWeights weights;       // this rank's slots, checkpoint dtype
  std::unique_ptr<LayerPipeline> pipeline;
  // A shared expert runs on this rank's own tokens, added before the output is
  // narrowed. Host ranks: CpuSharedExpert (the single-rank CPU layer's code)
  // after the combine, with its scratch sized for max_num_tokens. GPU ranks:
  // the sm90 pipeline's shared expert, added by the device combine.
  cpu::CpuSharedExpert shared;
  std::vector<float> shared_x, shared_h, shared_s;
  dispatch::DeviceSharedExpertPass device_shared;

  dispatch::SharedExpertPass shared_pass() {
    if (!shared.present()) return {};
    return [this](const TensorView& hidden, int64_t m, float* y) {
      const float* x = dispatch::local_prepare(hidden, shared_x.data());
      shared.add_to(x, m, y, shared_h.data(), shared_s.data());
    };
  }
};

namespace {

// The config of the experts stage on one rank: its slots as the experts and
// the caller's routing. Host ranks: one row per (token, slot) pair, k = 1 with
// weight 1 (the pair's output unweighted) and fp32 rows, reduced in finalize.
// GPU ranks: one row per received token, k' = min(k, S) local slots, each
// row's weighted partial sum in the activation dtype.
MoeConfig experts_config(const MoeConfig& c, int64_t slots, int ranks, bool on_gpu) {
  MoeConfig local = c;
  local.num_experts = slots;
  local.routing = RoutingConfig{};
  local.routing.method = RoutingMethod::kCustom;
  local.parallel = ParallelConfig{};
  local.needs_capture = false;
  local.needs_replay = false;
  local.shared_intermediate = 0;  // the shared expert runs on the token's own rank, not on pairs
  local.has_shared_gate = false;
  const dispatch::EpShape shape{c.max_num_tokens, c.hidden, c.top_k(), slots, c.quant.act_dtype};
  if (on_gpu) {
    local.max_num_tokens = ranks * c.max_num_tokens;
    local.routing.top_k = static_cast<int>(std::min<int64_t>(c.top_k(), slots));
  } else {
    local.max_num_tokens = std::max<int64_t>(shape.max_pairs(ranks), 1);
    local.routing.top_k = 1;
    local.quant.act_dtype = DType::kF32;
  }
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

// The experts stage and prepare/finalize of one rank: `kernel_class` (the
// oracle's choice for the whole layer) on this rank's slots, its workspace,
// and the host or device PrepareFinalize.
struct RankStages {
  std::unique_ptr<MoeKernel> experts;
  std::shared_ptr<DeviceBuffer> workspace;
  std::unique_ptr<dispatch::PrepareFinalize> pf;
};

// reuse (host ranks): the workspace to keep, grown if needed (rebalance keeps a Model's shared one).
StatusOr<RankStages> make_rank_stages(const MoeConfig& c, const KernelClass& kernel_class,
                                      const eplb::SlotWeights& weights, const ExpertPlacement& placement,
                                      All2AllBackend kind, Communicator& comm, const Platform& platform,
                                      dispatch::SharedExpertPass shared,
                                      dispatch::DeviceSharedExpertPass device_shared,
                                      std::shared_ptr<DeviceBuffer> reuse = nullptr) {
  const bool on_gpu = comm.device().type != DeviceType::kCpu;
  const MoeConfig local = experts_config(c, placement.slots_per_rank, comm.size(), on_gpu);
  if (const Support s = kernel_class.supports(local, platform); !s.ok) {
    return Internal("expert parallel: " + kernel_class.name + " serves the layer but not its experts stage: " +
                    s.reason);
  }
  RankStages st;
  MOEKIT_ASSIGN_OR_RETURN(st.experts, kernel_class.create(local, platform));
  if (!(st.experts->device() == comm.device())) {
    return InvalidArgument("expert parallel: the communicator is on " + comm.device().to_string() + " but " +
                           kernel_class.name + " runs on " + st.experts->device().to_string());
  }
  MOEKIT_RETURN_IF_ERROR(st.experts->prepare_weights(weights.kernel_weights()));
  const size_t need = st.experts->workspace_size(local.max_num_tokens);
  if (reuse != nullptr && reuse->device().type == DeviceType::kCpu && reuse->device() == comm.device()) {
    // Host ranks run the experts inline and are never in a captured graph: a
    // buffer too small grows in place, for every layer that shares it.
    if (reuse->bytes() < need) {
      MOEKIT_ASSIGN_OR_RETURN(*reuse, DeviceBuffer::allocate(comm.device(), need));
    }
    st.workspace = std::move(reuse);
  } else {
    MOEKIT_ASSIGN_OR_RETURN(st.workspace, LayerPipeline::allocate_workspace(*st.experts));
  }
  const dispatch::EpShape shape{c.max_num_tokens, c.hidden, c.top_k(), placement.slots_per_rank, c.quant.act_dtype};
  MOEKIT_ASSIGN_OR_RETURN(st.pf, on_gpu ? dispatch::make_ep_device_prepare_finalize(comm, shape, placement,
                                                                                   placement.replicas(),
                                                                                   std::move(device_shared))
                                        : dispatch::make_ep_host_prepare_finalize(comm, shape, kind, placement,
                                                                                 placement.replicas(),
                                                                                 std::move(shared)));
  return st;
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
  // The modular kernel class the oracle picks for the layer, asked with its real
  // parallel config: a monolithic class refuses dispatch across ranks, and the
  // EP limits (sm90_supports: GPU ranks) are reasons in its report.
  StatusOr<Resolution> whole = local.ok() ? select_backend_on(config, platform, comm.device().type)
                                          : StatusOr<Resolution>(local);
  if (local.ok()) local = whole.status();
  if (local.ok() && whole->kernel.monolithic) {
    local = Internal("expert parallel: the oracle chose the monolithic " + whole->kernel.name + " for ep > 1");
  }
  MOEKIT_RETURN_IF_ERROR(dispatch::agree(comm, local));
  MOEKIT_RETURN_IF_ERROR(check_same_on_every_rank(comm, group_fingerprint(config, chosen), "the layer config"));

  Status built = Status::Ok();
  std::unique_ptr<ExpertParallelLayer> layer(new ExpertParallelLayer());
  layer->config_ = config;
  layer->comm_ = &comm;
  layer->placement_ = chosen;
  layer->dispatch_reason_ = choice->reason;
  layer->report_ = std::move(whole->report);
  layer->expert_load_.assign(config.num_experts, 0);
  layer->state_ = std::make_unique<State>();
  State& st = *layer->state_;
  st.platform = platform;
  st.experts_class = whole->kernel;
  st.dispatch_kind = choice->kind;
  StatusOr<eplb::SlotWeights> w = weights_are_slots
                                      ? eplb::slot_weights_from_local(weights, chosen, comm.rank(), config)
                                      : eplb::slot_weights_from_logical(weights, chosen, comm.rank(), config);
  if (w.ok()) st.weights = std::move(*w); else built = w.status();
  if (built.ok() && config.shared_intermediate > 0 && on_gpu) {
    StatusOr<dispatch::DeviceSharedExpertPass> pass =
        cuda::make_sm90_shared_expert_pass(config, weights, comm.device());
    if (pass.ok()) st.device_shared = std::move(*pass); else built = pass.status();
  } else if (built.ok() && config.shared_intermediate > 0) {
    built = st.shared.prepare(config, weights);
    const int64_t rows = config.max_num_tokens, H = config.hidden;
    st.shared_x.resize(rows * H);
    st.shared_h.resize(rows * st.shared.gemm1_width());
    st.shared_s.resize(rows * H);
  }
  RoutingStage::Options routing_options;
  routing_options.keep_load = true;
  StatusOr<RoutingStage> routing = built.ok() ? RoutingStage::create(config, comm.device(), weights.score_bias,
                                                                     routing_options)
                                              : StatusOr<RoutingStage>(built);
  if (built.ok()) built = routing.status();
  StatusOr<RankStages> stages =
      built.ok() ? make_rank_stages(config, st.experts_class, st.weights, chosen, choice->kind, comm, platform,
                                    st.shared_pass(), st.device_shared)
                 : StatusOr<RankStages>(built);
  if (built.ok()) built = stages.status();
  MOEKIT_RETURN_IF_ERROR(dispatch::agree(comm, built));
  st.pipeline = std::make_unique<LayerPipeline>(std::move(*routing), std::move(stages->pf),
                                                std::move(stages->experts), std::move(stages->workspace));
  return layer;
}

const char* ExpertParallelLayer::dispatch_name() const { return state_->pipeline->prepare_finalize()->name(); }

// The counters live on the layer's device. A failed read leaves the last
// values (the CUDA error then fails the next forward).
const std::vector<int64_t>& ExpertParallelLayer::expert_load() const {
  std::vector<int64_t> load;
  if (state_->pipeline->routing().read_load(&load).ok()) expert_load_ = std::move(load);
  return expert_load_;
}

int64_t ExpertParallelLayer::computed_pairs() const {
  StatusOr<int64_t> pairs = state_->pipeline->prepare_finalize()->computed_pairs();
  if (pairs.ok()) computed_pairs_ = *pairs;
  return computed_pairs_;
}

void ExpertParallelLayer::reset_load() {
  std::fill(expert_load_.begin(), expert_load_.end(), 0);
  computed_pairs_ = 0;
  (void)state_->pipeline->routing().reset_load();
  (void)state_->pipeline->prepare_finalize()->reset_computed_pairs();
}

StatusOr<std::vector<int64_t>> ExpertParallelLayer::gather_expert_load() {
  const int n = comm_->size();
  const int64_t E = config_.num_experts;
  std::vector<int64_t> mine, all(n * E), sum(E, 0);
  MOEKIT_RETURN_IF_ERROR(state_->pipeline->routing().read_load(&mine));
  MOEKIT_RETURN_IF_ERROR(dispatch::all_gather_host(*comm_, mine.data(), all.data(), E * sizeof(int64_t)));
  for (int r = 0; r < n; ++r) {
    for (int64_t e = 0; e < E; ++e) sum[e] += all[r * E + e];
  }
  return sum;
}

StatusOr<std::vector<int64_t>> ExpertParallelLayer::gather_computed_pairs() {
  std::vector<int64_t> all(comm_->size());
  MOEKIT_ASSIGN_OR_RETURN(const int64_t mine, state_->pipeline->prepare_finalize()->computed_pairs());
  MOEKIT_RETURN_IF_ERROR(dispatch::all_gather_host(*comm_, &mine, all.data(), sizeof(int64_t)));
  return all;
}

Status ExpertParallelLayer::set_phase_timing(bool on) {
  return state_->pipeline->prepare_finalize()->set_phase_timing(on);
}

StatusOr<ExpertParallelLayer::PhaseTimes> ExpertParallelLayer::last_phase_times() const {
  PhaseTimes t;
  MOEKIT_RETURN_IF_ERROR(
      state_->pipeline->prepare_finalize()->last_phase_times(&t.dispatch_us, &t.experts_us, &t.combine_us));
  return t;
}

Device ExpertParallelLayer::device() const { return comm_->device(); }

size_t ExpertParallelLayer::workspace_bytes() const { return state_->pipeline->workspace_bytes(); }

const std::shared_ptr<DeviceBuffer>& ExpertParallelLayer::workspace_buffer() const {
  return state_->pipeline->workspace_buffer();
}

Status ExpertParallelLayer::use_workspace(std::shared_ptr<DeviceBuffer> buffer) {
  return state_->pipeline->use_workspace(std::move(buffer));
}

bool ExpertParallelLayer::has_run() const { return state_->pipeline->has_run(); }

std::string ExpertParallelLayer::producer() const {
  std::string experts = "experts";
  for (const CandidateReport& c : report_) {
    if (c.chosen) experts = c.backend + "/" + c.kernel;
  }
  return "ep" + std::to_string(comm_->size()) + "/" + experts;
}

Status ExpertParallelLayer::set_capture_target(const TensorView& target, const TensorView& router_weights) {
  MOEKIT_RETURN_IF_ERROR(check_capture_targets(*this, target, router_weights));
  capture_target_ = target;
  router_weights_target_ = target.defined() ? router_weights : TensorView{};
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
  MOEKIT_RETURN_IF_ERROR(check_forward_args(*this, a));
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
  // What a bad argument on one rank does is the prepare/finalize's (admit):
  // host ranks agree and all stop; GPU ranks go on without its tokens.
  return state_->pipeline->forward(args, validate(args), CaptureTargets{capture_target_, router_weights_target_},
                                   stream);
}

Status ExpertParallelLayer::rebalance(const ExpertPlacement& next) {
  Status local = next.validate();
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
  if (comm_->device().type != DeviceType::kCpu && next.slots_per_rank == placement_.slots_per_rank) {
    // GPU ranks, same slots per rank: in place. The experts re-prepare into
    // their own buffers and the dispatch writes the new replica table over the
    // old one (each after the device finished reading them); the kernel, its
    // workspace and every buffer keep their addresses.
    Status in_place = st.pipeline->experts().prepare_weights(moved.kernel_weights());
    if (in_place.ok()) in_place = st.pipeline->prepare_finalize()->use_replicas(next.replicas());
    if (!in_place.ok()) {
      in_place = Status(in_place.code(), "rebalance: " + in_place.message() +
                                             "; the layer is left unusable: create it again with the placement");
    }
    MOEKIT_RETURN_IF_ERROR(dispatch::agree(*comm_, in_place));
    st.weights = std::move(moved);
    placement_ = next;
    return Status::Ok();
  }
  StatusOr<RankStages> stages = make_rank_stages(config_, st.experts_class, moved, next, st.dispatch_kind, *comm_,
                                                 st.platform, st.shared_pass(), st.device_shared,
                                                 st.pipeline->workspace_buffer());
  MOEKIT_RETURN_IF_ERROR(dispatch::agree(*comm_, stages.status()));
  st.weights = std::move(moved);
  st.pipeline->replace_experts(std::move(stages->experts), std::move(stages->workspace), std::move(stages->pf));
  placement_ = next;
  return Status::Ok();
}

Status ExpertParallelLayer::update_expert_weights(int64_t logical, const TensorView& w13, const TensorView& w2) {
  State& st = *state_;
  if (logical < 0 || logical >= config_.num_experts) {
    return OutOfRange("update_expert_weights: expert " + std::to_string(logical) + " not in [0, " +
                      std::to_string(config_.num_experts) + ")");
  }
  if (config_.quant.method != QuantMethod::kNone) {
    // TODO(ep): the expert's scales with its weights.
    return Unsupported("update_expert_weights: a layer of " + config_.quant.to_string() +
                       " needs the expert's scales too; only unquantized layers take new weights yet");
  }
  eplb::SlotWeights next = st.weights;
  eplb::SlotPart& p13 = next.part(&MoeWeights::w13);
  eplb::SlotPart& p2 = next.part(&MoeWeights::w2);
  MOEKIT_RETURN_IF_ERROR(check_tensor(w13, "w13", {p13.dtype}, p13.slot_shape, Device::cpu()));
  MOEKIT_RETURN_IF_ERROR(check_tensor(w2, "w2", {p2.dtype}, p2.slot_shape, Device::cpu()));
  const int me = comm_->rank();
  for (int64_t s = 0; s < placement_.slots_per_rank; ++s) {
    if (placement_.physical_to_logical[me * placement_.slots_per_rank + s] != logical) continue;
    std::memcpy(p13.data.data() + s * p13.slot_bytes(), w13.data, p13.slot_bytes());
    std::memcpy(p2.data.data() + s * p2.slot_bytes(), w2.data, p2.slot_bytes());
  }
  // The kernel keeps its own prepared copy: re-prepare it from every slot,
  // once no forward may still read the old weights.
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::synchronize(comm_->device()));
  MOEKIT_RETURN_IF_ERROR(st.pipeline->experts().prepare_weights(next.kernel_weights()));
  st.weights = std::move(next);
  return Status::Ok();
}

}  // namespace moekit

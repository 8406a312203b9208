// The GPU expert-parallel PrepareFinalize (prepare_finalize.h) over
// EpDeviceAllToAll, with optional phase timing by CUDA events.
#include <string>

#include "dispatch/prepare_finalize.h"

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "dispatch/ep_device_all_to_all.h"

namespace moekit::dispatch {
namespace {

class EpDevicePrepareFinalize final : public PrepareFinalize {
 public:
  EpDevicePrepareFinalize(std::unique_ptr<EpDeviceAllToAll> a2a, DeviceSharedExpertPass shared)
      : a2a_(std::move(a2a)), shared_(std::move(shared)) {}
  ~EpDevicePrepareFinalize() override {
    for (cudaEvent_t e : phase_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }

  const char* name() const override { return "all_to_all"; }

  // No agreement round (it would wait on the host): a rank with bad arguments
  // takes part with no tokens, so that no other rank is left waiting.
  Status admit(const Status& verdict, bool* without_tokens) override {
    *without_tokens = !verdict.ok();
    return Status::Ok();
  }

  StatusOr<MoeRunArgs> prepare(const RoutedTokens& tokens, const TensorView&, Stream stream) override {
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    recorded_ = false;
    MOEKIT_RETURN_IF_ERROR(mark(0, s));
    EpDeviceTokens in;
    in.num_tokens = tokens.num_tokens;
    if (tokens.num_tokens > 0) {
      in.hidden = tokens.hidden.ptr<const uint16_t>();
      in.topk_ids = tokens.topk_ids.ptr<const int32_t>();
      in.topk_weights = tokens.topk_weights.ptr<const float>();
    }
    MOEKIT_ASSIGN_OR_RETURN(EpExpertsInputs x, a2a_->prepare(in, s));
    MOEKIT_RETURN_IF_ERROR(mark(1, s));
    MoeRunArgs run;
    run.hidden = x.hidden;
    run.out = x.out;
    run.topk_ids = x.topk_ids;
    run.topk_weights = x.topk_weights;
    run.skip_negative_ids = true;
    return run;
  }

  Status finalize(const RoutedTokens& tokens, const Status& experts, const TensorView& out, Stream stream) override {
    MOEKIT_RETURN_IF_ERROR(experts);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const bool any = tokens.num_tokens > 0;
    // The shared expert on this rank's own tokens, timed with the experts. A
    // failure still takes part in the collective, so no other rank waits.
    StatusOr<DeviceSharedAddend> shared = DeviceSharedAddend{};
    if (shared_ && any) shared = shared_(tokens.hidden, stream);
    const DeviceSharedAddend addend = shared.ok() ? *shared : DeviceSharedAddend{};
    MOEKIT_RETURN_IF_ERROR(mark(2, s));
    MOEKIT_RETURN_IF_ERROR(a2a_->finalize(any ? tokens.topk_ids.ptr<const int32_t>() : nullptr,
                                          any ? out.ptr<uint16_t>() : nullptr, addend.out, addend.gate, s));
    MOEKIT_RETURN_IF_ERROR(shared.status());
    return mark(3, s);
  }

  StatusOr<int64_t> computed_pairs() const override { return a2a_->computed_pairs(); }
  Status use_replicas(const std::vector<std::vector<int32_t>>& replicas) override {
    return a2a_->use_replicas(replicas);
  }
  Status reset_computed_pairs() override { return a2a_->reset_computed_pairs(); }

  Status set_phase_timing(bool on) override {
    for (cudaEvent_t& e : phase_) {
      if (on && e == nullptr) MOEKIT_CUDA_CHECK(cudaEventCreate(&e));
      if (!on && e != nullptr) {
        MOEKIT_CUDA_CHECK(cudaEventDestroy(e));
        e = nullptr;
      }
    }
    recorded_ = false;
    return Status::Ok();
  }

  Status last_phase_times(double* prepare_us, double* experts_us, double* finalize_us) const override {
    if (!recorded_) {
      return FailedPrecondition("phase times: none recorded (set_phase_timing(true), then an eager forward)");
    }
    MOEKIT_CUDA_CHECK(cudaEventSynchronize(phase_[3]));
    float ms[3] = {0, 0, 0};
    for (int i = 0; i < 3; ++i) MOEKIT_CUDA_CHECK(cudaEventElapsedTime(&ms[i], phase_[i], phase_[i + 1]));
    *prepare_us = 1000.0 * ms[0];
    *experts_us = 1000.0 * ms[1];
    *finalize_us = 1000.0 * ms[2];
    return Status::Ok();
  }

 private:
  // Records phase event i on s when timing is on and s is not being captured.
  Status mark(int i, cudaStream_t s) {
    if (phase_[0] == nullptr) return Status::Ok();
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    MOEKIT_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) return Status::Ok();
    MOEKIT_CUDA_CHECK(cudaEventRecord(phase_[i], s));
    if (i == 3) recorded_ = true;
    return Status::Ok();
  }

  std::unique_ptr<EpDeviceAllToAll> a2a_;
  DeviceSharedExpertPass shared_;  // the shared expert on this rank's tokens, or empty
  // Before prepare, after prepare, before finalize (after the experts), after finalize.
  cudaEvent_t phase_[4] = {nullptr, nullptr, nullptr, nullptr};
  bool recorded_ = false;  // the last forward recorded them
};

}  // namespace

StatusOr<std::unique_ptr<PrepareFinalize>> make_ep_device_prepare_finalize(
    Communicator& comm, const EpShape& shape, const ExpertPlacement& placement,
    const std::vector<std::vector<int32_t>>& replicas, DeviceSharedExpertPass shared) {
  if (shape.act_dtype != DType::kBF16) {
    return Unsupported(std::string("expert parallel on GPUs: the device all-to-all moves bf16 rows, got ") +
                       dtype_name(shape.act_dtype));
  }
  cuda::EpDeviceShape s;
  s.ranks = comm.size();
  s.rank = comm.rank();
  s.max_tokens = shape.max_tokens;
  s.hidden = shape.hidden;
  s.top_k = shape.top_k;
  s.num_logical = placement.num_logical;
  s.slots_per_rank = placement.slots_per_rank;
  MOEKIT_ASSIGN_OR_RETURN(std::unique_ptr<EpDeviceAllToAll> a2a, EpDeviceAllToAll::create(comm, s, replicas));
  return std::unique_ptr<PrepareFinalize>(new EpDevicePrepareFinalize(std::move(a2a), std::move(shared)));
}

}  // namespace moekit::dispatch

#else  // !MOEKIT_WITH_CUDA

namespace moekit::dispatch {

StatusOr<std::unique_ptr<PrepareFinalize>> make_ep_device_prepare_finalize(
    Communicator& comm, const EpShape&, const ExpertPlacement&, const std::vector<std::vector<int32_t>>&,
    DeviceSharedExpertPass) {
  return Unsupported(std::string("expert parallel: the ") + comm.name() + " communicator is on " +
                     comm.device().to_string() + ", and this build has no CUDA support");
}

}  // namespace moekit::dispatch

#endif  // MOEKIT_WITH_CUDA

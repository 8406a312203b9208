// Sm90Modular and Sm90Monolithic: argument checks, weight preparation and the
// launch sequence. The stages themselves live in moe_pipeline.h; what the
// classes support, and their registration, in sm90_backend.cpp.
#include "experts/cuda/sm90_kernels.h"

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstring>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "experts/cuda/fp8_experts.h"
#include "experts/cuda/fp8_gemm_cutlass_sm90.h"
#include "experts/cuda/grouped_gemm.h"
#include "experts/cuda/moe_pipeline.h"
#include "experts/cuda/moe_pipeline_fp8.h"
#include "experts/cuda/sm90_support.h"
#include "experts/quant_weights.h"
#include "experts/cuda/weight_layout.h"
#include "experts/cuda/weight_values.h"
#include "routing/cuda/route_cuda.h"

namespace moekit::cuda {

namespace {

// Owning device allocation, freed on destruction.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory() { reset(); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  Status allocate(size_t bytes) {
    reset();
    if (bytes == 0) return Status::Ok();
    MOEKIT_CUDA_CHECK(cudaMalloc(&data_, bytes));
    return Status::Ok();
  }
  void reset() {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = nullptr;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
};

// The shared expert's side stream and its fork/join events
// (shared_expert_overlap): created once with the kernel, destroyed with it.
class OwnedSideStream {
 public:
  OwnedSideStream() = default;
  ~OwnedSideStream() {
    if (side_.join != nullptr) (void)cudaEventDestroy(side_.join);
    if (side_.fork != nullptr) (void)cudaEventDestroy(side_.fork);
    if (side_.stream != nullptr) (void)cudaStreamDestroy(side_.stream);  // pending work still completes
  }
  OwnedSideStream(const OwnedSideStream&) = delete;
  OwnedSideStream& operator=(const OwnedSideStream&) = delete;
  Status create() {
    // Non-blocking: the side stream never waits on the legacy default stream
    // behind the caller's back; the fork event is its only dependency.
    MOEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&side_.stream, cudaStreamNonBlocking));
    MOEKIT_CUDA_CHECK(cudaEventCreateWithFlags(&side_.fork, cudaEventDisableTiming));
    MOEKIT_CUDA_CHECK(cudaEventCreateWithFlags(&side_.join, cudaEventDisableTiming));
    return Status::Ok();
  }
  // nullptr until create() succeeded.
  const SharedExpertSide* get() const { return side_.join != nullptr ? &side_ : nullptr; }

 private:
  SharedExpertSide side_;
};

std::string str(int64_t v) { return std::to_string(v); }

// A host copy of an optional f32|bf16 tensor (host or device) widened to f32.
StatusOr<std::vector<float>> widened_f32(const TensorView& t) {
  std::vector<unsigned char> bytes(t.nbytes());
  if (!bytes.empty()) MOEKIT_CUDA_CHECK(cudaMemcpy(bytes.data(), t.data, bytes.size(), cudaMemcpyDefault));
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == DType::kF32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t b = 0;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      out[i] = bf16_bits_to_f32(b);
    }
  }
  return out;
}

// The device where a weight may be given: this kernel's device, or the host.
Device weight_device(const TensorView& t, Device dev) {
  return t.device.type == DeviceType::kCuda ? dev : Device::cpu();
}

class Sm90Kernel : public MoeKernel {
 public:
  Sm90Kernel(MoeConfig config, int device_index) : MoeKernel(std::move(config)), device_index_(device_index) {
    shape_ = sm90_shape_of(config_);
  }

  Device device() const override { return Device::cuda(device_index_); }

  // Once, at creation, on the kernel's device: the side stream when the config asks for it.
  Status create_side_stream() { return shape_.shared_overlap ? side_.create() : Status::Ok(); }

  StatusOr<ProblemSize> problem_size(const TensorView& hidden, const TensorView& w13, const TensorView& w2,
                                     const TensorView& topk_ids) const override {
    // Prepared W13 keeps the checkpoint's [E, N1, H] shape (rows permuted only).
    if (hidden.rank != 2) return InvalidArgument("hidden: expected [M, H], got " + hidden.shape_string());
    if (w13.rank != 3) return InvalidArgument("w13: expected [E, N1, H], got " + w13.shape_string());
    if (w2.rank != 3) return InvalidArgument("w2: expected [E, H, I], got " + w2.shape_string());
    if (topk_ids.rank != 2) return InvalidArgument("topk_ids: expected [M, k], got " + topk_ids.shape_string());
    ProblemSize p;
    p.num_experts = w13.shape[0];
    p.num_tokens = hidden.shape[0];
    p.n = w13.shape[1];
    p.k = w13.shape[2];
    p.top_k = topk_ids.shape[1];
    if (hidden.shape[1] != p.k || w2.shape[0] != p.num_experts || w2.shape[1] != p.k ||
        topk_ids.shape[0] != p.num_tokens) {
      return InvalidArgument("problem_size: inconsistent shapes hidden " + hidden.shape_string() + ", w13 " +
                             w13.shape_string() + ", w2 " + w2.shape_string() + ", topk_ids " + topk_ids.shape_string());
    }
    return p;
  }

  size_t workspace_size(int64_t num_tokens) const override {
    return config_.quant.is_fp8() ? fp8_workspace_layout(shape_, num_tokens).total
                                  : experts_workspace_layout(shape_, num_tokens).total;
  }

  Status prepare_weights(const MoeWeights& w) override {
    // NaN or Inf weights would run and return NaN rows: refused, as the cpu
    // backend refuses them, on the host or on the device where they are.
    const std::pair<const TensorView*, const char*> values[] = {
        {&w.w13, "w13"}, {&w.w2, "w2"}, {&w.w13_bias, "w13_bias"}, {&w.w2_bias, "w2_bias"},
        {&w.shared_w13, "shared_w13"}, {&w.shared_w2, "shared_w2"}, {&w.shared_gate, "shared_gate"}};
    for (const auto& [t, name] : values) {
      MOEKIT_RETURN_IF_ERROR(check_weight_values(*t, name));
      if (t->defined() && t->device == device()) {  // on another device: check_tensor refuses it below
        MOEKIT_RETURN_IF_ERROR(require_current_device());
        MOEKIT_RETURN_IF_ERROR(check_device_weight_values(*t, name));
      }
    }
    if (config_.quant.is_fp8()) return prepare_fp8_weights(w);
    const int64_t E = shape_.num_experts, H = shape_.hidden, I = shape_.intermediate, N1 = shape_.n1();
    const Device dev = device();
    const Device w13_dev = w.w13.device.type == DeviceType::kCuda ? dev : Device::cpu();
    const Device w2_dev = w.w2.device.type == DeviceType::kCuda ? dev : Device::cpu();
    MOEKIT_RETURN_IF_ERROR(check_tensor(w.w13, "w13", {DType::kBF16}, {E, N1, H}, w13_dev));
    MOEKIT_RETURN_IF_ERROR(check_tensor(w.w2, "w2", {DType::kBF16}, {E, H, I}, w2_dev));
    if (config_.routing.has_score_bias) {
      const Device b_dev = w.score_bias.device.type == DeviceType::kCuda ? dev : Device::cpu();
      MOEKIT_RETURN_IF_ERROR(check_tensor(w.score_bias, "score_bias", {DType::kF32}, {E}, b_dev));
    }
    MOEKIT_RETURN_IF_ERROR(check_extras(w));
    MOEKIT_RETURN_IF_ERROR(require_current_device());
    prepared_ = false;

    const size_t w13_bytes = w.w13.nbytes(), w2_bytes = w.w2.nbytes();
    MOEKIT_RETURN_IF_ERROR(w13_.allocate(w13_bytes));
    MOEKIT_RETURN_IF_ERROR(w2_.allocate(w2_bytes));
    const uint16_t* w13_src = w.w13.ptr<const uint16_t>();
    DeviceMemory staging;  // [E, N1, H] bf16: a host W13 on its way to the re-layout
    if (w.w13.device.type == DeviceType::kCpu) {
      MOEKIT_RETURN_IF_ERROR(staging.allocate(w13_bytes));
      MOEKIT_CUDA_CHECK(cudaMemcpy(staging.as<void>(), w.w13.data, w13_bytes, cudaMemcpyHostToDevice));
      w13_src = staging.as<const uint16_t>();
    }
    MOEKIT_RETURN_IF_ERROR(relayout_w13(w13_src, w13_.as<uint16_t>(), E, N1, H, config_.activation.kind, I, nullptr));
    MOEKIT_CUDA_CHECK(cudaMemcpy(w2_.as<void>(), w.w2.data, w2_bytes, cudaMemcpyDefault));
    if (config_.routing.has_score_bias) {
      MOEKIT_RETURN_IF_ERROR(bias_.allocate(sizeof(float) * E));
      MOEKIT_CUDA_CHECK(cudaMemcpy(bias_.as<void>(), w.score_bias.data, sizeof(float) * E, cudaMemcpyDefault));
    }
    MOEKIT_RETURN_IF_ERROR(prepare_extras(w));
    MOEKIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // prepare only: the re-layout is done before we return
    prepared_ = true;
    return Status::Ok();
  }

 protected:
  // Each extra tensor (kernel.h) required with its config flag, refused without it.
  Status check_extras(const MoeWeights& w) const {
    const int64_t E = shape_.num_experts, H = shape_.hidden, N1 = shape_.n1();
    const int64_t Is = shape_.shared_intermediate, N1s = shape_.shared_n1();
    const Device dev = device();
    auto check = [&](const TensorView& t, const char* name, bool wanted, const char* flag,
                     std::initializer_list<DType> dtypes, std::initializer_list<int64_t> shape) -> Status {
      if (wanted) return check_tensor(t, name, dtypes, shape, weight_device(t, dev));
      if (t.defined()) return InvalidArgument(std::string(name) + ": given, but " + flag + " is off in the config");
      return Status::Ok();
    };
    const bool bias = shape_.expert_bias, shared = Is > 0;
    MOEKIT_RETURN_IF_ERROR(check(w.w13_bias, "w13_bias", bias, "has_expert_bias", {DType::kF32, DType::kBF16}, {E, N1}));
    MOEKIT_RETURN_IF_ERROR(check(w.w2_bias, "w2_bias", bias, "has_expert_bias", {DType::kF32, DType::kBF16}, {E, H}));
    MOEKIT_RETURN_IF_ERROR(check(w.shared_w13, "shared_w13", shared, "shared_intermediate", {DType::kBF16}, {N1s, H}));
    MOEKIT_RETURN_IF_ERROR(check(w.shared_w2, "shared_w2", shared, "shared_intermediate", {DType::kBF16}, {H, Is}));
    MOEKIT_RETURN_IF_ERROR(check(w.shared_gate, "shared_gate", shape_.shared_gate, "has_shared_gate",
                                 {DType::kF32, DType::kBF16}, {H}));
    return Status::Ok();
  }

  // Device copies of the extras: biases widened to f32, the gate/up bias in
  // the prepared column order of W13; shared W13 re-laid-out like W13.
  Status prepare_extras(const MoeWeights& w) {
    const int64_t E = shape_.num_experts, H = shape_.hidden, N1 = shape_.n1(), I = shape_.intermediate;
    const Activation kind = config_.activation.kind;
    if (shape_.expert_bias) {
      MOEKIT_ASSIGN_OR_RETURN(std::vector<float> b13, widened_f32(w.w13_bias));
      std::vector<float> prepared(b13.size());
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t r = 0; r < N1; ++r) prepared[e * N1 + r] = b13[e * N1 + w13_source_row(kind, I, r)];
      }
      MOEKIT_ASSIGN_OR_RETURN(std::vector<float> b2, widened_f32(w.w2_bias));
      MOEKIT_RETURN_IF_ERROR(upload(w13_bias_, prepared));
      MOEKIT_RETURN_IF_ERROR(upload(w2_bias_, b2));
    }
    if (shape_.shared_intermediate > 0) {
      const int64_t Is = shape_.shared_intermediate, N1s = shape_.shared_n1();
      const size_t w13_bytes = w.shared_w13.nbytes(), w2_bytes = w.shared_w2.nbytes();
      MOEKIT_RETURN_IF_ERROR(shared_w13_.allocate(w13_bytes));
      MOEKIT_RETURN_IF_ERROR(shared_w2_.allocate(w2_bytes));
      DeviceMemory staging;  // [N1s, H] bf16 as given
      MOEKIT_RETURN_IF_ERROR(staging.allocate(w13_bytes));
      MOEKIT_CUDA_CHECK(cudaMemcpy(staging.as<void>(), w.shared_w13.data, w13_bytes, cudaMemcpyDefault));
      MOEKIT_RETURN_IF_ERROR(
          relayout_w13(staging.as<const uint16_t>(), shared_w13_.as<uint16_t>(), 1, N1s, H, kind, Is, nullptr));
      MOEKIT_CUDA_CHECK(cudaMemcpy(shared_w2_.as<void>(), w.shared_w2.data, w2_bytes, cudaMemcpyDefault));
      MOEKIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // staging is freed on return
      if (shape_.shared_gate) {
        MOEKIT_ASSIGN_OR_RETURN(std::vector<float> g, widened_f32(w.shared_gate));
        MOEKIT_RETURN_IF_ERROR(upload(shared_gate_, g));
      }
    }
    return Status::Ok();
  }

  static Status upload(DeviceMemory& dst, const std::vector<float>& src) {
    MOEKIT_RETURN_IF_ERROR(dst.allocate(src.size() * sizeof(float)));
    MOEKIT_CUDA_CHECK(cudaMemcpy(dst.as<void>(), src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice));
    return Status::Ok();
  }

  Status require_current_device() const {
    int current = -1;
    MOEKIT_CUDA_CHECK(cudaGetDevice(&current));
    if (current != device_index_) {
      return InvalidArgument(std::string(name()) + " lives on cuda:" + str(device_index_) +
                             " but the current CUDA device is cuda:" + str(current));
    }
    return Status::Ok();
  }

  // Checks shared by both classes; returns M through `num_tokens`.
  Status check_common(const MoeRunArgs& a, const Workspace& ws, int64_t* num_tokens) const {
    if (!prepared_) return FailedPrecondition(std::string(name()) + ": run() before prepare_weights()");
    const Device dev = device();
    const int64_t H = shape_.hidden, E = shape_.num_experts;
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.hidden, "hidden", {DType::kBF16}, {-1, H}, dev));
    const int64_t M = a.hidden.shape[0];
    if (M > config_.max_num_tokens) {
      return InvalidArgument("hidden: M = " + str(M) + " exceeds max_num_tokens = " + str(config_.max_num_tokens));
    }
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.out, "out", {DType::kBF16}, {M, H}, dev));
    if (a.expert_counts.defined()) {
      MOEKIT_RETURN_IF_ERROR(check_tensor(a.expert_counts, "expert_counts", {DType::kI32}, {E}, dev));
    }
    const size_t need = workspace_size(M);
    if (ws.bytes < need || (need > 0 && ws.data == nullptr)) {
      return InvalidArgument(std::string(name()) + ": workspace of " + str(static_cast<int64_t>(ws.bytes)) +
                             " bytes, needs " + str(static_cast<int64_t>(need)) + " for M = " + str(M));
    }
    if (reinterpret_cast<uintptr_t>(ws.data) % 256 != 0) {
      return InvalidArgument(std::string(name()) + ": workspace must be 256-byte aligned");
    }
    MOEKIT_RETURN_IF_ERROR(require_current_device());
    *num_tokens = M;
    return Status::Ok();
  }

  // fp8: weights kept in the checkpoint layout (1 byte each), scales beside them.
  Status prepare_fp8_weights(const MoeWeights& w) {
    const int64_t E = shape_.num_experts, H = shape_.hidden, I = shape_.intermediate, N1 = shape_.n1();
    const Device dev = device();
    const Device w_dev = w.w13.device.type == DeviceType::kCuda ? dev : Device::cpu();
    MOEKIT_RETURN_IF_ERROR(check_tensor(w.w13, "w13", {DType::kF8E4M3}, {E, N1, H}, w_dev));
    MOEKIT_RETURN_IF_ERROR(check_tensor(w.w2, "w2", {DType::kF8E4M3}, {E, H, I}, w_dev));
    // Scales on the weights' side; device scales are checked on a host copy.
    MOEKIT_RETURN_IF_ERROR(check_quant_scales(config_, w, w_dev));
    const std::pair<const TensorView*, const char*> scales[] = {
        {&w.w13_scale, "w13_scale"}, {&w.w2_scale, "w2_scale"}, {&w.a13_scale, "a13_scale"}, {&w.a2_scale, "a2_scale"}};
    if (w_dev.type == DeviceType::kCuda) {
      for (const auto& [t, name] : scales) {
        if (!t->defined()) continue;
        HostTensor host(DType::kF32, std::vector<int64_t>(t->shape.begin(), t->shape.begin() + t->rank));
        MOEKIT_CUDA_CHECK(cudaMemcpy(host.data<float>(), t->data, t->nbytes(), cudaMemcpyDeviceToHost));
        MOEKIT_RETURN_IF_ERROR(check_scale_values(host.view(), name));
      }
    }
    if (config_.routing.has_score_bias) {
      const Device b_dev = w.score_bias.device.type == DeviceType::kCuda ? dev : Device::cpu();
      MOEKIT_RETURN_IF_ERROR(check_tensor(w.score_bias, "score_bias", {DType::kF32}, {E}, b_dev));
    }
    MOEKIT_RETURN_IF_ERROR(require_current_device());
    prepared_ = false;
    DeviceMemory* dst[] = {&w13_scale_, &w2_scale_, &a13_scale_, &a2_scale_};
    for (int i = 0; i < 4; ++i) {
      const TensorView& t = *scales[i].first;
      dst[i]->reset();
      if (!t.defined()) continue;
      MOEKIT_RETURN_IF_ERROR(dst[i]->allocate(t.nbytes()));
      MOEKIT_CUDA_CHECK(cudaMemcpy(dst[i]->as<void>(), t.data, t.nbytes(), cudaMemcpyDefault));
    }
    MOEKIT_RETURN_IF_ERROR(w13_.allocate(w.w13.nbytes()));
    MOEKIT_RETURN_IF_ERROR(w2_.allocate(w.w2.nbytes()));
    MOEKIT_CUDA_CHECK(cudaMemcpy(w13_.as<void>(), w.w13.data, w.w13.nbytes(), cudaMemcpyDefault));
    MOEKIT_CUDA_CHECK(cudaMemcpy(w2_.as<void>(), w.w2.data, w.w2.nbytes(), cudaMemcpyDefault));
    w13_gemm_scale_.reset();
    w2_gemm_scale_.reset();
    if (fp8_cutlass_gemm_built()) {
      const int64_t parts = shape_.activation.gated() ? 2 : 1, part_count = fp8_w13_gemm_scale_count(shape_) / parts;
      const auto blocks = [](int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; };
      MOEKIT_RETURN_IF_ERROR(w13_gemm_scale_.allocate(sizeof(float) * parts * part_count));
      MOEKIT_RETURN_IF_ERROR(w2_gemm_scale_.allocate(sizeof(float) * E * blocks(I) * blocks(H)));
      if (fp8_gemm1_single_launch(shape_)) {
        MOEKIT_RETURN_IF_ERROR(fp8_expand_weight_scales(config_.quant.method, w13_scale_.as<const float>(), E, N1, H,
                                                        parts, -1, w13_gemm_scale_.as<float>(), nullptr));
      } else {
        for (int64_t p = 0; p < parts; ++p) {
          MOEKIT_RETURN_IF_ERROR(fp8_expand_weight_scales(config_.quant.method, w13_scale_.as<const float>(), E, N1,
                                                          H, parts, p, w13_gemm_scale_.as<float>() + p * part_count,
                                                          nullptr));
        }
      }
      MOEKIT_RETURN_IF_ERROR(fp8_expand_weight_scales(config_.quant.method, w2_scale_.as<const float>(), E, H, I, 1, 0,
                                                      w2_gemm_scale_.as<float>(), nullptr));
    }
    if (config_.routing.has_score_bias) {
      MOEKIT_RETURN_IF_ERROR(bias_.allocate(sizeof(float) * E));
      MOEKIT_CUDA_CHECK(cudaMemcpy(bias_.as<void>(), w.score_bias.data, sizeof(float) * E, cudaMemcpyDefault));
    }
    MOEKIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    prepared_ = true;
    return Status::Ok();
  }

  // The expert stages after routing, on the pipeline of the config's scheme;
  // both classes end here.
  Status run_pipeline(const MoeRunArgs& a, const Workspace& ws, int64_t M, const int32_t* ids, const float* weights,
                      cudaStream_t stream) const {
    if (config_.quant.is_fp8()) {
      if (a.skip_negative_ids) {
        // TODO(ep): the fp8 finalize (fp8_experts_sm90.cu) does not skip yet.
        return Unsupported(std::string(name()) + ": skip_negative_ids (expert parallelism) is served for bf16 only");
      }
      Fp8ExpertWeights fw;
      fw.quant = config_.quant;
      fw.w13 = w13_.as<const uint8_t>();
      fw.w2 = w2_.as<const uint8_t>();
      fw.w13_scale = w13_scale_.as<const float>();
      fw.w2_scale = w2_scale_.as<const float>();
      fw.a13_scale = a13_scale_.as<const float>();
      fw.a2_scale = a2_scale_.as<const float>();
      fw.w13_gemm_scale = w13_gemm_scale_.as<const float>();
      fw.w2_gemm_scale = w2_gemm_scale_.as<const float>();
      Fp8ExpertsRun r;
      r.num_tokens = M;
      r.hidden = a.hidden.ptr<const uint16_t>();
      r.topk_ids = ids;
      r.topk_weights = weights;
      r.out = a.out.ptr<uint16_t>();
      r.expert_counts = a.expert_counts.defined() ? a.expert_counts.ptr<int32_t>() : nullptr;
      r.workspace = static_cast<char*>(ws.data);
      return run_experts_fp8(shape_, fw, r, stream);
    }
    ExpertsRun r = experts_run(a, ws, M);
    r.topk_ids = ids;
    r.topk_weights = weights;
    r.skip_negative_ids = a.skip_negative_ids;
    return run_experts(shape_, r, stream);
  }

  // The first launch of a forward: with shared_expert_overlap, the shared
  // expert forked onto the side stream, so it overlaps routing and the routed experts.
  Status fork_shared(const MoeRunArgs& a, const Workspace& ws, int64_t M, cudaStream_t stream) const {
    if (!shape_.shared_overlap || config_.quant.is_fp8()) return Status::Ok();
    return fork_shared_expert(shape_, experts_run(a, ws, M), stream);
  }

  ExpertsRun experts_run(const MoeRunArgs& a, const Workspace& ws, int64_t M) const {
    ExpertsRun r;
    r.num_tokens = M;
    r.hidden = a.hidden.ptr<const uint16_t>();
    r.w13 = w13_.as<const uint16_t>();
    r.w2 = w2_.as<const uint16_t>();
    r.out = a.out.ptr<uint16_t>();
    r.expert_counts = a.expert_counts.defined() ? a.expert_counts.ptr<int32_t>() : nullptr;
    r.workspace = static_cast<char*>(ws.data);
    r.w13_bias = w13_bias_.as<const float>();
    r.w2_bias = w2_bias_.as<const float>();
    r.shared_w13 = shared_w13_.as<const uint16_t>();
    r.shared_w2 = shared_w2_.as<const uint16_t>();
    r.shared_gate = shared_gate_.as<const float>();
    r.shared_side = side_.get();
    return r;
  }

  int device_index_;
  ExpertsShape shape_;
  DeviceMemory w13_;   // [E, N1, H] bf16, gate/up block-interleaved (weight_layout.h)
  DeviceMemory w2_;    // [E, H, I] bf16
  DeviceMemory bias_;  // [E] f32, deepseek_v3 e_score_correction_bias (monolithic routing), optional
  // fp8 schemes only (w13_/w2_ then hold e4m3 bytes in the checkpoint layout):
  DeviceMemory w13_scale_, w2_scale_;  // MoeWeights layouts (kernel.h), f32
  DeviceMemory w13_gemm_scale_, w2_gemm_scale_;  // Fp8ExpertWeights layouts, iff fp8_cutlass_gemm_built
  DeviceMemory a13_scale_, a2_scale_;  // [E] f32, static activation scales, optional
  DeviceMemory w13_bias_;     // [E, N1] f32, prepared column order, iff has_expert_bias
  DeviceMemory w2_bias_;      // [E, H] f32, iff has_expert_bias
  DeviceMemory shared_w13_;   // [N1s, H] bf16, gate/up block-interleaved, iff a shared expert
  DeviceMemory shared_w2_;    // [H, Is] bf16
  DeviceMemory shared_gate_;  // [H] f32, iff has_shared_gate
  OwnedSideStream side_;      // iff shape_.shared_overlap
  bool prepared_ = false;
};

class Sm90Modular final : public Sm90Kernel {
 public:
  using Sm90Kernel::Sm90Kernel;
  const char* name() const override { return "Sm90Modular"; }
  bool is_monolithic() const override { return false; }

  Status run(const MoeRunArgs& a, Workspace ws, Stream stream) override {
    int64_t M = 0;
    MOEKIT_RETURN_IF_ERROR(check_common(a, ws, &M));
    const Device dev = device();
    const int64_t k = shape_.top_k;
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.topk_ids, "topk_ids", {DType::kI32}, {M, k}, dev));
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.topk_weights, "topk_weights", {DType::kF32}, {M, k}, dev));
    if (a.forced_ids.defined() || a.routing_replay_out.defined()) {
      return InvalidArgument(
          "Sm90Modular: forced_ids/routing_replay_out belong to the router of a modular kernel, not to run()");
    }
    const auto s = static_cast<cudaStream_t>(stream);
    MOEKIT_RETURN_IF_ERROR(fork_shared(a, ws, M, s));
    return run_pipeline(a, ws, M, a.topk_ids.ptr<const int32_t>(), a.topk_weights.ptr<const float>(), s);
  }
};

class Sm90Monolithic final : public Sm90Kernel {
 public:
  using Sm90Kernel::Sm90Kernel;
  const char* name() const override { return "Sm90Monolithic"; }
  bool is_monolithic() const override { return true; }
  bool supports_routing_replay_capture() const override { return true; }
  bool supports_router_weights_capture() const override { return true; }

  Status run(const MoeRunArgs& a, Workspace ws, Stream stream) override {
    int64_t M = 0;
    MOEKIT_RETURN_IF_ERROR(check_common(a, ws, &M));
    const Device dev = device();
    const int64_t k = shape_.top_k, E = shape_.num_experts;
    MOEKIT_RETURN_IF_ERROR(check_tensor(a.router_logits, "router_logits", {config_.logits_dtype}, {M, E}, dev));
    if (a.forced_ids.defined()) {
      MOEKIT_RETURN_IF_ERROR(check_tensor(a.forced_ids, "forced_ids", {DType::kI32}, {M, k}, dev));
    }
    if (a.routing_replay_out.defined()) {
      MOEKIT_RETURN_IF_ERROR(check_tensor(a.routing_replay_out, "routing_replay_out", {DType::kI16}, {-1, k}, dev));
      if (a.routing_replay_out.shape[0] < M) {
        return InvalidArgument("routing_replay_out: needs at least M = " + str(M) + " rows, got " +
                               a.routing_replay_out.shape_string());
      }
    }
    if (a.topk_ids.defined() || a.topk_weights.defined()) {
      return InvalidArgument("Sm90Monolithic: routes inside; topk_ids/topk_weights must not be given");
    }
    if (a.router_weights_out.defined()) {
      MOEKIT_RETURN_IF_ERROR(check_tensor(a.router_weights_out, "router_weights_out", {DType::kF32}, {-1, k}, dev));
      if (a.router_weights_out.shape[0] < M) {
        return InvalidArgument("router_weights_out: needs at least M = " + str(M) + " rows, got " +
                               a.router_weights_out.shape_string());
      }
    }
    if (a.skip_negative_ids) {
      return InvalidArgument("Sm90Monolithic: skip_negative_ids belongs to a modular kernel fed by an EP dispatch");
    }
    // NOTE: ids and weights lie at these offsets in the fp8 layout too (moe_pipeline_fp8.h).
    const ExpertsWorkspaceLayout l = experts_workspace_layout(shape_, M);
    char* base = static_cast<char*>(ws.data);
    auto* ids = reinterpret_cast<int32_t*>(base + l.topk_ids);         // [M, k] i32
    auto* weights = reinterpret_cast<float*>(base + l.topk_weights);  // [M, k] f32
    const auto s = static_cast<cudaStream_t>(stream);
    MOEKIT_RETURN_IF_ERROR(fork_shared(a, ws, M, s));

    // expert_counts: counted by the align stage.
    MOEKIT_RETURN_IF_ERROR(launch_routing(
        make_routing_launch(config_.routing, a.router_logits,
                            config_.routing.has_score_bias ? bias_.as<const float>() : nullptr, a.forced_ids, ids,
                            weights, a.routing_replay_out, /*expert_counts=*/nullptr),
        s));
    if (a.router_weights_out.defined()) {  // capture of router weights: the routing's own output, copied
      MOEKIT_CUDA_CHECK(cudaMemcpyAsync(a.router_weights_out.data, weights, static_cast<size_t>(M * k) * sizeof(float),
                                        cudaMemcpyDeviceToDevice, s));
    }

    return run_pipeline(a, ws, M, ids, weights, s);
  }
};

template <typename Kernel>
StatusOr<std::unique_ptr<MoeKernel>> create(const MoeConfig& config, const Platform& platform, bool monolithic) {
  const Support s = sm90_supports(config, platform, monolithic);
  if (!s.ok) return Unsupported(s.reason);
  int current = -1;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&current));
  bool sm90 = false;
  for (const CudaDeviceInfo& d : platform.cuda_devices) sm90 |= d.index == current && d.cc_major == 9 && d.cc_minor == 0;
  if (!sm90) return Unsupported("the current CUDA device cuda:" + str(current) + " is not an sm_90 device");
  auto kernel = std::make_unique<Kernel>(config, current);
  MOEKIT_RETURN_IF_ERROR(kernel->create_side_stream());
  return std::unique_ptr<MoeKernel>(std::move(kernel));
}

}  // namespace

StatusOr<std::unique_ptr<MoeKernel>> create_sm90_modular(const MoeConfig& config, const Platform& platform) {
  return create<Sm90Modular>(config, platform, false);
}
StatusOr<std::unique_ptr<MoeKernel>> create_sm90_monolithic(const MoeConfig& config, const Platform& platform) {
  return create<Sm90Monolithic>(config, platform, true);
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

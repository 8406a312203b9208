// RoutedExpertsCapturer: the capture buffer, the per-step sentinel reset and
// check, and the per-request accounting of captured rows.
#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "core/checked_size.h"
#include "moekit/device_buffer.h"
#include "moekit/capture.h"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "capture/cuda/capture_rows_cuda.h"
#endif

namespace moekit {

int64_t StepLayout::num_rows() const {
  int64_t n = 0;
  for (const StepSegment& s : segments) n += s.num_rows;
  return n;
}

const RequestCapture* CaptureSet::find(const std::string& request) const {
  for (const RequestCapture& r : requests) {
    if (r.request == request) return &r;
  }
  return nullptr;
}

struct RoutedExpertsCapturer::Request {
  int64_t skip = 0;         // tokens not kept at the start
  int64_t prompt = -1;      // prompt length (first generated token), -1 when not known
  int64_t tokens_seen = 0;  // tokens of this request seen in steps so far (kept or not)
  std::vector<int16_t> ids;  // [kept tokens, num_moe_layers, top_k] i16
  std::vector<float> weights;  // same shape, f32, iff the capturer records router weights
};

struct RoutedExpertsCapturer::Impl {
  DeviceBuffer buffer;   // [num_moe_layers, max_num_tokens, top_k] i16 on the capture device
  DeviceBuffer staging;  // same shape, pinned host; CUDA devices only (rows [0, M) per layer)
  DeviceBuffer weights;          // [num_moe_layers, max_num_tokens, top_k] f32, iff record_router_weights
  DeviceBuffer weights_staging;  // same shape, pinned host; CUDA devices only, iff record_router_weights
  std::map<std::string, Request> requests;
  std::vector<std::string> order;  // requests in the order they were added
  StepLayout step;                 // the step between begin_step and end_step
  bool in_step = false;
  // A step ended with end_step_async whose rows are being copied to `staging`.
  StepLayout pending;
  bool has_pending = false;
  void* copied = nullptr;  // cudaEvent_t recorded after the copy (CUDA devices, created on first use)
  ~Impl();
};

RoutedExpertsCapturer::Impl::~Impl() {
#ifdef MOEKIT_WITH_CUDA
  if (copied != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(copied));
#endif
}

namespace {
std::string quoted(const std::string& s) { return "'" + s + "'"; }

// The whole capture buffer set to the sentinel once, at create; afterwards each
// step's end puts it back on the rows it moved (move_capture_rows_to_host).
Status fill_sentinel(const DeviceBuffer& buffer, Device device) {
  switch (device.type) {
    case DeviceType::kCpu:
      std::memset(buffer.data(), 0xff, buffer.bytes());  // 0xff bytes are int16 -1 (two's complement)
      return Status::Ok();
    case DeviceType::kCuda: {
#ifdef MOEKIT_WITH_CUDA
      int previous = 0;
      cudaError_t err = cudaGetDevice(&previous);
      if (err == cudaSuccess) err = cudaSetDevice(device.index);
      if (err == cudaSuccess) err = cudaMemset(buffer.data(), 0xff, buffer.bytes());
      // cudaMemset is asynchronous: done before a capture on another stream writes ids.
      if (err == cudaSuccess) err = cudaStreamSynchronize(nullptr);
      (void)cudaSetDevice(previous);
      if (err != cudaSuccess) return Internal(std::string("capturer: sentinel fill failed: ") + cudaGetErrorString(err));
      return Status::Ok();
#else
      return Unsupported("capturer: this build has no CUDA support");
#endif
    }
  }
  return Internal("capturer: unknown device type");
}
}  // namespace

StatusOr<std::unique_ptr<RoutedExpertsCapturer>> RoutedExpertsCapturer::create(int num_moe_layers,
                                                                               int64_t max_num_tokens, int top_k,
                                                                               Device device, bool enabled,
                                                                               CapturerOptions options) {
  if (num_moe_layers < 1) {
    return InvalidArgument("capturer: num_moe_layers must be >= 1, got " + std::to_string(num_moe_layers));
  }
  if (max_num_tokens < 1) {
    return InvalidArgument("capturer: max_num_tokens must be >= 1, got " + std::to_string(max_num_tokens));
  }
  if (top_k < 1) return InvalidArgument("capturer: top_k must be >= 1, got " + std::to_string(top_k));
  std::unique_ptr<RoutedExpertsCapturer> c(new RoutedExpertsCapturer());
  c->enabled_ = enabled;
  c->options_ = options;
  c->num_layers_ = num_moe_layers;
  c->max_tokens_ = max_num_tokens;
  c->top_k_ = top_k;
  c->device_ = device;
  c->impl_ = std::make_unique<Impl>();
  if (!enabled) return c;  // NOTE: a disabled capturer must never allocate (tested).
  // Checked: a wrapped product would allocate a small buffer that begin_step then overruns.
  std::optional<int64_t> ids = checked_mul(num_moe_layers, max_num_tokens);
  if (ids) ids = checked_mul(*ids, top_k);
  if (ids) ids = checked_mul(*ids, static_cast<int64_t>(sizeof(float)));  // the router weights' bytes fit too
  if (!ids) {
    return ResourceExhausted("capturer: a buffer of " + std::to_string(num_moe_layers) + " x " +
                             std::to_string(max_num_tokens) + " x " + std::to_string(top_k) +
                             " ids exceeds any address space");
  }
  const size_t bytes = static_cast<size_t>(num_moe_layers) * max_num_tokens * top_k * sizeof(int16_t);
  StatusOr<DeviceBuffer> buffer = DeviceBuffer::allocate(device, bytes);
  if (!buffer.ok()) {
    return Status(buffer.status().code(), "capturer: the ids buffer of " + std::to_string(num_moe_layers) + " x " +
                                              std::to_string(max_num_tokens) + " x " + std::to_string(top_k) +
                                              ": " + buffer.status().message());
  }
  c->impl_->buffer = std::move(buffer).value();
  MOEKIT_RETURN_IF_ERROR(fill_sentinel(c->impl_->buffer, device));
  if (device.type == DeviceType::kCuda) {
    MOEKIT_ASSIGN_OR_RETURN(c->impl_->staging, DeviceBuffer::allocate_pinned_host(bytes));
  }
  if (options.record_router_weights) {
    const size_t weight_bytes = bytes / sizeof(int16_t) * sizeof(float);
    MOEKIT_ASSIGN_OR_RETURN(c->impl_->weights, DeviceBuffer::allocate(device, weight_bytes));
    if (device.type == DeviceType::kCuda) {
      MOEKIT_ASSIGN_OR_RETURN(c->impl_->weights_staging, DeviceBuffer::allocate_pinned_host(weight_bytes));
    }
  }
  return c;
}

RoutedExpertsCapturer::~RoutedExpertsCapturer() = default;

size_t RoutedExpertsCapturer::allocated_bytes() const {
  return impl_->buffer.bytes() + impl_->staging.bytes() + impl_->weights.bytes() + impl_->weights_staging.bytes();
}

const void* RoutedExpertsCapturer::buffer_data() const { return impl_->buffer.data(); }

TensorView RoutedExpertsCapturer::layer_target(int layer) const {
  if (!enabled_ || layer < 0 || layer >= num_layers_) return {};
  auto* base = static_cast<int16_t*>(impl_->buffer.data());
  return TensorView::contiguous(base + static_cast<int64_t>(layer) * max_tokens_ * top_k_, DType::kI16,
                                {max_tokens_, static_cast<int64_t>(top_k_)}, device_);
}

TensorView RoutedExpertsCapturer::layer_router_weights_target(int layer) const {
  if (!records_router_weights() || layer < 0 || layer >= num_layers_) return {};
  auto* base = static_cast<float*>(impl_->weights.data());
  return TensorView::contiguous(base + static_cast<int64_t>(layer) * max_tokens_ * top_k_, DType::kF32,
                                {max_tokens_, static_cast<int64_t>(top_k_)}, device_);
}

Status RoutedExpertsCapturer::require_bound(const char* what) const {
  if (!enabled_) return FailedPrecondition(std::string("capturer.") + what + ": capture is disabled");
  if (!bound_) return FailedPrecondition(std::string("capturer.") + what + ": bind(model, capturer) first");
  return Status::Ok();
}

Status RoutedExpertsCapturer::add_request(const std::string& request, int64_t skip_prompt_tokens,
                                          int64_t prompt_tokens) {
  if (!enabled_) return Status::Ok();
  if (skip_prompt_tokens < 0) {
    return InvalidArgument("capturer.add_request(" + quoted(request) + "): skip_prompt_tokens must be >= 0, got " +
                           std::to_string(skip_prompt_tokens));
  }
  if (prompt_tokens < -1) {
    return InvalidArgument("capturer.add_request(" + quoted(request) + "): prompt_tokens must be >= 0 (or -1: not known), got " +
                           std::to_string(prompt_tokens));
  }
  if (prompt_tokens >= 0 && skip_prompt_tokens > prompt_tokens) {
    // The capture would start after the first generated token: first_generated_token < first_token.
    return InvalidArgument("capturer.add_request(" + quoted(request) + "): skip_prompt_tokens " +
                           std::to_string(skip_prompt_tokens) + " lies past the prompt's end (prompt_tokens " +
                           std::to_string(prompt_tokens) + "): only prompt tokens can have been captured before");
  }
  if (impl_->requests.count(request)) {
    return InvalidArgument("capturer.add_request: request " + quoted(request) + " was already added");
  }
  impl_->requests[request].skip = skip_prompt_tokens;
  impl_->requests[request].prompt = prompt_tokens;
  impl_->order.push_back(request);
  return Status::Ok();
}

Status RoutedExpertsCapturer::begin_step(const StepLayout& layout, Stream stream) {
  if (!enabled_) return Status::Ok();
  MOEKIT_RETURN_IF_ERROR(require_bound("begin_step"));
  if (impl_->in_step) return FailedPrecondition("capturer.begin_step: the previous step was not ended");
  std::set<std::string> seen;
  for (const StepSegment& s : layout.segments) {
    if (!impl_->requests.count(s.request)) {
      return InvalidArgument("capturer.begin_step: request " + quoted(s.request) + " was not added");
    }
    if (!seen.insert(s.request).second) {
      return InvalidArgument("capturer.begin_step: request " + quoted(s.request) + " appears twice in one step");
    }
    if (s.num_rows < 1) {
      return InvalidArgument("capturer.begin_step: request " + quoted(s.request) + " has " +
                             std::to_string(s.num_rows) + " rows; a segment needs >= 1");
    }
  }
  const int64_t m = layout.num_rows();
  if (m < 1 || m > max_tokens_) {
    return InvalidArgument("capturer.begin_step: the step has " + std::to_string(m) + " rows; must be in [1, " +
                           std::to_string(max_tokens_) + "]");
  }
  // Rows [0, M) of every layer hold the sentinel -1, so a row the kernel leaves
  // alone is reported by end_step instead of being read as expert 0. On the CPU
  // they are filled here; on a CUDA device the previous step's end put the
  // sentinel back with its move of the rows, so no launch is spent here.
  if (device_.type == DeviceType::kCpu) {
    const size_t row_bytes = static_cast<size_t>(m) * top_k_ * sizeof(int16_t);
    const size_t layer_bytes = static_cast<size_t>(max_tokens_) * top_k_ * sizeof(int16_t);
    for (int l = 0; l < num_layers_; ++l) {
      std::memset(static_cast<char*>(impl_->buffer.data()) + l * layer_bytes, 0xff, row_bytes);  // int16 -1
    }
  }
  impl_->step = layout;
  impl_->in_step = true;
  return Status::Ok();
}

Status RoutedExpertsCapturer::end_step(Stream stream) {
  if (!enabled_) return Status::Ok();
  MOEKIT_RETURN_IF_ERROR(require_bound("end_step"));
  if (!impl_->in_step) return FailedPrecondition("capturer.end_step: no step was begun");
  MOEKIT_RETURN_IF_ERROR(end_step_async(stream));
  return collect();
}

Status RoutedExpertsCapturer::end_step_async(Stream stream) {
  if (!enabled_) return Status::Ok();
  MOEKIT_RETURN_IF_ERROR(require_bound("end_step_async"));
  if (!impl_->in_step) return FailedPrecondition("capturer.end_step: no step was begun");
  // The staging buffer holds one step: the previous one is collected first.
  MOEKIT_RETURN_IF_ERROR(collect());
  impl_->in_step = false;
  impl_->pending = impl_->step;
  impl_->has_pending = true;
  switch (device_.type) {
    case DeviceType::kCpu: break;  // the rows are in host memory already; collect() reads them
    case DeviceType::kCuda: {
#ifdef MOEKIT_WITH_CUDA
      auto s = static_cast<cudaStream_t>(stream);
      // One kernel moves the rows into mapped pinned memory and re-arms the
      // sentinel: one launch per step, no fill and no copy-engine transfer
      // (a fixed cost far above their few bytes; docs/capture.md, "Cost").
      capture_cuda::CaptureRowsArgs move;
      move.num_layers = num_layers_;
      move.layer_stride = max_tokens_ * top_k_;
      move.row_elements = impl_->step.num_rows() * top_k_;
      move.ids = static_cast<int16_t*>(impl_->buffer.data());
      move.weights = static_cast<const float*>(impl_->weights.data());
      cudaError_t err = impl_->copied == nullptr
                            ? cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(&impl_->copied),
                                                       cudaEventDisableTiming)
                            : cudaSuccess;
      if (err == cudaSuccess) err = cudaHostGetDevicePointer(reinterpret_cast<void**>(&move.host_ids), impl_->staging.data(), 0);
      if (err == cudaSuccess && move.weights != nullptr) {
        err = cudaHostGetDevicePointer(reinterpret_cast<void**>(&move.host_weights), impl_->weights_staging.data(), 0);
      }
      if (err == cudaSuccess) err = capture_cuda::move_capture_rows_to_host(move, s);
      if (err == cudaSuccess) err = cudaEventRecord(static_cast<cudaEvent_t>(impl_->copied), s);
      if (err != cudaSuccess) {
        impl_->has_pending = false;
        return Internal(std::string("capturer.end_step: copy to host failed: ") + cudaGetErrorString(err));
      }
      break;
#else
      impl_->has_pending = false;
      return Unsupported("capturer: this build has no CUDA support");
#endif
    }
  }
  // CPU: nothing to wait for, so the step is checked now (end_step_async is end_step there).
  return device_.type == DeviceType::kCpu ? collect() : Status::Ok();
}

Status RoutedExpertsCapturer::collect() { return collect_pending(); }

Status RoutedExpertsCapturer::collect_pending() const {
  if (!enabled_ || !impl_->has_pending) return Status::Ok();
  impl_->has_pending = false;  // collected once, whatever the outcome
  const StepLayout& step = impl_->pending;
  const int64_t m = step.num_rows();
  const int64_t k = top_k_;
  // host: rows [0, M) of layer l start at host + l * layer_stride (elements).
  const int16_t* host = static_cast<const int16_t*>(impl_->buffer.data());
  const float* host_weights = static_cast<const float*>(impl_->weights.data());  // null unless recorded
  switch (device_.type) {
    case DeviceType::kCpu: break;
    case DeviceType::kCuda: {
#ifdef MOEKIT_WITH_CUDA
      const cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(impl_->copied));
      if (err != cudaSuccess) {
        return Internal(std::string("capturer.end_step: copy to host failed: ") + cudaGetErrorString(err));
      }
      host = static_cast<const int16_t*>(impl_->staging.data());
      host_weights = static_cast<const float*>(impl_->weights_staging.data());
      break;
#else
      return Unsupported("capturer: this build has no CUDA support");
#endif
    }
  }
  const int64_t layer_stride = max_tokens_ * k;

  // Check every row of every layer before appending anything.
  const int64_t num_experts = info_.num_experts;
  for (int l = 0; l < num_layers_; ++l) {
    const int16_t* rows = host + l * layer_stride;
    for (int64_t i = 0; i < m * k; ++i) {
      const int16_t id = rows[i];
      if (id >= 0 && id < num_experts) continue;
      // Name the row's request and token for the message.
      int64_t row = i / k, base = 0;
      std::string where;
      for (const StepSegment& s : step.segments) {
        if (row < base + s.num_rows) {
          where = "request " + quoted(s.request) + ", token " +
                  std::to_string(impl_->requests.at(s.request).tokens_seen + row - base);
          break;
        }
        base += s.num_rows;
      }
      const std::string at = "MoE layer " + std::to_string(l) + " (model layer " +
                             std::to_string(info_.model_layers[l]) + "), step row " + std::to_string(row) + " (" +
                             where + "), slot " + std::to_string(i % k);
      if (id == kUnwrittenExpertId) {
        return DataLoss("routed experts not captured: " + at +
                        " still holds the sentinel -1; the layer did not write its capture target this step");
      }
      return DataLoss("routed experts: " + at + " holds id " + std::to_string(id) + ", outside [0, " +
                      std::to_string(num_experts) + ")");
    }
  }

  int64_t row0 = 0;
  for (const StepSegment& s : step.segments) {
    Request& req = impl_->requests.at(s.request);
    for (int64_t r = 0; r < s.num_rows; ++r) {
      const int64_t token = req.tokens_seen + r;
      if (token < req.skip) continue;
      for (int l = 0; l < num_layers_; ++l) {
        const int64_t at = l * layer_stride + (row0 + r) * k;
        req.ids.insert(req.ids.end(), host + at, host + at + k);
        if (host_weights != nullptr) req.weights.insert(req.weights.end(), host_weights + at, host_weights + at + k);
      }
    }
    req.tokens_seen += s.num_rows;
    row0 += s.num_rows;
  }
  return Status::Ok();
}

namespace {
RequestCapture to_capture(const std::string& name, int64_t skip, int64_t prompt, const std::vector<int16_t>& ids,
                          const std::vector<float>& weights, bool with_weights, int layers, int k) {
  RequestCapture rc;
  rc.request = name;
  rc.first_token = skip;
  rc.first_generated_token = prompt;
  const int64_t tokens = static_cast<int64_t>(ids.size()) / (static_cast<int64_t>(layers) * k);
  rc.ids = HostTensor(DType::kI16, {tokens, layers, k});
  std::copy(ids.begin(), ids.end(), rc.ids.data<int16_t>());
  if (with_weights) {
    rc.router_weights = HostTensor(DType::kF32, {tokens, layers, k});
    std::copy(weights.begin(), weights.end(), rc.router_weights.data<float>());
  }
  return rc;
}
}  // namespace

StatusOr<HostTensor> RoutedExpertsCapturer::routed_experts(const std::string& request) const {
  MOEKIT_RETURN_IF_ERROR(require_bound("routed_experts"));
  MOEKIT_RETURN_IF_ERROR(collect_pending());
  auto it = impl_->requests.find(request);
  if (it == impl_->requests.end()) {
    return NotFound("capturer.routed_experts: unknown request " + quoted(request));
  }
  return to_capture(request, it->second.skip, it->second.prompt, it->second.ids, {}, false, num_layers_, top_k_).ids;
}

StatusOr<RequestCapture> RoutedExpertsCapturer::finish_request(const std::string& request) {
  MOEKIT_RETURN_IF_ERROR(require_bound("finish_request"));
  if (impl_->in_step) return FailedPrecondition("capturer.finish_request: called inside a step");
  MOEKIT_RETURN_IF_ERROR(collect_pending());
  auto it = impl_->requests.find(request);
  if (it == impl_->requests.end()) {
    return NotFound("capturer.finish_request: unknown request " + quoted(request));
  }
  RequestCapture rc = to_capture(request, it->second.skip, it->second.prompt, it->second.ids, it->second.weights,
                                 records_router_weights(), num_layers_, top_k_);
  impl_->requests.erase(it);
  impl_->order.erase(std::find(impl_->order.begin(), impl_->order.end(), request));
  return rc;
}

StatusOr<CaptureSet> RoutedExpertsCapturer::snapshot() const {
  MOEKIT_RETURN_IF_ERROR(require_bound("snapshot"));
  MOEKIT_RETURN_IF_ERROR(collect_pending());
  CaptureSet set;
  set.info = info_;
  for (const std::string& name : impl_->order) {
    const Request& r = impl_->requests.at(name);
    set.requests.push_back(
        to_capture(name, r.skip, r.prompt, r.ids, r.weights, records_router_weights(), num_layers_, top_k_));
  }
  return set;
}

}  // namespace moekit

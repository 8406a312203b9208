// RoutedExpertsCapturer: the capture buffer, the per-step sentinel reset and
// check, and the per-request accounting of captured rows.
#include <algorithm>
#include <cstring>
#include <set>

#include "moekit/device_buffer.h"
#include "moekit/capture.h"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>
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
};

struct RoutedExpertsCapturer::Impl {
  DeviceBuffer buffer;   // [num_moe_layers, max_num_tokens, top_k] i16 on the capture device
  DeviceBuffer staging;  // same shape, pinned host; CUDA devices only (rows [0, M) per layer)
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
}  // namespace

StatusOr<std::unique_ptr<RoutedExpertsCapturer>> RoutedExpertsCapturer::create(int num_moe_layers,
                                                                               int64_t max_num_tokens, int top_k,
                                                                               Device device, bool enabled) {
  if (num_moe_layers < 1) {
    return InvalidArgument("capturer: num_moe_layers must be >= 1, got " + std::to_string(num_moe_layers));
  }
  if (max_num_tokens < 1) {
    return InvalidArgument("capturer: max_num_tokens must be >= 1, got " + std::to_string(max_num_tokens));
  }
  if (top_k < 1) return InvalidArgument("capturer: top_k must be >= 1, got " + std::to_string(top_k));
  std::unique_ptr<RoutedExpertsCapturer> c(new RoutedExpertsCapturer());
  c->enabled_ = enabled;
  c->num_layers_ = num_moe_layers;
  c->max_tokens_ = max_num_tokens;
  c->top_k_ = top_k;
  c->device_ = device;
  c->impl_ = std::make_unique<Impl>();
  if (!enabled) return c;  // NOTE: a disabled capturer must never allocate (tested).
  const size_t bytes = static_cast<size_t>(num_moe_layers) * max_num_tokens * top_k * sizeof(int16_t);
  MOEKIT_ASSIGN_OR_RETURN(c->impl_->buffer, DeviceBuffer::allocate(device, bytes));
  if (device.type == DeviceType::kCuda) {
    MOEKIT_ASSIGN_OR_RETURN(c->impl_->staging, DeviceBuffer::allocate_pinned_host(bytes));
  }
  return c;
}

RoutedExpertsCapturer::~RoutedExpertsCapturer() = default;

size_t RoutedExpertsCapturer::allocated_bytes() const {
  return impl_->buffer.bytes() + impl_->staging.bytes();
}

const void* RoutedExpertsCapturer::buffer_data() const { return impl_->buffer.data(); }

TensorView RoutedExpertsCapturer::layer_target(int layer) const {
  if (!enabled_ || layer < 0 || layer >= num_layers_) return {};
  auto* base = static_cast<int16_t*>(impl_->buffer.data());
  return TensorView::contiguous(base + static_cast<int64_t>(layer) * max_tokens_ * top_k_, DType::kI16,
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
  // Sentinel-fill rows [0, M) of every layer: a row the kernel leaves alone stays
  // -1 and end_step reports it, instead of reading it as expert 0.
  const size_t row_bytes = static_cast<size_t>(m) * top_k_ * sizeof(int16_t);
  const size_t layer_bytes = static_cast<size_t>(max_tokens_) * top_k_ * sizeof(int16_t);
  switch (device_.type) {
    case DeviceType::kCpu:
      for (int l = 0; l < num_layers_; ++l) {
        // 0xff bytes are int16 -1 (two's complement).
        std::memset(static_cast<char*>(impl_->buffer.data()) + l * layer_bytes, 0xff, row_bytes);
      }
      break;
    case DeviceType::kCuda: {
#ifdef MOEKIT_WITH_CUDA
      const cudaError_t err = cudaMemset2DAsync(impl_->buffer.data(), layer_bytes, 0xff, row_bytes, num_layers_,
                                                static_cast<cudaStream_t>(stream));
      if (err != cudaSuccess) {
        return Internal(std::string("capturer.begin_step: cudaMemset2DAsync failed: ") + cudaGetErrorString(err));
      }
      break;
#else
      return Unsupported("capturer: this build has no CUDA support");
#endif
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
      const int64_t m = impl_->step.num_rows();
      const size_t row_bytes = static_cast<size_t>(m) * top_k_ * sizeof(int16_t);
      const size_t layer_bytes = static_cast<size_t>(max_tokens_) * top_k_ * sizeof(int16_t);
      cudaError_t err = impl_->copied == nullptr
                            ? cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(&impl_->copied),
                                                       cudaEventDisableTiming)
                            : cudaSuccess;
      if (err == cudaSuccess) {
        err = cudaMemcpy2DAsync(impl_->staging.data(), layer_bytes, impl_->buffer.data(), layer_bytes, row_bytes,
                                num_layers_, cudaMemcpyDeviceToHost, s);
      }
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
  switch (device_.type) {
    case DeviceType::kCpu: break;
    case DeviceType::kCuda: {
#ifdef MOEKIT_WITH_CUDA
      const cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(impl_->copied));
      if (err != cudaSuccess) {
        return Internal(std::string("capturer.end_step: copy to host failed: ") + cudaGetErrorString(err));
      }
      host = static_cast<const int16_t*>(impl_->staging.data());
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
        const int16_t* src = host + l * layer_stride + (row0 + r) * k;
        req.ids.insert(req.ids.end(), src, src + k);
      }
    }
    req.tokens_seen += s.num_rows;
    row0 += s.num_rows;
  }
  return Status::Ok();
}

namespace {
RequestCapture to_capture(const std::string& name, int64_t skip, int64_t prompt, const std::vector<int16_t>& ids,
                          int layers, int k) {
  RequestCapture rc;
  rc.request = name;
  rc.first_token = skip;
  rc.first_generated_token = prompt;
  const int64_t tokens = static_cast<int64_t>(ids.size()) / (static_cast<int64_t>(layers) * k);
  rc.ids = HostTensor(DType::kI16, {tokens, layers, k});
  std::copy(ids.begin(), ids.end(), rc.ids.data<int16_t>());
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
  return to_capture(request, it->second.skip, it->second.prompt, it->second.ids, num_layers_, top_k_).ids;
}

StatusOr<RequestCapture> RoutedExpertsCapturer::finish_request(const std::string& request) {
  MOEKIT_RETURN_IF_ERROR(require_bound("finish_request"));
  if (impl_->in_step) return FailedPrecondition("capturer.finish_request: called inside a step");
  MOEKIT_RETURN_IF_ERROR(collect_pending());
  auto it = impl_->requests.find(request);
  if (it == impl_->requests.end()) {
    return NotFound("capturer.finish_request: unknown request " + quoted(request));
  }
  RequestCapture rc = to_capture(request, it->second.skip, it->second.prompt, it->second.ids, num_layers_, top_k_);
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
    set.requests.push_back(to_capture(name, r.skip, r.prompt, r.ids, num_layers_, top_k_));
  }
  return set;
}

}  // namespace moekit

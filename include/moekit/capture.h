// Routed-expert capture (record) and replay (force), docs/design.md §2.3-§2.4 and
// docs/capture.md.
//
// Record:  capturer = RoutedExpertsCapturer::create(...); bind(model, *capturer);
//          per request add_request(); per step begin_step(layout) -> run every
//          layer -> end_step(); then routed_experts(request) or snapshot().
// Replay:  replayer = RoutedExpertsReplayer::create(captures, model); per step
//          begin_step(layout) (validates every forced id first) -> each layer's
//          forward() with forced_ids = replayer.forced_ids(layer).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "moekit/config.h"
#include "moekit/layer.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit {

inline constexpr int16_t kUnwrittenExpertId = -1;  // sentinel of a capture row before the kernel writes it
inline constexpr int kCaptureFormatVersion = 2;        // written; versions 1 and 2 are read
inline constexpr int64_t kMaxU8CaptureExperts = 255;    // ids stored u8 when E <= 255 (255 is the sentinel), else u16

// One contiguous run of rows of a step's batch that belongs to one request: a
// prefill chunk, or one decode token.
struct StepSegment {
  std::string request;
  int64_t num_rows = 0;
};

// The rows of one step, segments in batch order: rows [0, M) of every layer's
// input, M = the sum of num_rows. A request appears at most once per step.
struct StepLayout {
  std::vector<StepSegment> segments;
  int64_t num_rows() const;
};

// What a capture describes, beyond the ids: everything needed to interpret them.
struct CaptureInfo {
  int format_version = kCaptureFormatVersion;
  int routing_spec_version = kRoutingSpecVersion;
  RoutingConfig routing;         // method and parameters (top_k = k)
  int64_t num_experts = 0;       // E (logical)
  std::vector<int> model_layers;  // model-layer index of each MoE layer, [num_moe_layers]
  // Ids are logical (before any expert-parallel remap) and in the routing
  // spec's order: higher score first, equal scores -> lower expert id first.
  std::string id_space = "logical";
  std::string id_order = "score_desc_index_asc";
  // The backend and kernel that produced the ids ("cpu/CpuModular"); empty when
  // not known (a version-1 file, or ids converted from elsewhere).
  std::string backend;
  // The dtype of RequestCapture::router_weights when the capture carries them
  // (f32 or bf16); empty: ids only.
  std::optional<DType> router_weights_dtype;

  int num_moe_layers() const { return static_cast<int>(model_layers.size()); }
  int top_k() const { return routing.top_k; }
};

// The captured ids of one request.
struct RequestCapture {
  std::string request;
  int64_t first_token = 0;  // tokens skipped at the start (skip_prompt_tokens)
  HostTensor ids;           // [num_tokens, num_moe_layers, top_k] i16, logical ids of tokens first_token..
  // Token index (in the request, like first_token) of the first generated
  // token: tokens before it are the prompt. -1: not known.
  int64_t first_generated_token = -1;
  // Optional: the router's weights at `ids`, same shape, f32 or bf16
  // (CaptureInfo::router_weights_dtype); undefined when the capture has none.
  HostTensor router_weights;
  int64_t num_tokens() const { return ids.shape().empty() ? 0 : ids.shape()[0]; }
};

// A capture: what the file holds.
struct CaptureSet {
  CaptureInfo info;
  std::vector<RequestCapture> requests;  // in the order requests were added
  // More "__metadata__" entries, kept as given (e.g. how the capture was made);
  // keys must differ from the format's own keys (docs/capture.md).
  std::map<std::string, std::string> extra_metadata;
  const RequestCapture* find(const std::string& request) const;
};

// What a capturer records beside the ids.
struct CapturerOptions {
  // The router's weights at the ids (what the routing method gives them), f32,
  // in a second buffer of the ids' shape; the capture then carries
  // RequestCapture::router_weights and CaptureInfo::router_weights_dtype = f32.
  bool record_router_weights = false;
};

class RoutedExpertsCapturer {
 public:
  // A disabled capturer allocates nothing, ever (allocated_bytes() == 0): bind()
  // then clears every layer's capture target and the step calls do nothing.
  // An enabled one allocates its buffer [num_moe_layers, max_num_tokens, top_k]
  // i16 on `device` here, once, filled with the sentinel -1 (plus pinned host
  // staging for a CUDA device, and the same again in f32 for router weights).
  static StatusOr<std::unique_ptr<RoutedExpertsCapturer>> create(int num_moe_layers, int64_t max_num_tokens,
                                                                 int top_k, Device device = Device::cpu(),
                                                                 bool enabled = true, CapturerOptions options = {});
  ~RoutedExpertsCapturer();

  bool enabled() const { return enabled_; }
  int num_moe_layers() const { return num_layers_; }
  int64_t max_num_tokens() const { return max_tokens_; }
  int top_k() const { return top_k_; }
  Device device() const { return device_; }
  size_t allocated_bytes() const;   // device buffer + host staging
  const void* buffer_data() const;  // the device buffer; nullptr when disabled
  // Layer `layer`'s slice buffer[layer]: [max_num_tokens, top_k] i16 (empty view when disabled).
  TensorView layer_target(int layer) const;
  bool records_router_weights() const { return enabled_ && options_.record_router_weights; }
  // Its router weights slice: [max_num_tokens, top_k] f32 (empty view unless records_router_weights()).
  TensorView layer_router_weights_target(int layer) const;
  bool bound() const { return bound_; }
  const CaptureInfo& info() const { return info_; }

  // A request whose rows will appear in later steps. The first
  // skip_prompt_tokens of its tokens are not kept (a multi-turn request that
  // re-sends earlier turns).
  // prompt_tokens (>= 0 when known) sets first_generated_token of its capture.
  Status add_request(const std::string& request, int64_t skip_prompt_tokens = 0, int64_t prompt_tokens = -1);
  // Checks the layout (known requests, each once, rows in [1, max_num_tokens]
  // in total). Rows [0, M) of every layer then hold the sentinel -1: on the CPU
  // begin_step fills them; on a CUDA device they already do (filled at create,
  // put back by the previous step's end), so begin_step enqueues nothing.
  // NOTE: a forward outside a step (a warm-up) leaves its ids in the buffer
  // until a step's end moves those rows; unwritten rows of that step are then
  // not detected.
  Status begin_step(const StepLayout& layout, Stream stream = nullptr);
  // Copies rows [0, M) of every layer to the host (asynchronously on a CUDA
  // device, then waits for them), checks that every row was written with an id
  // in [0, E), and appends each request's rows. On error nothing is appended.
  Status end_step(Stream stream = nullptr);
  // end_step without waiting: on a CUDA device one kernel on `stream` moves the
  // rows to mapped pinned host memory and puts the sentinel back in their place,
  // then an event is recorded; the check and append run
  // at collect() — called by the next end_step_async (which then waits for the
  // previous step's copy, normally long done), by end_step, routed_experts,
  // finish_request and snapshot. An error of that step is returned by the call
  // that collects it, and nothing of that step is appended. On the CPU it is end_step.
  // Forwards of the next step must be on the same stream (ordered after this step's move of the rows).
  Status end_step_async(Stream stream = nullptr);
  // Checks and appends the rows of a step ended with end_step_async (no-op when none is pending).
  Status collect();

  // [num_tokens, num_moe_layers, top_k] i16 for one request, tokens in order.
  StatusOr<HostTensor> routed_experts(const std::string& request) const;
  // Forgets a finished request and returns its capture.
  StatusOr<RequestCapture> finish_request(const std::string& request);
  // Every request so far, with the info of the bound model.
  StatusOr<CaptureSet> snapshot() const;

 private:
  friend Status bind(Model& model, RoutedExpertsCapturer& capturer);
  struct Request;
  struct Impl;
  RoutedExpertsCapturer() = default;
  Status require_bound(const char* what) const;
  // collect() for the const readers: it changes only what the pending step appends (its rows exist already).
  Status collect_pending() const;

  bool enabled_ = false;
  CapturerOptions options_;
  bool bound_ = false;
  int num_layers_ = 0;
  int64_t max_tokens_ = 0;
  int top_k_ = 0;
  Device device_ = Device::cpu();
  CaptureInfo info_;
  std::unique_ptr<Impl> impl_;
};

// Gives every MoE layer of `model` its capture target, buffer[layer]. Modular
// kernels: the router writes the ids. Monolithic kernels: the kernel writes
// them through routing_replay_out, so a monolithic kernel without
// supports_routing_replay_capture() is an error naming it. Also an error: a
// model without MoE layers, a layer count, top_k or device that differs from
// the capturer's, a layer whose max_num_tokens exceeds the buffer's rows, and
// layers that disagree on E or routing. All checked before any layer changes.
Status bind(Model& model, RoutedExpertsCapturer& capturer);

// Replays a capture: per step, the forced ids of every layer.
class RoutedExpertsReplayer {
 public:
  // Checks that `captures` fits `model` (layer count, model-layer map, E, k,
  // routing method) and that every stored id is in [0, E) and not repeated
  // within a row.
  static StatusOr<std::unique_ptr<RoutedExpertsReplayer>> create(CaptureSet captures, const Model& model);

  // Takes each segment's next rows from its request's capture (a request
  // starts at its first captured token, first_token, unless start_token()
  // moved it) and builds the
  // forced ids [M, k] i32 of every layer. Validates everything (known
  // requests, captured tokens available, ids) before it changes any state.
  Status begin_step(const StepLayout& layout);
  // Layer `layer`'s forced ids of the current step: [M, k] i32, host. An
  // undefined view before the first begin_step (has_step() tells), for a layer
  // out of range, and for a step of no rows (step_rows() == 0).
  TensorView forced_ids(int layer) const;
  // Whether a begin_step has succeeded (forced_ids has a step to answer for).
  bool has_step() const { return has_step_; }
  // M of the current step (0 before the first step and for an empty layout).
  int64_t step_rows() const { return step_rows_; }
  // Sets where a request's next step starts (token index in the request).
  Status start_token(const std::string& request, int64_t token);

  const CaptureSet& captures() const { return captures_; }

 private:
  RoutedExpertsReplayer() = default;
  CaptureSet captures_;
  std::map<std::string, int64_t> cursor_;  // next token of each request
  std::vector<int32_t> forced_;            // [num_moe_layers, M, k] i32 of the current step
  int64_t step_rows_ = 0;
  bool has_step_ = false;
};

// The capture file (docs/capture.md), format version 2: safetensors, one
// tensor per request ("routed_experts.<i>", [num_tokens, num_moe_layers,
// top_k], u8 when E <= 255, else u16; the sentinel -1 is stored as the type's
// all-ones value, 255 or 65535), optional router weights per request
// ("router_weights.<i>", f32 or bf16), and a "__metadata__" map that
// describes them. Ids must be in [0, E) or the sentinel. Atomic write.
Status write_capture_file(const std::string& path, const CaptureSet& captures);

struct CaptureReadOptions {
  // false: keep ids outside [0, E) as read (still i16) instead of failing, so
  // a validator (check_capture) can name every one. Structure is always checked.
  bool check_ids = true;
};
// Reads and validates a capture file of version 1 or 2 (format, version,
// metadata, shapes, dtypes, ids in [0, E) or the sentinel); the ids come back
// as i16 with the sentinel as -1.
StatusOr<CaptureSet> read_capture_file(const std::string& path, const CaptureReadOptions& options = {});

}  // namespace moekit

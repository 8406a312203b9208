// MoeLayer: one MoE layer ready to run on one device. It owns the kernel the
// oracle chose, with its prepared weights and workspace, and the routing
// stage's buffers; forward() runs the layer pipeline (routing -> local
// prepare/finalize -> kernel; a monolithic kernel routes inside). A capture
// target (bind(), capture.h) makes the ids of every forward land in the
// capturer's buffer; forced ids replay a capture.
//
// Model: the MoE layers of one model, each with its index among the model's
// layers (dense layers in between are the caller's), as RoutedLayers: one
// rank's MoeLayers or ExpertParallelLayers alike. Layers are shared, so a
// caller (the Python module) can keep its handle on a layer it added.
#pragma once

#include <memory>
#include <vector>

#include "moekit/config.h"
#include "moekit/device_buffer.h"
#include "moekit/kernel.h"
#include "moekit/oracle.h"
#include "moekit/platform.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit {

class LayerPipeline;  // layer/pipeline.h: routing -> prepare/finalize -> experts

// The tensors of one forward. M = hidden.dim(0) <= config.max_num_tokens.
struct LayerForwardArgs {
  TensorView hidden;         // [M, H] act dtype, on the layer's device
  TensorView router_logits;  // [M, E] logits dtype; required unless routing is custom
  TensorView out;            // [M, H] act dtype; every element overwritten
  TensorView forced_ids;     // [M, k] i32, optional: replay (the routing method computes the weights)
  TensorView topk_ids;       // [M, k] i32, custom routing only: the caller's ids
  TensorView topk_weights;   // [M, k] f32, custom routing only: the caller's weights
  TensorView expert_counts;  // [E] i32, optional: tokens routed to each expert
  // [>= M, k] i16, optional, on the layer's device: this forward's selected ids
  // (rows [0, M); logical, spec order). A bound capture target gets the same
  // rows as well. Rejected, like a capture target, by a kernel that cannot write them.
  TensorView routing_replay_out;
};

// What a Model, bind() (capture.h) and the replayer need of an MoE layer,
// whatever runs it: MoeLayer on one device, ExpertParallelLayer (ep_layer.h)
// over the ranks of a communicator. Ids are logical (spec order) either way.
class RoutedLayer {
 public:
  virtual ~RoutedLayer() = default;
  // The layer's logical configuration (E, k, routing, max_num_tokens).
  virtual const MoeConfig& config() const = 0;
  // Where its tensors live (hidden, out, capture targets).
  virtual Device device() const = 0;
  virtual Status forward(const LayerForwardArgs& args, Stream stream = nullptr) = 0;
  // Where forward() writes the selected ids: [>= max_num_tokens, k] i16 on the
  // layer's device, rows [0, M) per forward. An empty view turns capture off.
  // router_weights, optional (only with a target): [>= max_num_tokens, k] f32
  // on the layer's device, gets the routing weights of those ids.
  // Normally set by bind() (capture.h), which checks the layer can write them.
  virtual Status set_capture_target(const TensorView& target, const TensorView& router_weights = {}) = 0;
  virtual const TensorView& capture_target() const = 0;
  virtual const TensorView& router_weights_target() const = 0;
  // ok, or why this layer cannot write the selected ids (a monolithic kernel
  // without routing_replay_out): what a capture target needs.
  virtual Status capture_supported() const = 0;
  // ok, or why it cannot also hand out the routing weights.
  virtual Status router_weights_capture_supported() const = 0;
  // What computes it, for capture files: "backend/kernel" (e.g. "cpu/CpuModular").
  virtual std::string producer() const = 0;

  // The experts stage's workspace: the bytes a forward needs (for
  // max_num_tokens), and the buffer it runs with, its own or its Model's.
  virtual size_t workspace_bytes() const = 0;
  virtual const std::shared_ptr<DeviceBuffer>& workspace_buffer() const = 0;
  // Runs with `buffer` (on its device, >= workspace_bytes()) from now on,
  // releasing its own: for layers that never run at the same time (a Model's,
  // one at a time on one stream). Refused once the layer has run, since a
  // captured CUDA graph may hold the old address.
  virtual Status use_workspace(std::shared_ptr<DeviceBuffer> buffer) = 0;
  virtual bool has_run() const = 0;
};

class MoeLayer : public RoutedLayer {
 public:
  // Chooses the kernel with select_backend(config, platform), builds it and
  // prepares `weights` (copied or re-laid-out; the caller may free them after).
  static StatusOr<std::unique_ptr<MoeLayer>> create(const MoeConfig& config, const MoeWeights& weights,
                                                    const Platform& platform = Platform::probe());
  // The same among the backends that run on `device` (select_backend_on
  // device.type): a layer asked for on a CUDA device never falls back to the CPU.
  static StatusOr<std::unique_ptr<MoeLayer>> create(const MoeConfig& config, const MoeWeights& weights, Device device,
                                                    const Platform& platform = Platform::probe());
  // The same with a given kernel class (its supports() must accept the config).
  static StatusOr<std::unique_ptr<MoeLayer>> create_with(const MoeConfig& config, const MoeWeights& weights,
                                                         const KernelClass& kernel_class,
                                                         const Platform& platform = Platform::probe());
  ~MoeLayer();

  // Validates every argument (forced ids: range, duplicates, sentinel) before
  // anything is written; then routes (modular) and runs the kernel on `stream`.
  Status forward(const LayerForwardArgs& args, Stream stream = nullptr) override;

  // New values of the weights the layer was created with (same shapes and
  // dtypes: e.g. after an optimizer step), prepared in place after every
  // forward in flight on the layer's device: the kernel keeps its buffers, so
  // their addresses, and a CUDA graph captured over the layer, stay valid (the
  // cuda_sm90 kernels; the cpu kernels reuse their packed buffers too). Errors
  // name the tensor; after one the layer refuses to run, saying why, until an
  // update succeeds.
  Status update_weights(const MoeWeights& weights);
  // A new selection bias alone ([E] f32, as the layer was created with),
  // copied in place after the forwards in flight: for engines that update the
  // bias (DeepSeek's load balancing) apart from the expert weights.
  Status update_score_bias(const TensorView& score_bias);

  Status set_capture_target(const TensorView& target, const TensorView& router_weights = {}) override;
  const TensorView& capture_target() const override { return capture_target_; }
  const TensorView& router_weights_target() const override { return router_weights_target_; }
  // Unsupported for a monolithic kernel without routing_replay_out (or
  // router_weights_out for the weights).
  Status capture_supported() const override;
  Status router_weights_capture_supported() const override;
  // backend/kernel; the kernel alone for a layer of create_with() (no backend name).
  std::string producer() const override;

  const MoeConfig& config() const override { return config_; }
  const MoeKernel& kernel() const;
  const std::string& backend() const { return backend_; }
  // The oracle's report when create() chose the kernel (empty for create_with()).
  const std::vector<CandidateReport>& selection_report() const { return report_; }
  // Printable: the oracle's report (every candidate and its reason, what was
  // resolved), the GEMM paths the kernel takes and why (format_gemm_plan), and
  // the workspace the layer needs.
  std::string report_string() const;
  Device device() const override;
  size_t workspace_bytes() const override;
  const std::shared_ptr<DeviceBuffer>& workspace_buffer() const override;
  Status use_workspace(std::shared_ptr<DeviceBuffer> buffer) override;
  bool has_run() const override;

 private:
  MoeLayer() = default;
  static StatusOr<std::unique_ptr<MoeLayer>> from_resolution(Resolution res, const MoeConfig& config,
                                                             const MoeWeights& weights, const Platform& platform);

  MoeConfig config_;
  std::string backend_;
  std::vector<CandidateReport> report_;
  std::unique_ptr<LayerPipeline> pipeline_;  // routing -> local prepare/finalize -> the chosen kernel
  TensorView capture_target_;  // [>= max_num_tokens, k] i16, optional
  TensorView router_weights_target_;  // [>= max_num_tokens, k] f32, optional, only with capture_target_
  Status update_failure_;  // the last update_weights' error, or ok
};

// The layers of a model run one at a time on one stream, so they share one
// experts workspace per device, sized for the largest (engines do the same;
// single-rank and expert-parallel layers alike):
// add_layer hands the model's buffer to each new layer and frees the layer's
// own (48 layers hold one layer's workspace, not 48). A larger layer grows the
// buffer while no layer on it has run; once one has (a captured graph may hold
// the address), a larger newcomer keeps its own. Layers of a Model must not
// run concurrently (other streams or threads): construct it with
// share_workspace = false for that.
class Model {
 public:
  explicit Model(bool share_workspace = true) : share_workspace_(share_workspace) {}

  // Appends an MoE layer (one rank's or expert-parallel); model_layer_index is
  // its index among all layers of the model and must increase from one MoE
  // layer to the next.
  Status add_layer(std::shared_ptr<RoutedLayer> layer, int model_layer_index);
  // Bytes of experts workspace the model's layers hold, each buffer counted once.
  size_t workspace_bytes() const;

  int num_layers() const { return static_cast<int>(layers_.size()); }
  RoutedLayer& layer(int i) { return *layers_[i]; }
  const RoutedLayer& layer(int i) const { return *layers_[i]; }
  // Layer i as a single-rank MoeLayer, or nullptr when it is another kind.
  MoeLayer* moe_layer(int i) const { return dynamic_cast<MoeLayer*>(layers_[i].get()); }
  int model_layer_index(int i) const { return model_layers_[i]; }
  const std::vector<int>& model_layer_indices() const { return model_layers_; }

 private:
  void share_workspace_with(RoutedLayer& layer);

  bool share_workspace_ = true;
  std::vector<std::shared_ptr<DeviceBuffer>> workspaces_;  // one per device its layers share
  std::vector<std::shared_ptr<RoutedLayer>> layers_;
  std::vector<int> model_layers_;
};

}  // namespace moekit

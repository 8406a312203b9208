// LayerPipeline: the one forward of every MoE layer (docs/design.md §1):
//   routing stage -> PrepareFinalize.prepare -> experts -> PrepareFinalize.finalize
// MoeLayer runs it with the local PrepareFinalize (or, for a monolithic kernel,
// with routing inside the experts stage and none); ExpertParallelLayer with the
// host or device expert-parallel one. Capture, replay, counts and load are the
// routing stage's, so they behave the same on every layer.
#pragma once

#include <memory>

#include "dispatch/prepare_finalize.h"
#include "layer/routing_stage.h"
#include "moekit/device_buffer.h"
#include "moekit/kernel.h"
#include "moekit/layer.h"
#include "moekit/status.h"

namespace moekit {

class LayerPipeline {
 public:
  // pf: null exactly when `experts` is monolithic. workspace: on the experts'
  // device, >= workspace_bytes().
  LayerPipeline(RoutingStage routing, std::unique_ptr<dispatch::PrepareFinalize> pf,
                std::unique_ptr<MoeKernel> experts, std::shared_ptr<DeviceBuffer> workspace);

  // Allocates the workspace for `experts` at its config's max_num_tokens.
  static StatusOr<std::shared_ptr<DeviceBuffer>> allocate_workspace(const MoeKernel& experts);

  // verdict: the layer's check of args (check_forward_args and its own rules).
  // What a bad verdict does is the PrepareFinalize's (admit); it is returned.
  Status forward(const LayerForwardArgs& args, const Status& verdict, const CaptureTargets& capture, Stream stream);

  MoeKernel& experts() { return *experts_; }
  const MoeKernel& experts() const { return *experts_; }
  // Null for a monolithic kernel.
  dispatch::PrepareFinalize* prepare_finalize() const { return pf_.get(); }
  RoutingStage& routing() { return routing_; }
  const RoutingStage& routing() const { return routing_; }

  // The bytes of experts workspace a forward needs, and the buffer in use.
  size_t workspace_bytes() const;
  const std::shared_ptr<DeviceBuffer>& workspace_buffer() const { return workspace_; }
  // Runs with `buffer` from now on (MoeLayer::use_workspace says when).
  Status use_workspace(std::shared_ptr<DeviceBuffer> buffer);
  bool has_run() const { return has_run_; }

  // New experts and prepare/finalize (expert-parallel rebalance), built in full first.
  void replace_experts(std::unique_ptr<MoeKernel> experts, std::shared_ptr<DeviceBuffer> workspace,
                       std::unique_ptr<dispatch::PrepareFinalize> pf);

 private:
  RoutingStage routing_;
  std::unique_ptr<dispatch::PrepareFinalize> pf_;
  std::unique_ptr<MoeKernel> experts_;
  std::shared_ptr<DeviceBuffer> workspace_;
  bool has_run_ = false;  // a forward reached the experts: a captured graph may hold the workspace's address
};

}  // namespace moekit

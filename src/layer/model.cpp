// Model: the MoE layers of one model in order, with their model-layer indices,
// sharing one kernel workspace per device (layer.h says when).
#include <set>
#include <vector>
#include <string>

#include "moekit/layer.h"

namespace moekit {

Status Model::add_layer(std::shared_ptr<RoutedLayer> layer, int model_layer_index) {
  if (layer == nullptr) return InvalidArgument("model.add_layer: null layer");
  if (model_layer_index < 0) {
    return InvalidArgument("model.add_layer: model_layer_index must be >= 0, got " + std::to_string(model_layer_index));
  }
  if (!model_layers_.empty() && model_layer_index <= model_layers_.back()) {
    return InvalidArgument("model.add_layer: model_layer_index " + std::to_string(model_layer_index) +
                           " must be greater than the previous MoE layer's " + std::to_string(model_layers_.back()));
  }
  if (share_workspace_) share_workspace_with(*layer);
  layers_.push_back(std::move(layer));
  model_layers_.push_back(model_layer_index);
  return Status::Ok();
}

// Best effort: sharing only saves memory, so a layer that cannot share (it
// has run, or is larger than a buffer a layer has run with) keeps its own.
void Model::share_workspace_with(RoutedLayer& layer) {
  if (layer.has_run()) return;
  std::shared_ptr<DeviceBuffer>* shared = nullptr;  // the model's buffer on the layer's device
  for (std::shared_ptr<DeviceBuffer>& b : workspaces_) {
    if (b->device() == layer.device()) shared = &b;
  }
  if (shared != nullptr && (*shared)->bytes() >= layer.workspace_bytes()) {
    (void)layer.use_workspace(*shared);  // cannot fail: same device, large enough, not run
    return;
  }
  // The first layer on its device, or a larger one: its own buffer becomes the
  // model's, and the layers on the old one move to it.
  if (shared != nullptr) {
    std::vector<RoutedLayer*> on_old;
    for (const std::shared_ptr<RoutedLayer>& other : layers_) {
      if (other->workspace_buffer() != *shared) continue;
      if (other->has_run()) return;
      on_old.push_back(other.get());
    }
    for (RoutedLayer* other : on_old) (void)other->use_workspace(layer.workspace_buffer());
    *shared = layer.workspace_buffer();
  } else {
    workspaces_.push_back(layer.workspace_buffer());
  }
}

size_t Model::workspace_bytes() const {
  std::set<const DeviceBuffer*> seen;
  size_t bytes = 0;
  for (const std::shared_ptr<RoutedLayer>& layer : layers_) {
    const DeviceBuffer* b = layer->workspace_buffer().get();
    if (seen.insert(b).second) bytes += b->bytes();
  }
  return bytes;
}

}  // namespace moekit

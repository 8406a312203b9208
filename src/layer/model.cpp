// Model: the MoE layers of one model in order, with their model-layer indices.
#include <string>

#include "moekit/layer.h"

namespace moekit {

Status Model::add_layer(std::shared_ptr<MoeLayer> layer, int model_layer_index) {
  if (layer == nullptr) return InvalidArgument("model.add_layer: null layer");
  if (model_layer_index < 0) {
    return InvalidArgument("model.add_layer: model_layer_index must be >= 0, got " + std::to_string(model_layer_index));
  }
  if (!model_layers_.empty() && model_layer_index <= model_layers_.back()) {
    return InvalidArgument("model.add_layer: model_layer_index " + std::to_string(model_layer_index) +
                           " must be greater than the previous MoE layer's " + std::to_string(model_layers_.back()));
  }
  layers_.push_back(std::move(layer));
  model_layers_.push_back(model_layer_index);
  return Status::Ok();
}

}  // namespace moekit

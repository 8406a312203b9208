// load_checkpoint_layer (include/moekit/checkpoint.h): a model folder's layer
// as a ready Layer, with its router's weights for the logits.
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <memory>

#include "bind.h"
#include "convert.h"
#include "moekit/checkpoint.h"
#include "moekit/layer.h"

namespace moekit::python {

namespace {

// (Layer, MoeConfig, router weight [E, H] f32 | None, router bias [E] f32 | None, summary)
nb::tuple load(const std::string& model_dir, nb::handle layer_arg, nb::handle max_num_tokens_arg,
               const std::string& device_type, int device_index) {
  // Range-checked as Python ints before narrowing (a model layer index is an int).
  const int layer = static_cast<int>(int_arg("layer", layer_arg, 0, INT32_MAX));
  const int64_t max_num_tokens = int_arg("max_num_tokens", max_num_tokens_arg, 1, INT64_MAX);
  const Device device = parse_device(device_type, device_index);
  StatusOr<CheckpointLayer> ck = InvalidArgument("not loaded");
  StatusOr<std::unique_ptr<MoeLayer>> made = InvalidArgument("not created");
  const Platform& platform = Platform::probe();  // probed (once) with the GIL held
  throw_if_error(without_gil([&] {
    ck = load_checkpoint_layer(model_dir, layer);
    if (ck.ok()) {
      ck->config.max_num_tokens = max_num_tokens;
      made = MoeLayer::create(ck->config, ck->weights(), device, platform);
    }
    return Status::Ok();  // both results are raised below, with the GIL
  }));
  throw_if_error(ck.status());
  std::shared_ptr<MoeLayer> native = value_or_throw(std::move(made));
  auto optional = [](HostTensor& t) { return t.shape().empty() ? nb::none() : to_torch(std::move(t)); };
  const MoeConfig config = ck->config;
  const std::string summary = ck->summary();
  return nb::make_tuple(native, config, optional(ck->router_weight), optional(ck->router_bias), summary);
}

}  // namespace

void bind_checkpoint(nb::module_& m) {
  m.def("load_checkpoint_layer", &load, nb::arg("model_dir"), nb::arg("layer"), nb::arg("max_num_tokens"),
        nb::arg("device_type"), nb::arg("device_index"));
}

}  // namespace moekit::python

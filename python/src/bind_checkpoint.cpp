// load_checkpoint_layer (include/moekit/checkpoint.h): a model folder's layer
// as a ready Layer, with its router's weights for the logits.
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "bind.h"
#include "convert.h"
#include "moekit/checkpoint.h"
#include "moekit/io.h"
#include "moekit/layer.h"

namespace moekit::python {

namespace {

// Options of the layer beside what the checkpoint says.
struct LayerOptions {
  int64_t max_num_tokens = 1;
  std::string backend = "auto";
  bool batch_invariant = false;
  bool capture = true;
};

// (Layer, MoeConfig, router weight [E, H] f32 | None, router bias [E] f32 | None, summary,
//  selection bias [E] f32 | None). With `into` (a layer made here before) of
// the same config on the same device, that layer is updated in place
// (MoeLayer::update_weights) and returned instead of a new one.
// An allocation that failed while the layer was read or prepared, said with the layer's size:
// std::bad_alloc names none (`what`: which layer; `bytes`: its tensors in the shards, 0 if unknown).
Status with_size(Status s, const std::string& what, uint64_t bytes) {
  if (s.ok() || s.code() != StatusCode::kResourceExhausted) return s;
  const std::string size = bytes == 0 ? std::string()
                                      : ": its tensors are " + std::to_string(bytes) + " bytes in the shards, held " +
                                            "while the layer prepares its own copy (as large again, twice that for "
                                            "bf16 weights on the f32 GEMM path)";
  return ResourceExhausted(what + size + ": " + s.message());
}

nb::tuple layer_of(const std::function<StatusOr<CheckpointLayer>()>& read, const LayerOptions& o,
                   const std::string& device_type, int device_index, std::shared_ptr<MoeLayer> into = nullptr,
                   const std::function<Status(Status)>& explain = [](Status s) { return s; }) {
  const Device device = parse_device(device_type, device_index);
  StatusOr<CheckpointLayer> ck = InvalidArgument("not loaded");
  StatusOr<std::shared_ptr<MoeLayer>> made = InvalidArgument("not created");
  const Platform& platform = Platform::probe();  // probed (once) with the GIL held
  throw_if_error(explain(without_gil([&] {
    ck = read();
    if (ck.ok()) {
      MoeConfig& c = ck->config;
      c.max_num_tokens = o.max_num_tokens;
      c.backend = o.backend;
      c.batch_invariant = o.batch_invariant;
      c.needs_capture = o.capture;
      const Status valid = c.validate();
      if (!valid.ok()) {
        made = valid;
      } else if (into != nullptr && into->device() == device && into->config().to_string() == c.to_string()) {
        const Status updated = into->update_weights(ck->weights());
        made = updated.ok() ? StatusOr<std::shared_ptr<MoeLayer>>(into) : StatusOr<std::shared_ptr<MoeLayer>>(updated);
      } else {
        StatusOr<std::unique_ptr<MoeLayer>> created = MoeLayer::create(c, ck->weights(), device, platform);
        made = created.ok() ? StatusOr<std::shared_ptr<MoeLayer>>(std::move(*created))
                            : StatusOr<std::shared_ptr<MoeLayer>>(created.status());
      }
    }
    return Status::Ok();  // both results are raised below, with the GIL
  })));
  throw_if_error(explain(ck.status()));
  if (!made.ok()) throw_if_error(explain(made.status()));
  std::shared_ptr<MoeLayer> native = std::move(made).value();
  auto optional = [](HostTensor& t) { return t.shape().empty() ? nb::none() : to_torch(std::move(t)); };
  const MoeConfig config = ck->config;
  const std::string summary = ck->summary();
  return nb::make_tuple(native, config, optional(ck->router_weight), optional(ck->router_bias), summary,
                        optional(ck->score_bias));
}

LayerOptions options_of(nb::handle max_num_tokens_arg, const std::string& backend, bool batch_invariant,
                        bool capture) {
  LayerOptions o;
  o.max_num_tokens = int_arg("max_num_tokens", max_num_tokens_arg, 1, INT64_MAX);
  o.backend = backend;
  o.batch_invariant = batch_invariant;
  o.capture = capture;
  return o;
}

nb::tuple load(const std::string& model_dir, nb::handle layer_arg, nb::handle max_num_tokens_arg,
               const std::string& device_type, int device_index, const std::string& backend, bool batch_invariant,
               bool capture, bool keep_packed_weights) {
  // Range-checked as Python ints before narrowing (a model layer index is an int).
  const int layer = static_cast<int>(int_arg("layer", layer_arg, 0, INT32_MAX));
  const LayerOptions o = options_of(max_num_tokens_arg, backend, batch_invariant, capture);
  CheckpointLoadOptions load_options;
  load_options.keep_packed_weights = keep_packed_weights;
  uint64_t tensor_bytes = 0;
  load_options.check_size = [&](const CheckpointLayerSize& size) {
    tensor_bytes = size.tensor_bytes;
    return Status::Ok();
  };
  return layer_of([&] { return load_checkpoint_layer(model_dir, layer, load_options); }, o, device_type,
                  device_index, nullptr, [&](Status s) {
                    return with_size(std::move(s), "layer " + std::to_string(layer) + " of " + model_dir, tensor_bytes);
                  });
}

// A live model's layer: config.json's text and the block's tensors (names
// "model.layers.<layer>.mlp.*") as a safetensors image (bytes, or a 1-D uint8
// CPU tensor/array), or as a list of (name, safetensors dtype, shape, its bytes
// as a 1-D uint8 CPU tensor), read in place either way: the loader's expert
// weights view them until the layer's kernel has prepared its own copy, before
// this returns.
using ImageArray = nb::ndarray<const uint8_t, nb::ndim<1>, nb::device::cpu, nb::c_contig>;

// The list form as views (the arrays are kept alive by the caller's list).
std::vector<io::NamedTensor> named_views(const nb::list& tensors) {
  std::vector<io::NamedTensor> out;
  for (nb::handle item : tensors) {
    nb::tuple t;
    ImageArray bytes;
    if (!nb::try_cast(item, t) || t.size() != 4 || !nb::try_cast(t[3], bytes)) {
      throw nb::type_error("tensors: each entry is (name, safetensors dtype, shape, a 1-D uint8 CPU tensor of "
                           "its bytes)");
    }
    io::NamedTensor nt;
    nt.name = nb::cast<std::string>(t[0]);
    nt.stored_dtype = nb::cast<std::string>(t[1]);
    nt.stored_shape = nb::cast<std::vector<int64_t>>(t[2]);
    nt.tensor = TensorView::contiguous(const_cast<uint8_t*>(bytes.data()), DType::kU8,
                                       {static_cast<int64_t>(bytes.size())});
    out.push_back(std::move(nt));
  }
  return out;
}
nb::tuple load_in_memory(const std::string& config_json, nb::handle tensors, nb::handle layer_arg,
                         nb::handle max_num_tokens_arg, const std::string& device_type, int device_index,
                         const std::string& backend, bool batch_invariant, bool capture,
                         std::shared_ptr<MoeLayer> into) {
  const int layer = static_cast<int>(int_arg("layer", layer_arg, 0, INT32_MAX));
  const LayerOptions o = options_of(max_num_tokens_arg, backend, batch_invariant, capture);
  const void* data = nullptr;
  size_t size = 0;
  ImageArray image;
  if (nb::isinstance<nb::list>(tensors)) {
    StatusOr<io::SafetensorsFile> views =
        io::SafetensorsFile::of_views(named_views(nb::borrow<nb::list>(tensors)), "block tensors");
    throw_if_error(views.status());
    return layer_of([&] { return load_checkpoint_layer_in_memory(config_json, std::move(*views), layer); }, o,
                    device_type, device_index, std::move(into));
  }
  if (nb::isinstance<nb::bytes>(tensors)) {
    const auto b = nb::borrow<nb::bytes>(tensors);
    data = b.c_str();
    size = b.size();
  } else if (nb::try_cast(tensors, image)) {
    data = image.data();
    size = image.size();
  } else {
    throw nb::type_error("tensors: a safetensors image as bytes or a 1-D contiguous uint8 CPU tensor, or a list of "
                         "(name, dtype, shape, bytes)");
  }
  StatusOr<io::SafetensorsFile> file = io::SafetensorsFile::parse_borrowed(data, size, "block tensors");
  throw_if_error(file.status());
  return layer_of([&] { return load_checkpoint_layer_in_memory(config_json, std::move(*file), layer); }, o,
                  device_type, device_index, std::move(into));
}

}  // namespace

void bind_checkpoint(nb::module_& m) {
  m.def("load_checkpoint_layer", &load, nb::arg("model_dir"), nb::arg("layer"), nb::arg("max_num_tokens"),
        nb::arg("device_type"), nb::arg("device_index"), nb::arg("backend") = "auto",
        nb::arg("batch_invariant") = false, nb::arg("capture") = true, nb::arg("keep_packed_weights") = false);
  m.def(
      "checkpoint_layer_config",
      [](const std::string& config_json, nb::handle layer_arg) {
        const int layer = static_cast<int>(int_arg("layer", layer_arg, 0, INT32_MAX));
        return value_or_throw(checkpoint_layer_config(config_json, layer));
      },
      nb::arg("config_json"), nb::arg("layer"));
  // into: a layer this returned before (or None): updated in place when the config is unchanged.
  m.def("load_checkpoint_layer_in_memory", &load_in_memory, nb::arg("config_json"), nb::arg("tensors"),
        nb::arg("layer"), nb::arg("max_num_tokens"), nb::arg("device_type"), nb::arg("device_index"),
        nb::arg("backend") = "auto", nb::arg("batch_invariant") = false, nb::arg("capture") = true,
        nb::arg("into").none() = nb::none());
}

}  // namespace moekit::python

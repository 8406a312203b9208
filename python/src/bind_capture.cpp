// Routed-expert capture and replay: the capturer, bind(), the replayer and the
// capture file, as in include/moekit/capture.h.
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <utility>

#include "bind.h"
#include "convert.h"
#include "moekit/capture.h"

namespace moekit::python {

namespace {

using Segments = std::vector<std::pair<std::string, int64_t>>;

StepLayout layout_of(const Segments& segments) {
  StepLayout layout;
  for (const auto& [request, rows] : segments) layout.segments.push_back({request, rows});
  return layout;
}

// A host copy of a host view as a torch tensor (the capture keeps its own).
nb::object copy_to_torch(const TensorView& v) {
  std::vector<int64_t> shape(v.shape.begin(), v.shape.begin() + v.rank);
  HostTensor t(v.dtype, shape);
  if (t.nbytes() > 0) std::memcpy(t.data<void>(), v.data, t.nbytes());
  return to_torch(std::move(t));
}

std::unique_ptr<RoutedExpertsCapturer> create_capturer(int num_moe_layers, int64_t max_num_tokens, int top_k,
                                                       const std::string& device_type, int device_index,
                                                       bool enabled) {
  return value_or_throw(RoutedExpertsCapturer::create(num_moe_layers, max_num_tokens, top_k,
                                                      parse_device(device_type, device_index), enabled));
}

}  // namespace

void bind_capture(nb::module_& m) {
  m.attr("UNWRITTEN_EXPERT_ID") = kUnwrittenExpertId;
  m.attr("CAPTURE_FORMAT_VERSION") = kCaptureFormatVersion;

  nb::class_<RequestCapture>(m, "RequestCapture", "The captured ids of one request.")
      .def_ro("request", &RequestCapture::request)
      .def_ro("first_token", &RequestCapture::first_token)
      .def_prop_ro("num_tokens", &RequestCapture::num_tokens)
      .def_prop_ro("ids", [](const RequestCapture& r) { return copy_to_torch(r.ids.view()); },
                   "[num_tokens, num_moe_layers, top_k] int16 (a copy), logical ids");

  nb::class_<CaptureSet>(m, "CaptureSet", "A capture: what a capture file holds.")
      .def_ro("requests", &CaptureSet::requests)
      .def_ro("extra_metadata", &CaptureSet::extra_metadata)
      .def_prop_ro("num_experts", [](const CaptureSet& c) { return c.info.num_experts; })
      .def_prop_ro("top_k", [](const CaptureSet& c) { return c.info.top_k(); })
      .def_prop_ro("num_moe_layers", [](const CaptureSet& c) { return c.info.num_moe_layers(); })
      .def_prop_ro("model_layers", [](const CaptureSet& c) { return c.info.model_layers; })
      .def_prop_ro("routing", [](const CaptureSet& c) { return c.info.routing.to_string(); })
      .def_prop_ro("routing_method", [](const CaptureSet& c) { return std::string(routing_method_name(c.info.routing.method)); })
      .def_prop_ro("format_version", [](const CaptureSet& c) { return c.info.format_version; })
      .def_prop_ro("routing_spec_version", [](const CaptureSet& c) { return c.info.routing_spec_version; })
      .def_prop_ro("id_space", [](const CaptureSet& c) { return c.info.id_space; })
      .def_prop_ro("id_order", [](const CaptureSet& c) { return c.info.id_order; })
      .def("find", [](const CaptureSet& c, const std::string& request) -> nb::object {
            const RequestCapture* r = c.find(request);
            return r == nullptr ? nb::none() : nb::cast(*r);
          }, nb::arg("request"));

  nb::class_<RoutedExpertsCapturer>(m, "Capturer", "The routed-expert capture buffer (moekit.RoutedExpertsCapturer wraps it).")
      .def_prop_ro("enabled", &RoutedExpertsCapturer::enabled)
      .def_prop_ro("num_moe_layers", &RoutedExpertsCapturer::num_moe_layers)
      .def_prop_ro("max_num_tokens", &RoutedExpertsCapturer::max_num_tokens)
      .def_prop_ro("top_k", &RoutedExpertsCapturer::top_k)
      .def_prop_ro("device", [](const RoutedExpertsCapturer& c) { return c.device().to_string(); })
      .def_prop_ro("allocated_bytes", &RoutedExpertsCapturer::allocated_bytes)
      .def_prop_ro("bound", &RoutedExpertsCapturer::bound)
      .def("add_request", [](RoutedExpertsCapturer& c, const std::string& request, int64_t skip) {
            throw_if_error(c.add_request(request, skip));
          }, nb::arg("request"), nb::arg("skip_prompt_tokens") = 0)
      .def("begin_step", [](RoutedExpertsCapturer& c, const Segments& segments, uintptr_t stream) {
            throw_if_error(c.begin_step(layout_of(segments), reinterpret_cast<Stream>(stream)));
          }, nb::arg("segments"), nb::arg("stream"))
      .def("end_step", [](RoutedExpertsCapturer& c, uintptr_t stream) {
            Status s;
            {
              nb::gil_scoped_release release;
              s = c.end_step(reinterpret_cast<Stream>(stream));
            }
            throw_if_error(s);
          }, nb::arg("stream"))
      .def("routed_experts", [](const RoutedExpertsCapturer& c, const std::string& request) {
            return to_torch(value_or_throw(c.routed_experts(request)));
          }, nb::arg("request"))
      .def("finish_request", [](RoutedExpertsCapturer& c, const std::string& request) {
            return value_or_throw(c.finish_request(request));
          }, nb::arg("request"))
      .def("snapshot", [](const RoutedExpertsCapturer& c) { return value_or_throw(c.snapshot()); });
  m.def("create_capturer", &create_capturer, nb::arg("num_moe_layers"), nb::arg("max_num_tokens"), nb::arg("top_k"),
        nb::arg("device_type"), nb::arg("device_index"), nb::arg("enabled"));

  // The model keeps the capturer alive: its layers write into the capturer's buffer.
  m.def("bind", [](Model& model, RoutedExpertsCapturer& capturer) { throw_if_error(bind(model, capturer)); },
        nb::arg("model"), nb::arg("capturer"), nb::keep_alive<1, 2>());

  nb::class_<RoutedExpertsReplayer>(m, "Replayer", "Forced ids per step from a capture.")
      .def("begin_step", [](RoutedExpertsReplayer& r, const Segments& segments) {
            throw_if_error(r.begin_step(layout_of(segments)));
          }, nb::arg("segments"))
      .def("forced_ids", [](const RoutedExpertsReplayer& r, int layer) {
            if (layer < 0 || layer >= r.captures().info.num_moe_layers()) {
              throw nb::value_error(("forced_ids: layer " + std::to_string(layer) + " is not in [0, " +
                                     std::to_string(r.captures().info.num_moe_layers()) + ")").c_str());
            }
            return copy_to_torch(r.forced_ids(layer));
          }, nb::arg("layer"))
      .def("start_token", [](RoutedExpertsReplayer& r, const std::string& request, int64_t token) {
            throw_if_error(r.start_token(request, token));
          }, nb::arg("request"), nb::arg("token"))
      .def_prop_ro("captures", &RoutedExpertsReplayer::captures);
  m.def("create_replayer", [](const CaptureSet& captures, const Model& model) {
          return value_or_throw(RoutedExpertsReplayer::create(captures, model));
        }, nb::arg("captures"), nb::arg("model"));

  m.def("write_capture_file", [](const std::string& path, const CaptureSet& captures) {
          throw_if_error(write_capture_file(path, captures));
        }, nb::arg("path"), nb::arg("captures"));
  m.def("read_capture_file", [](const std::string& path) { return value_or_throw(read_capture_file(path)); },
        nb::arg("path"));
}

}  // namespace moekit::python

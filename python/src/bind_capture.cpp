// Routed-expert capture and replay: the capturer, bind(), the replayer and the
// capture file, as in include/moekit/capture.h.
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/optional.h>

#include <cstring>
#include <memory>
#include <utility>

#include "bind.h"
#include "convert.h"
#include "moekit/capture.h"
#include "moekit/capture_check.h"

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
  if (v.data == nullptr && v.numel() > 0) throw std::runtime_error("copy_to_torch: a view without data");
  std::vector<int64_t> shape(v.shape.begin(), v.shape.begin() + v.rank);
  HostTensor t(v.dtype, shape);
  if (t.nbytes() > 0) std::memcpy(t.data<void>(), v.data, t.nbytes());
  return to_torch(std::move(t));
}

std::unique_ptr<RoutedExpertsCapturer> create_capturer(nb::handle num_moe_layers, nb::handle max_num_tokens,
                                                       nb::handle top_k, const std::string& device_type,
                                                       int device_index, bool enabled) {
  const int layers = static_cast<int>(int_arg("num_moe_layers", num_moe_layers, 1, INT32_MAX));
  const int64_t tokens = int_arg("max_num_tokens", max_num_tokens, 1, INT64_MAX);
  const int k = static_cast<int>(int_arg("top_k", top_k, 1, 32767));
  return value_or_throw(RoutedExpertsCapturer::create(layers, tokens, k, parse_device(device_type, device_index),
                                                      enabled));
}

// One request for capture_set(): (request, first_token, first_generated_token, ids i16 [T, L, k] host,
// router weights f32|bf16 [T, L, k] host or None).
using RequestArrays = std::tuple<std::string, int64_t, int64_t, Array, OptArray>;

HostTensor host_copy(const TensorView& v, const std::string& name) {
  if (v.device.type != DeviceType::kCpu || !v.is_contiguous()) {
    throw nb::value_error((name + ": must be a contiguous host array").c_str());
  }
  std::vector<int64_t> shape(v.shape.begin(), v.shape.begin() + v.rank);
  HostTensor t(v.dtype, shape);
  if (t.nbytes() > 0) std::memcpy(t.data<void>(), v.data, t.nbytes());
  return t;
}

CaptureSet capture_set(nb::handle num_experts_arg, const std::string& method, nb::handle top_k_arg,
                       nb::handle num_groups_arg, nb::handle topk_groups_arg, float routed_scaling_factor, bool score_bias, const std::vector<int>& model_layers,
                       const std::vector<RequestArrays>& requests, const std::string& backend,
                       const std::string& router_weights_dtype) {
  // Range-checked as Python ints before any narrowing (as MoeConfig's fields are).
  const int64_t num_experts = int_arg("num_experts", num_experts_arg, 1, 32767);
  const int top_k = static_cast<int>(int_arg("top_k", top_k_arg, 1, 32767));
  const int num_groups = static_cast<int>(int_arg("num_groups", num_groups_arg, 1, INT32_MAX));
  const int topk_groups = static_cast<int>(int_arg("topk_groups", topk_groups_arg, 1, INT32_MAX));
  CaptureSet set;
  set.info.num_experts = num_experts;
  const std::optional<RoutingMethod> m = parse_routing_method(method);
  if (!m) throw nb::value_error(("routing: unknown routing method '" + method + "'").c_str());
  set.info.routing.method = *m;
  set.info.routing.top_k = top_k;
  set.info.routing.num_groups = num_groups;
  set.info.routing.topk_groups = topk_groups;
  set.info.routing.routed_scaling_factor = routed_scaling_factor;
  set.info.routing.has_score_bias = score_bias;
  if (num_experts < 1 || num_experts > 32767) {
    throw nb::value_error(("num_experts must be in [1, 32767], got " + std::to_string(num_experts)).c_str());
  }
  throw_if_error(set.info.routing.validate(static_cast<int>(num_experts)));
  set.info.model_layers = model_layers;
  set.info.backend = backend;
  if (!router_weights_dtype.empty()) {
    const auto dt = parse_dtype(router_weights_dtype);
    if (!dt || (*dt != DType::kF32 && *dt != DType::kBF16)) {
      throw nb::value_error(("router_weights_dtype must be f32 or bf16, got " + router_weights_dtype).c_str());
    }
    set.info.router_weights_dtype = dt;
  }
  for (const auto& [name, first, first_generated, ids, weights] : requests) {
    RequestCapture r;
    r.request = name;
    r.first_token = first;
    r.first_generated_token = first_generated;
    const TensorView v = view_of(ids, "ids");
    if (v.dtype != DType::kI16 || v.rank != 3) {
      throw nb::value_error(("request '" + name + "': ids must be int16 [tokens, moe_layers, k], got " +
                             dtype_name(v.dtype) + " " + v.shape_string()).c_str());
    }
    r.ids = host_copy(v, "request '" + name + "': ids");
    if (weights) r.router_weights = host_copy(view_of(weights, "router_weights"), "request '" + name + "': router_weights");
    set.requests.push_back(std::move(r));
  }
  return set;
}

nb::list findings_list(const CaptureCheckReport& report) {
  nb::list out;
  for (const CaptureFinding& f : report.findings) {
    nb::dict d;
    d["kind"] = capture_finding_name(f.kind);
    d["request"] = f.request;
    d["token"] = f.token;
    d["layer"] = f.layer;
    d["model_layer"] = f.model_layer;
    d["slot"] = f.slot;
    d["message"] = f.message;
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_capture(nb::module_& m) {
  m.attr("UNWRITTEN_EXPERT_ID") = kUnwrittenExpertId;
  m.attr("CAPTURE_FORMAT_VERSION") = kCaptureFormatVersion;

  nb::class_<RequestCapture>(m, "RequestCapture", "The captured ids of one request.")
      .def_ro("request", &RequestCapture::request)
      .def_ro("first_token", &RequestCapture::first_token)
      .def_ro("first_generated_token", &RequestCapture::first_generated_token, "-1: not known")
      .def_prop_ro("router_weights", [](const RequestCapture& r) -> nb::object {
            return r.router_weights.shape().empty() ? nb::none()
                                                                                      : copy_to_torch(r.router_weights.view());
          }, "[num_tokens, num_moe_layers, top_k] float32|bfloat16 (a copy), or None")
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
      .def_prop_ro("backend", [](const CaptureSet& c) { return c.info.backend; })
      .def_prop_ro("router_weights_dtype", [](const CaptureSet& c) -> nb::object {
            return c.info.router_weights_dtype ? nb::cast(std::string(dtype_name(*c.info.router_weights_dtype))) : nb::none();
          })
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
      .def("add_request", [](RoutedExpertsCapturer& c, const std::string& request, int64_t skip, int64_t prompt) {
            throw_if_error(c.add_request(request, skip, prompt));
          }, nb::arg("request"), nb::arg("skip_prompt_tokens") = 0, nb::arg("prompt_tokens") = -1)
      .def("begin_step", [](RoutedExpertsCapturer& c, const Segments& segments, uintptr_t stream) {
            throw_if_error(c.begin_step(layout_of(segments), reinterpret_cast<Stream>(stream)));
          }, nb::arg("segments"), nb::arg("stream"))
      .def("end_step", [](RoutedExpertsCapturer& c, uintptr_t stream) {
            throw_if_error(without_gil([&] { return c.end_step(reinterpret_cast<Stream>(stream)); }));
          }, nb::arg("stream"))
      .def("end_step_async", [](RoutedExpertsCapturer& c, uintptr_t stream) {
            throw_if_error(c.end_step_async(reinterpret_cast<Stream>(stream)));
          }, nb::arg("stream"))
      .def("collect", [](RoutedExpertsCapturer& c) {
            throw_if_error(without_gil([&] { return c.collect(); }));
          })
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
            if (!r.has_step()) {
              throw nb::value_error("forced_ids: no step has begun; call begin_step(segments) first");
            }
            if (r.step_rows() == 0) {  // begin_step([]): a step of no rows forces [0, k] ids
              return to_torch(HostTensor(DType::kI32, {0, static_cast<int64_t>(r.captures().info.top_k())}));
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
  m.def("read_capture_file", [](const std::string& path, bool check_ids) {
          CaptureReadOptions o;
          o.check_ids = check_ids;
          return value_or_throw(read_capture_file(path, o));
        }, nb::arg("path"), nb::arg("check_ids") = true);
  m.def("capture_set", &capture_set, nb::arg("num_experts"), nb::arg("method"), nb::arg("top_k"),
        nb::arg("num_groups"), nb::arg("topk_groups"), nb::arg("routed_scaling_factor"), nb::arg("score_bias"),
        nb::arg("model_layers"),
        nb::arg("requests"), nb::arg("backend") = "", nb::arg("router_weights_dtype") = "");
  m.def("check_capture", [](const CaptureSet& c, const std::map<std::string, int64_t>& expected_tokens,
                            int64_t num_physical_experts, const std::vector<int>& dense_layers,
                            int64_t min_tokens_constant, int max_findings_per_kind,
                            const std::vector<int>& physical_to_logical) {
          CaptureCheckOptions o;
          o.physical_to_logical = physical_to_logical;
          o.expected_tokens = expected_tokens;
          o.num_physical_experts = num_physical_experts;
          o.dense_layers = dense_layers;
          o.min_tokens_constant = min_tokens_constant;
          o.max_findings_per_kind = max_findings_per_kind;
          const CaptureCheckReport report = check_capture(c, o);
          nb::dict counts;
          for (const auto& [kind, n] : report.counts) counts[capture_finding_name(kind)] = n;
          return nb::make_tuple(findings_list(report), counts);
        }, nb::arg("captures"), nb::arg("expected_tokens"), nb::arg("num_physical_experts"), nb::arg("dense_layers"),
        nb::arg("min_tokens_constant"), nb::arg("max_findings_per_kind"), nb::arg("physical_to_logical"));
}

}  // namespace moekit::python

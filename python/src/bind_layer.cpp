// Layer (MoeLayer), Model, select_backend, route and the platform probe.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <memory>

#include "bind.h"
#include "convert.h"
#include "moekit/layer.h"
#include "moekit/parallel_for.h"
#include "moekit/platform.h"
#include "moekit/oracle.h"
#include "moekit/routing.h"

namespace moekit::python {

namespace {

nb::list report_list(const std::vector<CandidateReport>& report) {
  nb::list out;
  for (const CandidateReport& c : report) {
    nb::dict d;
    d["backend"] = c.backend;
    d["kernel"] = c.kernel;
    d["kind"] = c.monolithic ? "monolithic" : "modular";
    d["verdict"] = c.chosen ? "chosen" : (c.supported ? "supported" : "rejected");
    d["reason"] = c.reason;
    out.append(d);
  }
  return out;
}

// The platform the layer is chosen on: the probed machine; for a CPU layer only
// its CPU threads matter (the CUDA backends are filtered out by device type).
const Platform& platform() { return Platform::probe(); }

MoeWeights weights_of(const Array& w13, const Array& w2, const OptArray& score_bias, const OptArray& w13_scale,
                      const OptArray& w2_scale, const OptArray& a13_scale, const OptArray& a2_scale,
                      const OptArray& w13_bias, const OptArray& w2_bias, const OptArray& shared_w13,
                      const OptArray& shared_w2, const OptArray& shared_gate) {
  MoeWeights w;
  w.w13 = view_of(w13, "w13");
  w.w2 = view_of(w2, "w2");
  w.score_bias = view_of(score_bias, "score_bias");
  w.w13_scale = view_of(w13_scale, "w13_scale");  // fp8 schemes (docs/fp8.md)
  w.w2_scale = view_of(w2_scale, "w2_scale");
  w.a13_scale = view_of(a13_scale, "a13_scale");
  w.a2_scale = view_of(a2_scale, "a2_scale");
  w.w13_bias = view_of(w13_bias, "w13_bias");
  w.w2_bias = view_of(w2_bias, "w2_bias");
  w.shared_w13 = view_of(shared_w13, "shared_w13");
  w.shared_w2 = view_of(shared_w2, "shared_w2");
  w.shared_gate = view_of(shared_gate, "shared_gate");
  return w;
}

// New values of the layer's weights, prepared in place (MoeLayer::update_weights).
void update_weights(MoeLayer& layer, const Array& w13, const Array& w2, const OptArray& score_bias,
                    const OptArray& w13_scale, const OptArray& w2_scale, const OptArray& a13_scale,
                    const OptArray& a2_scale, const OptArray& w13_bias, const OptArray& w2_bias,
                    const OptArray& shared_w13, const OptArray& shared_w2, const OptArray& shared_gate) {
  const MoeWeights w = weights_of(w13, w2, score_bias, w13_scale, w2_scale, a13_scale, a2_scale, w13_bias, w2_bias,
                                  shared_w13, shared_w2, shared_gate);
  throw_if_error(without_gil([&] { return layer.update_weights(w); }));
}

std::shared_ptr<MoeLayer> create_layer(const MoeConfig& config, const Array& w13, const Array& w2,
                                       const OptArray& score_bias, const std::string& device_type,
                                       int device_index, const OptArray& w13_scale, const OptArray& w2_scale,
                                       const OptArray& a13_scale, const OptArray& a2_scale,
                                       const OptArray& w13_bias, const OptArray& w2_bias,
                                       const OptArray& shared_w13, const OptArray& shared_w2,
                                       const OptArray& shared_gate) {
  MoeConfig c = config;
  // The extras the tensors bring (as has_score_bias): the config follows what was given.
  c.routing.has_score_bias = score_bias.has_value();
  c.has_expert_bias = w13_bias.has_value() || w2_bias.has_value();
  c.has_shared_gate = shared_gate.has_value();
  if (shared_w2.has_value()) {
    const TensorView sw2 = view_of(shared_w2, "shared_w2");
    if (sw2.rank != 2) throw nb::value_error("shared_w2: expected [H, Is]");
    c.shared_intermediate = sw2.dim(1);
  } else if (shared_w13.has_value() || shared_gate.has_value()) {
    throw nb::value_error("shared_w13/shared_gate: given without shared_w2 [H, Is]");
  }
  const MoeWeights w = weights_of(w13, w2, score_bias, w13_scale, w2_scale, a13_scale, a2_scale, w13_bias, w2_bias,
                                  shared_w13, shared_w2, shared_gate);
  const Device device = parse_device(device_type, device_index);
  const Platform& p = platform();  // probed (once) with the GIL held
  std::unique_ptr<MoeLayer> made;
  // The Status leaves the released region as a value: raising it there (as
  // value_or_throw does) set a Python error without the GIL and killed the
  // interpreter on the first failed allocation.
  throw_if_error(without_gil([&]() -> Status {
    StatusOr<std::unique_ptr<MoeLayer>> r = MoeLayer::create(c, w, device, p);
    if (!r.ok()) return r.status();
    made = std::move(r).value();
    return Status::Ok();
  }));
  return std::shared_ptr<MoeLayer>(std::move(made));
}

void forward(MoeLayer& layer, const Array& hidden, const OptArray& router_logits, const Array& out,
             const OptArray& routing_replay_out, const OptArray& forced_ids, const OptArray& topk_ids,
             const OptArray& topk_weights, uintptr_t stream) {
  LayerForwardArgs a;
  a.hidden = view_of(hidden, "hidden");
  a.router_logits = view_of(router_logits, "router_logits");
  a.out = view_of(out, "out");
  a.routing_replay_out = view_of(routing_replay_out, "routing_replay_out");
  a.forced_ids = view_of(forced_ids, "forced_ids");
  a.topk_ids = view_of(topk_ids, "topk_ids");
  a.topk_weights = view_of(topk_weights, "topk_weights");
  throw_if_error(without_gil([&] { return layer.forward(a, reinterpret_cast<Stream>(stream)); }));
}

nb::list select(const MoeConfig& config, const std::string& device_type) {
  const Device device = parse_device(device_type, 0);
  return report_list(value_or_throw(select_backend_on(config, platform(), device.type)).report);
}

void route_into(const MoeConfig& config, const Array& logits, const OptArray& score_bias, const OptArray& forced_ids,
                const Array& topk_ids, const Array& topk_weights, const OptArray& expert_counts, uintptr_t stream) {
  RoutingConfig rc = config.routing;
  rc.has_score_bias = score_bias.has_value();
  throw_if_error(rc.validate(static_cast<int>(config.num_experts)));
  RoutingArgs a;
  a.logits = view_of(logits, "router_logits");
  a.score_bias = view_of(score_bias, "score_bias");
  a.forced_ids = view_of(forced_ids, "forced_ids");
  a.topk_ids = view_of(topk_ids, "topk_ids");
  a.topk_weights = view_of(topk_weights, "topk_weights");
  a.expert_counts = view_of(expert_counts, "expert_counts");
  if (a.logits.rank == 2 && a.logits.dim(1) != config.num_experts) {
    throw nb::value_error(("router_logits: " + std::to_string(a.logits.dim(1)) + " experts per row, the config has " +
                           std::to_string(config.num_experts)).c_str());
  }
  throw_if_error(without_gil([&] { return route(rc, a, reinterpret_cast<Stream>(stream)); }));
}

}  // namespace

void bind_layer(nb::module_& m) {
  nb::class_<MoeLayer>(m, "Layer", "One MoE layer ready to run (moekit.MoeLayer wraps it).")
      .def_prop_ro("backend", [](const MoeLayer& l) { return l.backend(); })
      .def_prop_ro("kernel", [](const MoeLayer& l) { return std::string(l.kernel().name()); })
      .def_prop_ro("monolithic", [](const MoeLayer& l) { return l.kernel().is_monolithic(); })
      .def_prop_ro("device", [](const MoeLayer& l) { return l.device().to_string(); })
      .def_prop_ro("config", [](const MoeLayer& l) { return l.config(); })
      .def_prop_ro("workspace_bytes", &MoeLayer::workspace_bytes)
      // Which buffer it runs with (layers that share one give the same number).
      .def_prop_ro("workspace_id",
                   [](const MoeLayer& l) { return reinterpret_cast<uintptr_t>(l.workspace_buffer().get()); })
      .def(
          "adopt_workspace",
          [](MoeLayer& l, const MoeLayer& other) { return l.use_workspace(other.workspace_buffer()).ok(); },
          nb::arg("other"),
          "Runs with other's workspace from now on (releasing its own) and returns True, or returns False "
          "when it cannot: another device, too small, or this layer has run. For layers that never run at "
          "the same time.")
      .def_prop_ro("selection_report", [](const MoeLayer& l) { return report_list(l.selection_report()); })
      .def_prop_ro("report", &MoeLayer::report_string)
      .def("gemm_plan", [](const MoeLayer& l, int64_t num_tokens) { return l.kernel().gemm_plan(num_tokens); },
           nb::arg("num_tokens"), "The GEMM paths a forward of num_tokens tokens takes, and why.")
      .def("forward", &forward, nb::arg("hidden"), nb::arg("router_logits").none(), nb::arg("out"),
           nb::arg("routing_replay_out").none(), nb::arg("forced_ids").none(), nb::arg("topk_ids").none(),
           nb::arg("topk_weights").none(), nb::arg("stream"))
      .def("update_weights", &update_weights, nb::arg("w13"), nb::arg("w2"), nb::arg("score_bias").none(),
           nb::arg("w13_scale").none() = nb::none(), nb::arg("w2_scale").none() = nb::none(),
           nb::arg("a13_scale").none() = nb::none(), nb::arg("a2_scale").none() = nb::none(),
           nb::arg("w13_bias").none() = nb::none(), nb::arg("w2_bias").none() = nb::none(),
           nb::arg("shared_w13").none() = nb::none(), nb::arg("shared_w2").none() = nb::none(),
           nb::arg("shared_gate").none() = nb::none(),
           "New values of the weights it was made with (same shapes and dtypes), prepared in place.")
      .def(
          "update_score_bias",
          [](MoeLayer& layer, const Array& score_bias) {
            const TensorView bias = view_of(score_bias, "score_bias");
            throw_if_error(without_gil([&] { return layer.update_score_bias(bias); }));
          },
          nb::arg("score_bias"), "A new selection bias [E] float32, copied in place.");
  m.def("create_layer", &create_layer, nb::arg("config"), nb::arg("w13"), nb::arg("w2"), nb::arg("score_bias").none(),
        nb::arg("device_type"), nb::arg("device_index"), nb::arg("w13_scale").none() = nb::none(),
        nb::arg("w2_scale").none() = nb::none(), nb::arg("a13_scale").none() = nb::none(),
        nb::arg("a2_scale").none() = nb::none(), nb::arg("w13_bias").none() = nb::none(),
        nb::arg("w2_bias").none() = nb::none(), nb::arg("shared_w13").none() = nb::none(),
        nb::arg("shared_w2").none() = nb::none(), nb::arg("shared_gate").none() = nb::none());

  nb::class_<Model>(m, "Model", "The MoE layers of one model, in order, with their model-layer indices.")
      .def(nb::init<bool>(), nb::arg("share_workspace") = true)
      .def(
          "add_layer",
          [](Model& model, std::shared_ptr<MoeLayer> layer, int model_layer_index) {
            throw_if_error(model.add_layer(std::move(layer), model_layer_index));
          },
          nb::arg("layer"), nb::arg("model_layer_index"))
      .def_prop_ro("num_layers", &Model::num_layers)
      .def_prop_ro("workspace_bytes", &Model::workspace_bytes)
      .def_prop_ro("model_layer_indices", [](const Model& model) {
        nb::list out;
        for (int i : model.model_layer_indices()) out.append(i);
        return out;
      });

  m.def("select_backend", &select, nb::arg("config"), nb::arg("device_type"));
  m.def("route", &route_into, nb::arg("config"), nb::arg("router_logits"), nb::arg("score_bias").none(),
        nb::arg("forced_ids").none(), nb::arg("topk_ids"), nb::arg("topk_weights"), nb::arg("expert_counts").none(),
        nb::arg("stream"));
  m.def("platform", [] { return platform().to_string(); });
  m.def("cuda_built", [] { return platform().cuda_built; });
  m.def(
      "set_num_threads",
      [](nb::handle n) {
        const int threads = static_cast<int>(int_arg("num_threads", n, 1, 1024));
        throw_if_error(without_gil([&] { return set_num_threads(threads); }));
      },
      nb::arg("num_threads"));
  m.def("num_threads", [] { return parallel_num_threads(); });
  m.def(
      "use_openmp_runtime",
      [](const std::string& library) { throw_if_error(without_gil([&] { return use_openmp_runtime(library); })); },
      nb::arg("library"));
  m.def("openmp_runtime", [] { return openmp_runtime(); });
}

}  // namespace moekit::python

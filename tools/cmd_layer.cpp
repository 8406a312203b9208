// `moekit layer`: run one MoE layer on dumped tensors (hidden states, router
// logits) with weights from a safetensors checkpoint, the way an engine
// developer checks a kernel against their framework. Optionally writes the
// routed expert ids (capture) or forces them (replay).
#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "flag_checks.h"
#include "moekit/device_buffer.h"
#include "memory_budget.h"
#include "moekit/capture.h"
#include "moekit/checkpoint.h"
#include "moekit/io.h"
#include "moekit/layer.h"
#include "moekit/routing.h"
#include "output_paths.h"

namespace moekit::tools {
namespace {

struct LayerOptions {
  RoutingFlags routing;
  std::string weights_path, model_dir, hidden_path, logits_path, out_path, capture_path, replay_path;
  int layer = -1;  // -1: the file's only MoE layer (--weights); required with --model
  std::string activation = "silu";
  std::string dtype;  // compute (activation) dtype; default: the weights' dtype
  std::string backend = "auto";
  bool no_bias = false;
  bool keep_packed_weights = false;  // --model: gpt-oss's MXFP4 experts as stored (quant mxfp4)
  bool logits_given = false, capture_given = false, replay_given = false;  // optional path flags, given (even as "")
  bool model_given = false;
  // Flags that describe the layer, which config.json describes instead with --model.
  std::vector<const CLI::Option*> layer_description;
};

// The compute dtype when --dtype is not given: the weights' own, bf16 for
// quantized weights (f8_e4m3, or u8 holding 4-bit values).
DType default_act_dtype(DType weights) {
  return weights == DType::kF8E4M3 || weights == DType::kU8 ? DType::kBF16 : weights;
}

// A .npy as a float tensor of `dtype` with shape [rows?, cols].
StatusOr<HostTensor> load_matrix(const std::string& path, const char* what, int64_t rows, int64_t cols,
                                 DType dtype) {
  MOEKIT_ASSIGN_OR_RETURN(HostTensor t, io::read_npy(path));
  if (t.shape().size() != 2 || (rows >= 0 && t.shape()[0] != rows) || t.shape()[1] != cols || t.shape()[0] < 1) {
    return InvalidArgument(path + ": " + what + " must be [" + (rows >= 0 ? std::to_string(rows) : "M") + ", " +
                           std::to_string(cols) + "], got " + t.view().shape_string());
  }
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16) {
    return InvalidArgument(path + ": " + what + " must be f32, bf16 or f16, got " + dtype_name(t.dtype()));
  }
  if (t.dtype() == dtype) return t;
  return io::convert(t.view(), dtype);
}

Status expect_shape(const std::string& path, const char* what, const io::NpyInfo& info, std::vector<int64_t> want) {
  if (info.shape == want) return Status::Ok();
  return InvalidArgument(path + ": " + what + " must be " + TensorView::contiguous(nullptr, info.dtype, want).shape_string() +
                         ", got " + TensorView::contiguous(nullptr, info.dtype, info.shape).shape_string());
}

// A host tensor's copy on `device` (the same storage when the device is the CPU).
struct OnDevice {
  DeviceBuffer buffer;
  TensorView view;
};
StatusOr<OnDevice> on_device(const HostTensor& t, Device device) {
  OnDevice d;
  if (device.type == DeviceType::kCpu) {
    d.view = t.view();
    return d;
  }
  MOEKIT_ASSIGN_OR_RETURN(d.buffer, DeviceBuffer::copy_of(device, t.view()));
  d.view = TensorView::contiguous(d.buffer.data(), t.dtype(), t.shape(), device);
  return d;
}

// What the command holds at its peak for M tokens: the stacked weights and the
// kernel's f32 copy of them, the layer's other tensors as read (with the
// kernel's f32 copy), the inputs with their converted copies, the outputs and
// their encoded files, and the kernel's workspace (each routed row: its input,
// GEMM1 and GEMM2 rows in f32). From the tensors' headers, before any is read.
double layer_memory_bytes(const CheckpointLayerSize& s, int64_t tokens, int top_k, DType act_dtype) {
  const MoeConfig& c = s.config;
  const double E = static_cast<double>(c.num_experts), N = static_cast<double>(s.w13_rows),
               H = static_cast<double>(c.hidden), I = static_cast<double>(c.intermediate),
               M = static_cast<double>(tokens), k = std::min<double>(top_k, E);
  const double el = static_cast<double>(dtype_size(s.dtype));
  const double experts = E * H * (N + I) * el;
  const double weights = E * H * (N + I) * (el + 4.0) + E * H * 4.0;
  const double rest = std::max(0.0, static_cast<double>(s.tensor_bytes) - experts) * (1.0 + 4.0 / el);
  const double act = static_cast<double>(dtype_size(act_dtype));
  const double inputs = M * H * (4.0 + act + 4.0) + M * E * 4.0 * 2.0;  // hidden as read, converted, f32 for logits
  const double outputs = M * H * act * 2.0 + M * k * 4.0 * 4.0;          // out and its file; ids captured/forced
  const double workspace = M * k * (2.0 * H + N) * 4.0 + M * H * 8.0 + M * k * 16.0;
  return weights + rest + inputs + outputs + workspace;
}

StatusOr<DType> compute_dtype(const std::string& flag) {
  if (flag.empty()) return DType::kBF16;  // unused: the weights' dtype is the default
  const std::optional<DType> d = parse_dtype(flag);
  if (!d || (*d != DType::kF32 && *d != DType::kBF16)) {
    return InvalidArgument("--dtype must be f32 or bf16, got '" + flag + "'");
  }
  return *d;
}

// The layer to run and its inputs, from a checkpoint file (--weights) or a
// model folder (--model). Holds the tensors `weights` points into.
struct PreparedLayer {
  MoeConfig cfg;
  MoeWeights weights;
  HostTensor hidden, logits;
  CheckpointLayer ckpt;    // from --weights or --model
  std::string found;       // what was loaded, for the report
};

// Hidden states, then the logits: given, or from the checkpoint's router.
Status load_inputs(const LayerOptions& o, PreparedLayer& p, const std::function<StatusOr<HostTensor>()>& router,
                   const std::string& no_router) {
  MOEKIT_ASSIGN_OR_RETURN(p.hidden, load_matrix(o.hidden_path, "hidden", -1, p.cfg.hidden, p.cfg.quant.act_dtype));
  const int64_t M = p.hidden.shape()[0], E = p.cfg.num_experts;
  if (o.logits_given) {
    // The header first: a file of another shape is refused before its data is read.
    MOEKIT_ASSIGN_OR_RETURN(const io::NpyInfo info, io::read_npy_info(o.logits_path));
    MOEKIT_RETURN_IF_ERROR(expect_shape(o.logits_path, "router logits", info, {M, E}));
    const DType ldt = info.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
    MOEKIT_ASSIGN_OR_RETURN(p.logits, load_matrix(o.logits_path, "router logits", M, E, ldt));
  } else if (router) {
    MOEKIT_ASSIGN_OR_RETURN(p.logits, router());
  } else {
    return InvalidArgument("--logits is required: " + no_router);
  }
  return Status::Ok();
}

Status prepare_from_file(const LayerOptions& o, DType flag_dtype, PreparedLayer& p) {
  if (o.routing.top_k == 0) return InvalidArgument("--top-k is required (with --weights)");
  if (o.keep_packed_weights) {
    return InvalidArgument("--keep-packed-weights goes with --model (a layer file's weights load as stored)");
  }
  MOEKIT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::SafetensorsFile::open(o.weights_path));
  const std::optional<int> layer_index = o.layer >= 0 ? std::optional<int>(o.layer) : std::nullopt;
  MOEKIT_ASSIGN_OR_RETURN(const io::NpyInfo hidden_info, io::read_npy_info(o.hidden_path));
  const int64_t tokens = hidden_info.shape.empty() ? 0 : hidden_info.shape[0];
  const auto fits = [&](const CheckpointLayerSize& s) {
    const DType act = o.dtype.empty() ? default_act_dtype(s.dtype) : flag_dtype;
    return check_memory("layer", layer_memory_bytes(s, tokens, o.routing.top_k, act));
  };
  MOEKIT_ASSIGN_OR_RETURN(p.ckpt, load_layer_file(std::move(file), layer_index, fits));
  CheckpointLayer& ckpt = p.ckpt;
  const int64_t E = ckpt.config.num_experts, N = ckpt.w13.shape()[1], I = ckpt.config.intermediate;

  // The file gives sizes, quantization and the shared expert; the flags give the rest.
  MoeConfig& cfg = ckpt.config;
  if (!o.dtype.empty()) cfg.quant.act_dtype = flag_dtype;
  auto act = parse_activation(o.activation);
  if (!act) {
    return InvalidArgument("--activation: unknown activation '" + o.activation + "' (" +
                           name_list(kAllActivations, activation_name) + ")");
  }
  cfg.activation.kind = *act;
  if (N != (cfg.activation.gated() ? 2 * I : I)) {
    return InvalidArgument(o.weights_path + ": w13 has " + std::to_string(N) + " rows per expert; activation " +
                           o.activation + " with I = " + std::to_string(I) + " needs " +
                           std::to_string(cfg.activation.gated() ? 2 * I : I));
  }
  const bool use_bias = !ckpt.score_bias.shape().empty() && !o.no_bias && o.routing.method == "deepseek_v3";
  MOEKIT_ASSIGN_OR_RETURN(cfg.routing, routing_config_from(o.routing, E, use_bias));
  if (!use_bias) ckpt.score_bias = HostTensor();
  p.cfg = cfg;
  std::function<StatusOr<HostTensor>()> router;
  if (!ckpt.router_weight.shape().empty()) {
    router = [&p]() { return checkpoint_router_logits(p.ckpt, p.hidden.view()); };
  }
  MOEKIT_RETURN_IF_ERROR(load_inputs(o, p, router, o.weights_path + " has no router (" + ckpt.prefix + "gate.weight)"));
  p.weights = ckpt.weights();
  p.found = "weights:  " + o.weights_path + "\n" + ckpt.summary() + "\n";
  return Status::Ok();
}

Status prepare_from_model(const LayerOptions& o, DType flag_dtype, PreparedLayer& p) {
  for (const CLI::Option* opt : o.layer_description) {
    if (opt->count() > 0) {
      return InvalidArgument(opt->get_name() + ": with --model the layer is described by " + o.model_dir +
                             "/config.json (docs/layer_files.md)");
    }
  }
  if (o.layer < 0) return InvalidArgument("--layer N is required with --model");
  MOEKIT_ASSIGN_OR_RETURN(const io::NpyInfo hidden_info, io::read_npy_info(o.hidden_path));
  const int64_t tokens = hidden_info.shape.empty() ? 0 : hidden_info.shape[0];
  // Checked from config.json and the shards' headers, before any tensor is read.
  const auto fits = [&](const CheckpointLayerSize& s) {
    const DType act = o.dtype.empty() ? default_act_dtype(s.dtype) : flag_dtype;
    return check_memory("layer", layer_memory_bytes(s, tokens, s.config.top_k(), act));
  };
  CheckpointLoadOptions load;
  load.keep_packed_weights = o.keep_packed_weights;
  load.check_size = fits;
  MOEKIT_ASSIGN_OR_RETURN(p.ckpt, load_checkpoint_layer(o.model_dir, o.layer, load));
  const CheckpointLayer& ckpt = p.ckpt;
  p.cfg = ckpt.config;
  if (!o.dtype.empty()) p.cfg.quant.act_dtype = flag_dtype;
  std::function<StatusOr<HostTensor>()> router;
  if (!ckpt.router_weight.shape().empty()) {
    router = [&p]() { return checkpoint_router_logits(p.ckpt, p.hidden.view()); };
  }
  MOEKIT_RETURN_IF_ERROR(load_inputs(o, p, router, o.model_dir + " has no router weight under '" + ckpt.prefix + "'"));
  p.weights = ckpt.weights();
  p.found = ckpt.summary() + "\n";
  return Status::Ok();
}

Status run_layer(const LayerOptions& o) {
  std::vector<PathFlag> outputs = {{"--out", o.out_path}};
  std::vector<PathFlag> inputs = {{"--hidden", o.hidden_path}};
  if (o.model_given == !o.weights_path.empty()) {
    return InvalidArgument("give the layer's weights with exactly one of --weights FILE or --model DIR");
  }
  if (!o.model_given) inputs.push_back({"--weights", o.weights_path});
  if (o.model_given) {
    if (o.model_dir.empty()) return InvalidArgument("--model: the option is empty; give the model folder");
    const std::vector<PathFlag> model = model_folder_inputs(o.model_dir);
    inputs.insert(inputs.end(), model.begin(), model.end());
  }
  if (o.capture_given) outputs.push_back({"--capture", o.capture_path});
  if (o.logits_given) inputs.push_back({"--logits", o.logits_path});
  if (o.replay_given) inputs.push_back({"--replay", o.replay_path});
  MOEKIT_RETURN_IF_ERROR(check_output_paths(outputs, inputs));
  MOEKIT_ASSIGN_OR_RETURN(const DType flag_dtype, compute_dtype(o.dtype));
  auto prepared = std::make_unique<PreparedLayer>();  // the tensors stay put while views point at them
  PreparedLayer& p = *prepared;
  if (o.model_given) {
    MOEKIT_RETURN_IF_ERROR(prepare_from_model(o, flag_dtype, p));
  } else {
    MOEKIT_RETURN_IF_ERROR(prepare_from_file(o, flag_dtype, p));
  }
  MoeConfig& cfg = p.cfg;
  const HostTensor& hidden = p.hidden;
  const HostTensor& logits = p.logits;
  const int64_t M = hidden.shape()[0], H = cfg.hidden;
  cfg.backend = o.backend;
  cfg.needs_capture = o.capture_given;
  cfg.needs_replay = o.replay_given;
  // Checked here for every backend: on a device, routing marks a non-finite row
  // with the sentinel instead (docs/routing.md section 7), and the host has the data now.
  MOEKIT_RETURN_IF_ERROR(check_logits_finite(logits.view()));
  cfg.logits_dtype = logits.dtype();
  cfg.max_num_tokens = M;
  HostTensor forced;
  if (o.replay_given) {
    MOEKIT_ASSIGN_OR_RETURN(const io::NpyInfo info, io::read_npy_info(o.replay_path));
    MOEKIT_RETURN_IF_ERROR(expect_shape(o.replay_path, "forced ids", info, {M, cfg.top_k()}));
    MOEKIT_ASSIGN_OR_RETURN(HostTensor ids, io::read_npy(o.replay_path));
    if (ids.dtype() != DType::kI32 && ids.dtype() != DType::kI16 && ids.dtype() != DType::kU8) {
      return InvalidArgument(o.replay_path + ": forced ids must be i32, i16 or u8, got " + dtype_name(ids.dtype()));
    }
    MOEKIT_ASSIGN_OR_RETURN(forced, io::convert(ids.view(), DType::kI32));
  }

  MOEKIT_ASSIGN_OR_RETURN(std::unique_ptr<MoeLayer> layer, MoeLayer::create(cfg, p.weights));
  std::printf("%s", p.found.c_str());
  std::printf("routing:  %s%s\n", cfg.routing.to_string().c_str(),
              o.logits_given ? "" : " (logits from the checkpoint's router)");
  std::printf("backend:  %s / %s on %s\n", layer->backend().c_str(), layer->kernel().name(),
              layer->device().to_string().c_str());
  const Device dev = layer->device();

  Model model;
  MOEKIT_RETURN_IF_ERROR(model.add_layer(std::move(layer), std::max(o.layer, 0)));
  MOEKIT_ASSIGN_OR_RETURN(auto capturer,
                          RoutedExpertsCapturer::create(1, M, cfg.top_k(), dev, /*enabled=*/cfg.needs_capture));
  MOEKIT_RETURN_IF_ERROR(bind(model, *capturer));
  MOEKIT_RETURN_IF_ERROR(capturer->add_request("layer"));
  const StepLayout step{{{"layer", M}}};

  MOEKIT_ASSIGN_OR_RETURN(OnDevice d_hidden, on_device(hidden, dev));
  MOEKIT_ASSIGN_OR_RETURN(OnDevice d_logits, on_device(logits, dev));
  HostTensor out(cfg.quant.act_dtype, {M, H});
  MOEKIT_ASSIGN_OR_RETURN(OnDevice d_out, on_device(out, dev));
  LayerForwardArgs args;
  args.hidden = d_hidden.view;
  args.router_logits = d_logits.view;
  args.out = d_out.view;
  if (o.replay_given) args.forced_ids = forced.view();

  const auto t0 = std::chrono::steady_clock::now();
  MOEKIT_RETURN_IF_ERROR(capturer->begin_step(step));
  MOEKIT_RETURN_IF_ERROR(model.layer(0).forward(args));
  MOEKIT_RETURN_IF_ERROR(capturer->end_step());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (dev.type != DeviceType::kCpu) {
    MOEKIT_RETURN_IF_ERROR(DeviceBuffer::copy_bytes(out.data<unsigned char>(), Device::cpu(), d_out.view.data, dev,
                                                    out.nbytes()));
  }
  std::printf("run:      M=%lld tokens in %.3f ms%s\n", static_cast<long long>(M), ms,
              o.replay_given ? " (forced ids)" : "");

  std::vector<std::pair<std::string, std::vector<uint8_t>>> files;
  MOEKIT_ASSIGN_OR_RETURN(auto out_bytes, io::encode_npy(out.view()));
  files.emplace_back(o.out_path, std::move(out_bytes));
  if (o.capture_given) {
    MOEKIT_ASSIGN_OR_RETURN(HostTensor ids, capturer->routed_experts("layer"));  // [M, 1, k] i16
    HostTensor ids2(DType::kI32, {M, cfg.top_k()});
    for (int64_t i = 0; i < ids.numel(); ++i) ids2.data<int32_t>()[i] = ids.data<int16_t>()[i];
    MOEKIT_ASSIGN_OR_RETURN(auto id_bytes, io::encode_npy(ids2.view()));
    files.emplace_back(o.capture_path, std::move(id_bytes));
  }
  MOEKIT_RETURN_IF_ERROR(io::write_files_atomic(files));
  std::printf("wrote:    %s [%lld, %lld] %s%s\n", o.out_path.c_str(), static_cast<long long>(M),
              static_cast<long long>(H), dtype_name(cfg.quant.act_dtype),
              cfg.quant.act_dtype == DType::kBF16 ? " (stored as f32, exact)" : "");
  if (o.capture_given) {
    std::printf("wrote:    %s [%lld, %d] i32 routed expert ids (logical, spec order)\n", o.capture_path.c_str(),
                static_cast<long long>(M), cfg.top_k());
  }
  return Status::Ok();
}

}  // namespace

void add_layer_command(CLI::App& app) {
  auto o = std::make_shared<LayerOptions>();
  CLI::App* cmd = app.add_subcommand("layer", "Run one MoE layer on dumped tensors with checkpoint weights");
  cmd->add_option("--weights", o->weights_path, "safetensors file with the layer's experts (docs/layer_files.md)");
  cmd->add_option("--model", o->model_dir,
                  "model folder (config.json + safetensors shards): the layer and its routing as the config says");
  cmd->add_option("--layer", o->layer,
                  "model layer N (tensors under 'layers.N.'); needed with --model or when the file has several")
      ->check(integer_in(0, std::numeric_limits<int>::max()));
  cmd->add_option("--hidden", o->hidden_path, "hidden states .npy [M, H] (f32 or bf16)")->required();
  cmd->add_option("--logits", o->logits_path,
                  "router logits .npy [M, E] (f32 or bf16); default: hidden . gate.weight^T from the checkpoint");
  cmd->add_option("--out", o->out_path, "output .npy [M, H]")->required();
  cmd->add_option("--capture", o->capture_path, "write the routed expert ids .npy [M, k] i32");
  cmd->add_option("--replay", o->replay_path, "force these expert ids .npy [M, k] (i32, i16 or u8)");
  cmd->add_option("--backend", o->backend, "auto, or a backend name (never falls back)")->capture_default_str();
  o->layer_description.push_back(
      cmd->add_option("--activation", o->activation, name_list(kAllActivations, activation_name, "|"))->capture_default_str());
  cmd->add_option("--dtype", o->dtype, "compute dtype of hidden/out: f32|bf16 (default: the weights', bf16 for "
                                      "fp8 or 4-bit weights)");
  cmd->add_flag("--keep-packed-weights", o->keep_packed_weights,
                "with --model: gpt-oss's MXFP4 experts as stored (quant mxfp4) instead of dequantized to bf16 "
                "(docs/weights_4bit.md)");
  o->layer_description.push_back(
      cmd->add_flag("--no-bias", o->no_bias, "deepseek_v3: ignore the checkpoint's e_score_correction_bias"));
  add_routing_flags(cmd, &o->routing, /*top_k_required=*/false);
  for (const char* name : {"--method", "--top-k"}) o->layer_description.push_back(cmd->get_option(name));
  for (const CLI::Option* opt : o->routing.deepseek_only) o->layer_description.push_back(opt);
  cmd->callback([o, cmd] {
    o->logits_given = cmd->count("--logits") > 0;
    o->capture_given = cmd->count("--capture") > 0;
    o->replay_given = cmd->count("--replay") > 0;
    o->model_given = cmd->count("--model") > 0;
    const Status st = run_layer(*o);
    finish(st.ok() ? kExitOk : report_error("layer", st));
  });
}

}  // namespace moekit::tools

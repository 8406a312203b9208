// `moekit layer`: run one MoE layer on dumped tensors (hidden states, router
// logits) with weights from a safetensors checkpoint, the way an engine
// developer checks a kernel against their framework. Optionally writes the
// routed expert ids (capture) or forces them (replay).
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "moekit/device_buffer.h"
#include "layer_weights.h"
#include "moekit/capture.h"
#include "moekit/io.h"
#include "moekit/layer.h"

namespace moekit::tools {
namespace {

struct LayerOptions {
  RoutingFlags routing;
  std::string weights_path, hidden_path, logits_path, out_path, capture_path, replay_path;
  int layer = -1;  // -1: the file's only MoE layer
  std::string activation = "silu";
  std::string dtype;  // compute (activation) dtype; default: the weights' dtype
  std::string backend = "auto";
  bool no_bias = false;
};

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

// logits [M, E] f32 = hidden [M, H] . router [E, H]^T, fp32 accumulation in index order.
HostTensor compute_logits(const HostTensor& hidden, const HostTensor& router) {
  const int64_t M = hidden.shape()[0], H = hidden.shape()[1], E = router.shape()[0];
  HostTensor x = io::convert(hidden.view(), DType::kF32).value();
  HostTensor logits(DType::kF32, {M, E});
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      float acc = 0.0f;
      for (int64_t h = 0; h < H; ++h) acc += x.data<float>()[t * H + h] * router.data<float>()[e * H + h];
      logits.data<float>()[t * E + e] = acc;
    }
  }
  return logits;
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

Status run_layer(const LayerOptions& o) {
  MOEKIT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::SafetensorsFile::open(o.weights_path));
  const std::optional<int> layer_index = o.layer >= 0 ? std::optional<int>(o.layer) : std::nullopt;
  MOEKIT_ASSIGN_OR_RETURN(LayerCheckpoint ckpt, load_layer_checkpoint(file, layer_index));
  const int64_t E = ckpt.w13.shape()[0], N = ckpt.w13.shape()[1], H = ckpt.w13.shape()[2];
  const int64_t I = ckpt.w2.shape()[2];

  MoeConfig cfg;
  cfg.num_experts = E;
  cfg.hidden = H;
  cfg.intermediate = I;
  cfg.quant.weight_dtype = ckpt.w13.dtype();
  if (o.dtype.empty()) {
    cfg.quant.act_dtype = ckpt.w13.dtype();
  } else {
    auto d = parse_dtype(o.dtype);
    if (!d) return InvalidArgument("--dtype: unknown dtype '" + o.dtype + "'");
    cfg.quant.act_dtype = *d;
  }
  auto act = parse_activation(o.activation);
  if (!act) return InvalidArgument("--activation: unknown activation '" + o.activation + "'");
  cfg.activation.kind = *act;
  if (N != (cfg.activation.gated() ? 2 * I : I)) {
    return InvalidArgument(o.weights_path + ": w13 has " + std::to_string(N) + " rows per expert; activation " +
                           o.activation + " with I = " + std::to_string(I) + " needs " +
                           std::to_string(cfg.activation.gated() ? 2 * I : I));
  }
  const bool use_bias = ckpt.has_bias() && !o.no_bias && o.routing.method == "deepseek_v3";
  MOEKIT_ASSIGN_OR_RETURN(cfg.routing, routing_config_from(o.routing, E, use_bias));
  cfg.backend = o.backend;
  cfg.needs_capture = !o.capture_path.empty();
  cfg.needs_replay = !o.replay_path.empty();

  MOEKIT_ASSIGN_OR_RETURN(HostTensor hidden, load_matrix(o.hidden_path, "hidden", -1, H, cfg.quant.act_dtype));
  const int64_t M = hidden.shape()[0];
  HostTensor logits;
  if (!o.logits_path.empty()) {
    MOEKIT_ASSIGN_OR_RETURN(HostTensor l, io::read_npy(o.logits_path));
    const DType ldt = l.dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32;
    MOEKIT_ASSIGN_OR_RETURN(logits, load_matrix(o.logits_path, "router logits", M, E, ldt));
  } else if (ckpt.has_router()) {
    logits = compute_logits(hidden, ckpt.router);
  } else {
    return InvalidArgument("--logits is required: " + o.weights_path + " has no router (" + ckpt.prefix +
                           "gate.weight)");
  }
  cfg.logits_dtype = logits.dtype();
  cfg.max_num_tokens = M;
  HostTensor forced;
  if (!o.replay_path.empty()) {
    MOEKIT_ASSIGN_OR_RETURN(HostTensor ids, io::read_npy(o.replay_path));
    if (ids.dtype() != DType::kI32 && ids.dtype() != DType::kI16 && ids.dtype() != DType::kU8) {
      return InvalidArgument(o.replay_path + ": forced ids must be i32, i16 or u8, got " + dtype_name(ids.dtype()));
    }
    MOEKIT_ASSIGN_OR_RETURN(forced, io::convert(ids.view(), DType::kI32));
  }

  MoeWeights weights{ckpt.w13.view(), ckpt.w2.view(), use_bias ? ckpt.score_bias.view() : TensorView{}};
  MOEKIT_ASSIGN_OR_RETURN(std::unique_ptr<MoeLayer> layer, MoeLayer::create(cfg, weights));
  std::printf("weights:  %s (%s naming%s), E=%lld, H=%lld, I=%lld, %s\n", o.weights_path.c_str(),
              ckpt.naming.c_str(), ckpt.prefix.empty() ? "" : (", prefix '" + ckpt.prefix + "'").c_str(),
              static_cast<long long>(E), static_cast<long long>(H), static_cast<long long>(I),
              dtype_name(cfg.quant.weight_dtype));
  std::printf("routing:  %s%s\n", cfg.routing.to_string().c_str(),
              o.logits_path.empty() ? " (logits from the checkpoint's router)" : "");
  std::printf("backend:  %s / %s on %s\n", layer->backend().c_str(), layer->kernel().name(),
              layer->device().to_string().c_str());
  const Device dev = layer->device();

  Model model;
  MOEKIT_RETURN_IF_ERROR(model.add_layer(std::move(layer), layer_index.value_or(0)));
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
  if (!o.replay_path.empty()) args.forced_ids = forced.view();

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
              o.replay_path.empty() ? "" : " (forced ids)");

  std::vector<std::pair<std::string, std::vector<uint8_t>>> files;
  MOEKIT_ASSIGN_OR_RETURN(auto out_bytes, io::encode_npy(out.view()));
  files.emplace_back(o.out_path, std::move(out_bytes));
  if (!o.capture_path.empty()) {
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
  if (!o.capture_path.empty()) {
    std::printf("wrote:    %s [%lld, %d] i32 routed expert ids (logical, spec order)\n", o.capture_path.c_str(),
                static_cast<long long>(M), cfg.top_k());
  }
  return Status::Ok();
}

}  // namespace

void add_layer_command(CLI::App& app) {
  auto o = std::make_shared<LayerOptions>();
  CLI::App* cmd = app.add_subcommand("layer", "Run one MoE layer on dumped tensors with checkpoint weights");
  cmd->add_option("--weights", o->weights_path, "safetensors file with the layer's experts (docs/layer_files.md)")
      ->required();
  cmd->add_option("--layer", o->layer, "model layer N (tensors under 'layers.N.'); needed when the file has several");
  cmd->add_option("--hidden", o->hidden_path, "hidden states .npy [M, H] (f32 or bf16)")->required();
  cmd->add_option("--logits", o->logits_path,
                  "router logits .npy [M, E] (f32 or bf16); default: hidden . gate.weight^T from the checkpoint");
  cmd->add_option("--out", o->out_path, "output .npy [M, H]")->required();
  cmd->add_option("--capture", o->capture_path, "write the routed expert ids .npy [M, k] i32");
  cmd->add_option("--replay", o->replay_path, "force these expert ids .npy [M, k] (i32, i16 or u8)");
  cmd->add_option("--backend", o->backend, "auto, or a backend name (never falls back)")->capture_default_str();
  cmd->add_option("--activation", o->activation, "silu|gelu|swiglu_oai|relu2")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "compute dtype of hidden/out: f32|bf16 (default: the weights')");
  cmd->add_flag("--no-bias", o->no_bias, "deepseek_v3: ignore the checkpoint's e_score_correction_bias");
  add_routing_flags(cmd, &o->routing, /*top_k_required=*/true);
  cmd->callback([o] {
    const Status st = run_layer(*o);
    finish(st.ok() ? kExitOk : report_error("layer", st));
  });
}

}  // namespace moekit::tools

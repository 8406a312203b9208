// `moekit quantize`: a BF16/F32 layer file converted to an fp8 scheme
// (docs/fp8.md) or a 4-bit one (docs/weights_4bit.md), for users without such
// a checkpoint and for tests. fp8: expert weights are replaced by F8_E4M3
// tensors with their scales, in the naming the file uses. 4-bit: each MoE
// block's experts become moekit's stacked naming, <prefix>w13 / <prefix>w2 U8
// (two values a byte) with <prefix>w13_scale / <prefix>w2_scale. Every other
// tensor (router, bias, ...) is copied unchanged, and the file's metadata
// "moekit.quant" names the scheme. The output is written atomically: on any
// error nothing appears.
#include <cstdio>
#include <cstring>
#include <list>
#include <optional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "moekit/checkpoint.h"
#include "moekit/io.h"
#include "output_paths.h"

namespace moekit::tools {
namespace {

struct QuantizeOptions {
  std::string weights_path, out_path, scheme;
};

// The scheme is named as MoeConfig's quant method (one spelling everywhere).
StatusOr<QuantMethod> scheme_from_flag(const std::string& flag) {
  const std::optional<QuantMethod> m = parse_quant_method(flag);
  if (m && *m != QuantMethod::kNone) return *m;
  const char* hint = flag == "fp8-block" ? " (spelled fp8_block128, as MoeConfig's quant)"
                     : flag == "fp8-tensor" ? " (spelled fp8_per_tensor, as MoeConfig's quant)"
                     : flag == "int4" ? " (int4_g32 or int4_g128: the group is part of the name)"
                     : flag == "int4-g32" || flag == "int4-g128" ? " (spelled with '_', as MoeConfig's quant)" : "";
  return InvalidArgument("--scheme must be fp8_block128 or fp8_per_tensor, got '" + flag + "'" + hint +
                         "; or 4-bit: mxfp4, int4_g32 or int4_g128");
}

int64_t blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

// What the output holds: owned tensors in the input's order.
struct Output {
  std::vector<std::pair<std::string, HostTensor>> owned;
  std::vector<io::NamedTensor> named;  // views into `owned` or into the input file
};

// A stacked [E, N, K] tensor quantized expert by expert and part by part
// (rows [p*N/P, (p+1)*N/P)); scales in the MoeWeights layout (kernel.h).
Status quantize_stacked(const TensorView& w, const std::string& name, int64_t parts, QuantMethod method, Output* out) {
  const int64_t E = w.dim(0), N = w.dim(1), K = w.dim(2), rows = N / parts;
  const size_t el = dtype_size(w.dtype);
  HostTensor q(DType::kF8E4M3, {E, N, K});
  const bool block = method == QuantMethod::kFp8Block128;
  const bool is_w2 = parts == 1 && name.ends_with("w2");
  HostTensor scale = block ? HostTensor(DType::kF32, {E, parts * blocks(rows), blocks(K)})
                           : (is_w2 ? HostTensor(DType::kF32, {E}) : HostTensor(DType::kF32, {E, parts}));
  const int64_t per_part = block ? blocks(rows) * blocks(K) : 1;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t row0 = e * N + p * rows;
      const TensorView part = TensorView::contiguous(
          const_cast<unsigned char*>(w.ptr<const unsigned char>()) + static_cast<size_t>(row0 * K) * el, w.dtype,
          {rows, K});
      MOEKIT_ASSIGN_OR_RETURN(io::Fp8Matrix m, io::quantize_fp8(part, method,
                                                                name + "[" + std::to_string(e) + "] part " + std::to_string(p)));
      std::memcpy(q.data<uint8_t>() + row0 * K, m.weight.data<uint8_t>(), m.weight.nbytes());
      std::memcpy(scale.data<float>() + (e * parts + p) * per_part, m.scale.data<float>(), m.scale.nbytes());
    }
  }
  out->owned.emplace_back(name, std::move(q));
  out->owned.emplace_back(name + "_scale", std::move(scale));
  return Status::Ok();
}

// A tensor copied unchanged, whatever its dtype (I64 and the other dtypes
// moekit does not compute with included): its bytes under its own dtype and shape.
StatusOr<io::NamedTensor> copied_tensor(const io::SafetensorsFile& file, const io::SafetensorsEntry& e,
                                        std::list<std::vector<uint8_t>>& copied) {
  MOEKIT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, file.copy_bytes(e.name));
  copied.push_back(std::move(bytes));
  io::NamedTensor nt;
  nt.name = e.name;
  nt.tensor = TensorView::contiguous(copied.back().data(), DType::kU8, {static_cast<int64_t>(copied.back().size())});
  nt.stored_dtype = e.dtype_name;
  nt.stored_shape = e.shape;
  return nt;
}

// The MoE block prefix an expert weight's name belongs to: per-expert
// (<prefix>experts.<e>.<proj>.weight) or stacked (<prefix>w13, <prefix>w2 with its pair).
StatusOr<std::optional<std::string>> expert_block_of(const io::SafetensorsFile& file, const std::string& name) {
  MOEKIT_ASSIGN_OR_RETURN(const std::optional<ExpertTensorName> expert, parse_expert_tensor_name(name));
  if (expert) return std::optional<std::string>(expert->prefix);
  if (const std::optional<std::string> p = stacked_w13_prefix(name); p && file.contains(*p + "w2")) return p;
  if (name.ends_with("w2") && file.contains(name.substr(0, name.size() - 2) + "w13")) {
    return std::optional<std::string>(name.substr(0, name.size() - 2));
  }
  return std::optional<std::string>();
}

// One MoE block read as `moekit layer --weights` reads it (so what the layer
// refuses is refused here), from the file's tensors under `prefix`.
StatusOr<CheckpointLayer> read_block(const io::SafetensorsFile& file, const std::string& prefix) {
  std::vector<io::NamedTensor> views;
  for (const io::SafetensorsEntry& e : file.entries()) {
    if (!e.name.starts_with(prefix)) continue;
    MOEKIT_ASSIGN_OR_RETURN(const uint8_t* bytes, file.bytes(e.name));
    io::NamedTensor nt;
    nt.name = e.name;
    nt.tensor = TensorView::contiguous(const_cast<uint8_t*>(bytes), DType::kU8, {static_cast<int64_t>(e.nbytes)});
    nt.stored_dtype = e.dtype_name;
    nt.stored_shape = e.shape;
    views.push_back(std::move(nt));
  }
  MOEKIT_ASSIGN_OR_RETURN(io::SafetensorsFile block, io::SafetensorsFile::of_views(views, file.path()));
  return load_layer_file(std::move(block), std::nullopt);
}

// A 4-bit scheme: each MoE block's experts in the stacked naming, quantized
// row by row (core/weight4.h); per-expert gate and up rows stack gate first.
Status run_quantize_weight4(const QuantizeOptions& o, QuantMethod method, const io::SafetensorsFile& file) {
  const int64_t g = weight4_group(method);
  std::map<std::string, std::vector<std::string>> blocks;  // prefix -> its expert weights' names
  for (const io::SafetensorsEntry& e : file.entries()) {
    for (const char* s : {".weight_scale_inv", ".weight_scale", ".input_scale", ".weight_packed"}) {
      if (e.name.ends_with(s)) return InvalidArgument(e.name + ": the input already holds quantized weights or scales");
    }
    MOEKIT_ASSIGN_OR_RETURN(const std::optional<std::string> prefix, expert_block_of(file, e.name));
    if (prefix) blocks[*prefix].push_back(e.name);
  }
  if (blocks.empty()) {
    return InvalidArgument(o.weights_path + ": no expert weights to quantize (docs/layer_files.md namings)");
  }
  std::map<std::string, io::Weight4Tensor> quantized;  // "<prefix>w13" / "<prefix>w2" -> packed and scales
  for (const auto& [prefix, names] : blocks) {
    MOEKIT_ASSIGN_OR_RETURN(const CheckpointLayer block, read_block(file, prefix));
    const MoeConfig& c = block.config;
    if (c.quant.method != QuantMethod::kNone) {
      return InvalidArgument(names.front() + ": already " + quant_method_name(c.quant.method) +
                             "; quantize takes a BF16 or F32 layer file");
    }
    if (c.shared_intermediate > 0) {
      return InvalidArgument(block.shared_prefix + "*: a shared expert; moekit does not run one beside " +
                             quant_method_name(method) + " experts yet, so the file would not load");
    }
    if (c.hidden % g != 0 || c.intermediate % g != 0) {
      return InvalidArgument(names.front() + ": H = " + std::to_string(c.hidden) + ", I = " +
                             std::to_string(c.intermediate) + "; " + quant_method_name(method) +
                             " needs both to be multiples of its group of " + std::to_string(g) + " input columns");
    }
    for (const auto& [suffix, w] : {std::pair<const char*, const HostTensor*>{"w13", &block.w13}, {"w2", &block.w2}}) {
      MOEKIT_ASSIGN_OR_RETURN(io::Weight4Tensor q, io::quantize_weight4_tensor(w->view(), method, prefix + suffix));
      quantized.emplace(prefix + suffix, std::move(q));
    }
  }
  std::set<std::string> dropped, written;
  for (const auto& [prefix, names] : blocks) dropped.insert(names.begin(), names.end());
  std::list<std::vector<uint8_t>> copied;
  std::vector<io::NamedTensor> named;  // input order; a block's four tensors where its first expert weight was
  for (const io::SafetensorsEntry& e : file.entries()) {
    if (dropped.count(e.name) == 0) {
      MOEKIT_ASSIGN_OR_RETURN(io::NamedTensor nt, copied_tensor(file, e, copied));
      named.push_back(std::move(nt));
      continue;
    }
    MOEKIT_ASSIGN_OR_RETURN(const std::optional<std::string> prefix, expert_block_of(file, e.name));
    if (!written.insert(*prefix).second) continue;
    for (const char* suffix : {"w13", "w2"}) {
      const io::Weight4Tensor& q = quantized.at(*prefix + suffix);
      for (const auto& [name, t] : {std::pair{*prefix + suffix, &q.packed}, {*prefix + suffix + "_scale", &q.scale}}) {
        io::NamedTensor nt;
        nt.name = name;
        nt.tensor = t->view();
        named.push_back(std::move(nt));
      }
    }
  }
  MOEKIT_RETURN_IF_ERROR(io::write_safetensors(o.out_path, named, {{"moekit.quant", quant_method_name(method)}}));
  std::printf("wrote:    %s (%zu MoE block%s quantized to %s: stacked w13/w2 u8 with scales, %zu tensors in all)\n",
              o.out_path.c_str(), blocks.size(), blocks.size() > 1 ? "s" : "", quant_method_name(method), named.size());
  return Status::Ok();
}

Status run_quantize(const QuantizeOptions& o) {
  MOEKIT_ASSIGN_OR_RETURN(const QuantMethod method, scheme_from_flag(o.scheme));
  MOEKIT_RETURN_IF_ERROR(check_output_paths({{"--out", o.out_path}}, {{"--weights", o.weights_path}}));
  MOEKIT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::SafetensorsFile::open(o.weights_path));
  const char* scale_suffix = method == QuantMethod::kFp8Block128 ? "_scale_inv" : "_scale";
  Output out;
  int64_t quantized = 0;
  std::vector<std::string> order;  // output names, input order
  for (const io::SafetensorsEntry& e : file.entries()) {
    if (e.dtype == DType::kF8E4M3) {
      return InvalidArgument(e.name + ": already F8_E4M3; quantize takes a BF16 or F32 layer file");
    }
  }
  if (quant_family(method) == QuantFamily::kWeight4) return run_quantize_weight4(o, method, file);
  // Checks the stacked pair <prefix>w13 [E, N, H] / <prefix>w2 [E, H, I] once,
  // before either is read: ranks, no zero size, one E and one H, N = I or 2I.
  const auto check_stacked = [&](const std::string& prefix) -> Status {
    const io::SafetensorsEntry* w13 = file.find(prefix + "w13");
    const io::SafetensorsEntry* w2 = file.find(prefix + "w2");
    for (const io::SafetensorsEntry* t : {w13, w2}) {
      if (t->dtype != DType::kBF16 && t->dtype != DType::kF32) {
        return InvalidArgument(t->name + ": dtype " + t->dtype_name + "; quantize takes BF16 or F32 expert weights");
      }
      if (t->shape.size() != 3) {
        return InvalidArgument(t->name + ": expected " + (t == w13 ? "[E, N, H]" : "[E, H, I]") + ", got rank " +
                               std::to_string(t->shape.size()));
      }
      for (int64_t d : t->shape) {
        if (d == 0) return InvalidArgument(t->name + ": a size of 0 in its shape; the layer has no weights to quantize");
      }
    }
    const auto dims = [](const io::SafetensorsEntry* t) {
      return "[" + std::to_string(t->shape[0]) + ", " + std::to_string(t->shape[1]) + ", " +
             std::to_string(t->shape[2]) + "]";
    };
    if (w13->shape[0] != w2->shape[0] || w13->shape[2] != w2->shape[1]) {
      return InvalidArgument(prefix + "w13 " + dims(w13) + " and " + prefix + "w2 " + dims(w2) +
                             " disagree on E or H (expected [E, N, H] and [E, H, I])");
    }
    const int64_t I = w2->shape[2], N = w13->shape[1];
    if (N != I && N != 2 * I) {
      return InvalidArgument(w13->name + ": " + std::to_string(N) + " rows per expert; w2 has I = " +
                             std::to_string(I) + " (expected I or 2I)");
    }
    return Status::Ok();
  };
  std::list<std::vector<uint8_t>> copied;  // bytes of the tensors copied unchanged (stable addresses)
  std::vector<io::NamedTensor> passthrough;
  for (const io::SafetensorsEntry& e : file.entries()) {
    for (const char* s : {".weight_scale_inv", ".weight_scale", ".input_scale"}) {
      if (e.name.ends_with(s)) return InvalidArgument(e.name + ": the input already holds fp8 scales");
    }
    MOEKIT_ASSIGN_OR_RETURN(const std::optional<ExpertTensorName> expert, parse_expert_tensor_name(e.name));
    const std::optional<std::string> w13_prefix = stacked_w13_prefix(e.name);
    const bool stacked_w13 = w13_prefix && file.contains(*w13_prefix + "w2");
    const std::string w2_prefix = e.name.ends_with("w2") ? e.name.substr(0, e.name.size() - 2) : std::string();
    const bool stacked_w2 = e.name.ends_with("w2") && file.contains(w2_prefix + "w13");
    const size_t before = out.owned.size();
    if (expert) {
      if (e.dtype != DType::kBF16 && e.dtype != DType::kF32) {
        return InvalidArgument(e.name + ": dtype " + e.dtype_name + "; quantize takes BF16 or F32 expert weights");
      }
      if (e.shape.size() != 2) return InvalidArgument(e.name + ": expected a matrix, got rank " + std::to_string(e.shape.size()));
      if (e.shape[0] == 0 || e.shape[1] == 0) {
        return InvalidArgument(e.name + ": a size of 0 in its shape; the layer has no weights to quantize");
      }
      MOEKIT_ASSIGN_OR_RETURN(const HostTensor t, file.read(e.name));
      MOEKIT_ASSIGN_OR_RETURN(io::Fp8Matrix m, io::quantize_fp8(t.view(), method, e.name));
      out.owned.emplace_back(e.name, std::move(m.weight));
      out.owned.emplace_back(e.name + scale_suffix, std::move(m.scale));
    } else if (stacked_w13 || stacked_w2) {
      MOEKIT_RETURN_IF_ERROR(check_stacked(stacked_w13 ? *w13_prefix : w2_prefix));
      int64_t parts = 1;
      if (stacked_w13) parts = e.shape[1] / file.find(*w13_prefix + "w2")->shape[2];
      MOEKIT_ASSIGN_OR_RETURN(const HostTensor t, file.read(e.name));
      MOEKIT_RETURN_IF_ERROR(quantize_stacked(t.view(), e.name, parts, method, &out));
    } else {
      MOEKIT_ASSIGN_OR_RETURN(io::NamedTensor nt, copied_tensor(file, e, copied));
      order.push_back(e.name);
      passthrough.push_back(std::move(nt));
      continue;
    }
    ++quantized;
    for (size_t i = before; i < out.owned.size(); ++i) order.push_back(out.owned[i].first);
  }
  if (quantized == 0) {
    return InvalidArgument(o.weights_path + ": no expert weights to quantize (docs/layer_files.md namings)");
  }
  std::map<std::string, const HostTensor*> owned;
  for (const auto& [name, t] : out.owned) owned[name] = &t;
  std::map<std::string, const io::NamedTensor*> copies;
  for (const io::NamedTensor& nt : passthrough) copies[nt.name] = &nt;
  for (const std::string& name : order) {
    auto it = owned.find(name);
    if (it != owned.end()) {
      io::NamedTensor nt;
      nt.name = name;
      nt.tensor = it->second->view();
      out.named.push_back(std::move(nt));
    } else {
      out.named.push_back(*copies.at(name));
    }
  }
  MOEKIT_RETURN_IF_ERROR(io::write_safetensors(o.out_path, out.named, {{"moekit.quant", quant_method_name(method)}}));
  std::printf("wrote:    %s (%lld expert tensors quantized to %s, %zu tensors in all)\n", o.out_path.c_str(),
              static_cast<long long>(quantized), quant_method_name(method), out.named.size());
  return Status::Ok();
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand("quantize", "Convert a BF16/F32 layer file to fp8 or 4-bit weights with scales");
  cmd->add_option("--scheme", o->scheme,
                  "fp8_block128 (128x128 block scales), fp8_per_tensor (one scale per tensor), mxfp4 (e2m1, an E8M0 "
                  "exponent per 32 columns), int4_g32 or int4_g128 (symmetric int4, an f32 scale per 32/128 columns)")
      ->required();
  cmd->add_option("--weights", o->weights_path, "input safetensors layer file (docs/layer_files.md)")->required();
  cmd->add_option("--out", o->out_path, "output safetensors file")->required();
  cmd->callback([o] {
    const Status st = run_quantize(*o);
    finish(st.ok() ? kExitOk : report_error("quantize", st));
  });
}

}  // namespace moekit::tools

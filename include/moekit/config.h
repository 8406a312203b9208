// MoeConfig: the whole description of an MoE layer as plain, printable data.
// validate() returns the first bad field by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "moekit/dtype.h"
#include "moekit/status.h"

namespace moekit {

// Routing methods of the versioned routing spec (docs/routing.md, docs/design.md §3).
enum class RoutingMethod : uint8_t {
  kSoftmaxTopk,       // p = softmax(logits); ids = topk(p); w = p[ids]
  kRenormalize,       // ids = topk(logits); w = softmax(logits[ids])
  kRenormalizeNaive,  // p = softmax(logits); ids = topk(p); w = p[ids] / sum
  kTopk,              // ids = topk(logits); w = logits[ids]
  kSigmoid,           // s = sigmoid(logits); ids = topk(s); w = s[ids]
  kSigmoidRenorm,     // as kSigmoid, w divided by its sum
  kLlama4,            // ids = topk(logits); w = sigmoid(logits[ids])
  kDeepseekV3,        // grouped, biased selection; w = s[ids]/sum * scaling (or s[ids] * scaling)
  kCustom,            // ids/weights supplied by the caller (modular kernels only)
};
inline constexpr int kRoutingSpecVersion = 1;
// Every method, in the spec's order: the one list that parsing, help texts, the
// Python bindings (moekit._moekit.routing_methods()) and their tables read.
inline constexpr RoutingMethod kAllRoutingMethods[] = {
    RoutingMethod::kSoftmaxTopk, RoutingMethod::kRenormalize, RoutingMethod::kRenormalizeNaive,
    RoutingMethod::kTopk,        RoutingMethod::kSigmoid,     RoutingMethod::kSigmoidRenorm,
    RoutingMethod::kLlama4,      RoutingMethod::kDeepseekV3,  RoutingMethod::kCustom};

const char* routing_method_name(RoutingMethod m);  // "softmax_topk", ...
std::optional<RoutingMethod> parse_routing_method(std::string_view name);

struct RoutingConfig {
  RoutingMethod method = RoutingMethod::kSoftmaxTopk;
  int top_k = 1;
  // deepseek_v3 only:
  int num_groups = 1;                  // experts split into this many equal groups
  int topk_groups = 1;                 // groups kept
  float routed_scaling_factor = 1.0f;  // multiplies the renormalized weights
  bool has_score_bias = false;         // e_score_correction_bias [E] given (selection only)
  // deepseek_v3: divide the selected scores by their sum before scaling (the
  // checkpoints' `norm_topk_prob`); false: w = s[ids] * routed_scaling_factor.
  bool renormalize = true;

  Status validate(int num_experts) const;
  std::string to_string() const;
};

enum class Activation : uint8_t {
  kSiluGated,   // silu(gate) * up
  kGeluGated,   // gelu_tanh(gate) * up
  kSwigluOai,   // gpt-oss: interleaved gate/up rows, clamp, alpha, (up + 1)
  kRelu2,       // relu(x)^2, not gated: w13 has I rows, not 2I
};
inline constexpr Activation kAllActivations[] = {Activation::kSiluGated, Activation::kGeluGated,
                                                 Activation::kSwigluOai, Activation::kRelu2};
const char* activation_name(Activation a);
std::optional<Activation> parse_activation(std::string_view name);

// Where an activation's inputs sit in a row of GEMM1's output (w13's rows):
// every kernel lays out and reads w13 by this, so a new activation with an
// existing layout adds only its function (CPU activations.cpp, CUDA activation.cuh).
enum class GateUpLayout : uint8_t {
  kSplit,        // 2I rows: gate rows [0, I), up rows [I, 2I)
  kInterleaved,  // 2I rows: gate 2i, up 2i + 1 (gpt-oss)
  kNotGated,     // I rows, one input each
};
// constexpr: kernels call it too (--expt-relaxed-constexpr).
constexpr GateUpLayout gate_up_layout(Activation a) {
  switch (a) {
    case Activation::kSiluGated:
    case Activation::kGeluGated: return GateUpLayout::kSplit;
    case Activation::kSwigluOai: return GateUpLayout::kInterleaved;
    case Activation::kRelu2: return GateUpLayout::kNotGated;
  }
  return GateUpLayout::kSplit;
}

struct ActivationConfig {
  Activation kind = Activation::kSiluGated;
  float swiglu_limit = 7.0f;    // kSwigluOai: gate clamped to (-inf, limit], up to [-limit, limit]
  float swiglu_alpha = 1.702f;  // kSwigluOai: gate * sigmoid(alpha * gate)

  GateUpLayout layout() const { return gate_up_layout(kind); }
  bool gated() const { return layout() != GateUpLayout::kNotGated; }
  std::string to_string() const;
};

// How the expert GEMMs quantize their operands (docs/fp8.md and
// docs/weights_4bit.md have the layouts).
enum class QuantMethod : uint8_t {
  kNone,            // weights f32|bf16 as given; GEMMs on those values
  kFp8Block128,     // W8A8: e4m3 weights, one f32 scale_inv per 128x128 block; activations
                    // quantized per token per 128 columns (scale = amax/448) before each GEMM
  kFp8PerTensor,    // W8A8: e4m3 weights, one f32 scale per weight tensor per expert;
                    // activations quantized with one scale per tensor (act_scale says how)
  kMxfp4,           // W4A16: e2m1 weights two per byte, one E8M0 exponent per 32 input columns
  kInt4G32,         // W4A16: symmetric int4 (nibble - 8) two per byte, one f32 scale per 32 input columns
  kInt4G128,        //   the same with one scale per 128 input columns
};
inline constexpr QuantMethod kAllQuantMethods[] = {QuantMethod::kNone,    QuantMethod::kFp8Block128,
                                                   QuantMethod::kFp8PerTensor, QuantMethod::kMxfp4,
                                                   QuantMethod::kInt4G32, QuantMethod::kInt4G128};
// "none", "fp8_block128", "fp8_per_tensor", "mxfp4", "int4_g32", "int4_g128"
const char* quant_method_name(QuantMethod m);
std::optional<QuantMethod> parse_quant_method(std::string_view name);

// What a method does to the weights and activations (one place, so a new
// method is a row here and its kernels, not a branch at every use).
enum class QuantFamily : uint8_t { kNone, kFp8, kWeight4 };
constexpr QuantFamily quant_family(QuantMethod m) {
  switch (m) {
    case QuantMethod::kNone: return QuantFamily::kNone;
    case QuantMethod::kFp8Block128:
    case QuantMethod::kFp8PerTensor: return QuantFamily::kFp8;
    case QuantMethod::kMxfp4:
    case QuantMethod::kInt4G32:
    case QuantMethod::kInt4G128: return QuantFamily::kWeight4;
  }
  return QuantFamily::kNone;
}
// The weight dtype a method takes: bf16 (none; f32 also serves), f8_e4m3
// (fp8), u8 (4-bit, two values a byte).
constexpr DType default_weight_dtype(QuantMethod m) {
  switch (quant_family(m)) {
    case QuantFamily::kNone: return DType::kBF16;
    case QuantFamily::kFp8: return DType::kF8E4M3;
    case QuantFamily::kWeight4: return DType::kU8;
  }
  return DType::kBF16;
}
// 4-bit methods: input columns per scale (the group), 0 otherwise.
constexpr int64_t weight4_group(QuantMethod m) {
  switch (m) {
    case QuantMethod::kMxfp4:
    case QuantMethod::kInt4G32: return 32;
    case QuantMethod::kInt4G128: return 128;
    case QuantMethod::kNone:
    case QuantMethod::kFp8Block128:
    case QuantMethod::kFp8PerTensor: return 0;
  }
  return 0;
}

// fp8 per-tensor only: where the activation scale comes from.
enum class ActScale : uint8_t {
  kDynamic,  // amax/448 of the whole GEMM input, computed every call
  kStatic,   // given with the weights, one f32 per expert and GEMM (a13_scale, a2_scale)
};
inline constexpr ActScale kAllActScales[] = {ActScale::kDynamic, ActScale::kStatic};
const char* act_scale_name(ActScale s);  // "dynamic", "static"
std::optional<ActScale> parse_act_scale(std::string_view name);

// The names of one of the tables above (kAllRoutingMethods, kAllActivations,
// ...) joined by `sep`, for help texts and messages: each vocabulary is
// spelled in one place.
template <typename Enum, size_t N>
std::string name_list(const Enum (&all)[N], const char* (*name_of)(Enum), std::string_view sep = ", ") {
  std::string out;
  for (size_t i = 0; i < N; ++i) out += (i ? std::string(sep) : std::string()) + name_of(all[i]);
  return out;
}

inline constexpr int64_t kFp8BlockSize = 128;   // block edge of fp8_block128 (weights and activation groups)
inline constexpr float kFp8E4M3Max = 448.0f;    // largest finite e4m3fn value
inline constexpr float kFp8ScaleFloor = 1e-10f; // amax is clamped to >= this before amax/448

struct QuantScheme {
  DType weight_dtype = DType::kBF16;  // f32 | bf16 (method none); f8_e4m3 (fp8); u8 (4-bit: two values a byte)
  DType act_dtype = DType::kBF16;     // f32 | bf16 (hidden and out)
  QuantMethod method = QuantMethod::kNone;
  ActScale act_scale = ActScale::kDynamic;  // kFp8PerTensor only

  bool is_fp8() const { return quant_family(method) == QuantFamily::kFp8; }
  bool is_weight4() const { return quant_family(method) == QuantFamily::kWeight4; }
  // The stored width of a weight row of `cols` input columns (4-bit: two a byte).
  int64_t stored_cols(int64_t cols) const { return is_weight4() ? cols / 2 : cols; }
  Status validate() const;
  std::string to_string() const;
};

// How an expert-parallel layer moves tokens between ranks (docs/expert_parallel.md):
// kNccl: all-to-all, each token sent once per rank holding one of its experts
// (over the layer's communicator, NCCL or loopback); kAllgatherReducescatter:
// every token to every rank, partial outputs reduce-scattered back; kAuto: the
// oracle picks (choose_ep_dispatch, oracle.h) and says why.
enum class All2AllBackend : uint8_t { kNone, kNccl, kAllgatherReducescatter, kAuto };
const char* all2all_name(All2AllBackend b);

struct ParallelConfig {
  int tp_size = 1, tp_rank = 0;
  int ep_size = 1, ep_rank = 0;
  int dp_size = 1, dp_rank = 0;
  All2AllBackend all2all = All2AllBackend::kNone;
  bool enable_eplb = false;

  bool use_all2all() const { return dp_size > 1 && ep_size > 1; }
  Status validate() const;
  std::string to_string() const;
};

// Which GEMM path or instance a backend runs, where its own table would choose
// otherwise: for comparisons, tests and experiments, never needed for
// correctness (every path computes the same layer). Empty = the table's choice.
// The environment variables MOEKIT_SM90_GEMM, MOEKIT_SM90_STREAM,
// MOEKIT_SM90_CUTLASS, MOEKIT_SM90_FP8_GEMM, MOEKIT_SM90_FP8_STREAM,
// MOEKIT_SM90_FP8_TILE, MOEKIT_SM80_FP8_MMA, MOEKIT_SM90_W4_GEMM, MOEKIT_SM90_W4_STREAM and MOEKIT_CPU_GEMM override the field of that name
// (kernel_options_in_effect, read in one place: src/core/kernel_options.cpp).
// A path that cannot serve a problem falls back to the table's choice; an
// unknown name is an error (validate(), or the backend's supports() for the
// instance names only it knows).
struct KernelOptions {
  std::string sm90_gemm;        // bf16 grouped GEMM path: reference | streaming | cutlass
  std::string sm90_stream;      // bf16 streaming instance (streaming_gemm.h names)
  std::string sm90_cutlass;     // bf16 CUTLASS tile: m128_n256 | m64_n256 | swap_n32 | swap_n64
  std::string sm90_fp8_gemm;    // fp8 GEMM path: mma_sync | cutlass | streaming
  std::string sm90_fp8_stream;  // fp8 streaming instance, or off
  std::string sm90_fp8_tile;    // fp8 GEMM tile: m128n128 | m64n128 | m32n128 (small: CUTLASS 64 rows, mma.sync 32)
  std::string sm80_fp8_mma;     // fp8 mma.sync GEMM operands: e4m3 (sm_89 on) | f16 (fp8_mma_gemm.h)
  std::string sm90_w4_gemm;     // 4-bit GEMM path: streaming | mixed | dequant (moe_pipeline_weight4.h)
  std::string sm90_w4_stream;   // 4-bit streaming instance (weight4_streaming_gemm.h names)
  std::string sm90_w4_tile;     // 4-bit mixed-input tile: n128 | n256 (token rows per tile)
  std::string cpu_gemm;         // cpu GEMM path: blas (f32 BLAS) | packed (packed_bf16: its older name)

  bool empty() const;
  // Sets the field called `name` (e.g. "sm90_gemm"); InvalidArgument for another name.
  Status set(std::string_view name, std::string value);
  Status validate() const;
  std::string to_string() const;  // the fields that are set, "name=value" comma-separated
};

// `config`'s options with the environment's overrides applied. The environment
// is read once per process; call reload_kernel_options_environment() after
// changing it in-process (a benchmark comparing paths), while no forward runs.
KernelOptions kernel_options_in_effect(const KernelOptions& config);
void reload_kernel_options_environment();
// The environment's overrides alone (valid until the next reload).
const KernelOptions& kernel_options_environment();
// What a kernel choice reads: `in_effect` (a kernel's kernel_options_in_effect,
// held by the caller), or the environment's alone when there is none.
const KernelOptions& kernel_options_or_environment(const KernelOptions* in_effect);
// One knob in effect without a copy: the environment's value when set, else the config's.
const std::string& kernel_option_in_effect(const KernelOptions& config, std::string KernelOptions::*field);
// Counts the reloads: a kernel holding kernel_options_in_effect() re-reads it when this changed.
uint64_t kernel_options_environment_generation();

struct MoeConfig {
  int64_t num_experts = 0;     // E (logical)
  int64_t hidden = 0;          // H
  int64_t intermediate = 0;    // I (per expert; w13 has 2I rows when gated)
  int64_t max_num_tokens = 0;  // M upper bound per call; sizes workspaces and capture rows
  DType logits_dtype = DType::kF32;  // f32 | bf16
  QuantScheme quant;
  ActivationConfig activation;
  RoutingConfig routing;  // routing.top_k is the layer's k
  ParallelConfig parallel;
  std::string backend = "auto";  // "auto" or a backend name ("cpu", "cuda_sm90")
  // What the caller needs from the kernel (checked last by supports()):
  bool needs_capture = false;  // routed-expert ids written out (routing_replay_out)
  bool needs_replay = false;   // forced ids accepted
  // Terms some model families add to the routed experts (MoeWeights names the tensors):
  bool has_expert_bias = false;     // w13_bias [E, n1] and w2_bias [E, H] (gpt-oss)
  int64_t shared_intermediate = 0;  // > 0: a shared expert, a dense MLP of this width on every token (DeepSeek-V3)
  bool has_shared_gate = false;     // shared output scaled by sigmoid(x . shared_gate) per token (Qwen2-MoE)
  // A token's output row must not depend on M or on the other rows of the
  // batch: one GEMM path and one reduction order for every M (docs/batch_invariance.md).
  // Kernels that cannot honour it are rejected by supports().
  bool batch_invariant = false;
  // How the kernel schedules the shared expert (a choice, not part of the math:
  // the output bits are the same either way). true: on a side stream the CUDA
  // kernel owns, forked from the caller's stream at the start of the forward
  // and joined before the finalize, so it overlaps the routed experts; false:
  // after the routed experts on the caller's stream. Only a shared expert is
  // affected; the CPU backend has one stream and ignores it. On by default: on
  // the H200 the side stream was faster at every M measured (2% to 31%,
  // docs/cuda_backend.md).
  bool shared_expert_overlap = true;
  KernelOptions kernel;  // GEMM path overrides (not part of the math)

  int top_k() const { return routing.top_k; }
  Status validate() const;
  std::string to_string() const;
};

}  // namespace moekit

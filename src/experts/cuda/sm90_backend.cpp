// The cuda_sm90 backend's rules and registration (sm90_kernels.h): what its two
// kernel classes support, in the order of docs/design.md §2.2, and the candidates in
// priority order. The classes live in sm90_modular.cpp and sm90_monolithic.cpp
// (their common part in sm90_kernel.h), their weights in sm90_weights.h.
#include "experts/cuda/sm90_kernels.h"

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "experts/cuda/fp8_streaming_gemm.h"
#include "experts/cuda/grouped_gemm.h"
#include "experts/cuda/grouped_gemm_cutlass.h"
#include "experts/cuda/instance_names.h"
#include "experts/cuda/sm90_support.h"
#include "experts/cuda/streaming_gemm.h"
#include "experts/cuda/weight4_streaming_gemm.h"
#include "routing/cuda/route_cuda.h"

namespace moekit::cuda {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// ok, or which instance name among the kernel options (in effect) this backend does not have.
Support check_instance_names(const KernelOptions& o) {
  if (!o.sm90_stream.empty() && !sm90::parse_stream_variant(o.sm90_stream)) {
    return Support::no("kernel.sm90_stream '" + o.sm90_stream + "': no such streaming instance (" +
                       instance_names(sm90::kAllStreamVariants, &sm90::stream_variant_name) + ")");
  }
  if (!o.sm90_cutlass.empty() && !parse_cutlass_tile(o.sm90_cutlass)) {
    return Support::no("kernel.sm90_cutlass '" + o.sm90_cutlass + "': no such CUTLASS tile (" +
                       instance_names(kAllCutlassTiles, &cutlass_tile_name) + ")");
  }
  if (!o.sm90_w4_stream.empty() && !parse_w4_stream_variant(o.sm90_w4_stream)) {
    return Support::no("kernel.sm90_w4_stream '" + o.sm90_w4_stream + "': no such 4-bit streaming instance (" +
                       instance_names(kAllW4StreamVariants, &w4_stream_variant_name) + ")");
  }
  if (!o.sm90_fp8_stream.empty() && o.sm90_fp8_stream != "off" && !parse_fp8_stream_variant(o.sm90_fp8_stream)) {
    return Support::no("kernel.sm90_fp8_stream '" + o.sm90_fp8_stream + "': no such fp8 streaming instance (off, " +
                       instance_names(kAllFp8StreamVariants, &fp8_stream_variant_name) + ")");
  }
  return Support::yes();
}

}  // namespace

Sm90Pipeline sm90_pipeline_of(QuantMethod method) {
  switch (method) {
    case QuantMethod::kNone: return Sm90Pipeline::kBf16;
    case QuantMethod::kFp8Block128:
    case QuantMethod::kFp8PerTensor: return Sm90Pipeline::kFp8;
    case QuantMethod::kMxfp4:
    case QuantMethod::kInt4G32:
    case QuantMethod::kInt4G128: return Sm90Pipeline::kWeight4;
  }
  return Sm90Pipeline::kBf16;  // unreachable: the switch names every method (-Wswitch)
}

Status require_current_device(int device_index, const char* who) {
  int current = -1;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device_index) {
    return InvalidArgument(std::string(who) + " lives on cuda:" + str(device_index) +
                           " but the current CUDA device is cuda:" + str(current));
  }
  return Status::Ok();
}

StatusOr<int> current_cuda_device(const Platform& platform, CudaBackend backend, CudaTarget* target) {
  int current = -1;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&current));
  for (const CudaDeviceInfo& d : platform.cuda_devices) {
    if (d.index != current) continue;
    if (backend == CudaBackend::kSm90 && d.cc_major == 9 && d.cc_minor == 0) {
      *target = CudaTarget::kSm90;
      return current;
    }
    if (backend == CudaBackend::kPortable && d.cc_major >= Platform::kPortableMinCcMajor) {
      // e4m3 mma.sync from sm_89 on (Ada, Hopper, Blackwell: the PTX is compute_89).
      *target = d.cc_major * 10 + d.cc_minor >= 89 ? CudaTarget::kSm89 : CudaTarget::kSm80;
      return current;
    }
  }
  return Unsupported("the current CUDA device cuda:" + str(current) + " is not " +
                     (backend == CudaBackend::kSm90 ? "an sm_90 device" : "an sm_80 or later device"));
}

ExpertsShape sm90_shape_of(const MoeConfig& c) {
  ExpertsShape s;
  s.num_experts = c.num_experts;
  s.hidden = c.hidden;
  s.intermediate = c.intermediate;
  s.top_k = c.top_k();
  s.activation = c.activation;
  s.expert_bias = c.has_expert_bias;
  s.shared_intermediate = c.shared_intermediate;
  s.shared_gate = c.has_shared_gate;
  s.batch_invariant = c.batch_invariant;
  s.shared_overlap = c.shared_expert_overlap && c.shared_intermediate > 0;
  s.max_num_tokens = c.max_num_tokens;
  return s;
}

// The reasons both classes share, in the order of docs/design.md §2.2.
Support cuda_supports(const MoeConfig& c, const Platform& platform, bool monolithic, CudaBackend backend) {
  // device / arch
  if (!platform.cuda_built) return Support::no("this build has no CUDA kernels");
  if (backend == CudaBackend::kSm90 && !platform.has_sm90()) {
    return Support::no("needs a compute capability 9.0 device (H100/H200) and sm_90a kernels; platform: " +
                       platform.to_string());
  }
  if (backend == CudaBackend::kPortable && !platform.has_cuda_portable()) {
    return Support::no(std::string("needs a compute capability 8.0 or later device and the portable kernels (") +
                       (platform.portable_built ? "built" : "not built: MOEKIT_CUDA_PORTABLE_ARCHS was empty") +
                       "); platform: " + platform.to_string());
  }
  // dtypes / quant
  const Sm90Pipeline pipeline = sm90_pipeline_of(c.quant.method);
  switch (c.quant.method) {
    case QuantMethod::kNone: break;
    case QuantMethod::kFp8Block128:
    case QuantMethod::kFp8PerTensor:
      // The fp8 pipeline (moe_pipeline_fp8.h) serves both schemes, partial
      // 128-blocks included.
      if (c.quant.weight_dtype != DType::kF8E4M3) {
        return Support::no(std::string("quant ") + quant_method_name(c.quant.method) + ": needs f8_e4m3 weights, got " +
                           dtype_name(c.quant.weight_dtype));
      }
      break;
    case QuantMethod::kMxfp4:
    case QuantMethod::kInt4G32:
    case QuantMethod::kInt4G128: {
      // The 4-bit streaming GEMM (weight4_streaming_gemm.h): 32 weight rows per
      // CTA, so GEMM1's N1 and GEMM2's N = H are multiples of 32.
      if (c.quant.weight_dtype != DType::kU8) {
        return Support::no(std::string("quant ") + quant_method_name(c.quant.method) +
                           ": needs u8 weights (two 4-bit values a byte), got " + dtype_name(c.quant.weight_dtype));
      }
      const int64_t n1 = c.activation.gated() ? 2 * c.intermediate : c.intermediate;
      if (c.hidden % 32 != 0 || n1 % 32 != 0) {
        return Support::no(std::string("quant ") + quant_method_name(c.quant.method) + ": H=" + str(c.hidden) +
                           " and GEMM1's N=" + str(n1) + " must be multiples of 32 (the 4-bit kernel's row slab)");
      }
      break;
    }
  }
  if (pipeline == Sm90Pipeline::kBf16 && c.quant.weight_dtype != DType::kBF16) {
    return Support::no(std::string("weights ") + dtype_name(c.quant.weight_dtype) + ": needs bf16 weights");
  }
  if (c.quant.act_dtype != DType::kBF16) {
    return Support::no(std::string("activations ") + dtype_name(c.quant.act_dtype) + ": needs bf16 activations");
  }
  // activation: silu, gelu, swiglu_oai and relu2 are all served.
  // routing method
  if (c.routing.method == RoutingMethod::kCustom) {
    if (monolithic) return Support::no("custom routing: a monolithic kernel knows only the built-in routing methods");
  } else {
    const Status r = routing_supported(c.routing, c.num_experts);
    if (!r.ok()) return Support::no(r.message());
  }
  // logits dtype
  if (c.logits_dtype != DType::kF32 && c.logits_dtype != DType::kBF16) {
    return Support::no(std::string("logits ") + dtype_name(c.logits_dtype) + ": needs f32 or bf16 logits");
  }
  // parallel config
  if (monolithic && c.parallel.use_all2all()) {
    return Support::no("all-to-all dispatch (dp > 1 and ep > 1): a monolithic kernel cannot dispatch");
  }
  if (monolithic && c.parallel.enable_eplb) return Support::no("EPLB: a monolithic kernel has no expert remap");
  if (monolithic && (c.parallel.ep_size > 1 || c.parallel.dp_size > 1)) {
    return Support::no("expert/data parallelism (ep=" + str(c.parallel.ep_size) + ", dp=" + str(c.parallel.dp_size) +
                       "): a monolithic kernel cannot dispatch tokens across ranks");
  }
  // NOTE: the modular kernel serves ep > 1 and EPLB as the experts stage of
  // ExpertParallelLayer, which dispatches, remaps and combines around it
  // (its run() then takes skip_negative_ids), within the EP limits.
  // Every pipeline's finalize skips the ids of other ranks; the biases travel
  // with their slots, and a shared expert runs on each rank's own tokens
  // (experts/cuda/sm90_shared_expert.h), so no extra is refused for ep > 1.
  // shape / alignment
  if (c.hidden % kSm90DimAlignment != 0) {
    return Support::no("hidden H=" + str(c.hidden) + " must be a multiple of " + str(kSm90DimAlignment));
  }
  if (c.intermediate % kSm90DimAlignment != 0) {
    return Support::no("intermediate I=" + str(c.intermediate) + " must be a multiple of " + str(kSm90DimAlignment));
  }
  if (c.shared_intermediate % kSm90DimAlignment != 0) {
    return Support::no("shared expert intermediate Is=" + str(c.shared_intermediate) + " must be a multiple of " +
                       str(kSm90DimAlignment));
  }
  if (c.max_num_tokens * c.top_k() > (int64_t{1} << 30)) {
    return Support::no("max_num_tokens * top_k exceeds 2^30 permuted rows");
  }
  const ExpertsShape s = sm90_shape_of(c);
  std::vector<GroupedGemmProblem> gemms = {gemm1_problem(s, c.max_num_tokens), gemm2_problem(s, c.max_num_tokens)};
  if (s.shared_intermediate > 0) {
    gemms.push_back(shared_gemm1_problem(s, c.max_num_tokens));
    gemms.push_back(shared_gemm2_problem(s, c.max_num_tokens));
  }
  for (const GroupedGemmProblem& g : gemms) {
    // The bf16 grouped GEMMs only (the fp8 and 4-bit pipelines run their own).
    const Support gs = pipeline == Sm90Pipeline::kBf16 ? grouped_gemm_supports(g) : Support::yes();
    if (!gs.ok) return gs;
  }
  if (const Support names_ok = check_instance_names(kernel_options_in_effect(c.kernel)); !names_ok.ok) return names_ok;
  // capture / replay: both classes serve them (the monolithic kernel writes
  // routing_replay_out and accepts forced ids; the modular one is routed by the caller).
  // batch_invariant is served: the GEMM problems carry it (sm90_shape_of), and
  // choose_sm90_gemm then takes one path for every M, without K slices.
  return Support::yes();
}

Support sm90_modular_supports(const MoeConfig& config, const Platform& platform) {
  return cuda_supports(config, platform, false, CudaBackend::kSm90);
}
Support sm90_monolithic_supports(const MoeConfig& config, const Platform& platform) {
  return cuda_supports(config, platform, true, CudaBackend::kSm90);
}
Support sm80_modular_supports(const MoeConfig& config, const Platform& platform) {
  return cuda_supports(config, platform, false, CudaBackend::kPortable);
}
Support sm80_monolithic_supports(const MoeConfig& config, const Platform& platform) {
  return cuda_supports(config, platform, true, CudaBackend::kPortable);
}
Backend sm90_backend() {
  Backend b;
  b.name = kSm90BackendName;
  // Sm90Monolithic writes routing_replay_out (its kernels' supports_routing_replay_capture()).
  b.candidates.push_back(KernelClass{"Sm90Monolithic", true, &sm90_monolithic_supports, &create_sm90_monolithic,
                                     /*writes_routing_replay_out=*/true});
  b.candidates.push_back(KernelClass{"Sm90Modular", false, &sm90_modular_supports, &create_sm90_modular});
  return b;
}
Backend sm80_backend() {
  Backend b;
  b.name = kSm80BackendName;
  b.candidates.push_back(KernelClass{"Sm80Monolithic", true, &sm80_monolithic_supports, &create_sm80_monolithic,
                                     /*writes_routing_replay_out=*/true});
  b.candidates.push_back(KernelClass{"Sm80Modular", false, &sm80_modular_supports, &create_sm80_modular});
  return b;
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

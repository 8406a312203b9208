// The fp8 scales next to a checkpoint's expert weights (docs/fp8.md), read
// into the layout MoeWeights takes. Per-expert files follow the checkpoint
// convention: <proj>.weight in F8_E4M3 with <proj>.weight_scale_inv
// [ceil(rows/128), ceil(cols/128)] (block-128) or <proj>.weight_scale [] or [1]
// (per tensor), and optionally <proj>.input_scale [] or [1] (static activation
// scales, per tensor only). The scheme is detected from the tensors present and
// must be the same for every projection of every expert.
#pragma once

#include <array>
#include <vector>

#include "moekit/config.h"
#include "io/tensor_files.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::io {

struct Fp8Scales {
  QuantMethod method = QuantMethod::kNone;
  ActScale act_scale = ActScale::kDynamic;
  HostTensor w13_scale, w2_scale;  // MoeWeights layouts (kernel.h), f32
  HostTensor a13_scale, a2_scale;  // [E] f32, static activation scales only
};

// experts[e] = {gate, up, down} weight entries, F8_E4M3, gate/up [I, H], down
// [H, I] (checked by the caller). Errors name the tensor at fault.
StatusOr<Fp8Scales> read_expert_fp8_scales(TensorFiles& files,
                                            const std::vector<std::array<const SafetensorsEntry*, 3>>& experts,
                                            int64_t I, int64_t H);

// The stacked naming: <prefix>w13_scale and <prefix>w2_scale (and
// a13_scale/a2_scale) in the MoeWeights layouts; the scheme from w13_scale's
// rank (3: block-128, 2: per tensor). Shapes and values are checked when the
// layer is built (the kernel's prepare_weights names the tensor).
StatusOr<Fp8Scales> read_stacked_fp8_scales(TensorFiles& files, const std::string& prefix);

}  // namespace moekit::io

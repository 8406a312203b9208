// Argument checks shared by the CPU kernels (modular and monolithic). Each
// returns a Status naming the offending tensor; none writes anything.
#pragma once

#include <cstdint>

#include "moekit/config.h"
#include "moekit/kernel.h"
#include "moekit/platform.h"
#include "moekit/status.h"

namespace moekit::cpu {

// The supports() steps both CPU kernels share: device, dtypes/quant, activation.
Support supports_common(const MoeConfig& config, const Platform& platform);

// hidden [M, H] and out [M, H] in the act dtype, M <= max_num_tokens. Sets *num_tokens.
Status check_hidden_and_out(const MoeConfig& config, const MoeRunArgs& args, int64_t* num_tokens);

// topk_ids [M, k] i32 with every id in [0, E) and no id twice in a row;
// topk_weights [M, k] f32.
Status check_topk(const MoeConfig& config, const MoeRunArgs& args, int64_t num_tokens);

// The workspace holds at least `needed` bytes.
Status check_workspace(const Workspace& workspace, size_t needed);

// CpuKernel::problem_size(): hidden [M, H], w13 [E, n1, H], w2 [E, H, I]
// (n1 = 2I gated, I relu2), topk_ids [M, k] or absent (k from the config).
StatusOr<ProblemSize> cpu_problem_size(const MoeConfig& config, const TensorView& hidden, const TensorView& w13,
                                       const TensorView& w2, const TensorView& topk_ids);

}  // namespace moekit::cpu

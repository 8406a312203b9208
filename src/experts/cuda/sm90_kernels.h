// The cuda_sm90 backend's kernel classes (docs/design.md §2.2), in priority order:
//   Sm90Monolithic: router logits -> out in one call; routing inside (every
//                   built-in method), writes routing_replay_out, accepts forced ids.
//   Sm90Modular:    the caller's ids/weights (any routing, custom included).
// Both run the same expert stages (moe_pipeline.h), so for the same ids and
// weights their outputs are bitwise equal.
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <memory>

#include "moekit/kernel.h"
#include "moekit/oracle.h"
#include "moekit/platform.h"

namespace moekit::cuda {

inline constexpr const char* kSm90BackendName = "cuda_sm90";
// The portable backend: the same classes on any GPU from sm_80 on (sm90_support.h, CudaBackend).
inline constexpr const char* kSm80BackendName = "cuda_sm80";
inline constexpr int64_t kSm90DimAlignment = 16;  // H and I: multiples of this (16-byte rows, gate/up blocks)

Support sm90_modular_supports(const MoeConfig& config, const Platform& platform);
Support sm90_monolithic_supports(const MoeConfig& config, const Platform& platform);
StatusOr<std::unique_ptr<MoeKernel>> create_sm90_modular(const MoeConfig& config, const Platform& platform);
StatusOr<std::unique_ptr<MoeKernel>> create_sm90_monolithic(const MoeConfig& config, const Platform& platform);
Support sm80_modular_supports(const MoeConfig& config, const Platform& platform);
Support sm80_monolithic_supports(const MoeConfig& config, const Platform& platform);
StatusOr<std::unique_ptr<MoeKernel>> create_sm80_modular(const MoeConfig& config, const Platform& platform);
StatusOr<std::unique_ptr<MoeKernel>> create_sm80_monolithic(const MoeConfig& config, const Platform& platform);

// "cuda_sm90": [Sm90Monolithic, Sm90Modular].
Backend sm90_backend();
// "cuda_sm80": [Sm80Monolithic, Sm80Modular], after cuda_sm90 in the oracle's order.
Backend sm80_backend();

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

// The device passes for the terms some families add to the routed experts
// (MoeWeights: expert biases, a shared expert and its gate), around the grouped
// GEMMs of moe_pipeline. The biases sit where they cost one pass: the gate/up
// bias in the activation pass that reads GEMM1's output, the down bias in the
// finalize (finalize.h), which adds sum_j w_j * w2_bias[e_j].
#pragma once

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/config.h"
#include "moekit/status.h"

namespace moekit::cuda {

// inter[r, i] = act(gemm1_out[r, gate(i)] + bias[e, gate(i)], gemm1_out[r, up(i)] + bias[e, up(i)])
// for every permuted row r of expert e (its group), in fp32, rounded once to bf16;
// gate(i)/up(i) are the prepared (kGateUpBlock-interleaved) columns of
// intermediate column i; relu2: act(gemm1_out[r, i] + bias[e, i]). Rows outside
// every group are left untouched.
struct BiasActivationArgs {
  int64_t max_rows = 0;                  // rows of gemm1_out / inter (M·k)
  int64_t num_groups = 0;                // E
  int64_t n1 = 0;                        // GEMM1 columns: 2I gated, I relu2
  int64_t intermediate = 0;              // I
  ActivationConfig activation;
  const uint16_t* gemm1_out = nullptr;   // [max_rows, n1] bf16, prepared column order
  const float* bias = nullptr;           // [E, n1] f32, prepared column order
  const int32_t* group_start = nullptr;  // [E] i32
  const int32_t* group_rows = nullptr;   // [E] i32
  uint16_t* inter = nullptr;             // [max_rows, I] bf16
};
Status bias_activation(const BiasActivationArgs& args, cudaStream_t stream);

// group_start[0] = 0, group_rows[0] = rows: the one group of a dense GEMM run
// through the grouped GEMM (the shared expert), written on the stream.
Status write_single_group(int32_t* group_start, int32_t* group_rows, int64_t rows, cudaStream_t stream);

// gate[t] = sigmoid(sum_c hidden[t, c] * weight[c]) in fp32, for t in [0, M)
// (the shared expert's gate).
Status shared_gate_scores(const uint16_t* hidden, const float* weight, int64_t num_tokens, int64_t hidden_size,
                          float* gate, cudaStream_t stream);

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

// The forward loop of `moekit run`: one engine step (a batch of rows from
// several requests) through every MoE layer of the synthetic model, with the
// per-layer statistics the report prints.
#pragma once

#include <cstdint>
#include <vector>

#include "batch_schedule.h"
#include "moekit/capture.h"
#include "moekit/status.h"
#include "moekit/tensor.h"
#include "moekit/device_buffer.h"
#include "synthetic_model.h"

namespace moekit::tools {

// The buffers of one step, sized for max_num_tokens rows, reused by every layer.
// The dense parts of the synthetic model (embedding, rmsnorm, router matmul)
// run on the host; when the MoE layers run on a CUDA device, each layer's
// input, logits, output and counts travel through device mirrors.
struct StepBuffers {
  static StatusOr<StepBuffers> create(const MoeConfig& config, Device layer_device);

  std::vector<float> h;  // [Mmax, H] f32 residual stream
  HostTensor x;          // [Mmax, H] bf16 layer input: rmsnorm(h)
  HostTensor logits;     // [Mmax, E] f32 router logits
  HostTensor out;        // [Mmax, H] bf16 layer output
  HostTensor counts;     // [E] i32 tokens per expert of the last layer forward
  Device device = Device::cpu();  // where the MoE layers run
  DeviceBuffer d_x, d_logits, d_out, d_counts;  // device mirrors of the four above; empty on the CPU
};

// What the run measured, per MoE layer.
struct LayerStats {
  std::vector<int64_t> expert_tokens;  // [E] token-slots routed to each expert, summed over steps
  double seconds = 0.0;                // time in MoeLayer::forward (routing + experts)
};

// Runs `step` through the model: embeds its tokens, then for each layer
// x = rmsnorm(h), logits = x . gate^T, h += moe(x). Leaves the last layer's
// output in buffers.out[:M]. With a replayer, each layer gets its forced ids.
Status forward_step(const SyntheticModelSpec& spec, SyntheticModel& model, const Step& step, StepBuffers& buffers,
                    std::vector<LayerStats>& stats, const RoutedExpertsReplayer* replayer = nullptr);

}  // namespace moekit::tools

// make_sm90_shared_expert_pass (sm90_shared_expert.h).
#include "experts/cuda/sm90_shared_expert.h"

#include <memory>
#include <string>

#ifdef MOEKIT_WITH_CUDA

#include <cuda_runtime_api.h>

#include "experts/cuda/moe_pipeline.h"
#include "experts/cuda/sm90_support.h"
#include "experts/cuda/sm90_weights.h"
#include "moekit/device_buffer.h"

namespace moekit::cuda {

namespace {

constexpr const char* kName = "shared expert (expert parallel)";

struct SharedExpert {
  ExpertsShape shape;
  Sm90Weights weights;
  DeviceBuffer workspace;  // take_shared_workspace for max_num_tokens
};

}  // namespace

StatusOr<dispatch::DeviceSharedExpertPass> make_sm90_shared_expert_pass(const MoeConfig& config,
                                                                       const MoeWeights& weights, Device device) {
  if (device.type != DeviceType::kCuda) {
    return InvalidArgument(std::string(kName) + ": needs a CUDA device, got " + device.to_string());
  }
  auto se = std::make_shared<SharedExpert>();
  se->shape = sm90_shape_of(config);
  se->shape.shared_overlap = false;  // runs on the caller's stream
  MOEKIT_RETURN_IF_ERROR(prepare_sm90_shared_expert(se->shape, device.index, kName, weights, &se->weights));
  size_t bytes = 0;
  take_shared_workspace(&bytes, se->shape, config.max_num_tokens);
  MOEKIT_ASSIGN_OR_RETURN(se->workspace, DeviceBuffer::allocate(device, bytes));
  const int64_t max_tokens = config.max_num_tokens;
  return dispatch::DeviceSharedExpertPass(
      [se, max_tokens](const TensorView& hidden, Stream stream) -> StatusOr<dispatch::DeviceSharedAddend> {
        const int64_t m = hidden.dim(0);
        if (m < 1 || m > max_tokens) {
          return InvalidArgument(std::string(kName) + ": " + std::to_string(m) + " tokens; 1 to " +
                                 std::to_string(max_tokens));
        }
        // The layout of m tokens fits in the workspace of max_num_tokens (the GEMM
        // scratch is sized for max(m, max_num_tokens) rows either way).
        size_t end = 0;
        const SharedWorkspaceLayout l = take_shared_workspace(&end, se->shape, m);
        ExpertsRun run;
        run.num_tokens = m;
        run.hidden = hidden.ptr<const uint16_t>();
        run.workspace = static_cast<char*>(se->workspace.data());
        run.shared_w13 = device_ptr<const uint16_t>(se->weights.shared_w13);
        run.shared_w2 = device_ptr<const uint16_t>(se->weights.shared_w2);
        run.shared_gate = device_ptr<const float>(se->weights.shared_gate);
        MOEKIT_RETURN_IF_ERROR(run_shared_expert(se->shape, run, l, static_cast<cudaStream_t>(stream)));
        dispatch::DeviceSharedAddend addend;
        addend.out = reinterpret_cast<const uint16_t*>(run.workspace + l.shared_out);
        if (se->shape.shared_gate) addend.gate = reinterpret_cast<const float*>(run.workspace + l.shared_gate);
        return addend;
      });
}

}  // namespace moekit::cuda

#else  // !MOEKIT_WITH_CUDA

namespace moekit::cuda {

StatusOr<dispatch::DeviceSharedExpertPass> make_sm90_shared_expert_pass(const MoeConfig&, const MoeWeights&,
                                                                       Device device) {
  return Unsupported("shared expert on " + device.to_string() + ": this build has no CUDA support");
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

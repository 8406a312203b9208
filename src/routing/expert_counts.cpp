// record_caller_ids and accumulate_expert_load: the counting half of the
// routing step, on the host or (routing/cuda/expert_counts.cu) on a GPU.
#include <cstring>
#include <string>

#include "moekit/routing.h"

#ifdef MOEKIT_WITH_CUDA
#include "routing/cuda/expert_counts.h"
#endif

namespace moekit {

Status record_caller_ids(const TensorView& ids, int64_t E, const TensorView& counts, const TensorView& ids_out,
                         Stream stream) {
  MOEKIT_RETURN_IF_ERROR(check_tensor(ids, "topk_ids", {DType::kI32}, {-1, -1}, ids.device));
  const int64_t m = ids.dim(0), k = ids.dim(1);
  if (counts.defined()) MOEKIT_RETURN_IF_ERROR(check_tensor(counts, "expert_counts", {DType::kI32}, {E}, ids.device));
  if (ids_out.defined()) {
    MOEKIT_RETURN_IF_ERROR(check_tensor(ids_out, "routing_replay_out", {DType::kI16}, {-1, k}, ids.device));
    if (ids_out.dim(0) < m) {
      return InvalidArgument("routing_replay_out: needs at least " + std::to_string(m) + " rows, got " +
                             ids_out.shape_string());
    }
  }
  if (ids.device.type == DeviceType::kCuda) {
#ifdef MOEKIT_WITH_CUDA
    return cuda::record_caller_ids(ids.ptr<const int32_t>(), m, k, E,
                                   counts.defined() ? counts.ptr<int32_t>() : nullptr,
                                   ids_out.defined() ? ids_out.ptr<int16_t>() : nullptr,
                                   static_cast<cudaStream_t>(stream));
#else
    return Unsupported("caller ids on " + ids.device.to_string() + ": this build has no CUDA support");
#endif
  }
  const int32_t* id = ids.ptr<const int32_t>();
  if (counts.defined()) {
    int32_t* c = counts.ptr<int32_t>();
    std::memset(c, 0, E * sizeof(int32_t));
    for (int64_t i = 0; i < m * k; ++i) {
      if (id[i] >= 0 && id[i] < E) ++c[id[i]];
    }
  }
  if (ids_out.defined()) {
    int16_t* out = ids_out.ptr<int16_t>();
    for (int64_t i = 0; i < m * k; ++i) out[i] = static_cast<int16_t>(id[i]);
  }
  return Status::Ok();
}

Status accumulate_expert_load(const TensorView& counts, int64_t* load, Stream stream) {
  MOEKIT_RETURN_IF_ERROR(check_tensor(counts, "expert_counts", {DType::kI32}, {-1}, counts.device));
  const int64_t E = counts.dim(0);
  if (counts.device.type == DeviceType::kCuda) {
#ifdef MOEKIT_WITH_CUDA
    return cuda::accumulate_expert_load(counts.ptr<const int32_t>(), load, E,
                                        static_cast<cudaStream_t>(stream));
#else
    return Unsupported("expert load on " + counts.device.to_string() + ": this build has no CUDA support");
#endif
  }
  for (int64_t e = 0; e < E; ++e) load[e] += counts.ptr<const int32_t>()[e];
  return Status::Ok();
}

}  // namespace moekit

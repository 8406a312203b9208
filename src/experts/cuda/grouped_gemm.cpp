// Printing for the grouped GEMM's problem (the kernels live in grouped_gemm.cu).
#include "experts/cuda/grouped_gemm.h"

#include <sstream>

namespace moekit::cuda {

const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone: return "none";
    case GemmEpilogue::kActivation: return "activation";
  }
  return "?";
}

const char* cuda_target_name(CudaTarget t) {
  switch (t) {
    case CudaTarget::kSm80: return "sm80";
    case CudaTarget::kSm89: return "sm89";
    case CudaTarget::kSm90: return "sm90";
  }
  return "?";
}

std::string GroupedGemmProblem::to_string() const {
  std::ostringstream os;
  os << "GroupedGemm{G=" << num_groups << ", max_rows=" << max_rows << ", a_rows=" << a_rows << ", N=" << n
     << ", K=" << k << ", out=" << dtype_name(out_dtype) << ", gather_a=" << (gather_a ? "yes" : "no")
     << ", epilogue=" << gemm_epilogue_name(epilogue);
  if (epilogue == GemmEpilogue::kActivation) os << "(" << activation.to_string() << ")";
  if (k_splits > 1) os << ", k_splits=" << k_splits;
  if (batch_invariant) os << ", batch_invariant";
  if (target != CudaTarget::kSm90) os << ", target=" << cuda_target_name(target);
  os << "}";
  return os.str();
}

}  // namespace moekit::cuda

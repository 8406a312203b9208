#include "core/cuda_check.h"

#ifdef MOEKIT_WITH_CUDA

#include <sstream>

namespace moekit::cuda {

Status cuda_error_status(cudaError_t err, const char* stmt, const char* file, int line) {
  int device = -1;
  // cudaGetDevice does not touch the last-error state; a failure leaves device = -1.
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  // Non-sticky errors (bad arguments, launch configuration) are cleared so the
  // next call is not blamed for them; sticky ones keep failing, as they must.
  (void)cudaGetLastError();
  std::ostringstream os;
  os << "CUDA error in `" << stmt << "` at " << file << ":" << line << " on cuda:" << device << ": "
     << cudaGetErrorName(err) << ": " << cudaGetErrorString(err);
  const StatusCode code =
      err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code, os.str());
}

}  // namespace moekit::cuda

#endif  // MOEKIT_WITH_CUDA

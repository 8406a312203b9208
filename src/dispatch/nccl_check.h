// The one error path for NCCL calls (STYLE.md rule 2): a failed call becomes a
// Status naming the statement, file:line, device and NCCL's error strings.
#pragma once

#ifdef MOEKIT_WITH_NCCL

#include <nccl.h>

#include "moekit/status.h"

namespace moekit::dispatch {

// "NCCL error in `stmt` at file:line on cuda:D: <string> (<last error>)".
Status nccl_error_status(ncclResult_t r, const char* stmt, const char* file, int line);

}  // namespace moekit::dispatch

#define MOEKIT_NCCL_CHECK(stmt)                                                                  \
  do {                                                                                           \
    const ncclResult_t moekit_nccl_r_ = (stmt);                                                  \
    if (moekit_nccl_r_ != ncclSuccess)                                                           \
      return ::moekit::dispatch::nccl_error_status(moekit_nccl_r_, #stmt, __FILE__, __LINE__);  \
  } while (0)

#endif  // MOEKIT_WITH_NCCL

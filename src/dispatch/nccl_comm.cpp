// The NCCL Communicator. TODO(ep): the NCCL implementation (ncclCommInitRank
// from the caller's unique id, ncclGroupStart/ncclSend/ncclRecv for
// all_to_all_v with counts exchanged on the device) is not written yet; until
// it is, a build has no NCCL and these entry points say so.
#include "moekit/comm.h"

namespace moekit {

bool nccl_built() { return false; }

StatusOr<CommUniqueId> nccl_unique_id() {
  return Unsupported("NCCL communicator: this build has no NCCL support (use the loopback communicator)");
}

StatusOr<std::unique_ptr<Communicator>> create_nccl_communicator(const CommUniqueId&, int, int, Device, CommOptions) {
  return Unsupported("NCCL communicator: this build has no NCCL support (use the loopback communicator)");
}

}  // namespace moekit

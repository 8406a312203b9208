#include "dispatch/host_all_gather.h"

#include "moekit/device_buffer.h"

namespace moekit::dispatch {

Status all_gather_host(Communicator& comm, const void* send, void* recv, size_t bytes) {
  const Device dev = comm.device();
  if (dev.type == DeviceType::kCpu) return comm.all_gather(send, recv, bytes);
  const size_t all = bytes * static_cast<size_t>(comm.size());
  MOEKIT_ASSIGN_OR_RETURN(DeviceBuffer d_send, DeviceBuffer::allocate(dev, bytes));
  MOEKIT_ASSIGN_OR_RETURN(DeviceBuffer d_recv, DeviceBuffer::allocate(dev, all));
  MOEKIT_RETURN_IF_ERROR(DeviceBuffer::copy_bytes(d_send.data(), dev, send, Device::cpu(), bytes));
  // Both on the default stream: the barrier's bounded wait covers the gather before it.
  MOEKIT_RETURN_IF_ERROR(comm.all_gather(d_send.data(), d_recv.data(), bytes, nullptr));
  MOEKIT_RETURN_IF_ERROR(comm.barrier(nullptr));
  return DeviceBuffer::copy_bytes(recv, Device::cpu(), d_recv.data(), dev, all);
}

}  // namespace moekit::dispatch

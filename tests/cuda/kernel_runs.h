// The runs the quantized-scheme GPU tests compare (test_fp8_cuda,
// test_weight4_cuda): the cpu modular kernel on the routing spec's ids, the
// device router's ids and weights, one modular and one monolithic forward on
// the device.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "experts/cpu/cpu_modular.h"
#include "moekit/kernel.h"
#include "moekit/routing.h"
#include "routing/cuda/route_cuda.h"

namespace moekit::cuda_test {

// route_cpu's ids and weights for `logits`, and the cpu modular kernel's bf16 output on them.
struct CpuRun {
  HostTensor ids, weights, out;
};
inline StatusOr<CpuRun> cpu_modular_run(const MoeConfig& cfg, const MoeWeights& w, const HostTensor& hidden,
                                        const HostTensor& logits) {
  const int64_t M = hidden.shape()[0], H = hidden.shape()[1], k = cfg.top_k();
  CpuRun r{HostTensor(DType::kI32, {M, k}), HostTensor(DType::kF32, {M, k}), HostTensor(DType::kBF16, {M, H})};
  RoutingArgs ra;
  ra.logits = logits.view();
  ra.topk_ids = r.ids.view();
  ra.topk_weights = r.weights.view();
  MOEKIT_RETURN_IF_ERROR(route_cpu(cfg.routing, ra));
  cpu::CpuModular kernel(cfg);
  MOEKIT_RETURN_IF_ERROR(kernel.prepare_weights(w));
  std::vector<unsigned char> ws(kernel.workspace_size(M));
  MoeRunArgs a;
  a.hidden = hidden.view();
  a.out = r.out.view();
  a.topk_ids = r.ids.view();
  a.topk_weights = r.weights.view();
  MOEKIT_RETURN_IF_ERROR(kernel.run(a, Workspace{ws.data(), ws.size()}, nullptr));
  return r;
}

// route_cuda's ids and weights for device `logits` [M, E].
struct DeviceRoute {
  DeviceTensor ids, weights;
};
inline StatusOr<DeviceRoute> device_route(const MoeConfig& cfg, const DeviceTensor& logits, int64_t M) {
  DeviceRoute r{DeviceTensor(DType::kI32, {M, cfg.top_k()}), DeviceTensor(DType::kF32, {M, cfg.top_k()})};
  RoutingArgs ra;
  ra.logits = logits.view();
  ra.topk_ids = r.ids.view();
  ra.topk_weights = r.weights.view();
  MOEKIT_RETURN_IF_ERROR(cuda::route_cuda(cfg.routing, ra, nullptr));
  return r;
}

// One forward of a prepared modular kernel on `route`'s ids; the bf16 output
// (poisoned first, so an unwritten element shows).
inline StatusOr<HostTensor> modular_run(MoeKernel& kernel, const DeviceTensor& hidden, const DeviceRoute& route,
                                        int64_t M, int64_t H) {
  DeviceTensor out(DType::kBF16, {M, H});
  out.poison();
  DeviceBytes ws(kernel.workspace_size(M));
  MoeRunArgs a;
  a.hidden = hidden.view();
  a.out = out.view();
  a.topk_ids = route.ids.view();
  a.topk_weights = route.weights.view();
  MOEKIT_RETURN_IF_ERROR(kernel.run(a, Workspace{ws.data(), ws.bytes()}, nullptr));
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    return Internal(std::string("modular_run: ") + cudaGetErrorString(e));
  }
  return out.download();
}

// One forward of a prepared monolithic kernel on rows [0, M) of device `hidden`
// and `logits`, writing `capture` or taking `forced` ids when given; the bf16 output.
inline StatusOr<HostTensor> monolithic_run(MoeKernel& kernel, const DeviceTensor& hidden, const DeviceTensor& logits,
                                           int64_t M, int64_t H, const TensorView& capture = {},
                                           const TensorView& forced = {}) {
  DeviceTensor out(DType::kBF16, {M, H});
  out.poison();
  DeviceBytes ws(kernel.workspace_size(M));
  MoeRunArgs a;
  a.hidden = hidden.view();
  a.hidden.shape[0] = M;
  a.router_logits = logits.view();
  a.router_logits.shape[0] = M;
  a.out = out.view();
  a.routing_replay_out = capture;
  a.forced_ids = forced;
  MOEKIT_RETURN_IF_ERROR(kernel.run(a, Workspace{ws.data(), ws.bytes()}, nullptr));
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    return Internal(std::string("monolithic_run: ") + cudaGetErrorString(e));
  }
  return out.download();
}

}  // namespace moekit::cuda_test

// Both CPU kernels on one layer's inputs, for the tests that hold them bitwise
// equal: the monolithic kernel routes itself (capturing the ids), the modular
// one runs on route_cpu's ids and weights.
#pragma once

#include <cstring>
#include <vector>

#include "experts/cpu/cpu_modular.h"
#include "experts/cpu/cpu_monolithic.h"
#include "moekit/routing.h"
#include "util/test_util.h"

namespace moekit::cpu {

struct KernelPairRun {
  HostTensor monolithic, modular;  // [M, H] act dtype
  HostTensor ids;                  // [M, k] i16, the monolithic kernel's capture
  bool outputs_equal() const {
    return monolithic.nbytes() == modular.nbytes() &&
           std::memcmp(monolithic.data<unsigned char>(), modular.data<unsigned char>(), monolithic.nbytes()) == 0;
  }
};

inline StatusOr<KernelPairRun> run_kernel_pair(const MoeConfig& config, const MoeWeights& weights,
                                               const HostTensor& hidden, const HostTensor& logits) {
  const Platform cpu = Platform::cpu_only(2);
  if (!CpuMonolithic::supports(config, cpu).ok || !CpuModular::supports(config, cpu).ok) {
    return Internal("a CPU kernel refuses the config: " + CpuMonolithic::supports(config, cpu).reason + " / " +
                    CpuModular::supports(config, cpu).reason);
  }
  CpuMonolithic mono(config);
  CpuModular modular(config);
  MOEKIT_RETURN_IF_ERROR(mono.prepare_weights(weights));
  MOEKIT_RETURN_IF_ERROR(modular.prepare_weights(weights));
  const int64_t M = hidden.shape()[0], k = config.top_k();
  KernelPairRun r{HostTensor(config.quant.act_dtype, {M, config.hidden}),
                  HostTensor(config.quant.act_dtype, {M, config.hidden}), HostTensor(DType::kI16, {M, k})};
  for (HostTensor* t : {&r.monolithic, &r.modular, &r.ids}) testing::poison(*t);
  std::vector<unsigned char> ws(std::max(mono.workspace_size(M), modular.workspace_size(M)));
  MoeRunArgs am;
  am.hidden = hidden.view();
  am.out = r.monolithic.view();
  am.router_logits = logits.view();
  am.routing_replay_out = r.ids.view();
  MOEKIT_RETURN_IF_ERROR(mono.run(am, {ws.data(), ws.size()}, nullptr));
  HostTensor ids(DType::kI32, {M, k}), weights_f32(DType::kF32, {M, k});
  RoutingArgs ra;
  ra.logits = logits.view();
  ra.topk_ids = ids.view();
  ra.topk_weights = weights_f32.view();
  MOEKIT_RETURN_IF_ERROR(route_cpu(config.routing, ra));
  MoeRunArgs ad;
  ad.hidden = hidden.view();
  ad.out = r.modular.view();
  ad.topk_ids = ids.view();
  ad.topk_weights = weights_f32.view();
  MOEKIT_RETURN_IF_ERROR(modular.run(ad, {ws.data(), ws.size()}, nullptr));
  return r;
}

}  // namespace moekit::cpu

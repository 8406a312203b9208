// The backend oracle: priority order, fallback from monolithic to modular,
// forced backends that never fall back, capture needs, the report, and errors
// that list every rejection. The real "cpu" registry plus a fake registry and
// fake platforms for what the CPU kernels cannot show.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "experts/cpu/packed_bf16_gemm.h"
#include "moekit/oracle.h"
#include "util/test_util.h"
#ifdef MOEKIT_WITH_CUDA
#include "experts/cuda/sm90_kernels.h"
#endif

namespace moekit {
namespace {

MoeConfig small_config(RoutingMethod method = RoutingMethod::kSoftmaxTopk) {
  MoeConfig c;
  c.num_experts = 16;
  c.hidden = 64;
  c.intermediate = 32;
  c.max_num_tokens = 8;
  c.routing.method = method;
  c.routing.top_k = 2;
  if (method == RoutingMethod::kDeepseekV3) {
    c.routing.num_groups = 4;
    c.routing.topk_groups = 2;
  }
  return c;
}

const CandidateReport* find(const Resolution& r, const std::string& kernel) {
  for (const CandidateReport& c : r.report) {
    if (c.kernel == kernel) return &c;
  }
  return nullptr;
}

// ---------------------------------------------------------------- kernel options

TEST(KernelOptions, SetNamesTheFieldsAndRefusesOthers) {
  KernelOptions o;
  EXPECT_TRUE(o.empty());
  ASSERT_TRUE(o.set("sm90_gemm", "cutlass").ok());
  ASSERT_TRUE(o.set("cpu_gemm", "blas").ok());
  EXPECT_FALSE(o.empty());
  EXPECT_EQ(o.sm90_gemm, "cutlass");
  EXPECT_EQ(o.to_string(), "sm90_gemm=cutlass, cpu_gemm=blas");
  const Status s = o.set("sm90_gem", "cutlass");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'sm90_gem': unknown"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("sm90_fp8_tile"), std::string::npos) << s.message();  // lists every option
}

TEST(KernelOptions, ValidateRefusesAPathNameNoBackendHas) {
  MoeConfig c = small_config();
  c.kernel.sm90_gemm = "cutlas";
  const Status s = c.validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("config.kernel.sm90_gemm (or MOEKIT_SM90_GEMM): 'cutlas' is not one of reference, "
                             "streaming, cutlass"),
            std::string::npos)
      << s.message();
  c.kernel.sm90_gemm = "streaming";
  EXPECT_TRUE(c.validate().ok());
}

// Instance names are checked against the built tables on every machine (this
// build may have no CUDA at all), from the config and from the environment.
TEST(KernelOptions, ValidateRefusesAnInstanceNameThatIsNotBuilt) {
  struct Case {
    std::string KernelOptions::*field;
    const char *name, *env, *good, *bad, *listed;
  };
  const Case cases[] = {
      {&KernelOptions::sm90_stream, "sm90_stream", "MOEKIT_SM90_STREAM", "rows32_k64_t16", "rows7_k3", "rows128_k64"},
      {&KernelOptions::sm90_cutlass, "sm90_cutlass", "MOEKIT_SM90_CUTLASS", "swap_n64", "m256", "m128_n256"},
      {&KernelOptions::sm90_fp8_stream, "sm90_fp8_stream", "MOEKIT_SM90_FP8_STREAM", "off", "w1_t8", "off, w1_t8_k128_s2"},
      {&KernelOptions::sm90_w4_stream, "sm90_w4_stream", "MOEKIT_SM90_W4_STREAM", "w4_t16_k128_s3", "t8_k128_s4",
       "w1_t8_k128_s3"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    MoeConfig c = small_config();
    c.kernel.*k.field = k.good;
    EXPECT_TRUE(c.validate().ok()) << c.validate().to_string();
    c.kernel.*k.field = k.bad;
    const Status s = c.validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    const std::string want = std::string("config.kernel.") + k.name + " (or " + k.env + "): '" + k.bad +
                             "' is not one of the built instances: " + k.listed;
    EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
    c.kernel.*k.field = "";
    ::setenv(k.env, k.bad, 1);
    reload_kernel_options_environment();
    EXPECT_NE(c.validate().message().find(want), std::string::npos) << c.validate().message();
    ::unsetenv(k.env);
    reload_kernel_options_environment();
    EXPECT_TRUE(c.validate().ok());
  }
}

// Sets one variable and reloads the options' environment for a scope.
class ScopedKernelEnv {
 public:
  ScopedKernelEnv(const char* name, const char* value) : name_(name) {
    ::setenv(name, value, 1);
    reload_kernel_options_environment();
  }
  ~ScopedKernelEnv() {
    ::unsetenv(name_);
    reload_kernel_options_environment();
  }
  ScopedKernelEnv(const ScopedKernelEnv&) = delete;
  ScopedKernelEnv& operator=(const ScopedKernelEnv&) = delete;

 private:
  const char* name_;
};

TEST(KernelOptions, TheEnvironmentOverridesTheConfigAfterAReload) {
  KernelOptions config;
  config.cpu_gemm = "packed_bf16";
  const uint64_t before = kernel_options_environment_generation();
  {
    const ScopedKernelEnv env("MOEKIT_CPU_GEMM", "blas");
    EXPECT_GT(kernel_options_environment_generation(), before);
    EXPECT_EQ(kernel_options_in_effect(config).cpu_gemm, "blas");
    EXPECT_EQ(kernel_options_in_effect({}).sm90_gemm, "");  // unset variables leave the config's value
  }
  EXPECT_EQ(kernel_options_in_effect(config).cpu_gemm, "packed_bf16");
  {
    const ScopedKernelEnv env("MOEKIT_CPU_GEMM", "blsa");  // a bad value: every config using it is refused
    const Status s = small_config().validate();
    EXPECT_NE(s.message().find("MOEKIT_CPU_GEMM): 'blsa'"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(small_config().validate().ok());
}

TEST(KernelOptions, TheCpuKernelSaysItsGemmPathAndWhy) {
  MoeConfig c = small_config();
  c.quant.weight_dtype = DType::kF32;
  c.quant.act_dtype = DType::kF32;
  auto res = select_backend(c, Platform::cpu_only());
  ASSERT_TRUE(res.ok()) << res.status().message();
  auto f32 = res->kernel.create(c, Platform::cpu_only());
  ASSERT_TRUE(f32.ok()) << f32.status().message();
  // Which packed kernel (if any) this CPU runs is the one thing the plan's words depend on.
  const std::string packed_or_blas =
      cpu::packed_gemm_supported() ? std::string("packed_f32 (f32 weights, this CPU's ") + cpu::packed_gemm_isa() + " kernel)"
                              : "blas_f32 (f32 weights, this CPU has no packed kernel (AVX-512, or AVX2 with FMA))";
  EXPECT_EQ((*f32)->gemm_plan(1), "gemm " + packed_or_blas + ", every M");
  c.quant.weight_dtype = DType::kBF16;
  c.kernel.cpu_gemm = "blas";
  auto forced = res->kernel.create(c, Platform::cpu_only());
  ASSERT_TRUE(forced.ok()) << forced.status().message();
  EXPECT_EQ((*forced)->gemm_plan(8), "gemm blas_f32 (bf16 weights, forced by kernel.cpu_gemm), every M");
  c.kernel.cpu_gemm.clear();
  c.hidden = c.intermediate = 128;
  c.quant.method = QuantMethod::kMxfp4;
  c.quant.weight_dtype = DType::kU8;
  auto mxfp4 = res->kernel.create(c, Platform::cpu_only());
  ASSERT_TRUE(mxfp4.ok()) << mxfp4.status().message();
  EXPECT_NE((*mxfp4)->gemm_plan(1).find(" (mxfp4 weights, dequantized to f32 once, "), std::string::npos)
      << (*mxfp4)->gemm_plan(1);
}

#ifdef MOEKIT_WITH_CUDA
// The sm90 classes' rules on a described H200 (no device is touched): an
// instance name the backend lacks is a supports() reason naming the choices.
TEST(KernelOptions, TheSm90BackendRefusesAnInstanceItDoesNotHave) {
  const Platform h200 = testing::described_h200();
  MoeConfig c = small_config();
  ASSERT_TRUE(cuda::sm90_modular_supports(c, h200).ok) << cuda::sm90_modular_supports(c, h200).reason;
  c.kernel.sm90_stream = "rows7_k3";
  Support s = cuda::sm90_modular_supports(c, h200);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("kernel.sm90_stream 'rows7_k3': no such streaming instance (rows128_k64"),
            std::string::npos)
      << s.reason;
  c.kernel.sm90_stream.clear();
  c.kernel.sm90_cutlass = "m256";
  s = cuda::sm90_monolithic_supports(c, h200);
  EXPECT_NE(
      s.reason.find("no such CUTLASS tile (m128_n256, m64_n256, swap_n32, swap_n64, sm80_m128_n256, sm80_m128_n128)"),
      std::string::npos)
      << s.reason;
}

// 4-bit weights: both sm90 classes serve them (the 4-bit pipeline), so the
// oracle's choice on that H200 is cuda_sm90; on GPU EP ranks the modular one serves them.
TEST(Oracle, TheSm90BackendServes4BitWeights) {
  const Platform h200 = testing::described_h200();
  MoeConfig c = small_config();
  c.hidden = c.intermediate = 128;
  for (QuantMethod m : {QuantMethod::kMxfp4, QuantMethod::kInt4G32, QuantMethod::kInt4G128}) {
    c.quant.method = m;
    c.quant.weight_dtype = DType::kU8;
    ASSERT_TRUE(c.validate().ok()) << c.validate().to_string();
    for (const Support& s : {cuda::sm90_modular_supports(c, h200), cuda::sm90_monolithic_supports(c, h200)}) {
      EXPECT_TRUE(s.ok) << quant_method_name(m) << ": " << s.reason;
    }
    auto r = select_backend(c, h200);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->backend, "cuda_sm90") << r->report_string();
    MoeConfig ep = c;
    ep.parallel.ep_size = 2;
    const Support s = cuda::sm90_modular_supports(ep, h200);
    EXPECT_TRUE(s.ok) << "the experts stage of GPU EP ranks: " << s.reason;
    EXPECT_FALSE(cuda::sm90_monolithic_supports(ep, h200).ok);
  }
}

Platform described_gpu(int cc_major, int cc_minor, bool portable_built) {
  Platform p = testing::described_h200();
  p.cuda_devices[0].cc_major = cc_major;
  p.cuda_devices[0].cc_minor = cc_minor;
  p.portable_built = portable_built;
  return p;
}

// An A100 (sm_80), an L40S (sm_89) or a Blackwell GPU (sm_100, through the PTX):
// the portable backend serves every scheme there, the monolithic class first.
TEST(Oracle, ThePortableBackendServesGpusFromAmpereOn) {
  for (const auto& [major, minor] : {std::pair{8, 0}, std::pair{8, 6}, std::pair{8, 9}, std::pair{10, 0}}) {
    const Platform gpu = described_gpu(major, minor, /*portable_built=*/true);
    MoeConfig c = small_config();
    c.hidden = c.intermediate = 128;
    auto r = select_backend(c, gpu);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->backend, "cuda_sm80") << r->report_string();
    EXPECT_EQ(r->kernel.name, "Sm80Monolithic") << r->report_string();
    for (QuantMethod m : {QuantMethod::kFp8Block128, QuantMethod::kFp8PerTensor, QuantMethod::kMxfp4,
                          QuantMethod::kInt4G32, QuantMethod::kInt4G128}) {
      MoeConfig q = c;
      q.quant.method = m;
      q.quant.weight_dtype = q.quant.is_weight4() ? DType::kU8 : DType::kF8E4M3;
      ASSERT_TRUE(q.validate().ok()) << q.validate().to_string();
      for (const Support& s : {cuda::sm80_modular_supports(q, gpu), cuda::sm80_monolithic_supports(q, gpu)}) {
        EXPECT_TRUE(s.ok) << quant_method_name(m) << " on sm_" << major << minor << ": " << s.reason;
      }
    }
  }
}

// On Hopper the sm90 backend wins and the portable one is second, reported as
// such; forcing it (backend = "cuda_sm80") selects it.
TEST(Oracle, OnHopperThePortableBackendIsSecondAndCanBeForced) {
  const Platform h200 = described_gpu(9, 0, /*portable_built=*/true);
  MoeConfig c = small_config();
  auto r = select_backend(c, h200);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->backend, "cuda_sm90");
  const CandidateReport* sm80 = find(*r, "Sm80Monolithic");
  ASSERT_NE(sm80, nullptr) << r->report_string();
  EXPECT_EQ(sm80->reason, "lower priority than cuda_sm90/Sm90Monolithic");
  c.backend = "cuda_sm80";
  auto forced = select_backend(c, h200);
  ASSERT_TRUE(forced.ok()) << forced.status().to_string();
  EXPECT_EQ(forced->backend, "cuda_sm80");
  EXPECT_EQ(forced->kernel.name, "Sm80Monolithic");
}

// Before Ampere, or in a build without the portable kernels, no CUDA backend
// serves the device: the CPU does, and forcing cuda_sm80 is an error naming what is there.
TEST(Oracle, NoPortableBackendBeforeAmpereOrWhenNotBuilt) {
  for (const Platform& p : {described_gpu(7, 5, true), described_gpu(8, 0, false)}) {
    MoeConfig c = small_config();
    auto r = select_backend(c, p);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->backend, "cpu") << r->report_string();
    c.backend = "cuda_sm80";
    auto forced = select_backend(c, p);
    ASSERT_FALSE(forced.ok());
    EXPECT_NE(forced.status().message().find("backend 'cuda_sm80' is not available"), std::string::npos)
        << forced.status().message();
  }
  const Support s = cuda::sm80_modular_supports(small_config(), described_gpu(8, 0, false));
  EXPECT_NE(s.reason.find("not built: MOEKIT_CUDA_PORTABLE_ARCHS was empty"), std::string::npos) << s.reason;
}
#endif

// ---------------------------------------------------------------- the real cpu registry

TEST(Oracle, CpuRegistryListsMonolithicThenModular) {
  const std::vector<Backend> reg = backend_registry(Platform::cpu_only());
  ASSERT_FALSE(reg.empty());
  const Backend& cpu = reg.back();
  EXPECT_EQ(cpu.name, "cpu");
  ASSERT_EQ(cpu.candidates.size(), 2u);
  EXPECT_EQ(cpu.candidates[0].name, "CpuMonolithic");
  EXPECT_TRUE(cpu.candidates[0].monolithic);
  EXPECT_EQ(cpu.candidates[1].name, "CpuModular");
  EXPECT_FALSE(cpu.candidates[1].monolithic);
}

TEST(Oracle, MonolithicChosenWhenItFits) {
  for (RoutingMethod m : {RoutingMethod::kSoftmaxTopk, RoutingMethod::kRenormalize, RoutingMethod::kDeepseekV3}) {
    auto r = select_backend(small_config(m), Platform::cpu_only());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->backend, "cpu");
    EXPECT_EQ(r->kernel.name, "CpuMonolithic") << routing_method_name(m);
    ASSERT_EQ(r->report.size(), 2u);
    EXPECT_TRUE(r->report[0].chosen);
    EXPECT_TRUE(r->report[1].supported);
    EXPECT_FALSE(r->report[1].chosen);
    EXPECT_NE(r->report[1].reason.find("lower priority than cpu/CpuMonolithic"), std::string::npos);
  }
}

TEST(Oracle, CustomRoutingFallsBackToModular) {
  auto r = select_backend(small_config(RoutingMethod::kCustom), Platform::cpu_only());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kernel.name, "CpuModular");
  const CandidateReport* mono = find(*r, "CpuMonolithic");
  ASSERT_NE(mono, nullptr);
  EXPECT_FALSE(mono->supported);
  EXPECT_NE(mono->reason.find("custom"), std::string::npos) << mono->reason;
}

TEST(Oracle, AllToAllParallelConfigFallsBackToModular) {
  MoeConfig c = small_config();
  c.parallel.dp_size = 2;
  c.parallel.ep_size = 2;
  c.parallel.all2all = All2AllBackend::kNccl;
  ASSERT_TRUE(c.parallel.use_all2all());
  auto r = select_backend(c, Platform::cpu_only());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kernel.name, "CpuModular");
  EXPECT_NE(find(*r, "CpuMonolithic")->reason.find("all-to-all"), std::string::npos);
}

TEST(Oracle, EplbFallsBackToModular) {
  MoeConfig c = small_config();
  c.parallel.enable_eplb = true;
  auto r = select_backend(c, Platform::cpu_only());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kernel.name, "CpuModular");
  EXPECT_NE(find(*r, "CpuMonolithic")->reason.find("EPLB"), std::string::npos);
}

TEST(Oracle, CaptureAndReplayKeepTheCapableMonolithic) {
  // The CPU monolithic kernel writes routing_replay_out and accepts forced ids.
  MoeConfig c = small_config();
  c.needs_capture = true;
  c.needs_replay = true;
  auto r = select_backend(c, Platform::cpu_only());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kernel.name, "CpuMonolithic");
}

TEST(Oracle, KernelClassesDeclareTheCaptureTheirKernelsDo) {
  // writes_routing_replay_out on the class is what select_backend reads; the
  // kernel instance is what writes. They must agree for every class here.
  const Platform& platform = Platform::probe();
  int checked = 0;
  for (const Backend& b : backend_registry(platform)) {
    for (const KernelClass& kc : b.candidates) {
      if (!kc.supports(small_config(), platform).ok) continue;
      auto kernel = kc.create(small_config(), platform);
      ASSERT_TRUE(kernel.ok()) << kc.name << ": " << kernel.status().to_string();
      if (kc.monolithic) {
        EXPECT_EQ(kc.writes_routing_replay_out, (*kernel)->supports_routing_replay_capture()) << kc.name;
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 2);  // the CPU classes at least
}

TEST(Oracle, ForcedCpuBackendIsUsed) {
  MoeConfig c = small_config();
  c.backend = "cpu";
  auto r = select_backend(c, Platform::cpu_only());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->backend, "cpu");
}

TEST(Oracle, ForcedUnknownBackendIsNotFound) {
  MoeConfig c = small_config();
  c.backend = "tpu_v9";
  auto r = select_backend(c, Platform::cpu_only());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("tpu_v9"), std::string::npos);
  EXPECT_NE(r.status().message().find("available: cpu"), std::string::npos) << r.status().message();
}

TEST(Oracle, InvalidConfigIsRejectedBeforeAnyCandidate) {
  MoeConfig c = small_config();
  c.routing.top_k = 17;  // > E
  auto r = select_backend(c, Platform::cpu_only());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("routing.top_k"), std::string::npos);
}

// ---------------------------------------------------------------- a fake GPU backend

// FakeMono: a monolithic GPU kernel that knows renormalize and deepseek_v3 only
// and cannot write routed ids. FakeModular: any routing, capture capable. Both
// need a compute capability 9.0 device.
Support fake_device(const Platform& p) {
  for (const auto& d : p.cuda_devices) {
    if (d.cc_major == 9 && d.cc_minor == 0) return Support::yes();
  }
  return Support::no("needs a device with compute capability 9.0");
}
Support fake_mono_supports(const MoeConfig& c, const Platform& p) {
  if (Support s = fake_device(p); !s.ok) return s;
  if (c.routing.method != RoutingMethod::kRenormalize && c.routing.method != RoutingMethod::kDeepseekV3) {
    return Support::no(std::string("routing method ") + routing_method_name(c.routing.method) + " not built in");
  }
  if (c.parallel.use_all2all()) return Support::no("no all-to-all dispatch");
  if (c.needs_capture) return Support::no("cannot write routed expert ids (capture)");
  return Support::yes();
}
Support fake_modular_supports(const MoeConfig& c, const Platform& p) { return fake_device(p); }
Support never_supports(const MoeConfig&, const Platform&) { return Support::no("never fits (test)"); }
StatusOr<std::unique_ptr<MoeKernel>> no_create(const MoeConfig&, const Platform&) {
  return Unsupported("test kernels are never built");
}

std::vector<Backend> fake_registry() {
  std::vector<Backend> reg;
  reg.push_back({"fake_gpu",
                 {KernelClass{"FakeMono", true, &fake_mono_supports, &no_create},
                  KernelClass{"FakeModular", false, &fake_modular_supports, &no_create}}});
  for (Backend& b : backend_registry(Platform::cpu_only())) reg.push_back(std::move(b));
  return reg;
}

Platform fake_gpu_platform(int cc_major = 9) {
  Platform p = Platform::cpu_only(4);
  p.cuda_built = true;
  p.sm90a_built = true;
  CudaDeviceInfo d;
  d.name = "Fake";
  d.cc_major = cc_major;
  d.cc_minor = 0;
  d.sm_count = 132;
  p.cuda_devices.push_back(d);
  return p;
}

TEST(OracleFake, MonolithicFirstWhenItFits) {
  auto r = select_backend(small_config(RoutingMethod::kRenormalize), fake_gpu_platform(), fake_registry());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->backend, "fake_gpu");
  EXPECT_EQ(r->kernel.name, "FakeMono");
  // Every candidate of every backend is in the report, in walk order.
  ASSERT_EQ(r->report.size(), 4u);
  EXPECT_EQ(r->report[0].kernel, "FakeMono");
  EXPECT_EQ(r->report[1].kernel, "FakeModular");
  EXPECT_EQ(r->report[2].kernel, "CpuMonolithic");
  EXPECT_EQ(r->report[3].kernel, "CpuModular");
}

TEST(OracleFake, RoutingMethodTheMonolithicLacksFallsBackToModular) {
  auto r = select_backend(small_config(RoutingMethod::kSigmoid), fake_gpu_platform(), fake_registry());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->backend, "fake_gpu");
  EXPECT_EQ(r->kernel.name, "FakeModular");
  EXPECT_NE(find(*r, "FakeMono")->reason.find("routing method sigmoid"), std::string::npos);
}

TEST(OracleFake, AllToAllFallsBackToModular) {
  MoeConfig c = small_config(RoutingMethod::kRenormalize);
  c.parallel.dp_size = 2;
  c.parallel.ep_size = 4;
  c.parallel.all2all = All2AllBackend::kNccl;
  auto r = select_backend(c, fake_gpu_platform(), fake_registry());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kernel.name, "FakeModular");
}

TEST(OracleFake, CaptureRequestedChoosesACapableClass) {
  MoeConfig c = small_config(RoutingMethod::kRenormalize);
  c.needs_capture = true;
  auto r = select_backend(c, fake_gpu_platform(), fake_registry());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kernel.name, "FakeModular");
  EXPECT_NE(find(*r, "FakeMono")->reason.find("capture"), std::string::npos);
}

TEST(OracleFake, AutoSkipsABackendWithoutItsDevice) {
  auto r = select_backend(small_config(RoutingMethod::kRenormalize), fake_gpu_platform(/*cc_major=*/8),
                          fake_registry());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->backend, "cpu");
  EXPECT_EQ(r->kernel.name, "CpuMonolithic");
  EXPECT_NE(find(*r, "FakeMono")->reason.find("compute capability 9.0"), std::string::npos);
}

TEST(OracleFake, ForcedBackendThatCannotServeNeverFallsBack) {
  MoeConfig c = small_config(RoutingMethod::kRenormalize);
  c.backend = "fake_gpu";
  auto r = select_backend(c, fake_gpu_platform(/*cc_major=*/8), fake_registry());
  ASSERT_FALSE(r.ok());  // cpu could serve it, but the user forced fake_gpu
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("'fake_gpu' (forced)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("FakeMono"), std::string::npos) << msg;
  EXPECT_NE(msg.find("FakeModular"), std::string::npos) << msg;
  EXPECT_NE(msg.find("compute capability 9.0"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("CpuMonolithic"), std::string::npos) << "a forced backend considers only itself: " << msg;
}

TEST(OracleFake, ForcedBackendIsUsedEvenWhenAnEarlierOneFits) {
  MoeConfig c = small_config(RoutingMethod::kRenormalize);
  c.backend = "cpu";
  auto r = select_backend(c, fake_gpu_platform(), fake_registry());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->backend, "cpu");
  EXPECT_EQ(r->report.size(), 2u);
}

TEST(OracleFake, NothingFitsListsEveryRejection) {
  std::vector<Backend> reg = {
      {"a", {KernelClass{"A1", true, &never_supports, &no_create}, KernelClass{"A2", false, &fake_modular_supports, &no_create}}},
      {"b", {KernelClass{"B1", false, &never_supports, &no_create}}},
  };
  auto r = select_backend(small_config(), Platform::cpu_only(), reg);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  const std::string msg = r.status().message();
  for (const char* want : {"A1", "A2", "B1", "never fits (test)", "compute capability 9.0"}) {
    EXPECT_NE(msg.find(want), std::string::npos) << want << " missing from: " << msg;
  }
}

Support always_supports(const MoeConfig&, const Platform&) { return Support::yes(); }

TEST(OracleFake, MonolithicWithoutCaptureIsRejectedWhenCaptureIsOn) {
  std::vector<Backend> reg{{"b",
                            {KernelClass{"Blind", true, &always_supports, &no_create},
                             KernelClass{"Modular", false, &always_supports, &no_create}}}};
  MoeConfig c = small_config();
  auto plain = select_backend(c, Platform::cpu_only(), reg);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->kernel.name, "Blind");
  c.needs_capture = true;
  auto captured = select_backend(c, Platform::cpu_only(), reg);
  ASSERT_TRUE(captured.ok()) << captured.status().to_string();
  EXPECT_EQ(captured->kernel.name, "Modular");
  EXPECT_NE(captured->report[0].reason.find("routing_replay_out"), std::string::npos) << captured->report[0].reason;
  reg[0].candidates[0].writes_routing_replay_out = true;
  auto capable = select_backend(c, Platform::cpu_only(), reg);
  ASSERT_TRUE(capable.ok());
  EXPECT_EQ(capable->kernel.name, "Blind");
}

TEST(OracleFake, EmptyRegistryIsAnError) {
  auto r = select_backend(small_config(), Platform::cpu_only(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
}

TEST(OracleFake, SelectionIsDeterministic) {
  MoeConfig c = small_config(RoutingMethod::kSigmoid);
  auto a = select_backend(c, fake_gpu_platform(), fake_registry());
  auto b = select_backend(c, fake_gpu_platform(), fake_registry());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->report_string(), b->report_string());
  EXPECT_EQ(a->kernel.name, b->kernel.name);
}

TEST(OracleFake, ReportNamesEveryCandidateAndTheChoice) {
  auto r = select_backend(small_config(RoutingMethod::kSigmoid), fake_gpu_platform(), fake_registry());
  ASSERT_TRUE(r.ok());
  const std::string s = r->report_string();
  EXPECT_NE(s.find("* fake_gpu"), std::string::npos) << s;
  EXPECT_NE(s.find("rejected: routing method sigmoid not built in"), std::string::npos) << s;
  EXPECT_NE(s.find("supported, not chosen: lower priority than fake_gpu/FakeModular"), std::string::npos) << s;
  EXPECT_NE(s.find("resolved: fake_gpu / FakeModular"), std::string::npos) << s;
}

}  // namespace
}  // namespace moekit

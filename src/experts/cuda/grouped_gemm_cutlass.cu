// The CUTLASS path's adapter (grouped_gemm_cutlass.h): validates, lays out
// the workspace, gathers A and applies the activation around the instantiated
// GEMM (grouped_gemm_cutlass_sm90_<tile>.cu, bf16 or 4-bit weights;
// grouped_gemm_cutlass_sm80_<tile>.cu, bf16). Includes no CUTLASS header, and
// is built for every CUDA architecture (the portable backend's prefill runs it).
//
// Gather and activation run blocks per (group, part): a block visits rows
// lo + part, lo + part + parts, ... of its group's rows inside the chunk only,
// so rows outside every group are never read (their row index may be
// undefined) nor written.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/cuda_check.h"
#include "core/cuda_func_attr.h"
#include "experts/cuda/activation.cuh"
#include "experts/cuda/grouped_gemm_cutlass.h"

namespace moekit::cuda {
namespace {

constexpr int kRowThreads = 256;  // threads of a gather / activation block
constexpr int kVec = 8;           // bf16 per 16-byte access
// Rows per block when group sizes match the estimate: one, so that a gather or
// activation pass has blocks enough to keep HBM busy (with four, Mixtral-8x7B
// M=256 ran the activation on 128 blocks at 13% of the read bandwidth).
constexpr int kRowsPerBlock = 1;
constexpr size_t kAlign = 256;

size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// NOTE: with the (M·k + E·64) rows bound of the MoE workspace (moe_pipeline.h,
// tests/cuda/test_layer_cuda.cpp): the chunk buffers take at most C's size for
// max(max_rows, scratch_rows) rows plus kSlackRowsPerGroup rows per group of (N + K).
constexpr int64_t kSlackRowsPerGroup = 32;

// How a problem's rows are split, and where the buffers sit in the workspace.
struct CutlassPlan {
  int64_t chunk_rows = 0;  // rows per launch (all of max_rows when no buffer is needed)
  int64_t chunks = 0;
  size_t gemm = 0;      // cutlass_gemm_workspace_size(tile, G, N), largest over tiles: tables + CUTLASS's own
  size_t gathered = 0;  // [chunk_rows, K] bf16, gather_a only: A rows of the chunk in row order
  size_t pre_act = 0;   // [chunk_rows, N] bf16, kActivation only: A·Bᵀ before the activation
  size_t total = 0;     // bytes
};

CutlassPlan plan(const GroupedGemmProblem& pr) {
  CutlassPlan p;
  const bool activation = pr.epilogue == GemmEpilogue::kActivation;
  const bool own_gather = pr.gather_a && !pr.gather_room;  // the gathered rows in our workspace
  const int64_t scratch_per_row = (own_gather ? pr.k : 0) + (activation ? pr.n : 0);  // bf16 elements
  p.chunk_rows = std::max<int64_t>(1, pr.max_rows);
  if (scratch_per_row > 0) {
    const int64_t room_rows = std::max(pr.max_rows, pr.scratch_rows);  // sized for room_rows: all of it is ours
    const int64_t budget = room_rows * pr.n_out() + pr.num_groups * kSlackRowsPerGroup * (pr.n + pr.k);
    p.chunk_rows = std::clamp<int64_t>(budget / scratch_per_row, 1, p.chunk_rows);
  }
  p.chunks = (pr.max_rows + p.chunk_rows - 1) / p.chunk_rows;
  // The instantiated GEMM's tables come first: room for the largest kernel's.
  size_t c = std::max(round_up(sm90::cutlass_w4_int4_n128_workspace_size(pr.num_groups)),
                      round_up(sm90::cutlass_w4_int4_n256_workspace_size(pr.num_groups)));
  for (CutlassTile t : kAllCutlassTiles) c = std::max(c, round_up(cutlass_gemm_workspace_size(t, pr.num_groups, pr.n)));
  p.gemm = 0;
  if (own_gather) {
    p.gathered = c;
    c += round_up(static_cast<size_t>(p.chunk_rows) * static_cast<size_t>(pr.k) * 2);
  }
  if (activation) {
    p.pre_act = c;
    c += round_up(static_cast<size_t>(p.chunk_rows) * static_cast<size_t>(pr.n) * 2);
  }
  p.total = c;
  return p;
}

struct RowSweep {
  const int32_t* group_start;  // [G]
  const int32_t* group_rows;   // [G]
  int row_begin, row_end;      // only group rows inside [row_begin, row_end)
  int vecs;                    // 16-byte vectors per output row
  int min_group_rows;          // smaller groups are skipped
};

// Calls f(row, vec) for every (group row inside the chunk, vector) of this block's share.
template <class F>
__device__ __forceinline__ void sweep_rows(const RowSweep& s, F&& f) {
  const int g = blockIdx.x;
  const int parts = gridDim.y, part = blockIdx.y;
  if (s.group_rows[g] < s.min_group_rows) return;
  const int start = s.group_start[g];
  const int lo = max(start, s.row_begin), hi = min(start + s.group_rows[g], s.row_end);
  if (lo + part >= hi) return;
  const int mine = (hi - lo - part + parts - 1) / parts;  // rows lo + part, lo + part + parts, ... below hi
  for (int i = threadIdx.x; i < mine * s.vecs; i += blockDim.x) {
    const int local = i / s.vecs, v = i - local * s.vecs;
    f(lo + part + local * parts, v);
  }
}

// dst[r - row_begin, :] = a[row_index[r], :] for every group row r of the chunk.
__global__ void __launch_bounds__(kRowThreads) gather_rows_kernel(RowSweep s, const uint4* __restrict__ a,
                                                                    const int32_t* __restrict__ row_index,
                                                                    uint4* __restrict__ dst) {
  sweep_rows(s, [&](int r, int v) {
    dst[static_cast<int64_t>(r - s.row_begin) * s.vecs + v] = a[static_cast<int64_t>(row_index[r]) * s.vecs + v];
  });
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&p);
}

// c[r, :] = act(pre[r - row_begin, :]) for every group row r of the chunk.
// Gated: output columns pair pre-activation columns of the kGateUpBlock layout.
__global__ void __launch_bounds__(kRowThreads) activation_kernel(RowSweep s, const uint4* __restrict__ pre,
                                                                   int pre_vecs, uint4* __restrict__ c, bool gated,
                                                                   ActivationParams act) {
  static_assert(kGateUpBlock % kVec == 0, "a vector of outputs lies within one gate block");
  sweep_rows(s, [&](int r, int v) {
    const uint4* row = pre + static_cast<int64_t>(r - s.row_begin) * pre_vecs;
    uint4 out;
    uint32_t* o = reinterpret_cast<uint32_t*>(&out);
    if (gated) {
      // NOTE: kGateUpBlock layout (grouped_gemm.h): output columns [16b, 16b + 16)
      // come from gate columns [32b, 32b + 16) and up columns [32b + 16, 32b + 32).
      constexpr int kVecsPerBlock = kGateUpBlock / kVec;
      const int b = v / kVecsPerBlock, within = v % kVecsPerBlock;
      const uint4 gv = row[2 * b * kVecsPerBlock + within];
      const uint4 uv = row[(2 * b + 1) * kVecsPerBlock + within];
      const uint32_t* gw = reinterpret_cast<const uint32_t*>(&gv);
      const uint32_t* uw = reinterpret_cast<const uint32_t*>(&uv);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        o[j] = pack_bf16(gated_activation(act, bf16_lo(gw[j]), bf16_lo(uw[j])),
                         gated_activation(act, bf16_hi(gw[j]), bf16_hi(uw[j])));
      }
    } else {
      const uint4 xv = row[v];
      const uint32_t* xw = reinterpret_cast<const uint32_t*>(&xv);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        o[j] = pack_bf16(plain_activation(act, bf16_lo(xw[j])), plain_activation(act, bf16_hi(xw[j])));
      }
    }
    c[static_cast<int64_t>(r) * s.vecs + v] = out;
  });
}

// Blocks per group: about kRowsPerBlock rows each at the estimated group size in a chunk.
dim3 sweep_grid(const GroupedGemmProblem& pr, int64_t chunk_rows) {
  const int64_t groups = std::max<int64_t>(1, std::min(pr.num_groups, chunk_rows));
  const int64_t rows_per_group = (chunk_rows + groups - 1) / groups;
  const int64_t parts = std::clamp<int64_t>((rows_per_group + kRowsPerBlock - 1) / kRowsPerBlock, 1, 65535);
  return dim3(static_cast<unsigned>(pr.num_groups), static_cast<unsigned>(parts));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int device_sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
  return sms;
}

}  // namespace

size_t cutlass_gemm_workspace_size(CutlassTile tile, int64_t num_groups, int64_t n) {
  switch (tile) {
    case CutlassTile::kM128N256: return sm90::cutlass_m128n256_workspace_size(num_groups);
    case CutlassTile::kM64N256: return sm90::cutlass_m64n256_workspace_size(num_groups);
    case CutlassTile::kSwapN32: return sm90::cutlass_swap_n32_workspace_size(num_groups);
    case CutlassTile::kSwapN64: return sm90::cutlass_swap_n64_workspace_size(num_groups);
    case CutlassTile::kSm80M128N256: return sm80::cutlass_m128n256_workspace_size(num_groups, n);
    case CutlassTile::kSm80M128N128: return sm80::cutlass_m128n128_workspace_size(num_groups, n);
  }
  return 0;
}

Status cutlass_gemm(CutlassTile tile, const CutlassGemmLaunch& launch, cudaStream_t stream) {
  switch (tile) {
    case CutlassTile::kM128N256: return sm90::cutlass_m128n256_gemm(launch, stream);
    case CutlassTile::kM64N256: return sm90::cutlass_m64n256_gemm(launch, stream);
    case CutlassTile::kSwapN32: return sm90::cutlass_swap_n32_gemm(launch, stream);
    case CutlassTile::kSwapN64: return sm90::cutlass_swap_n64_gemm(launch, stream);
    case CutlassTile::kSm80M128N256: return sm80::cutlass_m128n256_gemm(launch, stream);
    case CutlassTile::kSm80M128N128: return sm80::cutlass_m128n128_gemm(launch, stream);
  }
  return Internal("CUTLASS grouped GEMM: unknown tile");
}

namespace {

// The problem's limits, whichever tile runs it.
Support cutlass_problem_supports(const GroupedGemmProblem& pr) {
  if (pr.out_dtype != DType::kBF16) {
    return Support::no(std::string("CUTLASS grouped GEMM: output dtype ") + dtype_name(pr.out_dtype) +
                       " (only bf16 is instantiated)");
  }
  if (pr.k < 8 || pr.k % 8 != 0 || pr.n < 8 || pr.n % 8 != 0) {
    return Support::no("CUTLASS grouped GEMM: N=" + std::to_string(pr.n) + " and K=" + std::to_string(pr.k) +
                       " must be multiples of 8 (16-byte rows)");
  }
  const bool gated = pr.epilogue == GemmEpilogue::kActivation && pr.activation.gated();
  if (gated && pr.n % (2 * kGateUpBlock) != 0) {
    return Support::no("CUTLASS grouped GEMM: gated N=" + std::to_string(pr.n) + " must be a multiple of " +
                       std::to_string(2 * kGateUpBlock));
  }
  if (pr.num_groups < 1 || pr.num_groups > (1 << 20)) return Support::no("CUTLASS grouped GEMM needs 1..2^20 groups");
  if (pr.max_rows > INT32_MAX / 2 || pr.a_rows > INT32_MAX / 2 || pr.n > INT32_MAX / 2 || pr.k > INT32_MAX / 2 ||
      pr.num_groups * ((pr.n + 127) / 128) > INT32_MAX / 2) {  // the sm80 tiles' (group, column strip) problems
    return Support::no("CUTLASS grouped GEMM sizes exceed int32 problem shapes");
  }
  return Support::yes();
}

int sm80_tile_smem_bytes(CutlassTile tile) {
  return tile == CutlassTile::kSm80M128N256 ? sm80::cutlass_m128n256_smem_bytes() : sm80::cutlass_m128n128_smem_bytes();
}

}  // namespace

Support cutlass_grouped_gemm_supports(const GroupedGemmProblem& pr) {
  // The portable tile every sm_80+ device fits stands for the sm80 family.
  return cutlass_tile_supports(pr, pr.target == CudaTarget::kSm90 ? CutlassTile::kM64N256 : CutlassTile::kSm80M128N128);
}

Support cutlass_tile_supports(const GroupedGemmProblem& pr, CutlassTile tile) {
  if (is_sm80_cutlass_tile(tile)) {
    const int optin = current_device_smem_optin();
    if (optin > 0 && sm80_tile_smem_bytes(tile) > optin) {
      return Support::no(std::string("CUTLASS tile ") + cutlass_tile_name(tile) + " needs " +
                         std::to_string(sm80_tile_smem_bytes(tile)) + " bytes of shared memory per block; the device offers " +
                         std::to_string(optin));
    }
  } else if (pr.target != CudaTarget::kSm90) {
    return Support::no(std::string("CUTLASS tile ") + cutlass_tile_name(tile) + " needs wgmma and TMA (cuda_sm90); target " +
                       cuda_target_name(pr.target));
  }
  return cutlass_problem_supports(pr);
}

size_t cutlass_grouped_gemm_workspace_size(const GroupedGemmProblem& pr) { return plan(pr).total; }

namespace {

// Both entry points: validation, then per chunk of rows the gather, the
// instantiated GEMM (`gemm`, given a launch with everything but the weights'
// own fields) and the activation. `b` stands for the weights in the checks.
template <class Gemm>  // Status(CutlassGemmLaunch&)
Status run_chunks(const GroupedGemmProblem& pr, const GroupedGemmArgs& args, const void* b, cudaStream_t stream,
                  int min_group_rows, Gemm&& gemm) {
  if (args.a == nullptr || b == nullptr || args.c == nullptr || args.group_start == nullptr ||
      args.group_rows == nullptr || args.workspace == nullptr || (pr.gather_a && args.a_row_index == nullptr) ||
      (pr.gather_a && pr.gather_room && args.gather_room == nullptr)) {
    return InvalidArgument("CUTLASS grouped GEMM: a required pointer is null in " + pr.to_string());
  }
  if (!aligned16(args.a) || !aligned16(b) || !aligned16(args.c) || !aligned16(args.workspace) ||
      !aligned16(args.gather_room)) {
    return InvalidArgument("CUTLASS grouped GEMM: a, b, c, gather_room and workspace must be 16-byte aligned");
  }
  if (pr.max_rows == 0) return Status::Ok();
  const int sms = std::min(device_sm_count(), kCutlassMaxSmCount);
  if (sms < 1) return Internal("CUTLASS grouped GEMM: cannot read the device's SM count");

  const CutlassPlan w = plan(pr);
  char* ws = static_cast<char*>(args.workspace);
  const dim3 grid = sweep_grid(pr, w.chunk_rows);
  const bool activation = pr.epilogue == GemmEpilogue::kActivation;
  auto* gathered = static_cast<uint16_t*>(pr.gather_room ? args.gather_room : ws + w.gathered);  // [chunk_rows, K]
  auto* pre_act = reinterpret_cast<uint16_t*>(ws + w.pre_act);    // [chunk_rows, N] bf16 (kActivation)
  for (int64_t chunk = 0; chunk < w.chunks; ++chunk) {
    const int row_begin = static_cast<int>(chunk * w.chunk_rows);
    const int row_end = static_cast<int>(std::min(pr.max_rows, (chunk + 1) * w.chunk_rows));
    if (pr.gather_a) {
      const RowSweep s{args.group_start, args.group_rows, row_begin, row_end, static_cast<int>(pr.k / kVec),
                       min_group_rows};
      gather_rows_kernel<<<grid, kRowThreads, 0, stream>>>(s, reinterpret_cast<const uint4*>(args.a),
                                                           args.a_row_index, reinterpret_cast<uint4*>(gathered));
      MOEKIT_CUDA_CHECK_LAUNCH("gather_rows_kernel");
    }
    CutlassGemmLaunch l;
    l.num_groups = static_cast<int>(pr.num_groups);
    l.n = static_cast<int>(pr.n);
    l.k = static_cast<int>(pr.k);
    l.sm_count = sms;
    l.row_begin = row_begin;
    l.row_end = row_end;
    l.a = pr.gather_a ? gathered : args.a;
    l.a_row0 = pr.gather_a ? row_begin : 0;
    l.b = b;
    l.d = activation ? pre_act : static_cast<uint16_t*>(args.c);
    l.d_row0 = activation ? row_begin : 0;
    l.group_start = args.group_start;
    l.group_rows = args.group_rows;
    l.min_group_rows = min_group_rows;
    l.workspace = ws + w.gemm;
    MOEKIT_RETURN_IF_ERROR(gemm(l));
    if (activation) {
      const RowSweep s{args.group_start, args.group_rows, row_begin, row_end, static_cast<int>(pr.n_out() / kVec),
                       min_group_rows};
      activation_kernel<<<grid, kRowThreads, 0, stream>>>(
          s, reinterpret_cast<const uint4*>(pre_act), static_cast<int>(pr.n / kVec), static_cast<uint4*>(args.c),
          pr.activation.gated(),
          ActivationParams{pr.activation.kind, pr.activation.swiglu_limit, pr.activation.swiglu_alpha});
      MOEKIT_CUDA_CHECK_LAUNCH("activation_kernel");
    }
  }
  return Status::Ok();
}

}  // namespace

Status cutlass_grouped_gemm(const GroupedGemmProblem& pr, const GroupedGemmArgs& args, CutlassTile tile,
                            cudaStream_t stream, int min_group_rows) {
  const Support sup = cutlass_tile_supports(pr, tile);
  if (!sup.ok) return Unsupported(sup.reason);
  return run_chunks(pr, args, args.b, stream, min_group_rows,
                    [&](CutlassGemmLaunch& l) { return cutlass_gemm(tile, l, stream); });
}

Support cutlass_weight4_grouped_gemm_supports(const GroupedGemmProblem& pr, QuantMethod method) {
  if (method != QuantMethod::kInt4G128) {
    return Support::no(std::string("CUTLASS 4-bit grouped GEMM: ") + quant_method_name(method) +
                       " (the sm90 mixed-input mainloop takes one scale per row per K tile of at least 64: "
                       "int4_g128 only)");
  }
  // The tiles of the sm90 family stand for its 4-bit kernels' limits.
  const Support sup = cutlass_tile_supports(pr, CutlassTile::kM64N256);
  if (!sup.ok) return sup;
  if (pr.k % weight4_group(method) != 0) {
    return Support::no("CUTLASS 4-bit grouped GEMM: K=" + std::to_string(pr.k) + " is not in whole " +
                       quant_method_name(method) + " scale groups");
  }
  return Support::yes();
}

size_t cutlass_weight4_grouped_gemm_workspace_size(const GroupedGemmProblem& pr) { return plan(pr).total; }

Status cutlass_weight4_grouped_gemm(const GroupedGemmProblem& pr, const GroupedGemmArgs& args,
                                    const CutlassWeight4& weights, CutlassW4Tile tile, cudaStream_t stream) {
  const Support sup = cutlass_weight4_grouped_gemm_supports(pr, weights.method);
  if (!sup.ok) return Unsupported(sup.reason);
  if (weights.scales == nullptr || !aligned16(weights.scales)) {
    return InvalidArgument("CUTLASS 4-bit grouped GEMM: scales null or not 16-byte aligned");
  }
  return run_chunks(pr, args, weights.packed, stream, /*min_group_rows=*/1, [&](CutlassGemmLaunch& l) {
    l.b_scale = weights.scales;
    l.scale_group = static_cast<int>(weight4_group(weights.method));
    return tile == CutlassW4Tile::kN256 ? sm90::cutlass_w4_int4_n256_gemm(l, stream)
                                        : sm90::cutlass_w4_int4_n128_gemm(l, stream);
  });
}

}  // namespace moekit::cuda

// The reference implementation of grouped_gemm.h: a plain tiled tensor-core
// kernel (WMMA bf16 16x16x16, fp32 accumulate). Correctness first: every
// output element is computed by one block in a fixed K order (deterministic);
// partial tiles are masked; no host synchronization.
//
// Schedule: a one-block prologue writes tile_prefix[G + 1] (exclusive prefix of
// ceil(rows_g / kBlockM)) into the workspace; the main grid has an upper bound
// of tiles along x (blocks past the real count exit) and N tiles along y.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/cuda_check.h"
#include "experts/cuda/activation.cuh"
#include "experts/cuda/grouped_gemm.h"
#include "experts/cuda/grouped_gemm_sm90.h"

namespace moekit::cuda {

namespace {

struct MmaTraits {
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 64;
  static constexpr int kBlockK = 32;
  static constexpr int kThreads = 128;  // 4 warps, 2 x 2, each 32 x 32
  static constexpr int kPadK = 8;       // smem row padding (bf16), keeps WMMA ldm a multiple of 8
  static constexpr int kPadC = 4;       // fp32 epilogue tile padding
  static constexpr int kVec = 8;        // bf16 per 16-byte load
  static_assert(kBlockN % (2 * kGateUpBlock) == 0, "a tile must hold whole gate/up block pairs");
  static_assert(kBlockM * kBlockK / kVec == 2 * kThreads, "A tile: two 16-byte loads per thread");
  static_assert(kBlockN * kBlockK / kVec == 2 * kThreads, "B tile: two 16-byte loads per thread");
};

constexpr int kScanThreads = 1024;

// tile_prefix[g] = sum over g' < g of ceil(group_rows[g'] / kBlockM); tile_prefix[G] = total.
__global__ void tile_prefix_kernel(const int32_t* __restrict__ group_rows, int num_groups, int32_t* tile_prefix) {
  __shared__ int32_t partial[kScanThreads];
  const int t = threadIdx.x;
  const int per = (num_groups + kScanThreads - 1) / kScanThreads;
  const int begin = min(num_groups, t * per), end = min(num_groups, begin + per);
  int32_t sum = 0;
  for (int g = begin; g < end; ++g) sum += (group_rows[g] + MmaTraits::kBlockM - 1) / MmaTraits::kBlockM;
  partial[t] = sum;
  __syncthreads();
  for (int off = 1; off < kScanThreads; off *= 2) {  // inclusive Hillis-Steele scan
    const int32_t v = t >= off ? partial[t - off] : 0;
    __syncthreads();
    partial[t] += v;
    __syncthreads();
  }
  int32_t run = partial[t] - sum;  // exclusive
  for (int g = begin; g < end; ++g) {
    tile_prefix[g] = run;
    run += (group_rows[g] + MmaTraits::kBlockM - 1) / MmaTraits::kBlockM;
  }
  if (t == kScanThreads - 1) tile_prefix[num_groups] = partial[t];
}

struct KernelParams {
  const __nv_bfloat16* a;     // [a_rows, K]
  const int32_t* a_row_index;  // [max_rows] or null
  const __nv_bfloat16* b;     // [G, N, K]
  void* c;                    // [max_rows, n_out]
  const int32_t* group_start;  // [G]
  const int32_t* group_rows;   // [G]
  const int32_t* tile_prefix;  // [G + 1]
  int num_groups;
  int n, k, n_out;
  bool activation;
  bool gated;
  ActivationParams act;
};

template <typename OutT>
__device__ __forceinline__ void store_out(void* c, int64_t i, float v) {
  if constexpr (sizeof(OutT) == 4) {
    static_cast<float*>(c)[i] = v;
  } else {
    static_cast<__nv_bfloat16*>(c)[i] = __float2bfloat16_rn(v);
  }
}

template <typename OutT, bool kGather>
__global__ void __launch_bounds__(MmaTraits::kThreads) grouped_gemm_kernel(KernelParams p) {
  using T = MmaTraits;
  namespace wmma = nvcuda::wmma;
  __shared__ __align__(128) __nv_bfloat16 a_s[T::kBlockM][T::kBlockK + T::kPadK];  // (BLK_M, BLK_K)
  __shared__ __align__(128) __nv_bfloat16 b_s[T::kBlockN][T::kBlockK + T::kPadK];  // (BLK_N, BLK_K)
  __shared__ __align__(128) float c_s[T::kBlockM][T::kBlockN + T::kPadC];          // (BLK_M, BLK_N)
  __shared__ int32_t src_row[T::kBlockM];  // A row of each tile row, -1 past the group's end

  const int tile = blockIdx.x;
  if (tile >= p.tile_prefix[p.num_groups]) return;
  // The group owning this tile: the last g with tile_prefix[g] <= tile (non-empty groups are unique).
  int lo = 0, hi = p.num_groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.tile_prefix[mid] <= tile) lo = mid; else hi = mid - 1;
  }
  const int g = lo;
  const int row0 = p.group_start[g] + (tile - p.tile_prefix[g]) * T::kBlockM;
  const int rows = min(T::kBlockM, p.group_start[g] + p.group_rows[g] - row0);
  const int n0 = blockIdx.y * T::kBlockN;
  const int tid = threadIdx.x;

  if (tid < T::kBlockM) {
    const int r = row0 + tid;
    src_row[tid] = tid < rows ? (kGather ? p.a_row_index[r] : r) : -1;
  }
  __syncthreads();

  const int warp = tid / 32;
  const int wm = warp / 2, wn = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  const __nv_bfloat16* b_g = p.b + static_cast<int64_t>(g) * p.n * p.k;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int k0 = 0; k0 < p.k; k0 += T::kBlockK) {
    for (int l = tid; l < T::kBlockM * T::kBlockK / T::kVec; l += T::kThreads) {
      const int r = l / (T::kBlockK / T::kVec), cv = (l % (T::kBlockK / T::kVec)) * T::kVec;
      const int src = src_row[r];
      const int kk = k0 + cv;
      uint4 v = zero;
      if (src >= 0 && kk < p.k) v = *reinterpret_cast<const uint4*>(p.a + static_cast<int64_t>(src) * p.k + kk);
      *reinterpret_cast<uint4*>(&a_s[r][cv]) = v;
    }
    for (int l = tid; l < T::kBlockN * T::kBlockK / T::kVec; l += T::kThreads) {
      const int r = l / (T::kBlockK / T::kVec), cv = (l % (T::kBlockK / T::kVec)) * T::kVec;
      const int n = n0 + r, kk = k0 + cv;
      uint4 v = zero;
      if (n < p.n && kk < p.k) v = *reinterpret_cast<const uint4*>(b_g + static_cast<int64_t>(n) * p.k + kk);
      *reinterpret_cast<uint4*>(&b_s[r][cv]) = v;
    }
    __syncthreads();
    for (int kk = 0; kk < T::kBlockK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &a_s[wm * 32 + i * 16][kk], T::kBlockK + T::kPadK);
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &b_s[wn * 32 + j * 16][kk], T::kBlockK + T::kPadK);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&c_s[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], T::kBlockN + T::kPadC,
                              wmma::mem_row_major);
  __syncthreads();

  if (p.gated) {
    // NOTE: kGateUpBlock layout (grouped_gemm.h): within each 2*kGateUpBlock
    // columns, the first half are gates, the second half their ups.
    constexpr int kOutCols = T::kBlockN / 2;
    for (int l = tid; l < T::kBlockM * kOutCols; l += T::kThreads) {
      const int r = l / kOutCols, oc = l % kOutCols;
      const int gc = (oc / kGateUpBlock) * 2 * kGateUpBlock + oc % kGateUpBlock;
      if (r >= rows || n0 + gc >= p.n) continue;
      const float v = gated_activation(p.act, c_s[r][gc], c_s[r][gc + kGateUpBlock]);
      store_out<OutT>(p.c, static_cast<int64_t>(row0 + r) * p.n_out + n0 / 2 + oc, v);
    }
  } else {
    for (int l = tid; l < T::kBlockM * T::kBlockN; l += T::kThreads) {
      const int r = l / T::kBlockN, cc = l % T::kBlockN;
      if (r >= rows || n0 + cc >= p.n) continue;
      float v = c_s[r][cc];
      if (p.activation) v = plain_activation(p.act, v);
      store_out<OutT>(p.c, static_cast<int64_t>(row0 + r) * p.n_out + n0 + cc, v);
    }
  }
}

int64_t max_tiles(const GroupedGemmProblem& pr) {
  // Sum over groups of ceil(rows_g / BM) <= max_rows / BM + (number of non-empty groups).
  return (pr.max_rows + MmaTraits::kBlockM - 1) / MmaTraits::kBlockM + std::min(pr.num_groups, pr.max_rows);
}

}  // namespace

Support grouped_gemm_supports(const GroupedGemmProblem& pr) {
  if (pr.out_dtype != DType::kBF16 && pr.out_dtype != DType::kF32) {
    return Support::no(std::string("grouped GEMM output dtype ") + dtype_name(pr.out_dtype) + " (needs bf16|f32)");
  }
  if (pr.num_groups < 1 || pr.num_groups > (1 << 20)) return Support::no("grouped GEMM needs 1..2^20 groups");
  if (pr.k < 8 || pr.k % 8 != 0) return Support::no("grouped GEMM K=" + std::to_string(pr.k) + " must be a multiple of 8");
  if (pr.n < 8 || pr.n % 8 != 0) return Support::no("grouped GEMM N=" + std::to_string(pr.n) + " must be a multiple of 8");
  const bool gated = pr.epilogue == GemmEpilogue::kActivation && pr.activation.gated();
  if (gated && pr.n % (2 * kGateUpBlock) != 0) {
    return Support::no("gated grouped GEMM N=" + std::to_string(pr.n) + " must be a multiple of " +
                       std::to_string(2 * kGateUpBlock));
  }
  if (pr.max_rows < 0 || pr.max_rows > INT32_MAX / 2 || pr.a_rows > INT32_MAX / 2) {
    return Support::no("grouped GEMM rows exceed int32 indexing");
  }
  if ((pr.n / MmaTraits::kBlockN) > 65535) return Support::no("grouped GEMM N too large for the grid");
  if (pr.k_splits < 1) return Support::no("grouped GEMM k_splits must be >= 1");
  if (pr.k_splits > 1 && (pr.epilogue != GemmEpilogue::kNone || pr.out_dtype != DType::kF32)) {
    return Support::no("grouped GEMM K slices need an f32 output without an epilogue");
  }
  return Support::yes();
}

int64_t grouped_gemm_k_splits(const GroupedGemmProblem& pr) { return sm90_gemm_k_splits(pr); }

std::string grouped_gemm_plan(const GroupedGemmProblem& pr) {
  const Support s = grouped_gemm_supports(pr);
  return s.ok ? choose_sm90_gemm(pr).to_string() : "unsupported: " + s.reason;
}

size_t grouped_gemm_workspace_size(const GroupedGemmProblem& pr) {
  // tile_prefix, or what the Hopper path the table may pick needs.
  return std::max(sizeof(int32_t) * static_cast<size_t>(pr.num_groups + 1), sm90_gemm_workspace_size(pr));
}

Status grouped_gemm(const GroupedGemmProblem& pr, const GroupedGemmArgs& args, cudaStream_t stream) {
  const Support s = grouped_gemm_supports(pr);
  if (!s.ok) return Unsupported(s.reason);
  if (args.a == nullptr || args.b == nullptr || args.c == nullptr || args.group_start == nullptr ||
      args.group_rows == nullptr || args.workspace == nullptr || (pr.gather_a && args.a_row_index == nullptr)) {
    return InvalidArgument("grouped GEMM: a required pointer is null in " + pr.to_string());
  }
  if (pr.max_rows == 0) return Status::Ok();
  // The Hopper paths (grouped_gemm_sm90.h) serve every problem their table picks them for.
  const Sm90GemmChoice choice = choose_sm90_gemm(pr);
  if (choice.path != Sm90GemmPath::kReference) return run_sm90_gemm(choice, pr, args, stream);
  if (pr.k_splits > 1) return Unsupported("grouped GEMM: the reference kernel has no K slices; " + choice.reason);
  auto* tile_prefix = static_cast<int32_t*>(args.workspace);
  tile_prefix_kernel<<<1, kScanThreads, 0, stream>>>(args.group_rows, static_cast<int>(pr.num_groups), tile_prefix);
  MOEKIT_CUDA_CHECK_LAUNCH("tile_prefix_kernel");

  KernelParams p{};
  p.a = reinterpret_cast<const __nv_bfloat16*>(args.a);
  p.a_row_index = args.a_row_index;
  p.b = reinterpret_cast<const __nv_bfloat16*>(args.b);
  p.c = args.c;
  p.group_start = args.group_start;
  p.group_rows = args.group_rows;
  p.tile_prefix = tile_prefix;
  p.num_groups = static_cast<int>(pr.num_groups);
  p.n = static_cast<int>(pr.n);
  p.k = static_cast<int>(pr.k);
  p.n_out = static_cast<int>(pr.n_out());
  p.activation = pr.epilogue == GemmEpilogue::kActivation;
  p.gated = p.activation && pr.activation.gated();
  p.act = ActivationParams{pr.activation.kind, pr.activation.swiglu_limit, pr.activation.swiglu_alpha};

  const dim3 grid(static_cast<unsigned>(max_tiles(pr)),
                  static_cast<unsigned>((pr.n + MmaTraits::kBlockN - 1) / MmaTraits::kBlockN));
  const bool f32 = pr.out_dtype == DType::kF32;
  if (f32 && pr.gather_a) {
    grouped_gemm_kernel<float, true><<<grid, MmaTraits::kThreads, 0, stream>>>(p);
  } else if (f32) {
    grouped_gemm_kernel<float, false><<<grid, MmaTraits::kThreads, 0, stream>>>(p);
  } else if (pr.gather_a) {
    grouped_gemm_kernel<__nv_bfloat16, true><<<grid, MmaTraits::kThreads, 0, stream>>>(p);
  } else {
    grouped_gemm_kernel<__nv_bfloat16, false><<<grid, MmaTraits::kThreads, 0, stream>>>(p);
  }
  MOEKIT_CUDA_CHECK_LAUNCH("grouped_gemm_kernel");
  return Status::Ok();
}

}  // namespace moekit::cuda

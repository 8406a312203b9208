// Grouped GEMM over experts: the one seam between the MoE pipeline (align,
// permute, finalize) and the matrix kernels, so faster GEMMs can replace the
// reference tiled kernel without touching anything else.
//
// For every group g (an expert) with rows [group_start[g], group_start[g] + group_rows[g]):
//   C[r, :] = epilogue( A[src(r), :] · B[g]ᵀ )      for each such row r
// where src(r) = a_row_index[r] when A is gathered, else r.
//
//   A  [a_rows, K]   bf16 row-major (hidden states, or the activated intermediate)
//   B  [G, N, K]     bf16, each expert's weight as stored: out x in (row n = output column n)
//   C  [max_rows, N_out] bf16 | f32 row-major; N_out = N, or N/2 for a gated epilogue
//
// Group sizes and starts live in device memory (written by the align step on
// the same stream): nothing here reads them on the host, so a forward never
// waits on the host and can be captured in a CUDA graph. Rows of C outside every
// group are left untouched.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "moekit/config.h"
#include "moekit/dtype.h"
#include "moekit/kernel.h"
#include "moekit/status.h"

namespace moekit::cuda {

// NOTE: gated epilogues need a gate column and its up column in the same tile.
// prepare_weights re-lays-out W13 so that, for every block b of kGateUpBlock
// intermediate columns, B rows [2b·kGateUpBlock, 2b·kGateUpBlock + kGateUpBlock)
// are the gate rows of those columns and the next kGateUpBlock rows their up rows
// (see weight_layout.h). Every GEMM implementation with a gated epilogue reads
// this layout; change the constant here and both sides follow.
inline constexpr int kGateUpBlock = 16;

// The instructions a kernel's GEMMs may use, from its device and backend:
//   kSm90  cuda_sm90: wgmma, TMA and clusters too (the CUTLASS sm90 paths)
//   kSm89  cuda_sm80 on a device with fp8 mma.sync (sm_89 and later): the fp8 streaming kernel
//   kSm80  cuda_sm80: mma.sync, ldmatrix and cp.async on bf16 (every GPU since Ampere)
// Ordered: a path that needs kSm89 runs on every target >= it.
enum class CudaTarget : uint8_t { kSm80, kSm89, kSm90 };
const char* cuda_target_name(CudaTarget t);

enum class GemmEpilogue : uint8_t {
  kNone,        // C = A·Bᵀ (fp32 accumulate, rounded once to C's dtype)
  kActivation,  // C = act(A·Bᵀ): gated kinds pair gate/up columns (N_out = N/2); relu2 elementwise
};
const char* gemm_epilogue_name(GemmEpilogue e);

// The problem: shapes, dtypes, epilogue. Plain and printable (STYLE.md rule 5).
struct GroupedGemmProblem {
  int64_t num_groups = 0;  // G
  int64_t max_rows = 0;    // rows of C (and of A when not gathered); bounds every group
  int64_t a_rows = 0;      // rows of A (== max_rows unless gathered)
  int64_t n = 0;           // N: rows of each B[g]
  int64_t k = 0;           // K: reduction length
  // The rows the caller's workspace was sized for (>= max_rows; 0 = max_rows): a
  // path that needs scratch per row (CUTLASS: gathered A, pre-activation) may use
  // that room instead of cutting a smaller problem into row chunks, each of which
  // streams the weights again.
  int64_t scratch_rows = 0;
  DType out_dtype = DType::kBF16;  // bf16 | f32
  bool gather_a = false;           // A rows read through a_row_index
  // With gather_a: the caller lends GroupedGemmArgs::gather_room, [max_rows, K] bf16
  // that is idle during this GEMM, for a path that copies the gathered rows first
  // (CUTLASS); that copy then takes no share of the workspace and no row chunks.
  bool gather_room = false;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  ActivationConfig activation;     // used by GemmEpilogue::kActivation
  // > 1: K is cut into this many slices and C is [k_splits, max_rows, n] f32, slice s
  // holding the partial sums over the s-th K slice (the caller adds them in order).
  // Only where grouped_gemm_k_splits() asked for it, with epilogue kNone.
  int64_t k_splits = 1;
  // MoeConfig::batch_invariant: one path (and so one reduction order per element)
  // for every M and rows per group, no K slices (choose_sm90_gemm).
  bool batch_invariant = false;
  // Which paths exist for this problem (the kernel's backend and device).
  CudaTarget target = CudaTarget::kSm90;
  // Path overrides (MoeConfig::kernel with the environment's applied); null:
  // the environment's alone (kernel_options_environment()).
  const KernelOptions* kernel = nullptr;

  int64_t n_out() const {
    return epilogue == GemmEpilogue::kActivation && activation.gated() ? n / 2 : n;
  }
  std::string to_string() const;
};

// The pointers of one launch. Every pointer is device memory on the stream's device.
struct GroupedGemmArgs {
  const uint16_t* a = nullptr;            // [a_rows, K] bf16 bits, row-major
  const int32_t* a_row_index = nullptr;   // [max_rows] i32, required iff gather_a; read only for group rows
  const uint16_t* b = nullptr;            // [G, N, K] bf16 bits (gated: kGateUpBlock-interleaved rows)
  void* c = nullptr;                      // [max_rows, n_out] out_dtype
  const int32_t* group_start = nullptr;   // [G] i32 first row of each group
  const int32_t* group_rows = nullptr;    // [G] i32 rows in each group (may be 0)
  void* gather_room = nullptr;            // [max_rows, K] bf16, required iff problem.gather_room (16-byte aligned)
  void* workspace = nullptr;              // >= grouped_gemm_workspace_size(problem) bytes, 256-byte aligned
};

// ok, or why this implementation cannot serve the problem (dtype, alignment of N/K, ...).
Support grouped_gemm_supports(const GroupedGemmProblem& problem);

// K slices the fastest path for `problem` (unsplit, as the caller would run it)
// would like (1: none). A caller that can add f32 partial outputs then sets
// problem.k_splits to it and out_dtype to f32 (and sizes C for them).
int64_t grouped_gemm_k_splits(const GroupedGemmProblem& problem);

// The path grouped_gemm() takes for this problem and why, one line (the tile table's choice).
std::string grouped_gemm_plan(const GroupedGemmProblem& problem);

// Scratch bytes a launch needs (tile schedules, ...); may be 0. Host-only, no device call.
size_t grouped_gemm_workspace_size(const GroupedGemmProblem& problem);

// Enqueues the GEMM on `stream`. No allocation, no host synchronization.
// Returns an error for an unsupported problem or a failed launch.
Status grouped_gemm(const GroupedGemmProblem& problem, const GroupedGemmArgs& args, cudaStream_t stream);

}  // namespace moekit::cuda

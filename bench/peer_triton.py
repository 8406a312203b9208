#!/usr/bin/env python3
"""The Triton fused-MoE peer of the GPU MoE benchmark.

Runs the same MoE layers as bench/gpu_moe_bench.cu with the BF16 expert path that
serving engines run by default on Hopper: routing in torch, an "align" step in
torch (pairs sorted by expert, each expert padded to a multiple of BLOCK_M), one
Triton grouped-GEMM kernel that gathers its rows through the sorted pair list
(GEMM1 on w13, GEMM2 on w2 with the routing weight multiplied in), the activation
in torch and the top-k sum in fp32. Inputs, timing (one CUDA graph per input set,
launched round-robin, median launch) and the output check against moekit's dump
are those of bench/peer_torch.py.

Launch configurations come from a small table keyed by rows per expert
(M*k/E); --tune instead tries a grid of configurations per case on the real data,
keeps the fastest and reports it. --self-check tests the align step and the kernel
against an fp64 reference on small layers (on CUDA when present, else in the
Triton interpreter on the CPU).

--scheme fp8-block (or a moekit JSON whose "scheme" is fp8-block, from `moekit
bench --scheme fp8-block`) runs the block-128 W8A8 form of the same kernel: each
GEMM's input quantized to e4m3fn per token and 128 columns by a small Triton kernel
right before the GEMM, e4m3fn weights [E, N, K] with f32 scales
[E, ceil(N/128), ceil(K/128)], and in the K loop (BLOCK_K = 128) each block's
partial added as dot(a, b) * a_scale[row, kb] * b_scale[n // 128, kb] into an fp32
accumulator; bf16 outputs, then the same activation and top-k sum. The weights are
those of the moekit run, regenerated from its seeds; moekit dumps no fp8 outputs, so
each case is checked against a torch fp32 emulation of the same quantized math
instead (docs/fp8.md for the scheme).

  python3 bench/peer_triton.py --moekit-json out/moekit.json --dump-dir out/dumps --json out/triton.json [--tune]
  python3 bench/peer_triton.py --moekit-json out/moekit_fp8.json --json out/triton_fp8.json [--tune]
  python3 bench/peer_triton.py --self-check [--scheme bf16|fp8-block]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# Without a GPU the kernel runs in Triton's interpreter; the variable must be set
# before triton is imported and the kernel decorated.
if "--self-check" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_torch  # noqa: E402

OUTPUT_BOUND = peer_torch.OUTPUT_BOUND
# The fp8 layer against the torch fp32 emulation of the same quantized math, or two
# launch configs of it against each other (--tune). Every rounding point is shared;
# the fp32 sums differ in order (on the GPU the fp8 MMA also sums each 128-deep block
# at less than fp32 precision before the scales apply), which moves a bf16 GEMM1
# output by one step now and then, and an activation then crossing an e4m3 rounding
# midpoint moves by one e4m3 step (<= 2^-3 of it). Allowing 1.5% of GEMM2's inputs to
# flip: 2^-3 * sqrt(0.015) + 2^-8 ~ 0.019 (the bound docs/fp8.md gives moekit's
# tensor-core path for the same situation). A wrong scale block or row gives O(1).
FP8_LAYER_BOUND = 2e-2


def layer_bound(scheme):
    return FP8_LAYER_BOUND if scheme == FP8_BLOCK_SCHEME else OUTPUT_BOUND


# Triton's interpreter multiplies bf16 tiles as their raw 16-bit patterns and
# truncates fp32 -> bf16; there the kernel widens the tiles to fp32 first (exact,
# the sums are fp32 either way) and rounds to nearest even itself, as the GPU does.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Hopper's shared memory per block (227 KiB). smem_bytes counts every stage, as the
# wgmma pipelines allocate (the mma.sync ones for BLOCK_M < 64 hold one stage less).
SMEM_BUDGET = 227 * 1024


# ---- launch configurations ----
def cfg(bm, bn, bk, group, warps, stages):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_SIZE_M": group,
            "num_warps": warps, "num_stages": stages}


def cfg_name(c):
    return (f"m{c['BLOCK_M']}n{c['BLOCK_N']}k{c['BLOCK_K']}g{c['GROUP_SIZE_M']}"
            f"w{c['num_warps']}s{c['num_stages']}")


def smem_bytes(c, elem_bytes=2):
    return c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * elem_bytes


# Keyed by rows per expert (M*k/E). Each expert pads its rows to a multiple of
# BLOCK_M (~BLOCK_M/2 wasted rows per expert), and every BLOCK_M block of an expert
# reads the expert's whole weight matrix again (from L2 only when grouped ordering
# runs those blocks together). Up to ~16 rows the layer streams weights from HBM:
# one block per expert (16 or 32 rows, the smallest MMA tiles), enough CTAs and
# stages in flight to cover HBM latency. Past that it turns matmul-bound: wgmma
# tiles (64 rows, then 128 where the padding is a small share) with grouped
# ordering for L2 reuse of the weight tiles.
DEFAULT_TABLE = [
    (4, cfg(16, 64, 128, 8, 4, 4)),
    (16, cfg(32, 128, 64, 8, 4, 4)),
    (256, cfg(64, 128, 64, 16, 4, 4)),
    (1024, cfg(128, 128, 64, 16, 8, 4)),
    (math.inf, cfg(128, 256, 64, 32, 8, 3)),
]

# --tune candidates per regime (the table's entry is always tried as well).
TUNE_DECODE = [cfg(*c) for c in [
    (16, 32, 128, 8, 4, 4), (16, 32, 256, 8, 4, 3), (16, 64, 64, 8, 4, 5), (16, 64, 128, 1, 4, 4),
    (16, 64, 128, 8, 4, 4), (16, 64, 256, 8, 4, 3), (16, 128, 64, 8, 4, 4), (16, 128, 128, 8, 4, 3),
    (16, 128, 128, 8, 8, 4), (32, 64, 128, 8, 4, 4), (32, 128, 64, 8, 4, 4), (32, 128, 128, 8, 4, 3),
    (64, 64, 64, 8, 4, 4), (64, 128, 64, 8, 4, 4)]]
TUNE_MID = [cfg(*c) for c in [
    (16, 128, 128, 8, 4, 3), (32, 64, 128, 8, 4, 4), (32, 128, 64, 8, 4, 4), (32, 128, 128, 16, 4, 3),
    (64, 64, 64, 8, 4, 4), (64, 128, 64, 8, 4, 4), (64, 128, 64, 16, 4, 3), (64, 128, 128, 16, 4, 3),
    (64, 128, 128, 16, 8, 3), (64, 256, 64, 16, 8, 3), (128, 64, 64, 16, 4, 4), (128, 128, 64, 16, 8, 4),
    (128, 128, 64, 32, 8, 3), (128, 256, 64, 16, 8, 3)]]
TUNE_LARGE = [cfg(*c) for c in [
    (64, 128, 64, 16, 4, 4), (64, 128, 128, 32, 4, 3), (64, 256, 64, 16, 8, 3), (128, 64, 64, 16, 4, 4),
    (128, 128, 64, 16, 8, 3), (128, 128, 64, 16, 8, 4), (128, 128, 64, 32, 8, 4), (128, 128, 64, 64, 8, 4),
    (128, 128, 128, 32, 8, 3), (128, 256, 64, 16, 8, 3), (128, 256, 64, 32, 8, 4), (256, 128, 64, 16, 8, 3),
    (256, 128, 64, 32, 8, 4)]]

# fp8 block-128: BLOCK_K is the scale block (one activation and one weight scale per
# K step), and the 1-byte operands leave room for more stages. Same regimes as
# above; the entries are starting points, not measured on the H200 (--tune is).
FP8_BLOCK_SCHEME = "fp8-block"
FP8_TABLE = [
    (4, cfg(16, 64, 128, 1, 4, 5)),
    (16, cfg(32, 128, 128, 8, 4, 4)),
    (256, cfg(64, 128, 128, 16, 4, 4)),
    (1024, cfg(128, 128, 128, 16, 8, 4)),
    (math.inf, cfg(128, 256, 128, 32, 8, 3)),
]
TUNE_FP8_DECODE = [cfg(*c) for c in [
    (16, 32, 128, 1, 4, 4), (16, 64, 128, 1, 4, 4), (16, 64, 128, 1, 4, 5), (16, 64, 128, 8, 4, 4),
    (16, 128, 128, 1, 4, 3), (16, 128, 128, 1, 4, 4), (16, 128, 128, 8, 8, 4), (32, 64, 128, 1, 4, 4),
    (32, 128, 128, 1, 4, 3), (32, 128, 128, 8, 4, 4), (64, 64, 128, 1, 4, 4), (64, 128, 128, 1, 4, 3),
    (64, 128, 128, 8, 4, 4)]]
TUNE_FP8_MID = [cfg(*c) for c in [
    (16, 128, 128, 1, 4, 3), (32, 128, 128, 8, 4, 3), (64, 64, 128, 8, 4, 4), (64, 128, 128, 1, 4, 3),
    (64, 128, 128, 16, 4, 3), (64, 128, 128, 16, 4, 4), (64, 128, 128, 32, 4, 3), (64, 256, 128, 16, 8, 3),
    (128, 64, 128, 16, 4, 4), (128, 128, 128, 16, 8, 3), (128, 128, 128, 32, 8, 4), (128, 256, 128, 16, 8, 3)]]
TUNE_FP8_LARGE = [cfg(*c) for c in [
    (64, 128, 128, 16, 4, 4), (64, 256, 128, 16, 8, 3), (128, 64, 128, 16, 4, 4), (128, 128, 128, 16, 8, 3),
    (128, 128, 128, 16, 8, 4), (128, 128, 128, 32, 8, 4), (128, 128, 128, 64, 8, 4), (128, 256, 128, 16, 8, 3),
    (128, 256, 128, 32, 8, 3), (256, 128, 128, 16, 8, 3), (256, 128, 128, 32, 8, 3)]]


def elem_bytes(scheme):
    return 1 if scheme == FP8_BLOCK_SCHEME else 2


def rows_per_expert(m, k, e):
    return m * k / e


def num_sms():
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).multi_processor_count
    return 132


def default_config(m, k, e, n13, h, scheme="bf16"):
    rpe = rows_per_expert(m, k, e)
    table = FP8_TABLE if scheme == FP8_BLOCK_SCHEME else DEFAULT_TABLE
    c = dict(next(c for limit, c in table if rpe <= limit))
    if rpe <= 16:
        # Weight streaming needs CTAs on every SM: with few touched experts
        # (Mixtral, or M=1) narrow the N tile until the smaller GEMM fills ~2 waves.
        touched = min(e, m * k)
        while c["BLOCK_N"] > 32 and touched * triton.cdiv(min(n13, h), c["BLOCK_N"]) < 2 * num_sms():
            c["BLOCK_N"] //= 2
    return c


def tune_candidates(m, k, e, n13, h, scheme="bf16"):
    rpe = rows_per_expert(m, k, e)
    if scheme == FP8_BLOCK_SCHEME:
        grid = TUNE_FP8_DECODE if rpe <= 16 else TUNE_FP8_MID if rpe <= 256 else TUNE_FP8_LARGE
    else:
        grid = TUNE_DECODE if rpe <= 16 else TUNE_MID if rpe <= 256 else TUNE_LARGE
    out, seen = [], set()
    for c in [default_config(m, k, e, n13, h, scheme)] + grid:
        if cfg_name(c) not in seen and smem_bytes(c, elem_bytes(scheme)) <= SMEM_BUDGET:
            seen.add(cfg_name(c))
            out.append(c)
    return out


# ---- the align step (torch, on the device, graph-capturable) ----
def padded_len(m, k, e, block_m):
    """Host upper bound of the padded pair list (every touched expert adds < BLOCK_M),
    in whole blocks."""
    return triton.cdiv(m * k + min(e, m * k) * (block_m - 1), block_m) * block_m


def make_align(num_pairs, num_experts, block_m, max_padded, device):
    """align(ids [M, k]) -> (sorted_token_ids [max_padded] i64 with sentinel M*k,
    expert_ids [max_padded / BLOCK_M] i32, num_tokens_post_padded [1] i32).
    Expert e's pairs (index token*k + slot, in order) fill a BLOCK_M-aligned run,
    padded with the sentinel. Torch ops only, no host sync, so it is captured in the
    layer's CUDA graph; the index ranges are made once, outside the graph."""
    pair_idx = torch.arange(num_pairs, device=device)
    expert_idx = torch.arange(num_experts + 1, device=device)
    block_starts = torch.arange(0, max_padded, block_m, dtype=torch.int32, device=device)

    def align(ids):
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        expert_sorted = flat[order]
        # bounds[e] = first sorted position of expert e (not bincount: it syncs on CUDA).
        bounds = torch.searchsorted(expert_sorted, expert_idx)
        counts = bounds[1:] - bounds[:-1]
        padded = (counts + (block_m - 1)) & ~(block_m - 1)  # BLOCK_M is a power of two
        ends_padded = torch.cumsum(padded, 0, dtype=torch.int32)
        shift = (ends_padded - padded) - bounds[:-1]  # padded start minus unpadded start
        sorted_ids = torch.full((max_padded,), num_pairs, dtype=torch.int64, device=device)
        sorted_ids.scatter_(0, shift[expert_sorted] + pair_idx, order)
        # Blocks past the padded end get expert E; the kernel never reads them.
        expert_ids = torch.searchsorted(ends_padded, block_starts, right=True, out_int32=True)
        return sorted_ids, expert_ids, ends_padded[-1:]

    return align


def moe_align(ids, num_experts, block_m, max_padded):
    return make_align(ids.numel(), num_experts, block_m, max_padded, ids.device)(ids)


# ---- the grouped GEMM kernel ----
# num_valid (M*k) and a_row_div (top_k, or 1) vary per case and shape: left
# unspecialized so that one compiled kernel per config serves every case.
@triton.jit(do_not_specialize=["num_valid", "a_row_div"])
def fused_moe_kernel(
        a_ptr, b_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr,
        N, K, max_padded, num_valid, a_row_div,
        stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
        MUL_WEIGHT: tl.constexpr, EVEN_K: tl.constexpr, INTERPRETED: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    """C[pair, :] = A[pair // a_row_div, :] @ B[expert(pair)]^T (* topk_w[pair]) for the
    pairs of one BLOCK_M block of the sorted list and one BLOCK_N tile of N."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(max_padded, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped ordering: GROUP_SIZE_M row blocks sweep N together, so their A rows
    # and weight tiles are reused from L2.
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # The grid covers the host bound; blocks past the real padded end do nothing.
    ntpp = tl.load(ntpp_ptr)
    if pid_m * BLOCK_M >= ntpp:
        return

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_valid  # padding rows hold the sentinel num_valid
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    # The last N tile wraps around instead of masking its loads; its stores are masked.
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_rows = pair // a_row_div
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < K - k0
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        if INTERPRETED:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if MUL_WEIGHT:
        w = tl.load(topk_w_ptr + pair, mask=row_ok, other=0.0)
        acc = acc * w[:, None]

    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + pair[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    if INTERPRETED:
        # Round to nearest even by hand; the interpreter's cast then only truncates.
        bits = acc.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        acc = bits.to(tl.float32, bitcast=True)
    c = acc.to(tl.bfloat16)
    tl.store(c_ptrs, c, mask=row_ok[:, None] & (offs_cn[None, :] < N))


def grouped_gemm(a, w, sorted_ids, expert_ids, ntpp, num_pairs, a_row_div, c, topk_w=None, out=None):
    """out [num_pairs, N] bf16: row p = a[p // a_row_div] @ w[e(p)]^T (* topk_w[p]).
    w is [E, N, K] with K contiguous."""
    e, n, kdim = w.shape
    assert a.shape[1] == kdim and w.stride(2) == 1 and a.stride(1) == 1
    assert a.dtype == w.dtype == torch.bfloat16
    if out is None:
        out = torch.empty(num_pairs, n, dtype=a.dtype, device=a.device)
    max_padded = sorted_ids.numel()
    grid = (triton.cdiv(max_padded, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"]),)
    fused_moe_kernel[grid](
        a, w, out, topk_w if topk_w is not None else a, sorted_ids, expert_ids, ntpp,
        n, kdim, max_padded, num_pairs, a_row_div,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0), out.stride(1),
        MUL_WEIGHT=topk_w is not None, EVEN_K=kdim % c["BLOCK_K"] == 0, INTERPRETED=INTERPRET,
        BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], GROUP_SIZE_M=c["GROUP_SIZE_M"],
        num_warps=c["num_warps"], num_stages=c["num_stages"])
    return out


# ---- fp8 block-128 W8A8: the activation quantizer and the grouped GEMM ----
# NOTE: the scheme of docs/fp8.md (fp8_block128): one weight scale per 128x128 block,
# one activation scale per token and 128 columns, scale = max(amax, 1e-10) / 448,
# e4m3fn rounded to nearest even and saturated at +-448; the references below and
# the kernels take these constants from here.
FP8_GROUP = 128
E4M3_MAX = 448.0
FP8_SCALE_FLOOR = 1e-10
# Groups of one row per quantizer program: 8 x 128 columns over 4 warps.
QUANT_GROUPS_PER_PROG = 8


class Fp8Weight:
    """A block-128 fp8 weight: q [E, N, K] float8_e4m3fn (K contiguous) and scale
    [E, ceil(N/128), ceil(K/128)] f32; the real weight is q times its block's scale."""

    def __init__(self, q, scale):
        e, n, kdim = q.shape
        assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        assert tuple(scale.shape) == (e, triton.cdiv(n, FP8_GROUP), triton.cdiv(kdim, FP8_GROUP))
        self.q, self.scale = q, scale

    @property
    def shape(self):
        return self.q.shape


def scheme_of(w):
    return FP8_BLOCK_SCHEME if isinstance(w, Fp8Weight) else "bf16"


@triton.jit
def round_e4m3(y):
    """f32 y with |y| <= 448 -> the nearest e4m3fn value (ties to even), still f32.
    Only for the interpreter, whose own fp8 cast does not round to nearest even (it
    keeps values that are already e4m3 exactly); the GPU's cast is cvt.rn.satfinite."""
    bits = y.to(tl.uint32, bitcast=True)
    # Normal range (|y| >= 2^-6): keep 3 of the 23 mantissa bits, ties to even.
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    # Subnormals are multiples of 2^-9: adding and taking away 1.5 * 2^23 rounds |y| * 2^9
    # to an integer, ties to even (|y| * 2^9 < 8 here); the sign is put back after, so a
    # negative value that rounds to zero is -0, as the GPU's cast makes it.
    a = tl.abs(y)
    sub = ((a * 512.0 + 12582912.0) - 12582912.0) * 0.001953125
    sub = tl.where((bits >> 31) != 0, -sub, sub)
    return tl.where(a < 0.015625, sub, normal)


@triton.jit
def quant_fp8_kernel(
        x_ptr, q_ptr, s_ptr, K, num_groups, stride_xm, stride_qm, stride_sm,
        GROUPS: tl.constexpr, GROUP: tl.constexpr, E4M3_MAX: tl.constexpr, SCALE_FLOOR: tl.constexpr,
        INTERPRETED: tl.constexpr):
    """For GROUPS consecutive GROUP-column groups g of one row:
    s[row, g] = max(amax of the group, SCALE_FLOOR) / E4M3_MAX (f32, correctly rounded),
    q[row, cols of g] = e4m3fn(x / s), the quotient correctly rounded in f32, saturated."""
    pid = tl.program_id(0)
    progs_per_row = tl.cdiv(num_groups, GROUPS)
    row = (pid // progs_per_row).to(tl.int64)
    g = (pid % progs_per_row) * GROUPS + tl.arange(0, GROUPS)            # (GROUPS,)
    cols = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]              # (GROUPS, GROUP)
    ok = cols < K  # the last group of a row may be partial; groups past the row are empty
    x = tl.load(x_ptr + row * stride_xm + cols, mask=ok, other=0.0).to(tl.float32)
    s = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=1), SCALE_FLOOR), E4M3_MAX)  # (GROUPS,)
    y = tl.clamp(tl.math.div_rn(x, s[:, None]), -E4M3_MAX, E4M3_MAX)
    if INTERPRETED:
        y = round_e4m3(y)
    tl.store(q_ptr + row * stride_qm + cols, y.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row * stride_sm + g, s, mask=g < num_groups)


def quant_fp8(x):
    """x [rows, K] bf16 (K contiguous) -> (q [rows, K] e4m3fn, s [rows, ceil(K/128)] f32),
    per token and 128-column group."""
    rows, kdim = x.shape
    assert x.stride(1) == 1
    ng = triton.cdiv(kdim, FP8_GROUP)
    q = torch.empty(rows, kdim, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(rows, ng, dtype=torch.float32, device=x.device)
    gp = min(QUANT_GROUPS_PER_PROG, triton.next_power_of_2(ng))
    quant_fp8_kernel[(rows * triton.cdiv(ng, gp),)](
        x, q, s, kdim, ng, x.stride(0), q.stride(0), s.stride(0),
        GROUPS=gp, GROUP=FP8_GROUP, E4M3_MAX=E4M3_MAX, SCALE_FLOOR=FP8_SCALE_FLOOR, INTERPRETED=INTERPRET,
        num_warps=4)
    return q, s


@triton.jit(do_not_specialize=["num_valid", "a_row_div"])
def fused_moe_fp8_kernel(
        a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, topk_w_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr,
        N, K, max_padded, num_valid, a_row_div,
        stride_am, stride_ak, stride_asm, stride_ask,
        stride_be, stride_bn, stride_bk, stride_bse, stride_bsn, stride_bsk, stride_cm, stride_cn,
        MUL_WEIGHT: tl.constexpr, EVEN_K: tl.constexpr, INTERPRETED: tl.constexpr, GROUP: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    """fused_moe_kernel on e4m3fn operands with block scales: for the pairs of one
    BLOCK_M block and one BLOCK_N tile, C[pair, n] = sum over K blocks kb of
    (A[r, kb] . B[expert][n, kb]) * a_scale[r, kb] * b_scale[expert, n // GROUP, kb],
    r = pair // a_row_div, accumulated in fp32 (* topk_w[pair]), stored bf16."""
    tl.static_assert(BLOCK_K == GROUP, "one activation and one weight scale per K step")
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(max_padded, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    ntpp = tl.load(ntpp_ptr)
    if pid_m * BLOCK_M >= ntpp:
        return

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_valid
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_rows = pair // a_row_div
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
    # One scale per (A row, K block) and per (GROUP rows of N, K block) of the expert's weight.
    as_ptrs = a_scale_ptr + a_rows * stride_asm                                      # (BLOCK_M,)
    bs_ptrs = b_scale_ptr + expert * stride_bse + (offs_n // GROUP) * stride_bsn     # (BLOCK_N,)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < K - k0
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        a_s = tl.load(as_ptrs, mask=row_ok, other=0.0)
        b_s = tl.load(bs_ptrs)
        if INTERPRETED:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
        as_ptrs += stride_ask
        bs_ptrs += stride_bsk

    if MUL_WEIGHT:
        w = tl.load(topk_w_ptr + pair, mask=row_ok, other=0.0)
        acc = acc * w[:, None]

    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + pair[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    if INTERPRETED:
        bits = acc.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        acc = bits.to(tl.float32, bitcast=True)
    c = acc.to(tl.bfloat16)
    tl.store(c_ptrs, c, mask=row_ok[:, None] & (offs_cn[None, :] < N))


def grouped_gemm_fp8(a, a_scale, w, sorted_ids, expert_ids, ntpp, num_pairs, a_row_div, c, topk_w=None, out=None):
    """out [num_pairs, N] bf16: row p = the block-scaled product of a[p // a_row_div]
    (e4m3fn [rows, K], scales a_scale [rows, ceil(K/128)] f32) and w[e(p)] (an Fp8Weight),
    (* topk_w[p])."""
    e, n, kdim = w.shape
    assert c["BLOCK_K"] == FP8_GROUP, "block scaling takes BLOCK_K = 128"
    assert a.dtype == torch.float8_e4m3fn and a.shape[1] == kdim and a.stride(1) == 1 and w.q.stride(2) == 1
    assert tuple(a_scale.shape) == (a.shape[0], triton.cdiv(kdim, FP8_GROUP))
    if out is None:
        out = torch.empty(num_pairs, n, dtype=torch.bfloat16, device=a.device)
    max_padded = sorted_ids.numel()
    grid = (triton.cdiv(max_padded, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"]),)
    fused_moe_fp8_kernel[grid](
        a, a_scale, w.q, w.scale, out, topk_w if topk_w is not None else a_scale, sorted_ids, expert_ids, ntpp,
        n, kdim, max_padded, num_pairs, a_row_div,
        a.stride(0), a.stride(1), a_scale.stride(0), a_scale.stride(1),
        w.q.stride(0), w.q.stride(1), w.q.stride(2), w.scale.stride(0), w.scale.stride(1), w.scale.stride(2),
        out.stride(0), out.stride(1),
        MUL_WEIGHT=topk_w is not None, EVEN_K=kdim % FP8_GROUP == 0, INTERPRETED=INTERPRET, GROUP=FP8_GROUP,
        BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], GROUP_SIZE_M=c["GROUP_SIZE_M"],
        num_warps=c["num_warps"], num_stages=c["num_stages"])
    return out


# ---- the layer ----
def activate(shape, h):
    """[rows, N13] bf16 -> [rows, I] bf16; silu(gate) * up in fp32 with one rounding
    and no fp32 copy of the whole row, the rest through peer_torch.activate."""
    if shape["activation"] != "silu":
        return peer_torch.activate(shape, h)
    i = h.shape[1] // 2
    out = torch.empty(h.shape[0], i, dtype=h.dtype, device=h.device)
    return torch.mul(F.silu(h[:, :i].float(), inplace=True), h[:, i:], out=out)


def make_layer(shape, w13, w2, bias, m, c):
    """The layer for M tokens with launch config c; w13 [E, N13, H], w2 [E, H, I] bf16
    (Fp8Weight: the fp8 layer, make_layer_fp8)."""
    if isinstance(w13, Fp8Weight):
        return make_layer_fp8(shape, w13, w2, bias, m, c)
    e, k, h = shape["experts"], shape["top_k"], shape["hidden"]
    align = make_align(m * k, e, c["BLOCK_M"], padded_len(m, k, e, c["BLOCK_M"]), w13.device)

    def layer(hidden, logits):
        ids, w = peer_torch.route(shape, logits, bias)
        sorted_ids, expert_ids, ntpp = align(ids)
        # GEMM1's output dies inside activate: the graph's pool reuses it for GEMM2's.
        a = activate(shape, grouped_gemm(hidden, w13, sorted_ids, expert_ids, ntpp, m * k, k, c))
        y = grouped_gemm(a, w2, sorted_ids, expert_ids, ntpp, m * k, 1, c,
                         topk_w=w.reshape(-1).to(torch.float32).contiguous())
        # A bf16 sum reduces in fp32 and rounds once: the fp32 top-k sum, one launch.
        return y.view(m, k, h).sum(1)

    return layer


def make_layer_fp8(shape, w13, w2, bias, m, c):
    """The fp8 block-128 layer for M tokens: w13, w2 Fp8Weight. Each GEMM's input is
    quantized per token and 128 columns right before the GEMM (GEMM1: the M hidden rows,
    read by every slot of their token; GEMM2: the M*k bf16 activation rows); GEMM outputs
    bf16, the top-k weight applied in GEMM2's fp32 accumulator, the top-k sum in fp32."""
    e, k, h = shape["experts"], shape["top_k"], shape["hidden"]
    align = make_align(m * k, e, c["BLOCK_M"], padded_len(m, k, e, c["BLOCK_M"]), w13.q.device)

    def layer(hidden, logits):
        ids, w = peer_torch.route(shape, logits, bias)
        sorted_ids, expert_ids, ntpp = align(ids)
        xq, xs = quant_fp8(hidden)
        a = activate(shape, grouped_gemm_fp8(xq, xs, w13, sorted_ids, expert_ids, ntpp, m * k, k, c))
        aq, a_s = quant_fp8(a)
        y = grouped_gemm_fp8(aq, a_s, w2, sorted_ids, expert_ids, ntpp, m * k, 1, c,
                             topk_w=w.reshape(-1).to(torch.float32).contiguous())
        return y.view(m, k, h).sum(1)

    return layer


# `moekit bench --scheme fp8-block` fills its e4m3 weights with the seeded values at
# scale 2^8 (bench/gpu_fill.h, fill_uniform_e4m3: [-256, 256), rounded to nearest even)
# and sets every block scale to 2^(scale_log2 - 8), so the real weights span the bf16
# weights' range. NOTE: keep in step with bench/gpu_moe_bench.cu (ShapeRunner::setup).
E4M3_FILL_SCALE_LOG2 = 8


def shape_weights_fp8(shape, dev):
    """(w13, w2 as Fp8Weight, score bias [E] f32 or None) of a shape: the moekit run's
    e4m3 bytes, regenerated from its seeds (torch's e4m3fn cast rounds to nearest even,
    as the bench's fill does; the self-check tests that cast), and its scales. moekit
    keeps w13's scales per gate/up part ([E, 2*ceil(I/128), ...]); the kernel here reads
    the checkpoint layout [E, ceil(2I/128), ...]. The two differ in shape only where
    I % 128 != 0 (gpt-oss), and every scale of a tensor is the same value, so both
    describe the same real weights."""
    e, h, i = shape["experts"], shape["hidden"], shape["intermediate"]
    n13 = 2 * i if shape["activation"] != "relu2" else i
    f8 = torch.float8_e4m3fn
    g = FP8_GROUP
    w13 = Fp8Weight(
        peer_torch.fill_uniform((e, n13, h), shape["w13_seed"], E4M3_FILL_SCALE_LOG2, f8, dev),
        torch.full((e, triton.cdiv(n13, g), triton.cdiv(h, g)), math.ldexp(1.0, shape["w13_scale_log2"] - 8),
                   dtype=torch.float32, device=dev))
    w2 = Fp8Weight(
        peer_torch.fill_uniform((e, h, i), shape["w2_seed"], E4M3_FILL_SCALE_LOG2, f8, dev),
        torch.full((e, triton.cdiv(h, g), triton.cdiv(i, g)), math.ldexp(1.0, shape["w2_scale_log2"] - 8),
                   dtype=torch.float32, device=dev))
    bias = None
    if shape.get("score_bias"):
        bias = peer_torch.fill_uniform((e,), shape["bias_seed"], shape["bias_scale_log2"], torch.float32, dev)
    return w13, w2, bias


def time_layer(shape, w13, w2, bias, inputs, c, seconds, min_reps):
    m = inputs[0][0].shape[0]
    layer = make_layer(shape, w13, w2, bias, m, c)
    fns = [lambda hid=hid, lg=lg: layer(hid, lg) for hid, lg in inputs]
    return peer_torch.time_graphs(fns, seconds, min_reps)


def tune_case(shape, w13, w2, bias, inputs, seconds, log):
    """Times every candidate config on the case's data; returns (best config, {name: us})."""
    m = inputs[0][0].shape[0]
    scheme = scheme_of(w13)
    cands = tune_candidates(m, shape["top_k"], shape["experts"], w13.shape[1], shape["hidden"], scheme)
    bound = layer_bound(scheme)
    times, best, ref, ref_name, first_err = {}, None, None, None, None
    for c in cands:
        name = cfg_name(c)
        try:
            t, graphs, outs = time_layer(shape, w13, w2, bias, inputs, c, seconds, 2)
            # Every candidate computes the same layer: one that disagrees with the
            # first is broken and may not win.
            graphs[0].replay()
            torch.cuda.synchronize()
            if ref is None:
                ref, ref_name = outs[0].clone(), name
            else:
                err = peer_torch.rel_l2(outs[0], ref)
                if not err <= bound:
                    raise RuntimeError(f"output differs from {ref_name}'s: rel L2 {err:.2e}")
            times[name] = t * 1e6
            if best is None or t < best[0]:
                best = (t, c)
            del graphs, outs
        except Exception as ex:  # a config the compiler or the device rejects is skipped
            times[name] = None
            why = f"{name}: {type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}"
            first_err = first_err or why
            log("    tune " + why)
        torch.cuda.empty_cache()
    if best is None:
        raise RuntimeError(f"no tuning candidate ran (first: {first_err})")
    return best[1], times


# ---- self-check: the align step and the kernel against fp64, on small layers ----
def ref_activate(shape, h):
    act = shape["activation"]
    if act == "silu":
        i = h.shape[1] // 2
        return F.silu(h[:, :i]) * h[:, i:]
    if act == "gelu":
        i = h.shape[1] // 2
        return F.gelu(h[:, :i], approximate="tanh") * h[:, i:]
    if act == "swiglu_oai":
        limit, alpha = shape["swiglu_limit"], shape["swiglu_alpha"]
        g = h[:, 0::2].clamp(max=limit)
        u = h[:, 1::2].clamp(min=-limit, max=limit)
        return g * torch.sigmoid(alpha * g) * (u + 1.0)
    if act == "relu2":
        return torch.relu(h).square()
    raise ValueError(act)


def ref_layer(shape, w13, w2, hidden, ids, w):
    """fp64 layer on the bf16 inputs, no intermediate rounding."""
    x = hidden.double()
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64, device=x.device)
    for e in range(w13.shape[0]):
        t, s = (ids == e).nonzero(as_tuple=True)
        if t.numel():
            y = ref_activate(shape, x[t] @ w13[e].double().T) @ w2[e].double().T
            out.index_add_(0, t, y * w[t, s].double()[:, None])
    return out


def check_align(ids, e, bm, sorted_ids, expert_ids, ntpp):
    """Every pair once, each block one expert, padding only at an expert's end, sentinels past the end."""
    flat = ids.reshape(-1).cpu()
    n = flat.numel()
    s, ex, total = sorted_ids.cpu().long(), expert_ids.cpu().long(), int(ntpp.cpu()[0])
    counts = torch.bincount(flat, minlength=e)
    want_total = int(((counts + bm - 1) // bm * bm).sum())
    if total != want_total:
        return f"num_tokens_post_padded {total} != {want_total}"
    if (s[total:] != n).any():
        return "pairs past num_tokens_post_padded"
    real = s[:total][s[:total] < n]
    if real.numel() != n or not torch.equal(real.sort().values, torch.arange(n)):
        return "pairs missing or repeated"
    for b in range(total // bm):
        blk = s[b * bm:(b + 1) * bm]
        p = blk[blk < n]
        if p.numel() == 0:
            return f"block {b} holds only padding"
        if (flat[p] != ex[b]).any():
            return f"block {b}: pairs of another expert than {int(ex[b])}"
        if p.numel() < bm and not (blk[:p.numel()] < n).all():
            return f"block {b}: padding before pairs"
        if not torch.equal(p, p.sort().values):
            return f"block {b}: pairs out of order"
    return None


def gemm_err(a, w, sorted_ids, expert_ids, ntpp, ids, a_row_div, c, topk_w):
    """Runs one grouped GEMM into a NaN-guarded buffer; rel L2 vs fp64, or a reason."""
    n_pairs = ids.numel()
    n = w.shape[1]
    guard = c["BLOCK_M"] + 1
    buf = torch.full((n_pairs + guard, n), float("nan"), dtype=torch.bfloat16, device=a.device)
    out = grouped_gemm(a, w, sorted_ids, expert_ids, ntpp, n_pairs, a_row_div, c, topk_w=topk_w, out=buf[:n_pairs])
    if not torch.isnan(buf[n_pairs:].float()).all():
        return "wrote past the pair rows"
    if not torch.isfinite(out.float()).all():
        return "non-finite pair rows (not written, or garbage read)"
    flat = ids.reshape(-1)
    rows = a.double()[torch.arange(n_pairs, device=a.device) // a_row_div]
    ref = torch.bmm(rows.unsqueeze(1), w.double()[flat].transpose(1, 2)).squeeze(1)
    if topk_w is not None:
        ref = ref * topk_w.double()[:, None]
    return peer_torch.rel_l2(out, ref)


# One grouped GEMM vs fp64 on the same bf16 inputs: only the output's bf16 rounding
# (~1.3e-3 rel L2); a wrong or missing row among a few hundred gives > 3e-2.
GEMM_BOUND = 3e-3


def self_check():
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    where = "CUDA" if dev.type == "cuda" else "Triton interpreter (CPU)"
    print(f"self-check on {where}: torch {torch.__version__}, triton {triton.__version__}")
    shapes = [
        # K (H=96) not a multiple of BLOCK_K and N (2I=80, H=96) not of BLOCK_N; experts 2 and 5 never chosen.
        {"name": "t-silu", "experts": 8, "top_k": 2, "hidden": 96, "intermediate": 40,
         "routing": "renormalize", "activation": "silu", "dead": [2, 5]},
        {"name": "t-oai", "experts": 6, "top_k": 3, "hidden": 64, "intermediate": 48,
         "routing": "softmax_topk", "activation": "swiglu_oai", "swiglu_limit": 7.0, "swiglu_alpha": 1.702},
        {"name": "t-dsv3", "experts": 16, "top_k": 4, "hidden": 128, "intermediate": 32,
         "routing": "deepseek_v3", "num_groups": 4, "topk_groups": 2, "routed_scaling_factor": 2.5,
         "activation": "silu", "score_bias": True},
        # Expert 1 takes most tokens: many blocks of one expert.
        {"name": "t-relu2", "experts": 4, "top_k": 1, "hidden": 48, "intermediate": 64,
         "routing": "renormalize", "activation": "relu2", "hot": [1]},
    ]
    configs = [cfg(16, 32, 32, 1, 4, 2), cfg(32, 64, 64, 4, 4, 3), cfg(16, 16, 128, 2, 4, 2), cfg(64, 32, 32, 8, 4, 2)]
    ms = [1, 3, 16, 37, 100]
    gen = torch.Generator().manual_seed(20240601)

    def rnd(*s, scale=1.0):
        return ((torch.rand(*s, generator=gen) * 2 - 1) * scale)

    fails, worst_layer, worst_gemm, runs = [], 0.0, 0.0, 0
    for shape in shapes:
        e, k, h, i = shape["experts"], shape["top_k"], shape["hidden"], shape["intermediate"]
        n13 = i if shape["activation"] == "relu2" else 2 * i
        w13 = rnd(e, n13, h, scale=2 / math.sqrt(h)).to(torch.bfloat16).to(dev)
        w2 = rnd(e, h, i, scale=2 / math.sqrt(i)).to(torch.bfloat16).to(dev)
        bias = rnd(e, scale=0.1).to(dev) if shape.get("score_bias") else None
        lw = []
        for m in ms:
            hidden = rnd(m, h).to(torch.bfloat16).to(dev)
            logits = rnd(m, e, scale=4.0)
            for x in shape.get("dead", []):
                logits[:, x] = -1e4
            for x in shape.get("hot", []):
                logits[:, x] += 6.0
            logits = logits.to(dev)
            ids, w = peer_torch.route(shape, logits, bias)
            ref = ref_layer(shape, w13, w2, hidden, ids, w)
            for c in configs:
                tag = f"{shape['name']} M={m} {cfg_name(c)}"
                runs += 1
                try:
                    bm = c["BLOCK_M"]
                    al = moe_align(ids, e, bm, padded_len(m, k, e, bm))
                    why = check_align(ids, e, bm, *al)
                    if why:
                        fails.append(f"{tag}: align: {why}")
                        continue
                    err1 = gemm_err(hidden, w13, *al, ids, k, c, None)
                    h13 = grouped_gemm(hidden, w13, *al, m * k, k, c)
                    a = activate(shape, h13)
                    if not torch.equal(a, peer_torch.activate(shape, h13)):
                        fails.append(f"{tag}: activation differs from peer_torch.activate")
                    err2 = gemm_err(a, w2, *al, ids, 1, c, w.reshape(-1).float().contiguous())
                    for which, err in (("GEMM1", err1), ("GEMM2", err2)):
                        # One bf16 rounding of each output element: ~1e-3 rel L2.
                        if isinstance(err, str) or not err <= GEMM_BOUND:
                            fails.append(f"{tag}: {which}: {err}")
                        else:
                            worst_gemm = max(worst_gemm, err)
                    out = make_layer(shape, w13, w2, bias, m, c)(hidden, logits)
                    err = peer_torch.rel_l2(out, ref)
                    lw.append(err)
                    worst_layer = max(worst_layer, err)
                    if not err <= OUTPUT_BOUND:
                        fails.append(f"{tag}: layer rel L2 {err:.2e} > {OUTPUT_BOUND}")
                    if dev.type == "cuda":
                        why = check_graph(shape, w13, w2, bias, m, c, hidden, logits, out)
                        if why:
                            fails.append(f"{tag}: {why}")
                except Exception as ex:
                    fails.append(f"{tag}: {type(ex).__name__}: {ex}")
        lo, hi = min(lw, default=float("nan")), max(lw, default=float("nan"))
        print(f"  {shape['name']:<8} E={e} k={k} H={h} I={i}: layer rel L2 vs fp64 {lo:.2e}..{hi:.2e}"
              f" over M={ms} x {len(configs)} configs")
    # The default table must fit the shared-memory budget (tuning candidates past it are skipped).
    for _, c in DEFAULT_TABLE:
        if smem_bytes(c) > SMEM_BUDGET:
            fails.append(f"table entry {cfg_name(c)}: needs {smem_bytes(c)} B of shared memory")
    print(f"  {runs} runs: worst GEMM rel L2 {worst_gemm:.2e} (bound {GEMM_BOUND}), "
          f"worst layer rel L2 {worst_layer:.2e} (bound {OUTPUT_BOUND})"
          + ("; each layer also run under sync-debug 'error' and replayed from a CUDA graph"
             if dev.type == "cuda" else ""))
    for f in fails:
        print("FAILED: " + f)
    failed = len({f.split(":")[0] for f in fails})
    print(f"{max(0, runs - failed)} passed, {failed} failed")
    return 1 if fails else 0


def check_graph(shape, w13, w2, bias, m, c, hidden, logits, eager):
    """The layer must run without a host sync and replay from a CUDA graph bit for bit."""
    layer = make_layer(shape, w13, w2, bias, m, c)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        layer(hidden, logits)
    except RuntimeError as ex:
        return f"host sync in the layer: {ex}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    t, graphs, outs = peer_torch.time_graphs([lambda: layer(hidden, logits)], 0.001, 1)
    graphs[0].replay()
    torch.cuda.synchronize()
    if not torch.equal(outs[0], eager):
        return "graph replay differs from the eager run"
    return None


# ---- self-check of the fp8 mode: a torch fp32 emulation of the same quantized math ----
def e4m3_table():
    """The 127 non-negative finite e4m3fn values by code 0x00..0x7e, from the format:
    exponent field 0: m * 2^-9, else (8 + m) * 2^(e - 10) (float64)."""
    code = np.arange(127)
    ex, mant = code >> 3, code & 7
    return np.where(ex == 0, mant * 2.0 ** -9, (8 + mant) * np.exp2(ex - 10.0))


def ref_e4m3_bits(v):
    """float64 array -> e4m3fn codes (uint8): the nearest value of the table, ties to the
    even code, saturated at 448. A table search that shares nothing with torch's cast."""
    table = e4m3_table()
    a = np.minimum(np.abs(v), E4M3_MAX)
    hi = np.searchsorted(table, a)  # the first value >= a; a <= 448 = table[126]
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - table[lo], table[hi] - a
    code = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (code | np.where(np.signbit(v), 0x80, 0)).astype(np.uint8)


def ref_quant_fp8(x):
    """x [rows, K] -> (q [rows, K] e4m3fn, s [rows, ceil(K/128)] f32), torch only:
    s = max(amax, 1e-10) / 448 per 128-column group, q = e4m3fn(x / s) in f32, saturated."""
    rows, kdim = x.shape
    ng = triton.cdiv(kdim, FP8_GROUP)
    xf = F.pad(x.float(), (0, ng * FP8_GROUP - kdim)).view(rows, ng, FP8_GROUP)
    s = xf.abs().amax(-1).clamp_min(FP8_SCALE_FLOOR) / E4M3_MAX
    q = (xf / s[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(rows, ng * FP8_GROUP)[:, :kdim].contiguous(), s


def ref_dequant_rows(q, s):
    """[rows, K] e4m3fn and its [rows, ceil(K/128)] scales -> the real values, f32."""
    return q.float() * s.repeat_interleave(FP8_GROUP, 1)[:, :q.shape[1]]


def ref_dequant_weight(w, e):
    """Expert e of an Fp8Weight -> its real weight [N, K] f32."""
    q = w.q[e].float()
    s = w.scale[e].repeat_interleave(FP8_GROUP, 0)[:q.shape[0]].repeat_interleave(FP8_GROUP, 1)[:, :q.shape[1]]
    return q * s


def ref_layer_fp8(shape, w13, w2, hidden, ids, w):
    """The fp8 layer in plain torch fp32 with the peer's rounding points: hidden quantized
    per token, GEMM1 on the real (dequantized) values rounded to bf16, the activation in
    fp32 rounded to bf16, quantized per row, GEMM2 times the top-k weight rounded to bf16,
    the top-k sum in fp32 (not rounded: [M, H] f32)."""
    x = ref_dequant_rows(*ref_quant_fp8(hidden))
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        t, s = (ids == e).nonzero(as_tuple=True)
        if t.numel():
            h = (x[t] @ ref_dequant_weight(w13, e).T).to(torch.bfloat16)
            a = ref_activate(shape, h.float()).to(torch.bfloat16)
            y = (ref_dequant_rows(*ref_quant_fp8(a)) @ ref_dequant_weight(w2, e).T) * w[t, s].float()[:, None]
            out.index_add_(0, t, y.to(torch.bfloat16).float())
    return out


def gemm_err_fp8(a, a_scale, w, sorted_ids, expert_ids, ntpp, ids, a_row_div, c, topk_w):
    """One fp8 grouped GEMM into a NaN-guarded buffer; rel L2 vs fp64 on the same
    quantized inputs, or a reason."""
    n_pairs = ids.numel()
    n = w.shape[1]
    guard = c["BLOCK_M"] + 1
    buf = torch.full((n_pairs + guard, n), float("nan"), dtype=torch.bfloat16, device=a.device)
    out = grouped_gemm_fp8(a, a_scale, w, sorted_ids, expert_ids, ntpp, n_pairs, a_row_div, c,
                           topk_w=topk_w, out=buf[:n_pairs])
    if not torch.isnan(buf[n_pairs:].float()).all():
        return "wrote past the pair rows"
    if not torch.isfinite(out.float()).all():
        return "non-finite pair rows (not written, or garbage read)"
    rows = ref_dequant_rows(a, a_scale).double()[torch.arange(n_pairs, device=a.device) // a_row_div]
    wd = torch.stack([ref_dequant_weight(w, e) for e in range(w.shape[0])]).double()
    ref = torch.bmm(rows.unsqueeze(1), wd[ids.reshape(-1)].transpose(1, 2)).squeeze(1)
    if topk_w is not None:
        ref = ref * topk_w.double()[:, None]
    return peer_torch.rel_l2(out, ref)


def self_check_fp8():
    """The fp8 mode: torch's e4m3 cast (which regenerates the bench's weights) against a
    table search; the quantizer bit for bit against ref_quant_fp8; each grouped GEMM
    against fp64 on the same quantized inputs (GEMM_BOUND: one bf16 rounding); the layer
    against ref_layer_fp8 (FP8_LAYER_BOUND)."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    where = "CUDA" if dev.type == "cuda" else "Triton interpreter (CPU)"
    print(f"fp8 self-check on {where}: torch {torch.__version__}, triton {triton.__version__}")
    gen = torch.Generator().manual_seed(20240602)

    def rnd(*s, scale=1.0):
        return ((torch.rand(*s, generator=gen) * 2 - 1) * scale)

    fails, runs = [], 0

    # The cast: the bench fill's values, every e4m3 rounding midpoint and its f32 neighbours.
    runs += 1
    mids = ((e4m3_table()[:-1] + e4m3_table()[1:]) / 2).astype(np.float32)
    near = np.concatenate([mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(1e4))])
    vals = torch.cat([peer_torch.fill_uniform((1 << 16,), 4242, E4M3_FILL_SCALE_LOG2, torch.float32, dev),
                      torch.from_numpy(np.concatenate([near, -near])).to(dev)])
    got = vals.to(torch.float8_e4m3fn).view(torch.uint8).cpu().numpy()
    bad = int((got != ref_e4m3_bits(vals.double().cpu().numpy())).sum())
    if bad:
        fails.append(f"e4m3 cast: {bad} of {vals.numel()} values not rounded to nearest even")
    # The bench's weights from a shape's seeds: those bytes, and the scales.
    runs += 1
    shp = {"experts": 3, "hidden": 200, "intermediate": 72, "activation": "silu",
           "w13_seed": 7, "w13_scale_log2": -3, "w2_seed": 8, "w2_scale_log2": -2}
    w13, w2, _ = shape_weights_fp8(shp, dev)
    for name, wt, seed, dims, log2 in (("w13", w13, 7, (3, 144, 200), -3), ("w2", w2, 8, (3, 200, 72), -2)):
        v = peer_torch.fill_uniform(dims, seed, E4M3_FILL_SCALE_LOG2, torch.float32, dev).double().cpu().numpy()
        if not np.array_equal(wt.q.view(torch.uint8).cpu().numpy(), ref_e4m3_bits(v)):
            fails.append(f"weights: {name} bytes differ from the rounded fill")
        want = (dims[0], triton.cdiv(dims[1], FP8_GROUP), triton.cdiv(dims[2], FP8_GROUP))
        if tuple(wt.scale.shape) != want or not bool((wt.scale == 2.0 ** (log2 - 8)).all()):
            fails.append(f"weights: {name} scales {tuple(wt.scale.shape)} not {want} of 2^{log2 - 8}")

    # The quantizer: partial groups, more groups than one program takes, an all-zero row
    # (scale floor, zeros), an outlier, values below the floor, every e4m3 rounding tie
    # (a row whose groups start with 448: scale 1), rows 2^4 apart in magnitude.
    ties = torch.from_numpy(mids.astype(np.float32))
    for kdim in (72, 128, 200, 1100):
        runs += 1
        x = rnd(8, kdim) * torch.exp2(torch.arange(8.0) * 4 - 16)[:, None]
        x[0] = 0
        x[1, kdim // 3] = 3e4
        x[2] = rnd(kdim, scale=1e-30)
        x[3] = ties.repeat(triton.cdiv(kdim, ties.numel()))[:kdim] * (1 - 2 * (torch.arange(kdim) % 2))
        x[3, ::FP8_GROUP] = E4M3_MAX
        x = x.to(torch.bfloat16).to(dev)
        try:
            q, s = quant_fp8(x)
            rq, rs = ref_quant_fp8(x)
            if not torch.equal(s, rs):
                fails.append(f"quant K={kdim}: scales differ in {int((s != rs).sum())} of {s.numel()}")
            if not torch.equal(q.view(torch.uint8), rq.view(torch.uint8)):
                fails.append(f"quant K={kdim}: e4m3 bytes differ in {int((q.view(torch.uint8) != rq.view(torch.uint8)).sum())}"
                             f" of {q.numel()}")
        except Exception as ex:
            fails.append(f"quant K={kdim}: {type(ex).__name__}: {ex}")

    shapes = [
        # K (H=200; I=72) not a multiple of 128, N13=144 two scale rows, the second partial;
        # experts 2 and 5 never chosen.
        {"name": "t8-silu", "experts": 8, "top_k": 2, "hidden": 200, "intermediate": 72,
         "routing": "renormalize", "activation": "silu", "dead": [2, 5]},
        {"name": "t8-dsv3", "experts": 16, "top_k": 4, "hidden": 256, "intermediate": 128,
         "routing": "deepseek_v3", "num_groups": 4, "topk_groups": 2, "routed_scaling_factor": 2.5,
         "activation": "silu", "score_bias": True},
        {"name": "t8-oai", "experts": 6, "top_k": 3, "hidden": 128, "intermediate": 192,
         "routing": "softmax_topk", "activation": "swiglu_oai", "swiglu_limit": 7.0, "swiglu_alpha": 1.702},
        # Expert 1 takes most tokens: many blocks of one expert.
        {"name": "t8-relu2", "experts": 4, "top_k": 1, "hidden": 384, "intermediate": 64,
         "routing": "renormalize", "activation": "relu2", "hot": [1]},
    ]
    # BLOCK_N below, at and above the 128-row scale block.
    configs = [cfg(16, 32, 128, 1, 4, 2), cfg(32, 64, 128, 4, 4, 3), cfg(16, 128, 128, 2, 4, 2),
               cfg(64, 256, 128, 8, 4, 3)]
    ms = [1, 5, 33, 100]

    def fp8_weight(e, n, kdim):
        # e4m3 values over the format's range; block scales differ (2^[-1, 1) around
        # 2/sqrt(K)/256), so a scale read from the wrong block shows.
        q = rnd(e, n, kdim, scale=256.0).to(torch.float8_e4m3fn)
        s = torch.exp2(rnd(e, triton.cdiv(n, FP8_GROUP), triton.cdiv(kdim, FP8_GROUP))) * (2 / math.sqrt(kdim) / 256)
        return Fp8Weight(q.to(dev), s.to(dev))

    worst_layer, worst_gemm, layer_runs = 0.0, 0.0, 0
    for shape in shapes:
        e, k, h, i = shape["experts"], shape["top_k"], shape["hidden"], shape["intermediate"]
        n13 = i if shape["activation"] == "relu2" else 2 * i
        w13, w2 = fp8_weight(e, n13, h), fp8_weight(e, h, i)
        bias = rnd(e, scale=0.1).to(dev) if shape.get("score_bias") else None
        lw = []
        for m in ms:
            # Each (token, 128 columns) group of its own magnitude (2^[-2, 2)), so an
            # activation scale read for the wrong group or row shows.
            mag = torch.exp2(rnd(m, triton.cdiv(h, FP8_GROUP), scale=2.0)).repeat_interleave(FP8_GROUP, 1)[:, :h]
            hidden = (rnd(m, h) * mag).to(torch.bfloat16).to(dev)
            logits = rnd(m, e, scale=4.0)
            for x in shape.get("dead", []):
                logits[:, x] = -1e4
            for x in shape.get("hot", []):
                logits[:, x] += 6.0
            logits = logits.to(dev)
            ids, w = peer_torch.route(shape, logits, bias)
            ref = ref_layer_fp8(shape, w13, w2, hidden, ids, w)
            for c in configs:
                tag = f"{shape['name']} M={m} {cfg_name(c)}"
                runs += 1
                layer_runs += 1
                try:
                    bm = c["BLOCK_M"]
                    al = moe_align(ids, e, bm, padded_len(m, k, e, bm))
                    why = check_align(ids, e, bm, *al)
                    if why:
                        fails.append(f"{tag}: align: {why}")
                        continue
                    # Each GEMM on the emulation's quantized inputs (the quantizer is checked above).
                    xq, xs = ref_quant_fp8(hidden)
                    err1 = gemm_err_fp8(xq, xs, w13, *al, ids, k, c, None)
                    a = activate(shape, grouped_gemm_fp8(xq, xs, w13, *al, m * k, k, c))
                    aq, a_s = ref_quant_fp8(a)
                    err2 = gemm_err_fp8(aq, a_s, w2, *al, ids, 1, c, w.reshape(-1).float().contiguous())
                    for which, err in (("GEMM1", err1), ("GEMM2", err2)):
                        if isinstance(err, str) or not err <= GEMM_BOUND:
                            fails.append(f"{tag}: {which}: {err}")
                        else:
                            worst_gemm = max(worst_gemm, err)
                    out = make_layer(shape, w13, w2, bias, m, c)(hidden, logits)
                    err = peer_torch.rel_l2(out, ref)
                    lw.append(err)
                    worst_layer = max(worst_layer, err)
                    if not err <= FP8_LAYER_BOUND:
                        fails.append(f"{tag}: layer rel L2 {err:.2e} > {FP8_LAYER_BOUND}")
                    if dev.type == "cuda":
                        why = check_graph(shape, w13, w2, bias, m, c, hidden, logits, out)
                        if why:
                            fails.append(f"{tag}: {why}")
                except Exception as ex:
                    fails.append(f"{tag}: {type(ex).__name__}: {ex}")
        lo, hi = min(lw, default=float("nan")), max(lw, default=float("nan"))
        print(f"  {shape['name']:<8} E={e} k={k} H={h} I={i}: layer rel L2 vs the fp32 emulation {lo:.2e}..{hi:.2e}"
              f" over M={ms} x {len(configs)} configs")
    # The launch table and the tuning grids: BLOCK_K is the scale block, and the table fits.
    for c in [c for _, c in FP8_TABLE] + TUNE_FP8_DECODE + TUNE_FP8_MID + TUNE_FP8_LARGE:
        if c["BLOCK_K"] != FP8_GROUP:
            fails.append(f"fp8 config {cfg_name(c)}: BLOCK_K must be {FP8_GROUP}")
    for _, c in FP8_TABLE:
        if smem_bytes(c, 1) > SMEM_BUDGET:
            fails.append(f"fp8 table entry {cfg_name(c)}: needs {smem_bytes(c, 1)} B of shared memory")
    print(f"  {runs} runs ({layer_runs} layers; the e4m3 cast, the bench's weights, the quantizer at 4 widths):"
          f" worst GEMM rel L2 {worst_gemm:.2e} (bound {GEMM_BOUND}), worst layer rel L2 {worst_layer:.2e}"
          f" (bound {FP8_LAYER_BOUND})"
          + ("; each layer also run under sync-debug 'error' and replayed from a CUDA graph"
             if dev.type == "cuda" else ""))
    for f in fails:
        print("FAILED: " + f)
    failed = len({f.split(":")[0] for f in fails})
    print(f"{max(0, runs - failed)} passed, {failed} failed")
    return 1 if fails else 0


# ---- the benchmark ----
def run_case(args, shape, case, w13, w2, bias, sets, dev, failures, log):
    """One case: pick its config (table or tuning), time it, check it against the
    moekit dump (fp8: against the torch fp32 emulation, on the first input set);
    returns its result row. Its graphs and buffers die with the call."""
    m = case["m"]
    scheme = scheme_of(w13)
    inputs = peer_torch.case_inputs(shape, case, sets, dev)
    tune_times = None
    if args.tune:
        t0 = time.time()
        c, tune_times = tune_case(shape, w13, w2, bias, inputs, args.tune_seconds, log)
        log(f"  {shape['name']} M={m}: tuned {len(tune_times)} configs in {time.time() - t0:.0f} s, "
            f"best {cfg_name(c)}")
    else:
        c = default_config(m, shape["top_k"], shape["experts"], w13.shape[1], shape["hidden"], scheme)
    t, graphs, outs = time_layer(shape, w13, w2, bias, inputs, c, args.seconds, args.min_reps)
    r = {"shape": shape["name"], "m": m, "time_us": t * 1e6,
         "tflops": case["flops"] / t * 1e-12, "frac_floor": case["floor_us"] * 1e-6 / t,
         "moekit_time_us": case["time_us"], "ratio": case["time_us"] * 1e-6 / t,
         "config": dict(c, name=cfg_name(c)), "tuned": bool(args.tune), "scheme": scheme}
    if tune_times is not None:
        r["tune_us"] = tune_times
    if case.get("dump") and args.dump_dir:
        try:
            graphs[0].replay()
            torch.cuda.synchronize()
            ref = torch.from_numpy(np.load(os.path.join(args.dump_dir, case["dump"])).view(np.int16))
            ref = ref.view(torch.bfloat16).to(dev)
            err = peer_torch.rel_l2(outs[0], ref)
        except Exception as ex:  # a missing or unreadable dump fails the check, not the timing
            err = float("inf")
            failures.append(f"{shape['name']} M={m}: check: {type(ex).__name__}: {ex}")
        r["rel_l2_vs_moekit"] = err
        r["check"] = "pass" if err <= OUTPUT_BOUND else "FAIL"
        if err > OUTPUT_BOUND and math.isfinite(err):
            failures.append(f"{shape['name']} M={m}: triton vs moekit rel L2 {err:.3e} > {OUTPUT_BOUND}")
    if scheme == FP8_BLOCK_SCHEME:
        try:
            graphs[0].replay()
            torch.cuda.synchronize()
            hid, lg = inputs[0]
            ids, w = peer_torch.route(shape, lg, bias)
            err = peer_torch.rel_l2(outs[0], ref_layer_fp8(shape, w13, w2, hid, ids, w))
        except Exception as ex:  # a check that cannot run fails the check, not the timing
            err = float("inf")
            failures.append(f"{shape['name']} M={m}: check: {type(ex).__name__}: {ex}")
        r["rel_l2_vs_emulation"] = err
        r["check"] = "pass" if err <= FP8_LAYER_BOUND else "FAIL"
        if err > FP8_LAYER_BOUND and math.isfinite(err):
            failures.append(f"{shape['name']} M={m}: triton vs the fp32 emulation rel L2 {err:.3e} > {FP8_LAYER_BOUND}")
    err = r.get("rel_l2_vs_moekit", r.get("rel_l2_vs_emulation"))
    log(f"  {shape['name']} M={m}: triton {t * 1e6:.1f} us ({cfg_name(c)}), moekit {case['time_us']:.1f} us"
        + (f", rel_l2 {err:.2e}" if err is not None else ""))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moekit-json", help="JSON written by moekit_gpu_bench")
    ap.add_argument("--dump-dir", default="", help="where moekit_gpu_bench dumped its outputs")
    ap.add_argument("--json", default="", help="write the peer's results here")
    ap.add_argument("--seconds", type=float, default=0.25)
    ap.add_argument("--min-reps", type=int, default=3)
    ap.add_argument("--tune", action="store_true", help="pick the fastest launch config per case on its data")
    ap.add_argument("--tune-seconds", type=float, default=0.05, help="timing budget per tuning candidate")
    ap.add_argument("--only", nargs="+", metavar="SHAPE", help="run only these shapes")
    ap.add_argument("--scheme", choices=["bf16", FP8_BLOCK_SCHEME],
                    help="the expert GEMMs' scheme (default: the moekit JSON's \"scheme\"); with --self-check, "
                         "test only this scheme's path (default: both)")
    ap.add_argument("--self-check", action="store_true", help="test align and kernel against fp64, then exit")
    args = ap.parse_args()
    if args.self_check:
        rc = 0
        if args.scheme in (None, "bf16"):
            rc |= self_check()
        if args.scheme in (None, FP8_BLOCK_SCHEME):
            rc |= self_check_fp8()
        return rc
    if not args.moekit_json:
        ap.error("--moekit-json is required")

    with open(args.moekit_json) as f:
        mk = json.load(f)
    # The peer times the moekit run's cases, so it runs the scheme that run timed.
    mk_scheme = mk.get("scheme", "bf16")
    scheme = args.scheme or mk_scheme
    if scheme != mk_scheme:
        ap.error(f"--scheme {scheme}: {args.moekit_json} holds a run of scheme {mk_scheme}")
    if scheme not in ("bf16", FP8_BLOCK_SCHEME):
        ap.error(f"{args.moekit_json}: scheme {scheme} has no Triton peer here (bf16, {FP8_BLOCK_SCHEME})")
    if scheme == FP8_BLOCK_SCHEME and args.dump_dir:
        ap.error("--dump-dir: moekit dumps no outputs for fp8 schemes; each fp8 case is checked against "
                 "the torch fp32 emulation instead")
    dev = torch.device("cuda")
    sets = mk["num_sets"]
    results, failures = [], []

    def log(s):
        print(s, flush=True)

    for name in sorted(set(args.only or []) - {s["name"] for s in mk["shapes"]}):
        failures.append(f"--only {name}: no such shape in {args.moekit_json}")

    for shape in mk["shapes"]:
        if args.only and shape["name"] not in args.only:
            continue
        cases = [c for c in mk["cases"] if c["shape"] == shape["name"]]
        if not cases:
            continue
        try:
            if scheme == FP8_BLOCK_SCHEME:
                w13, w2, bias = shape_weights_fp8(shape, dev)
            else:
                w13, w2, bias = peer_torch.shape_weights(shape, dev)
        except Exception as ex:
            failures.append(f"{shape['name']}: weights: {ex}")
            log("  " + failures[-1])
            torch.cuda.empty_cache()
            continue
        for case in cases:
            try:
                results.append(run_case(args, shape, case, w13, w2, bias, sets, dev, failures, log))
            except Exception as ex:  # report and go on: one bad case must not hide the others
                failures.append(f"{shape['name']} M={case['m']}: {type(ex).__name__}: {ex}")
                log("  " + failures[-1])
            torch.cuda.empty_cache()
        # DeepSeek-V3's weights are ~23 GB: one shape's at a time.
        del w13, w2, bias
        torch.cuda.empty_cache()

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"triton": triton.__version__, "torch": torch.__version__, "tuned": bool(args.tune),
                       "scheme": scheme, "cases": results, "failures": failures}, f, indent=1)
    # The summary table, last: moekit's time and fraction of the floor next to the peer's.
    by_case = {(c["shape"], c["m"]): c for c in mk["cases"]}
    if scheme == FP8_BLOCK_SCHEME:
        print(f"scheme {FP8_BLOCK_SCHEME}: e4m3 weights regenerated from the moekit run's seeds, block scales "
              f"2^(scale_log2 - 8); activations quantized per token and 128 columns in Triton; %floor against "
              f"moekit's fp8 floor; check: rel L2 vs the torch fp32 emulation (set 0, bound {FP8_LAYER_BOUND})")
    print(f"{'shape':<18} {'M':>6} {'moekit_us':>10} {'%floor':>7} {'triton_us':>10} {'t%floor':>7} "
          f"{'mk/triton':>9} {'check':>14}  config")
    for r in results:
        c = by_case[(r["shape"], r["m"])]
        err = r.get("rel_l2_vs_moekit", r.get("rel_l2_vs_emulation"))
        chk = f"{r['check']} {err:.1e}" if "check" in r else "-"
        print(f"{r['shape']:<18} {r['m']:>6} {c['time_us']:>10.1f} {100 * c['frac_floor']:>6.1f}% "
              f"{r['time_us']:>10.1f} {100 * r['frac_floor']:>6.1f}% {r['ratio']:>9.2f} {chk:>14}  "
              f"{r['config']['name']}")
    for f in failures:
        print("FAILED: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

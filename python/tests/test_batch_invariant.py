"""Batch-invariant mode: row r computed in any batch equals row r computed alone, bit for bit, on fresh
inputs: the CPU backend (packed bf16 path and the fixed-order f32 path) and the CUDA backend (gpu)."""
import pytest
import torch

import moekit
from conftest import E, H, I, K, seed_of, small_config, tie_free_logits


@pytest.mark.parametrize("weight_dtype", ["bf16", "f32"])
@pytest.mark.parametrize("routing", ["renormalize", "deepseek_v3"])
def test_row_alone_equals_row_in_any_batch(weight_dtype, routing):
    gen = torch.Generator().manual_seed(seed_of("bi", weight_dtype, routing))
    cfg = small_config(routing, weight_dtype=weight_dtype, batch_invariant=True)
    assert cfg.batch_invariant
    dt = torch.bfloat16 if weight_dtype == "bf16" else torch.float32
    w13 = (torch.randn((E, 2 * I, H), generator=gen) * 0.1).to(dt)
    w2 = (torch.randn((E, H, I), generator=gen) * 0.1).to(dt)
    bias = torch.rand(E, generator=gen) * 1e-3 if routing == "deepseek_v3" else None
    layer = moekit.MoeLayer(cfg, w13, w2, score_bias=bias)
    M = 64  # sgemm (f32 weights) without the flag gives a few rows that differ alone at this size
    hidden = torch.randn((M, H), generator=gen).bfloat16()
    logits = torch.randn((M, E), generator=gen)
    full = layer(hidden, logits)
    bits = lambda t: t.view(torch.int16)
    for r in range(M):
        assert torch.equal(bits(layer(hidden[r:r + 1], logits[r:r + 1])), bits(full[r:r + 1])), r
    idx = torch.randperm(M, generator=gen)[:37]
    assert torch.equal(bits(layer(hidden[idx], logits[idx])), bits(full[idx]))


@pytest.mark.parametrize("routing", ["renormalize", "sigmoid_renorm"])
def test_fixed_order_f32_path_matches_the_fp64_reference(routing):
    """The fixed-order GEMM that replaces sgemm under the flag computes the layer, not just the same wrong
    thing for every batch: f32 throughout against the fp64 truth (reference.py)."""
    from reference import moe, rel_l2, route
    gen = torch.Generator().manual_seed(seed_of("bi-ref", routing))
    cfg = small_config(routing, weight_dtype="f32", act_dtype="f32", batch_invariant=True)
    w13 = torch.randn((E, 2 * I, H), generator=gen) * 0.1
    w2 = torch.randn((E, H, I), generator=gen) * 0.1
    layer = moekit.MoeLayer(cfg, w13, w2)
    hidden = torch.randn((40, H), generator=gen)
    logits = tie_free_logits(40, E, gen)
    ids, weights = route(logits, routing, K)
    ref = moe(hidden, w13, w2, ids, weights)
    # fp32 dot products of length H = 64 and I = 32 (~K 2^-24 each) plus the fp32 routing weights: 1e-5.
    assert rel_l2(layer(hidden, logits), ref) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("routing", ["renormalize", "deepseek_v3"])
def test_cuda_row_alone_equals_row_in_any_batch(routing):
    """M from 1 to 300 crosses every size threshold of the default GEMM path table (streaming for few rows
    per expert, CUTLASS above, K slices for tiny batches): under the flag one path serves them all."""
    gen = torch.Generator().manual_seed(seed_of("bi-cuda", routing))
    cfg = small_config(routing, batch_invariant=True, max_num_tokens=512)
    w13 = (torch.randn((E, 2 * I, H), generator=gen) * 0.1).bfloat16()
    w2 = (torch.randn((E, H, I), generator=gen) * 0.1).bfloat16()
    bias = (torch.rand(E, generator=gen) * 1e-3).cuda() if routing == "deepseek_v3" else None
    layer = moekit.MoeLayer(cfg, w13, w2, score_bias=bias, device="cuda")
    assert layer.backend == "cuda_sm90"
    M = 300
    hidden = torch.randn((M, H), generator=gen).bfloat16().cuda()
    logits = torch.randn((M, E), generator=gen).cuda()
    full = layer(hidden, logits)
    bits = lambda t: t.view(torch.int16)
    for r in torch.randperm(M, generator=gen)[:24].tolist():
        assert torch.equal(bits(layer(hidden[r:r + 1], logits[r:r + 1])), bits(full[r:r + 1])), r
    for n in (2, 7, 64, 129):
        idx = torch.randperm(M, generator=gen)[:n].cuda()
        assert torch.equal(bits(layer(hidden[idx], logits[idx])), bits(full[idx])), n

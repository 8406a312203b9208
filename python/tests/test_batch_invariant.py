"""Batch-invariant mode: row r computed in any batch equals row r computed alone, bit for bit, on fresh
inputs (CPU backend: packed bf16 path and the fixed-order f32 path); CUDA kernels refuse the flag."""
import pytest
import torch

import moekit
from conftest import E, H, I, K, seed_of, small_config


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


@pytest.mark.gpu
def test_cuda_kernels_refuse_batch_invariant_with_a_reason():
    cfg = small_config("renormalize", batch_invariant=True)
    with pytest.raises(ValueError, match="batch_invariant"):
        moekit.select_backend(cfg, device="cuda")
    report = moekit.select_backend(small_config("renormalize"), device="cuda")
    assert any(c["verdict"] == "chosen" for c in report)

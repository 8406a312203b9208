"""MoeLayer's constructor and from_pretrained options: batch invariance of the layer's own router logits,
and options that are refused rather than coerced or ignored."""
import pytest
import torch

import moekit
from conftest import seed_of

transformers = pytest.importorskip("transformers")

from test_checkpoints import DTYPES, LAYER, build  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for dtype_name in DTYPES:
        folder = tmp_path_factory.mktemp(f"qwen3_{dtype_name}")
        build("qwen3_moe", dtype_name, folder)
        out[dtype_name] = folder
    return out


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_own_router_logits_are_batch_invariant(folders, dtype_name):
    """A batch-invariant layer called without router logits computes them itself: row r of a batch
    equals row r alone, bit for bit (torch's F.linear rounds differently by M: 200 of 200 rows differ
    here in f32), and the logits are the router's product (float64 truth, 1e-6 relative)."""
    layer = moekit.MoeLayer.from_pretrained(folders[dtype_name], LAYER, batch_invariant=True)
    gen = torch.Generator().manual_seed(seed_of("bi-router", dtype_name))
    M = 50
    x = torch.randn((M, layer.config.hidden_size), generator=gen).to(DTYPES[dtype_name])
    logits = layer.router_logits(x)
    truth = x.double() @ layer.router_weight.double().t()
    assert ((logits.double() - truth).norm() / truth.norm()).item() <= 1e-6
    full = layer(x)
    for r in range(M):
        assert torch.equal(layer.router_logits(x[r:r + 1]), logits[r:r + 1]), r
        assert torch.equal(layer(x[r:r + 1]), full[r:r + 1]), r
    idx = torch.randperm(M, generator=gen)[:17]
    assert torch.equal(layer(x[idx]), full[idx])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_gpus_fixed_order_product_is_batch_invariant(device):
    """The elementwise pairwise product a batch-invariant layer on a GPU uses for its router logits
    (K = 1000 padded to 1024, more rows than one piece holds): row alone == row in the batch, bit for
    bit, and the product itself against float64 (1e-6 relative)."""
    from moekit.layer import _pairwise_linear
    gen = torch.Generator().manual_seed(seed_of("pairwise"))
    M, N, K = 300, 64, 1000
    x, w = torch.randn((M, K), generator=gen).to(device), torch.randn((N, K), generator=gen).to(device)
    full = torch.empty((M, N), device=device)
    _pairwise_linear(x, w, full)
    truth = x.double() @ w.double().t()
    assert ((full.double() - truth).norm() / truth.norm()).item() <= 1e-6
    for r in list(range(0, M, 23)) + [M - 1]:
        alone = torch.empty((1, N), device=device)
        _pairwise_linear(x[r:r + 1], w, alone)
        assert torch.equal(alone, full[r:r + 1]), r

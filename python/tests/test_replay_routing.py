"""moekit.torch.replay_routing: forward bit for bit the routing kernel's weights for forced ids (and for the
ids it selected), gradients to the dense logits checked by gradcheck in float64 and against the plain torch
spec in reference.py; moekit.r3.drift on known differences."""
import pytest
import torch

import moekit
from conftest import seed_of, tie_free_logits
from reference import METHODS, replay_weights

E, K = 16, 4


@pytest.fixture(autouse=True)
def _grad_enabled():
    """Other tests' examples switch autograd off process-wide (torch.set_grad_enabled(False))."""
    with torch.enable_grad():
        yield


def config(method, top_k=K):
    groups = dict(num_groups=4, topk_groups=2, routed_scaling_factor=2.5) if method == "deepseek_v3" else {}
    return moekit.MoeConfig(num_experts=E, top_k=top_k, hidden_size=64, intermediate_size=32, routing=method,
                            max_num_tokens=64, **groups)


def forced(M, gen, k=K):
    """Distinct ids per row in a random order (not the score order: replay keeps the given order)."""
    return torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(M)]).to(torch.int32)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_equals_the_kernel_bit_for_bit(method, dtype):
    gen = torch.Generator().manual_seed(seed_of("fwd", method, str(dtype)))
    cfg = config(method)
    logits = (torch.randn((37, E), generator=gen) * 3).to(dtype)
    ids = forced(37, gen)
    bias = torch.rand(E, generator=gen) * 0.1 if method == "deepseek_v3" else None
    w = moekit.torch.replay_routing(logits, ids, cfg, score_bias=bias)
    _, want = moekit.route(logits, cfg, score_bias=bias, forced_ids=ids)
    assert w.dtype == torch.float32 and torch.equal(w.view(torch.int32), want.view(torch.int32))
    # The ids the router selects, replayed, give the selection's weights bit for bit.
    sel_ids, sel_w = moekit.route(logits, cfg, score_bias=bias)
    assert torch.equal(moekit.torch.replay_routing(logits, sel_ids, cfg, score_bias=bias).view(torch.int32),
                       sel_w.view(torch.int32))
    # And they are the spec's weights (fp32 rounding of a handful of exp/divisions: 2e-6 relative).
    ref = replay_weights(logits.float(), ids, method, cfg.routed_scaling_factor)
    torch.testing.assert_close(w.double(), ref, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("method", METHODS)
def test_gradcheck_float64(method):
    gen = torch.Generator().manual_seed(seed_of("gradcheck", method))
    cfg = config(method)
    logits = (torch.randn((5, E), generator=gen, dtype=torch.float64) * 2).requires_grad_()
    ids = forced(5, gen)
    assert torch.autograd.gradcheck(lambda x: moekit.torch.replay_routing(x, ids, cfg), (logits,))


@pytest.mark.parametrize("method", METHODS)
def test_gradient_matches_the_plain_torch_spec(method):
    gen = torch.Generator().manual_seed(seed_of("grad", method))
    cfg = config(method)
    logits = (torch.randn((29, E), generator=gen) * 2).requires_grad_()
    ids = forced(29, gen)
    g = torch.randn((29, K), generator=gen)
    (moekit.torch.replay_routing(logits, ids, cfg) * g).sum().backward()
    x64 = logits.detach().double().requires_grad_()
    (replay_weights(x64, ids, method, cfg.routed_scaling_factor) * g.double()).sum().backward()
    # f32 analytic gradient against fp64 autograd: products of O(1) terms, a few ulp each.
    torch.testing.assert_close(logits.grad.double(), x64.grad, rtol=1e-5, atol=2e-6)
    if method == "softmax_topk":  # the full softmax reaches every logit, not just the forced ones
        unforced = torch.ones_like(logits, dtype=torch.bool).scatter(1, ids.long(), False)
        assert (logits.grad[unforced] != 0).all()


def test_router_weights_receive_gradients_through_replay():
    """The trainer's use: logits = h W^T; forcing the engine's ids must not cut W from the graph."""
    gen = torch.Generator().manual_seed(seed_of("router"))
    cfg = config("deepseek_v3")
    h = torch.randn((12, 32), generator=gen)
    W = (torch.randn((E, 32), generator=gen) * 0.1).requires_grad_()
    ids = forced(12, gen)
    moekit.torch.replay_routing(h @ W.t(), ids, cfg).pow(2).sum().backward()
    assert W.grad is not None and W.grad.abs().sum() > 0


def test_bad_forced_ids_are_refused():
    cfg = config("renormalize")
    logits = torch.zeros((3, E))
    good = torch.tensor([[0, 1, 2, 3]] * 3, dtype=torch.int32)
    for bad, what in [(good.clone().index_fill_(1, torch.tensor([2]), 1), "duplicates"),
                      (good.clone().index_fill_(1, torch.tensor([0]), E), "not an expert id"),
                      (good.clone().index_fill_(1, torch.tensor([3]), -1), "-1")]:
        with pytest.raises(ValueError, match=what):
            moekit.torch.replay_routing(logits, bad, cfg)
    with pytest.raises(ValueError, match="forced_ids: expected"):
        moekit.torch.replay_routing(logits, good[:, :2], cfg)
    with pytest.raises(ValueError, match="repeats"):
        moekit.torch.replay_routing(logits.double(), good.clone().index_fill_(1, torch.tensor([2]), 1), cfg)


def test_drift_counts_what_changed():
    gen = torch.Generator().manual_seed(seed_of("drift"))
    cfg = config("renormalize")
    a = torch.stack([tie_free_logits(40, E, gen) for _ in range(2)])
    same = moekit.r3.drift(a, a.clone(), cfg)
    assert [d["changed_tokens"] for d in same] == [0.0, 0.0]
    assert [d["id_agreement"] for d in same] == [1.0, 1.0]
    assert all(d["margin_min"] >= 0.03 - 1e-6 for d in same)  # tie_free_logits keeps values 0.03 apart
    b = a.clone()
    b[1, :10] = b[1, :10].flip(1)  # layer 1: reverse the expert order of 10 tokens: their top-k changes
    d = moekit.r3.drift(a, b, cfg)
    ia, _ = moekit.route(a[1], cfg)
    ib, _ = moekit.route(b[1], cfg)
    changed = (ia.sort(1).values != ib.sort(1).values).any(1).float().mean().item()
    assert d[0]["changed_tokens"] == 0.0 and d[1]["changed_tokens"] == changed > 0


@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
def test_cuda_forward_is_the_cuda_kernel_and_gradient_matches_the_cpu(method):
    gen = torch.Generator().manual_seed(seed_of("cuda", method))
    cfg = config(method)
    logits = torch.randn((45, E), generator=gen) * 2
    ids = forced(45, gen)
    g = torch.randn((45, K), generator=gen)
    x = logits.cuda().requires_grad_()
    w = moekit.torch.replay_routing(x, ids.cuda(), cfg)
    _, want = moekit.route(x.detach(), cfg, forced_ids=ids.cuda())
    assert torch.equal(w.view(torch.int32), want.view(torch.int32))  # the CUDA router's own weights
    (w * g.cuda()).sum().backward()
    xc = logits.clone().requires_grad_()
    (moekit.torch.replay_routing(xc, ids, cfg) * g).sum().backward()
    # CPU and CUDA weights agree to fp32 rounding (docs/routing.md section 2), so do the gradients.
    torch.testing.assert_close(x.grad.cpu(), xc.grad, rtol=1e-5, atol=2e-6)
    with pytest.raises(ValueError, match="repeats"):
        bad = ids.clone()
        bad[3, 1] = bad[3, 0]
        moekit.torch.replay_routing(x, bad.cuda(), cfg)

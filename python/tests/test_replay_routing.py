"""moekit.torch.replay_routing: forward bit for bit the routing kernel's weights for forced ids (and for the
ids it selected), gradients to the dense logits checked by gradcheck in float64 and against the plain torch
spec in reference.py; moekit.r3.drift on known differences."""
import pytest
import torch

import moekit
from conftest import seed_of, tie_free_logits
from reference import METHODS, replay_weights

E, K = 16, 4
# Every method, and deepseek_v3 without renormalization (norm_topk_prob = false: w = sigmoid(x_f) * scale).
VARIANTS = [pytest.param(m, True, id=m) for m in METHODS] + [pytest.param("deepseek_v3", False,
                                                                         id="deepseek_v3-no-renormalize")]


def config(method, top_k=K, renormalize=True):
    groups = dict(num_groups=4, topk_groups=2, routed_scaling_factor=2.5) if method == "deepseek_v3" else {}
    return moekit.MoeConfig(num_experts=E, top_k=top_k, hidden_size=64, intermediate_size=32, routing=method,
                            max_num_tokens=64, renormalize=renormalize, **groups)


def forced(M, gen, k=K):
    """Distinct ids per row in a random order (not the score order: replay keeps the given order)."""
    return torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(M)]).to(torch.int32)


@pytest.mark.parametrize("method,renormalize", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_equals_the_kernel_bit_for_bit(method, renormalize, dtype):
    gen = torch.Generator().manual_seed(seed_of("fwd", method, str(dtype), renormalize))
    cfg = config(method, renormalize=renormalize)
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
    ref = replay_weights(logits.float(), ids, method, cfg.routed_scaling_factor, renormalize)
    torch.testing.assert_close(w.double(), ref, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("method,renormalize", VARIANTS)
def test_gradcheck_float64(method, renormalize):
    gen = torch.Generator().manual_seed(seed_of("gradcheck", method, renormalize))
    cfg = config(method, renormalize=renormalize)
    logits = (torch.randn((5, E), generator=gen, dtype=torch.float64) * 2).requires_grad_()
    ids = forced(5, gen)
    # gradcheck only proves the backward consistent with the forward: first pin the float64 forward and its
    # autograd gradient to the independent spec of reference.py, so a wrong formula cannot pass.
    g = torch.randn((5, K), generator=gen, dtype=torch.float64)
    w = moekit.torch.replay_routing(logits, ids, cfg)
    ref_x = logits.detach().clone().requires_grad_()
    ref = replay_weights(ref_x, ids, method, cfg.routed_scaling_factor, renormalize)
    torch.testing.assert_close(w, ref, rtol=1e-12, atol=1e-12)
    (got,) = torch.autograd.grad((w * g).sum(), logits)
    (want,) = torch.autograd.grad((ref * g).sum(), ref_x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: moekit.torch.replay_routing(x, ids, cfg), (logits,))


@pytest.mark.parametrize("method", ["renormalize", "deepseek_v3"])
def test_replay_compiles_with_fullgraph_and_equals_eager(method):
    """With routing_spec(cfg) the call is one registered op (and its registered gradient): a router and
    the replayed weights compile with fullgraph=True, the weights bit for bit and the loss and gradients
    equal to eager (the loss's sum is torch's: inductor may order it differently from eager on a CPU, so
    it gets fp32 rounding, 2^-24 per term)."""
    gen = torch.Generator().manual_seed(seed_of("compile", method))
    cfg = config(method)
    spec = moekit.torch.routing_spec(cfg)
    assert spec == moekit.torch.routing_spec(config(method))  # equal configs, equal specs (one handle)
    router = torch.nn.Linear(32, E, bias=False)
    with torch.no_grad():
        router.weight.copy_(torch.randn((E, 32), generator=gen))
    h = torch.randn((9, 32), generator=gen)
    ids = forced(9, gen)
    g = torch.randn((9, K), generator=gen)

    def step(x):
        w = moekit.torch.replay_routing(router(x), ids, spec)
        return w, (w * g).sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    w_c, loss_c = compiled(h)
    (grad_c,) = torch.autograd.grad(loss_c, router.weight)
    w_e, loss_e = step(h)
    (grad_e,) = torch.autograd.grad(loss_e, router.weight)
    assert torch.equal(w_c, w_e)
    assert abs(loss_c.item() - loss_e.item()) <= w_e.numel() * 2 ** -24 * (w_e * g).abs().sum().item()
    torch.testing.assert_close(grad_c, grad_e, rtol=1e-6, atol=1e-7)
    assert grad_e.abs().sum() > 0


def test_a_config_under_fullgraph_says_to_pass_its_spec():
    """The MoeConfig is a native object dynamo cannot trace: under fullgraph=True the error names what to
    pass (routing_spec(cfg)) rather than dynamo's "nb_method.__call__" alone; eager calls take either."""
    cfg = config("renormalize")
    ids = forced(3, torch.Generator().manual_seed(seed_of("compile-cfg")))
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: moekit.torch.replay_routing(x, ids, cfg), fullgraph=True)
    with pytest.raises(Exception, match=r"pass moekit\.torch\.routing_spec\(cfg\)"):
        compiled(torch.randn(3, E))
    logits = torch.randn(3, E)
    assert torch.equal(moekit.torch.replay_routing(logits, ids, cfg),
                       moekit.torch.replay_routing(logits, ids, moekit.torch.routing_spec(cfg)))


@pytest.mark.parametrize("method,renormalize", VARIANTS)
def test_gradient_matches_the_plain_torch_spec(method, renormalize):
    gen = torch.Generator().manual_seed(seed_of("grad", method, renormalize))
    cfg = config(method, renormalize=renormalize)
    logits = (torch.randn((29, E), generator=gen) * 2).requires_grad_()
    ids = forced(29, gen)
    g = torch.randn((29, K), generator=gen)
    (moekit.torch.replay_routing(logits, ids, cfg) * g).sum().backward()
    x64 = logits.detach().double().requires_grad_()
    (replay_weights(x64, ids, method, cfg.routed_scaling_factor, renormalize) * g.double()).sum().backward()
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_int64_ids_are_range_checked_before_narrowing(dtype):
    """2**32 + 3 is not expert 3: an int64 id is checked as it is, never after a cast to int32."""
    cfg = config("renormalize")
    logits = torch.zeros((3, E), dtype=dtype)
    for wide in (2 ** 32 + 3, 2 ** 31, -(2 ** 32) + 1, 2 ** 63 - 1):
        ids = torch.tensor([[0, 1, 2, 3]] * 3, dtype=torch.int64)
        ids[1, 2] = wide
        with pytest.raises(ValueError, match=rf"forced_ids\[1, 2\] = {wide} outside \[0, {E}\)"):
            moekit.torch.replay_routing(logits, ids, cfg)
    ok = torch.tensor([[0, 1, 2, 3]] * 3, dtype=torch.int64)
    torch.testing.assert_close(moekit.torch.replay_routing(logits.float(), ok, cfg), torch.full((3, K), 0.25))


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
@pytest.mark.parametrize("method,renormalize", VARIANTS)
def test_cuda_forward_is_the_cuda_kernel_and_gradient_matches_the_cpu(method, renormalize):
    gen = torch.Generator().manual_seed(seed_of("cuda", method, renormalize))
    cfg = config(method, renormalize=renormalize)
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


def test_weight_rules_cover_exactly_the_library_methods():
    """One table for replay's weights and gradients: every routing method of the library has a rule
    (or is listed as having no weights), and a method the table does not know is an error, not a
    silently wrong replay."""
    from moekit import _moekit
    from moekit import torch as mtorch
    methods = _moekit.routing_methods()
    assert methods[0] == "softmax_topk" and "custom" in methods and "deepseek_v3" in methods
    mtorch._check_rules_cover(methods)  # the import ran it too
    with pytest.raises(RuntimeError, match="no rule for \\['new_method'\\]"):
        mtorch._check_rules_cover(methods + ["new_method"])
    with pytest.raises(RuntimeError, match="rules for unknown \\['topk'\\]"):
        mtorch._check_rules_cover([m for m in methods if m != "topk"])


def test_capture_format_knows_the_library_methods():
    """moekit.r3 (NumPy only, no native module) keeps its own list of method names for capture files:
    it must be the library's."""
    from moekit import _moekit
    from moekit.r3 import format as r3format
    assert list(r3format._METHODS) == _moekit.routing_methods()

"""The training path of a replayed MoE layer (moekit.torch.replayed_moe, forced_experts): the value is the
moekit layer's output with the ids forced, bit for bit; the gradients to hidden, the router and the expert
weights equal those of an independent float64 torch model of the same forced routing (reference.py's
weight formula, a token-by-token expert loop written here); forced_experts itself passes gradcheck in
float64 and matches that loop for every activation."""
import functools

import pytest
import torch

import moekit
from conftest import seed_of
from reference import replay_weights

E, K, H, I = 8, 2, 32, 16


@pytest.fixture(autouse=True)
def _grad_enabled():
    with torch.enable_grad():
        yield


def loop_experts(hidden, ids, weights, w13, w2, activation):
    """Token by token, slot by slot, float64: the forced routing's output, differentiable in every input."""
    limit, alpha = 7.0, 1.702
    rows = []
    for t in range(hidden.shape[0]):
        acc = torch.zeros(hidden.shape[1], dtype=torch.float64)
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            z = w13[e].double() @ hidden[t].double()
            if activation == "silu":
                a = z[:I] * torch.sigmoid(z[:I]) * z[I:]
            elif activation == "gelu":
                g = z[:I]
                a = 0.5 * g * (1 + torch.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3))) * z[I:]
            elif activation == "swiglu_oai":
                g, u = z[0::2].clamp(max=limit), z[1::2].clamp(-limit, limit)
                a = g * torch.sigmoid(alpha * g) * (u + 1)
            else:  # relu2
                a = torch.relu(z) ** 2
            acc = acc + weights[t, j].double() * (w2[e].double() @ a)
        rows.append(acc)
    return torch.stack(rows)


def inputs(activation, M, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    n1 = I if activation == "relu2" else 2 * I
    hidden = torch.randn((M, H), generator=gen, dtype=torch.float64).to(dtype)
    w13 = (torch.randn((E, n1, H), generator=gen, dtype=torch.float64) / H ** 0.5).to(dtype)
    w2 = (torch.randn((E, H, I), generator=gen, dtype=torch.float64) / I ** 0.5).to(dtype)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(M)]).to(torch.int32)
    weights = torch.rand((M, K), generator=gen, dtype=torch.float64).to(dtype)
    return hidden, ids, weights, w13, w2


@pytest.mark.parametrize("activation", ["silu", "gelu", "swiglu_oai", "relu2"])
def test_forced_experts_matches_the_token_loop_and_passes_gradcheck(activation):
    hidden, ids, weights, w13, w2 = inputs(activation, 6, seed_of("fe", activation))
    # Large enough to reach swiglu_oai's clamp on some rows.
    hidden = hidden * (8.0 if activation == "swiglu_oai" else 1.0)
    out = moekit.torch.forced_experts(hidden, ids, weights, w13, w2, activation=activation)
    ref = loop_experts(hidden, ids, weights, w13, w2, activation)
    assert out.dtype == torch.float64
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)  # the same float64 sums in another order
    args = [t.clone().requires_grad_() for t in (hidden, weights, w13, w2)]
    f = lambda h, w, a, b: moekit.torch.forced_experts(h, ids, w, a, b, activation=activation)  # noqa: E731
    assert torch.autograd.gradcheck(f, args, fast_mode=True)  # random projections of the Jacobian


def test_forced_experts_refuses_bad_shapes_and_ids():
    hidden, ids, weights, w13, w2 = inputs("silu", 3, 1)
    with pytest.raises(ValueError, match="ids must lie"):
        moekit.torch.forced_experts(hidden, ids + E, weights, w13, w2)
    with pytest.raises(ValueError, match=r"\[M, k\]"):
        moekit.torch.forced_experts(hidden, ids[:, :1], weights, w13, w2)
    with pytest.raises(ValueError, match="rows for I"):
        moekit.torch.forced_experts(hidden, ids, weights, w13, w2, activation="relu2")
    with pytest.raises(TypeError):
        moekit.torch.forced_experts(hidden.numpy(), ids, weights, w13, w2)


@pytest.mark.parametrize("method", ["renormalize", "deepseek_v3"])
def test_replayed_moe_value_is_the_layers_and_its_gradients_the_torch_models(method):
    M = 9
    gen = torch.Generator().manual_seed(seed_of("replayed", method))
    groups = dict(num_groups=4, topk_groups=2, routed_scaling_factor=2.5) if method == "deepseek_v3" else {}
    cfg = moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing=method,
                           max_num_tokens=64, **groups)
    w13 = (torch.randn((E, 2 * I, H), generator=gen) / H ** 0.5).bfloat16()
    w2 = (torch.randn((E, H, I), generator=gen) / I ** 0.5).bfloat16()
    bias = torch.rand(E, generator=gen) * 1e-3 if method == "deepseek_v3" else None
    layer = moekit.MoeLayer(cfg, w13, w2, score_bias=bias, device="cpu")
    router = (torch.randn((E, H), generator=gen) / H ** 0.5).requires_grad_()
    x = torch.randn((M, H), generator=gen).requires_grad_()
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(M)]).to(torch.int64)
    g_out = torch.randn((M, H), generator=gen).bfloat16().float()  # exact in the bf16 output's gradient
    p13, p2 = w13.float().requires_grad_(), w2.float().requires_grad_()

    hidden = x.bfloat16()  # the layer's activations are bf16; its gradient reaches x through the cast
    logits = hidden.float() @ router.t()
    experts = functools.partial(moekit.torch.forced_experts, w13=p13, w2=p2, activation="silu")
    out = moekit.torch.replayed_moe(layer, hidden, logits, ids, experts, score_bias=bias)
    want = layer(hidden.detach(), logits.detach(), forced_ids=ids.to(torch.int32))
    assert out.dtype == want.dtype and torch.equal(out.view(torch.int16), want.view(torch.int16))
    (out.float() * g_out).sum().backward()

    # The independent float64 model of the same forced routing: reference.py's weights, the token loop.
    x64 = x.detach().bfloat16().double().requires_grad_()
    r64 = router.detach().double().requires_grad_()
    a64, b64 = w13.double().requires_grad_(), w2.double().requires_grad_()
    w64 = replay_weights(x64 @ r64.t(), ids, method, scaling=2.5)
    (loop_experts(x64, ids, w64, a64, b64, "silu") * g_out.double()).sum().backward()

    # f32 torch against f64: the weights come from the f32 routing kernel, the sums run in f32 (1e-5);
    # hidden's gradient is rounded to bf16 once, where autograd passes it through the bf16 tensor (2^-8).
    for name, got, ref, bound in (("hidden", x.grad, x64.grad, 2.0 ** -8), ("router", router.grad, r64.grad, 1e-5),
                                  ("w13", p13.grad, a64.grad, 1e-5), ("w2", p2.grad, b64.grad, 1e-5)):
        err = float((got.double() - ref).norm() / ref.norm())
        assert err < bound, f"{name}: relative error {err:.2e} (bound {bound:.1e})"

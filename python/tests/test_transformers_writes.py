"""A patched model follows every write to its weights that torch can see, and computes what the
unpatched model computes after the same write (f32, 1e-5 relative: summation order only, as in
test_transformers.py); Mixtral's router jitter in train mode is applied as transformers applies it."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import moekit  # noqa: E402
import moekit.transformers as mt  # noqa: E402
from conftest import seed_of  # noqa: E402
from test_transformers import input_ids, make_model, rel  # noqa: E402


def _twins(family):
    """(patched model, unpatched copy of the same weights)."""
    model = make_model(family)
    plain = copy.deepcopy(model)
    mt.patch(model)
    return model, plain


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _expert_weights(model, name):
    return [p for n, p in model.named_parameters() if n.endswith(name) and ".mlp." in n]


WRITES = {
    # name -> (family, what is written, the write applied to one model)
    "data.copy_": ("qwen3_moe", "experts.gate_up_proj",
                   lambda p, g: p.data.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)),
    "data.mul_": ("qwen3_moe", "experts.gate_up_proj", lambda p, g: p.data.mul_(1.5)),
    "data.add_ on the selection bias": ("deepseek_v3", "gate.e_score_correction_bias",
                                        lambda p, g: p.data.add_(torch.randn(p.shape, generator=g))),
    "data = new": ("mixtral", "experts.down_proj",
                   lambda p, g: setattr(p, "data", torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)),
    "data[...] = (a view of the alias)": ("qwen2_moe", "experts.down_proj",
                                          lambda p, g: p.data[0].mul_(-2.0)),
}


def _targets(model, name):
    found = [t for n, t in list(model.named_parameters()) + list(model.named_buffers()) if n.endswith(name)]
    assert found, name
    return found


@pytest.mark.parametrize("write", list(WRITES))
def test_writes_through_data_reach_the_patched_model(write):
    family, name, apply = WRITES[write]
    model, plain = _twins(family)
    ids = input_ids(family)
    before = _logits(model, ids)
    for m in (model, plain):
        g = torch.Generator().manual_seed(seed_of(write))
        for t in _targets(m, name):
            apply(t, g)
    want = _logits(plain, ids)
    assert rel(want, before) > 1e-3  # the write changes the model
    assert rel(_logits(model, ids), want) <= 1e-5


def test_an_alias_kept_across_a_forward_is_followed():
    family = "qwen3_moe"
    model, plain = _twins(family)
    ids = input_ids(family)
    kept = [t.data for t in _targets(model, "experts.gate_up_proj")]
    before = _logits(model, ids)  # the aliases outlive this forward
    for alias in kept:
        alias.mul_(0.5)
    del kept  # gone before the next forward: still seen
    for t in _targets(plain, "experts.gate_up_proj"):
        t.data.mul_(0.5)
    want = _logits(plain, ids)
    assert rel(want, before) > 1e-3
    assert rel(_logits(model, ids), want) <= 1e-5


def test_a_replaced_parameter_is_followed():
    family = "qwen3_moe"
    model, plain = _twins(family)
    ids = input_ids(family)
    before = _logits(model, ids)
    for m in (model, plain):
        experts = m.model.layers[1].mlp.experts
        experts.down_proj = torch.nn.Parameter(experts.down_proj.detach() * -1.0)
    want = _logits(plain, ids)
    assert rel(want, before) > 1e-3
    assert rel(_logits(model, ids), want) <= 1e-5


def test_reading_data_alone_does_not_refit_and_unpatch_restores_the_classes():
    family = "qwen3_moe"
    model, _ = _twins(family)
    ids = input_ids(family)
    moe = model.model.layers[1].mlp
    _logits(model, ids)
    calls = []
    refit = moe.refit
    moe.refit = lambda: (calls.append(1), refit())[1]
    norms = [t.data.norm() for t in moe.parameters()]  # reads only
    _logits(model, ids)
    assert calls == [] and norms
    mt.unpatch(model)
    assert {type(p) for p in model.parameters()} == {torch.nn.Parameter}
    assert {type(b) for b in model.buffers()} <= {torch.Tensor}


def test_router_jitter_in_train_mode_is_transformers_own():
    """Mixtral with router_jitter_noise: in train mode the block scales its input by a uniform draw
    before the router; the patched block draws the same (same generator state), with and without
    gradients, and not in eval mode."""
    family = "mixtral"
    model = make_model(family)
    model.config.router_jitter_noise = 0.2
    for layer in model.model.layers:
        layer.mlp.jitter_noise = 0.2
    plain = copy.deepcopy(model)
    mt.patch(model)
    ids = input_ids(family)
    for m in (model, plain):
        m.train()
    runs = {}
    for name, m in (("patched", model), ("plain", plain)):
        torch.manual_seed(seed_of("jitter"))
        with torch.no_grad():
            runs[name, "no_grad"] = m(ids).logits
        torch.manual_seed(seed_of("jitter", "grad"))
        out = m(ids, labels=ids)
        out.loss.backward()
        runs[name, "grad"] = out.logits.detach()
        runs[name, "router_grad"] = m.model.layers[1].mlp.gate.weight.grad.clone()
    assert rel(runs["patched", "no_grad"], runs["plain", "no_grad"]) <= 1e-5
    assert rel(runs["patched", "grad"], runs["plain", "grad"]) <= 1e-5
    assert rel(runs["patched", "router_grad"], runs["plain", "router_grad"]) <= 1e-5
    plain.eval()
    with torch.no_grad():
        assert rel(plain(ids).logits, runs["plain", "no_grad"]) > 1e-3  # the jitter changes the output

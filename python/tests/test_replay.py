"""Replay: forced ids reproduce the output bit for bit, for every routing method;
the capturer across mixed prefill/decode steps; the capture file round trip."""
import pytest
import torch

import moekit
from conftest import Case, K, seed_of
from reference import METHODS


@pytest.mark.parametrize("routing", METHODS)
def test_forced_ids_replay_bitwise(routing):
    case = Case(routing, M=20)
    layer = case.layer()
    out, ids = layer(case.hidden, case.logits, return_ids=True)
    again = layer(case.hidden, case.logits, forced_ids=ids)
    assert torch.equal(out.view(torch.int16), again.view(torch.int16)), "replay differs from the original"


def test_forced_ids_choose_the_experts():
    """Forcing other ids changes the output: the forced path is not ignored."""
    case = Case("renormalize", M=4)
    layer = case.layer()
    out, ids = layer(case.hidden, case.logits, return_ids=True)
    other = (ids + 1) % 16
    moved = layer(case.hidden, case.logits, forced_ids=other)
    _, seen = layer(case.hidden, case.logits, return_ids=True, forced_ids=other)
    assert torch.equal(seen, other)
    assert not torch.equal(out, moved)


def _model(layers=2, routing="deepseek_v3"):
    cases = [Case(routing, M=12, seed_extra=(l,)) for l in range(layers)]
    model = moekit.Model()
    for l, c in enumerate(cases):
        model.add_layer(c.layer(), 2 * l + 1)
    return model, cases


def _step(model, cases, rows, forced=None):
    """One step of the model over rows [first, last) of every case's inputs."""
    outs = []
    for l, (layer, c) in enumerate(zip(model.layers, cases)):
        f = None if forced is None else forced.forced_ids(l)
        outs.append(layer(c.hidden[rows], c.logits[rows], forced_ids=f))
    return outs


def test_capture_mixed_prefill_decode_and_replay_bitwise(tmp_path):
    model, cases = _model()
    capturer = moekit.RoutedExpertsCapturer(num_moe_layers=2, max_num_tokens=64, top_k=K, device="cpu")
    moekit.bind(model, capturer)
    capturer.add_request("a")
    capturer.add_request("b")
    # step 0: prefill a (5 rows); step 1: decode a + prefill b (4); step 2: decode both.
    steps = [([("a", 5)], slice(0, 5)), ([("a", 1), ("b", 4)], slice(5, 10)), ([("a", 1), ("b", 1)], slice(10, 12))]
    recorded, step_ids = [], []
    for segments, rows in steps:
        capturer.begin_step(segments)
        outs = []
        for layer, c in zip(model.layers, cases):
            o, i = layer(c.hidden[rows], c.logits[rows], return_ids=True)
            outs.append(o)
            step_ids.append(i)
        recorded.append(outs)
        capturer.end_step()
    a, b = capturer.routed_experts("a"), capturer.routed_experts("b")
    assert a.shape == (7, 2, K) and b.shape == (5, 2, K) and a.dtype == torch.int16
    # a's tokens are rows 0-4, 5, 10; its layer-0 ids are what return_ids gave.
    assert torch.equal(a[:5, 0].int(), step_ids[0][:5])
    assert torch.equal(b[:4, 1].int(), step_ids[3][1:5])

    path = tmp_path / "capture.safetensors"
    moekit.write_capture_file(path, capturer.snapshot())
    captures = moekit.read_capture_file(path)
    assert (captures.num_moe_layers, captures.top_k, captures.model_layers) == (2, K, [1, 3])
    assert captures.routing_method == "deepseek_v3" and captures.id_space == "logical"
    assert torch.equal(captures.find("a").ids, a)

    replayer = moekit.RoutedExpertsReplayer(captures, model)
    for (segments, rows), outs in zip(steps, recorded):
        replayer.begin_step(segments)
        again = _step(model, cases, rows, forced=replayer)
        for o, r in zip(again, outs):
            assert torch.equal(o.view(torch.int16), r.view(torch.int16))


def test_disabled_capturer_allocates_nothing():
    model, _ = _model(layers=1)
    capturer = moekit.RoutedExpertsCapturer(1, 64, K, enabled=False)
    moekit.bind(model, capturer)
    assert capturer.allocated_bytes == 0 and not capturer.enabled


def test_capture_errors_are_value_errors(tmp_path):
    model, _ = _model(layers=2)
    capturer = moekit.RoutedExpertsCapturer(3, 64, K)
    with pytest.raises(ValueError, match="the model has 2 MoE layers, the capturer 3"):
        moekit.bind(model, capturer)
    good = moekit.RoutedExpertsCapturer(2, 64, K)
    moekit.bind(model, good)
    with pytest.raises(ValueError, match="zzz"):
        good.begin_step([("zzz", 1)])
    (tmp_path / "bad.safetensors").write_bytes(b"not a capture")
    with pytest.raises(ValueError):
        moekit.read_capture_file(tmp_path / "bad.safetensors")
    with pytest.raises(ValueError):
        moekit.read_capture_file(tmp_path / "missing.safetensors")


@pytest.mark.parametrize("routing", ["renormalize", "deepseek_v3"])
def test_rows_of_minus_one_route_live(routing):
    """A forced row of -1 routes live (the spec's ids for its logits, the selection bias
    included): the output is the row-by-row mix of a forced and a live forward."""
    from conftest import E, H, I, K, small_config
    cfg = small_config(routing)
    gen = torch.Generator().manual_seed(seed_of("live rows", routing))
    w13 = (torch.randn(E, 2 * I, H, generator=gen) / H ** 0.5).bfloat16()
    w2 = (torch.randn(E, H, I, generator=gen) / I ** 0.5).bfloat16()
    bias = torch.randn(E, generator=gen) * 0.1 if routing == "deepseek_v3" else None
    layer = moekit.MoeLayer(cfg, w13, w2, score_bias=bias, device="cpu")
    x = torch.randn(6, H, generator=gen).bfloat16()
    logits = torch.randn(6, E, generator=gen)
    live, live_ids = layer(x, logits, return_ids=True)
    forced = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(6)]).to(torch.int32)
    all_forced = layer(x, logits, forced_ids=forced)
    mixed = forced.clone()
    mixed[[1, 4]] = -1
    out, ids = layer(x, logits, forced_ids=mixed, return_ids=True)
    for r in range(6):
        want = live if r in (1, 4) else all_forced
        assert torch.equal(out[r], want[r]), r
    assert torch.equal(ids[[1, 4]], live_ids[[1, 4]])
    mixed[2, 0] = -1
    with pytest.raises(ValueError, match="row 2 is partly -1"):
        layer(x, logits, forced_ids=mixed)

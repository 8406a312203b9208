"""moekit.transformers.Routes as an object, and replay's alignment rules: each batch row is checked
against its request's token ids (a reordered batch is an error naming both, never another sample's
experts), generate() under replay forces each decode step's own position, replays do not nest, and
Routes survive a capture file and an engine's ids."""
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import moekit.transformers as mt  # noqa: E402
from moekit import r3  # noqa: E402
from test_transformers import _rollout, input_ids, make_model  # noqa: E402

FAMILY = "qwen3_moe"


@pytest.fixture(scope="module")
def rollout():
    return _rollout(FAMILY, True, new_tokens=4)


def test_capture_records_each_rows_tokens_and_names(rollout):
    model, routes, seq, _ = rollout
    assert routes.requests == ["0", "1"]
    for b in range(2):
        assert torch.equal(routes.tokens(b), seq[b, :-1])  # generate's last token was never an input
        assert routes.ids(b).shape == (seq.shape[1] - 1, len(routes.model_layers), routes.top_k)
    assert routes.digest(0) != routes.digest(1)


def test_a_reordered_batch_is_an_error_naming_the_request_it_matches(rollout):
    model, routes, seq, _ = rollout
    with torch.no_grad(), mt.replay(model, routes):
        with pytest.raises(ValueError, match=r"batch row 0's tokens 0\.\.9 are not request '0''s .*"
                                             r"they are request '1''s: select\(\)"):
            model(seq.flip(0))
    with torch.no_grad(), mt.capture(model) as ran, mt.replay(model, routes.select(["1", "0"])):
        model(seq.flip(0))
    assert torch.equal(ran.ids(0)[:routes.ids(1).shape[0]], routes.ids(1))


def test_rows_longer_than_the_capture_are_refused_unless_allowed(rollout):
    model, routes, seq, _ = rollout
    longer = torch.cat([seq, seq[:, :2]], dim=1)  # two tokens no forward of the capture computed
    with torch.no_grad(), mt.replay(model, routes):
        with pytest.raises(ValueError, match="3 tokens past request '0''s 9 routed tokens"):
            model(longer)
    with torch.no_grad(), mt.replay(model, routes, live_tail=3):
        model(longer)


def test_generate_under_replay_forces_each_decode_steps_position(rollout):
    """Before: a decode step (T = 1) took the ids of token 0 at every position."""
    model, routes, seq, _ = rollout
    prompt = seq[:, :6]
    with torch.no_grad(), mt.capture(model) as ran, mt.replay(model, routes):
        again = model.generate(prompt, max_new_tokens=4, do_sample=False)
    assert torch.equal(again, seq)
    for b in range(2):
        assert torch.equal(ran.ids(b), routes.ids(b))


def test_replays_do_not_nest(rollout):
    model, routes, seq, _ = rollout
    with mt.replay(model, routes):
        with pytest.raises(ValueError, match="already under a replay; replays do not nest"):
            with mt.replay(model, routes):
                pass
        with torch.no_grad(), mt.capture(model) as ran:  # the outer replay still forces
            model(seq)
    assert torch.equal(ran.ids(0)[:routes.ids(0).shape[0]], routes.ids(0))


def test_replay_refuses_what_is_not_routes_for_this_model(rollout):
    model, routes, seq, _ = rollout
    with pytest.raises(TypeError, match="expected moekit.transformers.Routes"):
        mt.replay(model, routes.batch())
    other_k = mt.Routes(routes.model_layers, routes.top_k - 1, routes.num_experts)
    other_k.add("a", torch.zeros((1, len(routes.model_layers), routes.top_k - 1), dtype=torch.int16) +
                torch.arange(routes.top_k - 1, dtype=torch.int16), [1])
    with pytest.raises(ValueError, match=f"k={routes.top_k - 1} of E={routes.num_experts} experts, the model routes"):
        mt.replay(model, other_k)
    with pytest.raises(ValueError, match="no requests to replay"):
        mt.replay(model, mt.Routes(routes.model_layers, routes.top_k, routes.num_experts))
    bad = routes.ids(0).clone()
    bad[2, 0, 1] = -1
    with pytest.raises(ValueError, match=r"row \[2, 0\] is partly -1"):
        mt.Routes(routes.model_layers, routes.top_k, routes.num_experts).add("x", bad, routes.tokens(0))


def test_routes_round_trip_a_capture_file_and_replay_the_same(rollout, tmp_path):
    model, routes, seq, _ = rollout
    routes.save(tmp_path / "routes.safetensors")
    back = mt.Routes.load(tmp_path / "routes.safetensors")
    assert back.requests == routes.requests and back.routing == routes.routing
    for b in range(2):
        assert torch.equal(back.ids(b), routes.ids(b)) and torch.equal(back.tokens(b), routes.tokens(b))
    assert r3.check(str(tmp_path / "routes.safetensors")).ok


def test_routes_from_an_engines_ids_force_the_same_experts(rollout):
    model, routes, seq, _ = rollout
    engine = {name: routes.ids(name).numpy().astype(np.uint8) for name in routes.requests}
    tokens = {name: routes.tokens(name).tolist() for name in routes.requests}
    built = mt.Routes.from_ids(engine, tokens, routes.model_layers, routes.num_experts)
    with torch.no_grad(), mt.capture(model) as a, mt.replay(model, routes):
        model(seq)
    with torch.no_grad(), mt.capture(model) as b, mt.replay(model, built):
        model(seq)
    assert all(torch.equal(a.ids(r), b.ids(r)) for r in range(2))
    with pytest.raises(ValueError, match="expected token ids for each of the 2 requests"):
        mt.Routes.from_ids(engine, {}, routes.model_layers, routes.num_experts)


def test_separate_forwards_capture_separate_requests():
    """Before: batches of different sizes under one capture gave an IndexError at replay."""
    model = make_model(FAMILY)
    x1, x2 = input_ids(FAMILY, batch=2, seq=5), input_ids(FAMILY, batch=3, seq=7)
    with torch.no_grad(), mt.capture(model) as routes:
        model(x1)
        model(x2)
    assert routes.requests == ["0", "1", "2", "3", "4"]
    assert routes.ids(4).shape[0] == 7 and torch.equal(routes.tokens(4), x2[2])
    with torch.no_grad(), mt.replay(model, routes.select(["2", "3", "4"])):
        model(x2)

"""moekit.r3.check: the C++ validator reached from Python over arrays, r3.Capture, CaptureSet and files;
each planted fault named by request, token and layer."""
import numpy as np
import pytest

import moekit
from moekit import r3


def clean(T=9, L=2, k=3, E=20, seed=0):
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(E)[:k] for _ in range(T * L)]).reshape(T, L, k).astype(np.int16)


def test_clean_arrays_pass():
    rep = r3.check({"a": clean(seed=1), "b": clean(seed=2)}, num_experts=20)
    assert rep.ok and rep.findings == [] and str(rep) == "ok: no findings"
    rep.raise_if_bad()


@pytest.mark.parametrize("plant,kind,message", [
    (lambda a: a["b"].__setitem__((4, 1), -1), "unwritten", "request 'b', token 4, MoE layer 1 (model layer 1)"),
    (lambda a: a["a"].__setitem__((2, 0, 1), 25), "out_of_range", "request 'a', token 2, MoE layer 0 (model layer 0), slot 1: id 25"),
    (lambda a: a["a"].__setitem__((8, 1), 0), "zero_padding", "request 'a', token 8, MoE layer 1"),
    (lambda a: a["b"].__setitem__((0, 0, 2), a["b"][0, 0, 0]), "duplicate", "request 'b', token 0, MoE layer 0 (model layer 0), slot 2"),
    (lambda a: a["a"].__setitem__((slice(None), 1), a["a"][0, 1]), "constant_layer", "request 'a', MoE layer 1"),
])
def test_planted_faults_are_named(plant, kind, message):
    arrays = {"a": clean(seed=3), "b": clean(seed=4)}
    plant(arrays)
    rep = r3.check(arrays, num_experts=20)
    assert not rep.ok and list(rep.counts) == [kind] and rep.counts[kind] == 1
    assert message in rep.findings[0]["message"]
    with pytest.raises(ValueError, match=kind):
        rep.raise_if_bad()


def test_physical_ids_dense_layers_and_token_counts():
    a = clean(seed=5)
    a[3, 1, 0] = 22
    rep = r3.check({"x": a}, num_experts=20, model_layers=[1, 2], num_physical_experts=24, dense_layers=[2],
                   expected_tokens={"x": 10})
    assert rep.counts == {"physical_id": 1, "dense_layer": 1, "token_count": 1}
    f = {x["kind"]: x for x in rep.findings}
    assert (f["physical_id"]["token"], f["physical_id"]["layer"], f["physical_id"]["model_layer"]) == (3, 1, 2)
    eplb = list(range(20)) + [5, 11, 7, 0]  # physical 20.. are replicas of hot logical experts
    rep = r3.check({"x": a}, num_experts=20, physical_to_logical=eplb)
    assert rep.counts == {"physical_id": 1} and "(logical expert 7)" in rep.findings[0]["message"]


def test_file_and_capture_forms(tmp_path):
    ids = clean(seed=6)
    ids[5, 0, 1] = 19 if ids[5, 0, 0] != 19 and ids[5, 0, 2] != 19 else 18
    ids[5, 0, 2] = ids[5, 0, 1]  # a duplicate the strict reader would accept (in range), the validator not
    cap = r3.Capture(20, [3, 7], r3.routing_dict("renormalize", 3), [r3.RequestRoutes("q", ids, 2, 6)])
    r3.write_capture(tmp_path / "c.safetensors", cap)
    for form in (cap, tmp_path / "c.safetensors", str(tmp_path / "c.safetensors"),
                 moekit.read_capture_file(tmp_path / "c.safetensors")):
        rep = r3.check(form)
        assert rep.counts == {"duplicate": 1}, form
        assert "request 'q', token 7, MoE layer 0 (model layer 3), slot 2" in rep.findings[0]["message"]

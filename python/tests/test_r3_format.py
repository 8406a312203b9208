"""The NumPy-only capture reader/writer (moekit.r3.format) against the C++ library's: files written by
one are read by the other, for u8 and u16 ids, the sentinel, router weights and first_generated_token."""
import numpy as np
import pytest
import torch

import moekit
from moekit import r3
from conftest import seed_of


def random_capture(E, k=4, L=3, weights=None, seed=0):
    rng = np.random.default_rng(seed)
    reqs = []
    for i, (T, first, fg) in enumerate([(7, 0, 4), (1, 2, -1), (0, 0, -1), (12, 5, 9)]):
        ids = np.array([rng.permutation(E)[:k] for _ in range(T * L)], np.int16).reshape(T, L, k)
        w = rng.standard_normal((T, L, k)).astype(np.float32) if weights else None
        reqs.append(r3.RequestRoutes(f"req-{i}", ids, first, fg, w))
    if reqs[0].ids.size:
        reqs[0].ids[2, 1, :] = -1  # a row never captured
        reqs[0].ids[0, 0, 0] = E - 1 if E - 1 not in reqs[0].ids[0, 0, 1:] else reqs[0].ids[0, 0, 0]
    return r3.Capture(E, [1, 3, 4][:L], r3.routing_dict("renormalize", k), reqs, backend="test/none",
                      router_weights_dtype=weights)


def assert_same(a: r3.Capture, b: r3.Capture):
    assert (a.num_experts, a.model_layers, a.routing, a.backend) == (b.num_experts, b.model_layers, b.routing, b.backend)
    assert [r.request for r in a.requests] == [r.request for r in b.requests]
    for x, y in zip(a.requests, b.requests):
        assert (x.first_token, x.first_generated_token) == (y.first_token, y.first_generated_token)
        assert x.ids.dtype == y.ids.dtype == np.int16 and np.array_equal(x.ids, y.ids)


@pytest.mark.parametrize("E", [8, 255, 256, 4000])
def test_numpy_writer_and_cpp_reader_agree(tmp_path, E):
    cap = random_capture(E, seed=seed_of("fmt", E))
    path = tmp_path / "np.safetensors"
    r3.write_capture(path, cap)
    back = r3.read_capture(path)
    assert_same(cap, back)
    cs = moekit.read_capture_file(path)  # the C++ reader
    assert cs.format_version == 2 and cs.backend == "test/none" and cs.num_experts == E
    for want, got in zip(cap.requests, cs.requests):
        assert got.first_generated_token == want.first_generated_token
        assert np.array_equal(got.ids.numpy(), want.ids)
    # and the C++ writer's file reads back with NumPy only
    moekit.write_capture_file(tmp_path / "cpp.safetensors", cs)
    assert_same(cap, r3.read_capture(tmp_path / "cpp.safetensors"))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_router_weights_round_trip(tmp_path, dtype):
    cap = random_capture(64, weights=dtype, seed=seed_of("w", dtype))
    r3.write_capture(tmp_path / "w.safetensors", cap)
    back = r3.read_capture(tmp_path / "w.safetensors")
    cs = moekit.read_capture_file(tmp_path / "w.safetensors")
    assert back.router_weights_dtype == cs.router_weights_dtype == dtype
    for want, got, c in zip(cap.requests, back.requests, cs.requests):
        exp = want.router_weights if dtype == "f32" else \
            torch.from_numpy(want.router_weights).bfloat16().float().numpy()  # torch rounds to nearest even too
        assert np.array_equal(got.router_weights, exp)
        assert np.array_equal(c.router_weights.float().numpy(), exp)


def test_writer_refuses_bad_ids_and_leaves_no_file(tmp_path):
    cap = random_capture(16, seed=1)
    cap.requests[3].ids[4, 2, 1] = 16
    with pytest.raises(ValueError, match=r"request 'req-3', token 9, MoE layer 2, slot 1: id 16 outside"):
        r3.write_capture(tmp_path / "bad.safetensors", cap)
    assert list(tmp_path.iterdir()) == []

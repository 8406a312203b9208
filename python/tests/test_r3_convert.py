"""moekit.r3 converters: every layout round-trips losslessly, with and without sentinel rows, skipped
prompt tokens and dense layers, and each refuses what it cannot hold."""
import numpy as np
import pytest

from moekit import r3
from conftest import seed_of


def request(E=300, T=11, L=3, k=4, first=0, fg=6, seed=0, name="r"):
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T * L)]).reshape(T, L, k).astype(np.int16)
    ids[T // 2, 1] = -1
    return r3.RequestRoutes(name, ids, first, fg)


def same(a: r3.RequestRoutes, b: r3.RequestRoutes):
    assert (a.request, a.first_token, a.first_generated_token) == (b.request, b.first_token, b.first_generated_token)
    assert b.ids.dtype == np.int16 and np.array_equal(a.ids, b.ids)


@pytest.mark.parametrize("E", [16, 255, 256, 3000])
@pytest.mark.parametrize("encoding", ["array", "base64_npy"])
def test_vllm_round_trip(E, encoding):
    req = request(E=E, first=2, fg=7, seed=seed_of("vllm", E, encoding))
    out = r3.to_vllm(req, encoding=encoding, num_experts=E)
    if encoding == "array":
        assert out["prompt_routed_experts"].shape == (5, 3, 4) and out["prompt_routed_experts"].dtype == np.int16
    else:
        import base64, io
        arr = np.load(io.BytesIO(base64.b64decode(out["routed_experts"])))
        assert arr.dtype == (np.uint8 if E <= 255 else np.uint16)
    same(req, r3.from_vllm("r", out["prompt_routed_experts"], out["routed_experts"], first_token=2))


def test_vllm_needs_the_prompt_boundary():
    with pytest.raises(ValueError, match="first_generated_token is not known"):
        r3.to_vllm(request(fg=-1))


@pytest.mark.parametrize("fill", [-1, 0])
def test_sglang_round_trip_drops_dense_layers(fill):
    req = request(first=4, fg=8, seed=seed_of("sgl", fill))
    model_layers, n = [1, 2, 5], 6  # layers 0, 3, 4 are dense
    flat, start = r3.to_sglang(req, model_layers, n, dense_fill=fill)
    assert flat.dtype == np.int32 and flat.shape == (11 * 6 * 4,) and start == 4
    assert (flat.reshape(11, 6, 4)[:, [0, 3, 4]] == fill).all()
    same(req, r3.from_sglang("r", flat, start, n, model_layers, top_k=4, first_generated_token=8))
    with pytest.raises(ValueError, match="not a whole number of tokens"):
        r3.from_sglang("r", flat[:-1], start, n, model_layers, 4)


def test_megatron_round_trip_pads_what_the_capture_lacks():
    req = request(first=3, fg=7, seed=2)
    sample = r3.to_megatron(req, seq_len=16)  # 3 skipped tokens before, the last generated token after
    assert sample.shape == (16, 3, 4) and (sample[:3] == -1).all() and (sample[14:] == -1).all()
    same(req, r3.from_megatron("r", sample, first_token=3, num_tokens=11, first_generated_token=7))
    with pytest.raises(ValueError, match="shorter than the captured tokens"):
        r3.to_megatron(req, seq_len=10)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_round_trip(side):
    reqs = [request(T=T, seed=seed_of("pad", side, T), name=f"r{T}", fg=-1) for T in (5, 11, 1)]
    batch, lengths = r3.to_padded_batch(reqs, seq_len=12, side=side)
    assert batch.shape == (3, 12, 3, 4) and list(lengths) == [5, 11, 1]
    pad = batch[0, 5:] if side == "right" else batch[0, :7]
    assert (pad == -1).all()
    back = r3.from_padded_batch(batch, lengths, [r.request for r in reqs], side=side)
    for a, b in zip(reqs, back):
        same(a, b)

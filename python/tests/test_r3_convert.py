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


def full(req):
    """The request without its unwritten row (vLLM's format has no sentinel)."""
    ids = req.ids.copy()
    ids[ids < 0] = np.arange(ids.shape[2])[None].repeat((ids < 0).any(axis=2).sum(), 0).ravel()
    return r3.RequestRoutes(req.request, ids, req.first_token, req.first_generated_token)


@pytest.mark.parametrize("E", [16, 256, 257, 3000])
@pytest.mark.parametrize("encoding", ["array", "base64_npy"])
def test_vllm_round_trip_over_every_hidden_layer(E, encoding):
    req = full(request(E=E, first=2, fg=7, seed=seed_of("vllm", E, encoding)))
    out = r3.to_vllm(req, num_hidden_layers=5, model_layers=[1, 2, 4], num_experts=E, encoding=encoding)
    if encoding == "base64_npy":
        import base64, io
        out = np.load(io.BytesIO(base64.b64decode(out)))
    assert out.shape == (11, 5, 4) and out.dtype == (np.uint8 if E <= 256 else np.uint16)
    assert (out[:, [0, 3]] == 0).all()  # dense layers are zeros, as vLLM writes them
    same(req, r3.from_vllm("r", out, [1, 2, 4], prompt_start=2, num_prompt_tokens=7))


def test_vllm_has_no_sentinel_and_catches_the_wrong_layer_map():
    with pytest.raises(ValueError, match=r"row \[5, 1, 0\] was never captured"):
        r3.to_vllm(request(), num_hidden_layers=3, model_layers=[0, 1, 2], num_experts=300)
    out = r3.to_vllm(full(request(E=20)), num_hidden_layers=4, model_layers=[1, 2, 3], num_experts=20)
    with pytest.raises(ValueError, match="layer 1 is not among model_layers"):
        r3.from_vllm("r", out, [0, 2, 3])


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

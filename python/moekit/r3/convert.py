"""Converters between moekit's per-request routes (format.RequestRoutes) and the
layouts of engines and trainers, lossless both ways where the target can hold
the data (docs/r3.md, "Converters"). NumPy only.

Conventions a layout leaves open are arguments; their defaults are documented
in docs/r3.md. Every converter checks shapes and names the problem
(ValueError); none changes its input.
"""
import base64
import io
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .format import MAX_U8_EXPERTS, SENTINEL, RequestRoutes

Array = np.ndarray


def _ids3(ids, what: str) -> Array:
    a = np.asarray(ids)
    if a.ndim != 3:
        raise ValueError(f"{what}: expected [tokens, moe_layers, k], got shape {list(a.shape)}")
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{what}: expected integer ids, got {a.dtype}")
    return a


def _first_bad(mask: Array) -> str:
    return ", ".join(str(int(x)) for x in np.argwhere(mask)[0])


def _as_i16(a: Array, what: str, sentinel: Optional[int] = None) -> Array:
    """Integer ids -> int16 with -1 as the sentinel; `sentinel` is the stored value meaning -1. Float ids are
    refused (never truncated), and the range is checked on the values as given, before any cast."""
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{what}: ids must be integers, got {a.dtype}")
    unwritten = a == sentinel if sentinel is not None else np.zeros(a.shape, bool)
    bad = ~unwritten & ((a < SENTINEL) | (a > np.iinfo(np.int16).max))
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise ValueError(f"{what}: id {a[i]} at [{_first_bad(bad)}] outside [-1, 32767] (moekit's id range)")
    out = a.astype(np.int64)  # exact: every value is in [-1, 32767] or the (small) stored sentinel
    out[unwritten] = SENTINEL
    return out.astype(np.int16)


def _check_fits(ids: Array, pad: int, dtype, what: str):
    """The output dtype must hold every id and the pad value exactly (a narrow or unsigned type would wrap)."""
    dt = np.dtype(dtype)
    if not np.issubdtype(dt, np.integer):
        raise ValueError(f"{what}: dtype must be an integer type, got {dt}")
    if not _is_int(pad):
        raise ValueError(f"{what}: pad must be an integer, got {pad!r:.40}")
    info = np.iinfo(dt)
    if not info.min <= int(pad) <= info.max:
        raise ValueError(f"{what}: pad {pad} does not fit {dt} [{info.min}, {info.max}]")
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < info.min or hi > info.max:
            raise ValueError(f"{what}: ids in [{lo}, {hi}] do not fit {dt} [{info.min}, {info.max}]"
                             + (" (the sentinel -1 needs a signed type)" if lo < 0 <= info.min else ""))
    return dt


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _layers(model_layers, num_model_layers: int) -> List[int]:
    if not _is_int(num_model_layers) or num_model_layers < 1:
        raise ValueError(f"num_model_layers must be an integer >= 1, got {num_model_layers!r:.40}")
    layers = list(model_layers)
    if not all(_is_int(l) for l in layers):
        raise ValueError(f"model_layers must be integers, got {layers!r:.80}")
    layers = [int(l) for l in layers]
    if layers and (min(layers) < 0 or max(layers) >= num_model_layers):
        raise ValueError(f"model_layers {layers} must lie in [0, num_model_layers={num_model_layers})")
    if len(set(layers)) != len(layers):
        dup = next(l for l in layers if layers.count(l) > 1)
        raise ValueError(f"model_layers {layers} names model layer {dup} twice (one MoE layer would overwrite "
                         "another)")
    return layers


def _routes(request, ids: Array, first_token, first_generated_token) -> RequestRoutes:
    """A RequestRoutes whose positions are checked as every reader checks them."""
    req = RequestRoutes(request, ids, first_token, first_generated_token)
    _check_row_count(req)
    return RequestRoutes(request, ids, int(first_token), int(first_generated_token))


def _check_row_count(req: RequestRoutes):
    if not _is_int(req.first_token) or req.first_token < 0:
        raise ValueError(f"request {req.request!r}: first_token must be an integer >= 0, got {req.first_token!r}")
    if not _is_int(req.first_generated_token) or req.first_generated_token < -1:
        raise ValueError(f"request {req.request!r}: first_generated_token must be -1 (not known) or a token index, "
                         f"got {req.first_generated_token!r}")
    if req.first_generated_token >= 0 and req.first_generated_token < req.first_token:
        raise ValueError(f"request {req.request!r}: first_generated_token {req.first_generated_token} is before "
                         f"first_token {req.first_token}")


# ---------------------------------------------------------------- vLLM 0.32: one array per request

VLLM_VERSION = "0.32"  # the vLLM release whose output these two follow (docs/r3.md)


def _vllm_dtype(num_experts: int):
    return np.uint8 if num_experts <= 256 else np.uint16  # vLLM's RoutedExpertsCapturer.output_dtype


def to_vllm(req: RequestRoutes, num_hidden_layers: int, model_layers: Sequence[int], num_experts: int,
            encoding: str = "array"):
    """What vLLM 0.32 returns for this request as CompletionOutput.routed_experts: [rows, num_hidden_layers, k],
    uint8 when num_experts <= 256 else uint16, every hidden layer present and the dense ones 0 (not a
    sentinel), row r the token at req.first_token + r (SamplingParams.routed_experts_prompt_start).
    model_layers[l]: the hidden layer of MoE layer l. encoding="base64_npy": its OpenAI server's text
    (base64 of the .npy). vLLM has no sentinel: a request with unwritten (-1) rows is refused."""
    if encoding not in ("array", "base64_npy"):
        raise ValueError(f"encoding must be 'array' or 'base64_npy', got {encoding!r}")
    if not _is_int(num_experts) or not 1 <= num_experts <= np.iinfo(np.uint16).max:
        raise ValueError(f"num_experts must be an integer in [1, 65535], got {num_experts!r:.40}")
    _check_row_count(req)
    ids = _as_i16(_ids3(req.ids, f"request {req.request!r}"), f"request {req.request!r}")
    layers = _layers(model_layers, num_hidden_layers)
    if len(layers) != ids.shape[1]:
        raise ValueError(f"request {req.request!r}: {ids.shape[1]} MoE layers but {len(layers)} model_layers")
    if (ids == SENTINEL).any():
        raise ValueError(f"request {req.request!r}: row [{_first_bad(ids == SENTINEL)}] was never captured; "
                         "vLLM's routed_experts has no sentinel for it")
    if (ids >= num_experts).any():
        bad = ids >= num_experts
        raise ValueError(f"request {req.request!r}: id {ids[tuple(np.argwhere(bad)[0])]} at [{_first_bad(bad)}] "
                         f"outside [0, num_experts={num_experts})")
    out = np.zeros((ids.shape[0], num_hidden_layers, ids.shape[2]), dtype=_vllm_dtype(num_experts))
    out[:, layers] = ids
    if encoding == "array":
        return out
    buf = io.BytesIO()
    np.save(buf, out, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _vllm_array(x, what: str) -> Array:
    if isinstance(x, (str, bytes)):
        try:
            raw = base64.b64decode(x, validate=True)
        except ValueError as e:  # binascii.Error
            raise ValueError(f"{what}: not base64 text: {e}") from None
        try:
            a = np.load(io.BytesIO(raw), allow_pickle=False)
        except Exception as e:  # noqa: BLE001 - untrusted bytes: np.load's parser raises many kinds
            # (truncated data, a header its tokenizer rejects, ...): every one is "not an .npy".
            raise ValueError(f"{what}: not an .npy array ({type(e).__name__}: {e})") from None
        if not isinstance(a, np.ndarray):
            raise ValueError(f"{what}: not an .npy array")
        x = a
    a = _ids3(x, what)
    if a.size and (int(a.min()) < 0 or int(a.max()) > np.iinfo(np.uint16).max):
        bad = (a < 0) | (a > np.iinfo(np.uint16).max)
        raise ValueError(f"{what}: id {a[tuple(np.argwhere(bad)[0])]} at [{_first_bad(bad)}] is not a vLLM expert id")
    return a


def from_vllm(request: str, routed_experts, model_layers: Sequence[int], prompt_start: int = 0,
              num_prompt_tokens: int = -1) -> RequestRoutes:
    """The inverse of to_vllm: vLLM 0.32's CompletionOutput.routed_experts [rows, num_hidden_layers, k]
    (any unsigned dtype it uses) or its OpenAI server's base64 .npy text, as moekit's routes of the MoE
    layers model_layers. prompt_start: the request's routed_experts_prompt_start (row 0's token);
    num_prompt_tokens: its prompt length, if known (the prompt/generation boundary). The columns of the
    other (dense) layers must be 0, as vLLM writes them: anything else means model_layers is not this
    model's, and is refused."""
    a = _vllm_array(routed_experts, "routed_experts")
    layers = _layers(model_layers, a.shape[1])
    if not layers:
        raise ValueError("model_layers is empty: name the MoE layers (the hidden layers vLLM routed)")
    dense = np.ones(a.shape[1], bool)
    dense[layers] = False
    if (a[:, dense] != 0).any():
        t, l, j = np.argwhere(a[:, dense] != 0)[0]
        raise ValueError(f"routed_experts: layer {int(np.flatnonzero(dense)[l])} is not among model_layers "
                         f"{list(layers)} but holds expert {int(a[t, np.flatnonzero(dense)[l], j])} at row {int(t)}: "
                         "are these this model's MoE layers?")
    if not _is_int(prompt_start) or prompt_start < 0:
        raise ValueError(f"prompt_start must be an integer >= 0, got {prompt_start!r}")
    if not _is_int(num_prompt_tokens) or num_prompt_tokens < -1:
        raise ValueError(f"num_prompt_tokens must be an integer >= -1, got {num_prompt_tokens!r}")
    return _routes(request, _as_i16(a[:, layers], "routed_experts"), prompt_start, num_prompt_tokens)


# ---------------------------------------------------------------- SGLang-style: flat int32 over all layers

def to_sglang(req: RequestRoutes, model_layers: Sequence[int], num_model_layers: int,
              dense_fill: int = -1) -> Tuple[Array, int]:
    """(flat int32 [tokens * num_model_layers * k], start): the layer axis runs over every layer of the
    model; rows of dense layers (not in model_layers) hold dense_fill. start = first_token, the index in
    the request of the first token the array covers."""
    _check_row_count(req)
    ids = _ids3(req.ids, f"request {req.request!r}")
    layers = _layers(model_layers, num_model_layers)
    if len(layers) != ids.shape[1]:
        raise ValueError(f"model_layers has {len(layers)} entries, the ids {ids.shape[1]} MoE layers")
    _check_fits(ids, dense_fill, np.int32, "to_sglang (dense_fill)")
    out = np.full((ids.shape[0], num_model_layers, ids.shape[2]), dense_fill, np.int32)
    out[:, layers, :] = ids
    return out.reshape(-1), int(req.first_token)


def from_sglang(request: str, flat, start: int, num_model_layers: int, model_layers: Sequence[int], top_k: int,
                first_generated_token: int = -1) -> RequestRoutes:
    """The inverse of to_sglang: keeps the rows of model_layers (the MoE layers), drops the dense ones."""
    a = np.asarray(flat)
    if a.ndim != 1:
        raise ValueError(f"expected a flat array, got shape {list(a.shape)}")
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"sglang ids must be integers, got {a.dtype}")
    layers = _layers(model_layers, num_model_layers)
    if not _is_int(top_k) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r:.40}")
    if not layers:
        raise ValueError("model_layers is empty: a capture needs >= 1 MoE layer")
    per_token = num_model_layers * top_k
    if a.size % per_token:
        raise ValueError(f"{a.size} ids are not a whole number of tokens of {num_model_layers} layers x {top_k}")
    ids = a.reshape(-1, num_model_layers, top_k)[:, layers, :]
    return _routes(request, _as_i16(ids, "sglang ids"), start, first_generated_token)


# ---------------------------------------------------------------- Megatron-Core-style: one sample

def to_megatron(req: RequestRoutes, seq_len: Optional[int] = None, pad: int = -1, dtype=np.int32) -> Array:
    """[seq_len, moe_layers, k] for one training sample whose token t is the request's token t.

    Rows the capture does not hold are `pad`: tokens before first_token (skipped earlier turns) and after
    the last captured one (the last generated token is never fed to the engine, but it is to the trainer).
    seq_len defaults to first_token + num_tokens. The trainer must not replay pad rows (mask them)."""
    _check_row_count(req)
    ids = _ids3(req.ids, f"request {req.request!r}")
    end = req.first_token + ids.shape[0]
    n = end if seq_len is None else int(seq_len)
    if n < end:
        raise ValueError(f"seq_len {n} is shorter than the captured tokens [0, {end})")
    dtype = _check_fits(ids, pad, dtype, "to_megatron")
    out = np.full((n,) + ids.shape[1:], pad, dtype)
    out[req.first_token:end] = ids
    return out


def from_megatron(request: str, sample, first_token: int = 0, num_tokens: Optional[int] = None,
                  first_generated_token: int = -1) -> RequestRoutes:
    """The inverse of to_megatron: rows [first_token, first_token + num_tokens) of the sample (default:
    up to its end)."""
    a = _ids3(sample, "sample")
    if not _is_int(first_token) or (num_tokens is not None and not _is_int(num_tokens)):
        raise ValueError(f"first_token and num_tokens must be integers, got {first_token!r}, {num_tokens!r}")
    end = a.shape[0] if num_tokens is None else first_token + int(num_tokens)
    if first_token < 0 or end > a.shape[0] or end < first_token:
        raise ValueError(f"rows [{first_token}, {end}) are not inside the sample's {a.shape[0]} rows")
    return _routes(request, _as_i16(a[first_token:end], "sample"), first_token, first_generated_token)


# ---------------------------------------------------------------- padded batch [B, S, moe_layers, k]

def to_padded_batch(reqs: Sequence[RequestRoutes], seq_len: Optional[int] = None, side: str = "right",
                    pad: int = -1, dtype=np.int32) -> Tuple[Array, Array]:
    """(batch [B, S, moe_layers, k] with `pad` in padding, lengths [B]): sample b is request b's captured
    rows, at the right end (side="left") or the left end (side="right", the default) of its row of S.
    S defaults to the longest request. Token positions are the capture's (first_token is not re-padded:
    use to_megatron per sample for that)."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    if not reqs:
        raise ValueError("no requests")
    shapes = {tuple(np.shape(r.ids)[1:]) for r in reqs}
    if len(shapes) != 1:
        raise ValueError(f"requests disagree on [moe_layers, k]: {sorted(shapes)}")
    lengths = np.array([r.num_tokens for r in reqs], np.int64)
    S = int(lengths.max()) if seq_len is None else int(seq_len)
    if S < lengths.max():
        raise ValueError(f"seq_len {S} is shorter than the longest request ({int(lengths.max())} rows)")
    ids = [_ids3(r.ids, f"request {r.request!r}") for r in reqs]
    for r, a in zip(reqs, ids):
        dtype = _check_fits(a, pad, dtype, f"to_padded_batch (request {r.request!r})")
    out = np.full((len(reqs), S) + shapes.pop(), pad, dtype)
    for b, r in enumerate(reqs):
        n = r.num_tokens
        if side == "right":
            out[b, :n] = r.ids
        else:
            out[b, S - n:] = r.ids
    return out, lengths


def from_padded_batch(batch, lengths, requests: Sequence[str], side: str = "right",
                      first_tokens: Optional[Sequence[int]] = None,
                      first_generated_tokens: Optional[Sequence[int]] = None) -> List[RequestRoutes]:
    """The inverse of to_padded_batch (lengths say where padding starts; a -1 inside a length is a row the
    capture never wrote and stays -1)."""
    a = np.asarray(batch)
    if a.ndim != 4:
        raise ValueError(f"expected [B, S, moe_layers, k], got shape {list(a.shape)}")
    lengths = np.asarray(lengths)
    if lengths.size and not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"lengths must be integers, got {lengths.dtype}")
    B, S = a.shape[:2]
    if len(requests) != B or lengths.shape != (B,):
        raise ValueError(f"{B} samples need {B} request names and lengths")
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    out = []
    for b in range(B):
        n = int(lengths[b])
        if not 0 <= n <= S:
            raise ValueError(f"lengths[{b}] = {n} outside [0, {S}]")
        rows = a[b, :n] if side == "right" else a[b, S - n:]
        out.append(_routes(requests[b], _as_i16(rows, f"sample {b}"),
                           0 if first_tokens is None else first_tokens[b],
                           -1 if first_generated_tokens is None else first_generated_tokens[b]))
    return out

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


# ---------------------------------------------------------------- vLLM-style: prompt / generation arrays

def to_vllm(req: RequestRoutes, encoding: str = "array", num_experts: Optional[int] = None) -> Dict[str, object]:
    """{"prompt_routed_experts": [prompt rows, L, k], "routed_experts": [generated rows, L, k]}.

    The split is at first_generated_token (required). Generation rows are the tokens that were fed back
    (each generated token but the last, which no forward has seen). encoding: "array" gives int16 arrays
    (-1 stays -1); "base64_npy" gives base64 text of an .npy file of uint8 (num_experts <= 255) or uint16,
    the sentinel stored as 255 / 65535 (the format's rule), so num_experts is then required.
    A capture that starts after token 0 (first_token > 0) holds no rows of the skipped prompt: the prompt
    array then has first_generated_token - first_token rows.
    """
    _check_row_count(req)
    if req.first_generated_token < 0:
        raise ValueError(f"request {req.request!r}: first_generated_token is not known; cannot split prompt rows")
    if encoding not in ("array", "base64_npy"):
        raise ValueError(f"encoding must be 'array' or 'base64_npy', got {encoding!r}")
    ids = _as_i16(_ids3(req.ids, f"request {req.request!r}"), f"request {req.request!r}")
    if num_experts is not None or encoding == "base64_npy":
        if num_experts is None:
            raise ValueError("encoding='base64_npy' needs num_experts (it picks uint8 or uint16)")
        if not _is_int(num_experts) or not 1 <= num_experts <= np.iinfo(np.int16).max:
            raise ValueError(f"num_experts must be an integer in [1, 32767], got {num_experts!r:.40}")
        bad = (ids != SENTINEL) & (ids >= num_experts)
        if bad.any():
            raise ValueError(f"request {req.request!r}: id {ids[tuple(np.argwhere(bad)[0])]} at [{_first_bad(bad)}] "
                             f"outside [0, num_experts={num_experts})")
    split = min(req.first_generated_token - req.first_token, ids.shape[0])
    prompt, gen = ids[:split], ids[split:]
    if encoding == "array":
        return {"prompt_routed_experts": prompt, "routed_experts": gen}
    dt, sentinel = (np.uint8, 0xFF) if num_experts <= MAX_U8_EXPERTS else (np.uint16, 0xFFFF)

    def enc(a):
        stored = a.astype(np.int64)  # ids are in [-1, num_experts): widen before the sentinel goes in
        stored[stored == SENTINEL] = sentinel
        buf = io.BytesIO()
        np.save(buf, stored.astype(dt), allow_pickle=False)
        return base64.b64encode(buf.getvalue()).decode("ascii")
    return {"prompt_routed_experts": enc(prompt), "routed_experts": enc(gen)}


def from_vllm(request: str, prompt_routed_experts, routed_experts, first_token: int = 0) -> RequestRoutes:
    """The inverse of to_vllm: arrays (any integer dtype; -1 is the sentinel) or base64 .npy text
    (uint8 with 255 or uint16 with 65535 as the sentinel; int16 with -1)."""
    def dec(x, what):
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
            sentinel = {np.dtype(np.uint8): 0xFF, np.dtype(np.uint16): 0xFFFF}.get(a.dtype.newbyteorder("="))
            return _as_i16(_ids3(a, what), what, sentinel)
        return _as_i16(_ids3(x, what), what)
    p = dec(prompt_routed_experts, "prompt_routed_experts")
    g = dec(routed_experts, "routed_experts")
    if p.shape[1:] != g.shape[1:]:
        raise ValueError(f"prompt rows are [*, {p.shape[1]}, {p.shape[2]}] but generation rows "
                         f"[*, {g.shape[1]}, {g.shape[2]}]")
    if not _is_int(first_token) or first_token < 0:
        raise ValueError(f"first_token must be an integer >= 0, got {first_token!r}")
    return _routes(request, np.concatenate([p, g]), first_token, first_token + p.shape[0])


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

"""The capture file (docs/capture.md) with NumPy only: read versions 1 and 2, write version 2.

This module imports nothing but the standard library and NumPy, so it can be
copied into a trainer that does not install moekit. In memory, ids are int16
[num_tokens, num_moe_layers, top_k] with -1 as the sentinel of a row that was
never captured, whatever the file stores (u8/u16 in version 2, u8/i16 in 1).
"""
import json
import os
import struct
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

FORMAT = "moekit.routed_experts"
FORMAT_VERSION = 2
SENTINEL = -1                 # in memory
MAX_U8_EXPERTS = 255          # version 2: u8 ids when E <= 255, so 255 stays free for the sentinel
ID_ORDER = "score_desc_index_asc"
LAYOUT = "[num_tokens, num_moe_layers, top_k]"
_OWN_KEYS = {"format", "format_version", "routing_spec_version", "routing", "num_experts", "top_k", "num_moe_layers",
             "model_layers", "id_space", "id_order", "id_dtype", "layout", "requests", "id_sentinel", "backend",
             "router_weights"}
_NP = {"U8": np.uint8, "U16": np.uint16, "I16": np.int16, "F32": np.float32, "BF16": np.uint16}


@dataclass
class RequestRoutes:
    """One request's routed experts: ids [num_tokens, num_moe_layers, top_k] int16 (-1: not captured) of
    tokens first_token, first_token + 1, ...; tokens before first_generated_token are the prompt (-1: not
    known). router_weights: the router's weights at ids, float32 (bf16 files are widened), or None."""
    request: str
    ids: np.ndarray
    first_token: int = 0
    first_generated_token: int = -1
    router_weights: Optional[np.ndarray] = None

    @property
    def num_tokens(self) -> int:
        return int(self.ids.shape[0])


@dataclass
class Capture:
    """What a capture file holds. routing: {"method", "top_k", "num_groups", "topk_groups",
    "routed_scaling_factor", "score_bias"}; model_layers[l]: the model layer of MoE layer l."""
    num_experts: int
    model_layers: List[int]
    routing: Dict
    requests: List[RequestRoutes] = field(default_factory=list)
    backend: str = ""
    routing_spec_version: int = 1
    format_version: int = FORMAT_VERSION
    router_weights_dtype: Optional[str] = None  # "f32" | "bf16" | None, as stored
    extra_metadata: Dict[str, str] = field(default_factory=dict)

    @property
    def top_k(self) -> int:
        return int(self.routing["top_k"])

    @property
    def num_moe_layers(self) -> int:
        return len(self.model_layers)

    def find(self, request: str) -> Optional[RequestRoutes]:
        return next((r for r in self.requests if r.request == request), None)


def routing_dict(method: str, top_k: int, num_groups: int = 1, topk_groups: int = 1,
                 routed_scaling_factor: float = 1.0, score_bias: bool = False, renormalize: bool = True) -> Dict:
    """The routing parameters a capture file records (renormalize: deepseek_v3's norm_topk_prob)."""
    return {"method": method, "top_k": int(top_k), "num_groups": int(num_groups), "topk_groups": int(topk_groups),
            "routed_scaling_factor": float(routed_scaling_factor), "score_bias": bool(score_bias),
            "renormalize": bool(renormalize)}


def stored_id_dtype(num_experts: int, version: int = FORMAT_VERSION):
    """(safetensors dtype, id_dtype name, stored sentinel or None) of a version's ids."""
    if version == 1:
        return ("U8", "u8", None) if num_experts <= 256 else ("I16", "i16", None)
    return ("U8", "u8", 0xFF) if num_experts <= MAX_U8_EXPERTS else ("U16", "u16", 0xFFFF)


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def read_capture(path) -> Capture:
    """Reads a capture file of version 1 or 2; ValueError names what is wrong."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(blob[8:8 + n])
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", {})
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a moekit capture file (format {meta.get('format')!r})")
    version = int(meta["format_version"])
    if version not in (1, 2):
        raise ValueError(f"{path}: capture format version {version} (this reader reads 1 and 2)")
    E = int(meta["num_experts"])
    routing = json.loads(meta["routing"])
    model_layers = json.loads(meta["model_layers"])
    k, L = int(meta["top_k"]), len(model_layers)
    if k != routing["top_k"] or int(meta["num_moe_layers"]) != L:
        raise ValueError(f"{path}: top_k / num_moe_layers disagree with routing / model_layers")
    if meta["id_space"] != "logical" or meta["id_order"] != ID_ORDER:
        raise ValueError(f"{path}: ids must be logical, in {ID_ORDER} order")
    st_dtype, _, sentinel = stored_id_dtype(E, version)
    wdtype = meta.get("router_weights", "none") if version >= 2 else "none"

    def tensor(name, want_dtype, shape):
        t = header[name]
        if t["dtype"] != want_dtype or list(t["shape"]) != list(shape):
            raise ValueError(f"{path}: tensor {name!r} must be {want_dtype} {list(shape)}, got {t['dtype']} {t['shape']}")
        a, b = t["data_offsets"]
        return np.frombuffer(data[a:b], _NP[want_dtype]).reshape(shape)

    cap = Capture(num_experts=E, model_layers=model_layers, routing=routing, backend=meta.get("backend", ""),
                  routing_spec_version=int(meta["routing_spec_version"]), format_version=version,
                  router_weights_dtype=None if wdtype == "none" else wdtype,
                  extra_metadata={key: v for key, v in meta.items() if key not in _OWN_KEYS})
    for r in json.loads(meta["requests"]):
        stored = tensor(r["tensor"], st_dtype, (r["num_tokens"], L, k))
        ids = stored.astype(np.int16)  # u16 ids are <= 32767, so the cast is exact except the sentinel
        if sentinel is not None:
            ids[stored == sentinel] = SENTINEL
        if ((ids != SENTINEL) & ((ids < 0) | (ids >= E))).any():
            raise ValueError(f"{path}: request {r['request']!r} holds ids outside [0, {E})")
        weights = None
        if cap.router_weights_dtype is not None:
            w = tensor(r["router_weights_tensor"], {"f32": "F32", "bf16": "BF16"}[wdtype], ids.shape)
            weights = _bf16_to_f32(w) if wdtype == "bf16" else w.copy()
        fg = r.get("first_generated_token")
        cap.requests.append(RequestRoutes(r["request"], ids, int(r["first_token"]), -1 if fg is None else int(fg),
                                          weights))
    return cap


def write_capture(path, cap: Capture) -> None:
    """Writes `cap` as a version-2 capture file, atomically (a temporary file, then a rename)."""
    E, L, k = cap.num_experts, cap.num_moe_layers, cap.top_k
    st_dtype, id_dtype, sentinel = stored_id_dtype(E)
    tensors, requests = [], []
    wdtype = cap.router_weights_dtype
    if wdtype not in (None, "f32", "bf16"):
        raise ValueError(f"router_weights_dtype must be None, 'f32' or 'bf16', got {wdtype!r}")
    names = set()
    for i, r in enumerate(cap.requests):
        if r.request in names:
            raise ValueError(f"request {r.request!r} appears twice")
        names.add(r.request)
        ids = np.asarray(r.ids)
        if ids.ndim != 3 or ids.shape[1:] != (L, k):
            raise ValueError(f"request {r.request!r}: ids must be [tokens, {L}, {k}], got {list(ids.shape)}")
        bad = (ids != SENTINEL) & ((ids < 0) | (ids >= E))
        if bad.any():
            t, l, j = np.argwhere(bad)[0]
            raise ValueError(f"request {r.request!r}, token {r.first_token + t}, MoE layer {l}, slot {j}: "
                             f"id {ids[t, l, j]} outside [0, {E}) and not the sentinel -1")
        stored = np.where(ids == SENTINEL, sentinel, ids).astype(_NP[st_dtype])
        tensors.append((f"routed_experts.{i}", st_dtype, stored))
        entry = {"request": r.request, "tensor": f"routed_experts.{i}", "first_token": int(r.first_token),
                 "num_tokens": int(ids.shape[0]),
                 "first_generated_token": None if r.first_generated_token < 0 else int(r.first_generated_token)}
        if wdtype is not None:
            if r.router_weights is None or np.shape(r.router_weights) != ids.shape:
                raise ValueError(f"request {r.request!r}: router_weights must be {list(ids.shape)}")
            w = np.asarray(r.router_weights, np.float32)
            tensors.append((f"router_weights.{i}", "F32" if wdtype == "f32" else "BF16",
                            w if wdtype == "f32" else _f32_to_bf16_bits(w)))
            entry["router_weights_tensor"] = f"router_weights.{i}"
        requests.append(entry)
    meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION),
            "routing_spec_version": str(cap.routing_spec_version),
            "routing": json.dumps(cap.routing, separators=(",", ":")), "num_experts": str(E), "top_k": str(k),
            "num_moe_layers": str(L), "model_layers": json.dumps(list(map(int, cap.model_layers)), separators=(",", ":")),
            "id_space": "logical", "id_order": ID_ORDER, "id_dtype": id_dtype, "id_sentinel": str(sentinel),
            "layout": LAYOUT, "backend": cap.backend, "router_weights": wdtype or "none",
            "requests": json.dumps(requests, separators=(",", ":"))}
    for key, v in cap.extra_metadata.items():
        if key in meta:
            raise ValueError(f"extra metadata key {key!r} is one of the format's own keys")
        meta[key] = v
    # Wider elements first keeps every tensor aligned to its element size.
    tensors.sort(key=lambda t: -t[2].dtype.itemsize)
    header, offset = {"__metadata__": meta}, 0
    for name, dt, a in tensors:
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".capture.")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for _, _, a in tensors:
                f.write(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise

"""The capture file (docs/capture.md) with NumPy only: read versions 1 and 2, write version 2.

This module imports nothing but the standard library and NumPy, so it can be
copied into a trainer that does not install moekit. In memory, ids are int16
[num_tokens, num_moe_layers, top_k] with -1 as the sentinel of a row that was
never captured, whatever the file stores (u8/u16 in version 2, u8/i16 in 1).
"""
import json
import math
import os
import stat
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


# ---------------------------------------------------------------- validation shared by the reader and the writer
# The rules of the C++ reader and writer (src/capture/capture_file.cpp, src/io/safetensors.cpp): a file is read
# only if it could have been written, and every number is range-checked, never truncated.

MAX_EXPERTS = 32767           # ids are int16 in memory (docs/routing.md section 1)
_MAX_INT = 2 ** 31 - 1        # counts the C++ reader stores as int
_MAX_INT64 = 2 ** 63 - 1
_MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own limit
_METHODS = ("softmax_topk", "renormalize", "renormalize_naive", "topk", "sigmoid", "sigmoid_renorm", "llama4",
            "deepseek_v3", "custom")
_ELEMENT_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                  "U16": 2, "U8": 1, "I8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}


def _is_int(v) -> bool:
    """A JSON / Python integer; bool is not one."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _int_in(v, lo: int, hi: int, what: str) -> int:
    if not _is_int(v) or not lo <= int(v) <= hi:
        raise ValueError(f"{what} must be an integer in [{lo}, {hi}], got {v!r:.60}")
    return int(v)


def _no_constants(name):
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs):
    out = {}
    for key, v in pairs:
        if key in out:
            raise ValueError(f"key {key!r:.60} appears twice")
        out[key] = v
    return out


def _json(text, what: str):
    """Strict JSON as the C++ reader parses it: one value, no key twice, no NaN/Infinity, UTF-8."""
    try:
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text).decode("utf-8")
        if "\0" in text:
            raise ValueError("a NUL byte (must be one JSON value)")
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
        _check_strings(value)
        return value
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{what} is not valid JSON: {e}") from None


def _check_strings(value) -> None:
    """JSON text decodes to valid Unicode only: an escaped lone surrogate ("\\ud800") is refused, as the C++
    parser refuses it."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            v.encode("utf-8")  # UnicodeEncodeError is a ValueError
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _check_routing(routing, num_experts: int, what: str) -> Dict:
    """The routing dict's fields (types as the C++ reader takes them) and RoutingConfig::validate(E)."""
    if not isinstance(routing, dict):
        raise ValueError(f"{what}: routing must be a JSON object, got {type(routing).__name__}")
    for key in ("method", "top_k", "num_groups", "topk_groups", "routed_scaling_factor", "score_bias"):
        if key not in routing:
            raise ValueError(f"{what}: routing lacks {key!r}")
    method = routing["method"]
    if not isinstance(method, str) or method not in _METHODS:
        raise ValueError(f"{what}: unknown routing method {method!r:.40}")
    k = _int_in(routing["top_k"], 0, _MAX_INT, f"{what}: routing top_k")
    groups = _int_in(routing["num_groups"], 0, _MAX_INT, f"{what}: routing num_groups")
    kept = _int_in(routing["topk_groups"], 0, _MAX_INT, f"{what}: routing topk_groups")
    scale = routing["routed_scaling_factor"]
    if not isinstance(scale, (int, float, np.integer, np.floating)) or isinstance(scale, (bool, np.bool_)) \
            or not math.isfinite(float(scale)) or abs(float(scale)) > float(np.finfo(np.float32).max):
        raise ValueError(f"{what}: routing routed_scaling_factor must be a finite number (f32), got {scale!r:.40}")
    for key in ("score_bias", "renormalize"):
        if key in routing and not isinstance(routing[key], (bool, np.bool_)):
            raise ValueError(f"{what}: routing {key} must be a boolean, got {routing[key]!r:.40}")
    E = num_experts
    if not 1 <= E <= MAX_EXPERTS:
        raise ValueError(f"{what}: num_experts must be in [1, {MAX_EXPERTS}] (ids are int16), got {E}")
    if not 1 <= k <= E:
        raise ValueError(f"{what}: top_k must be in [1, num_experts={E}], got {k}")
    if method == "deepseek_v3":
        if groups < 1 or E % groups:
            raise ValueError(f"{what}: deepseek_v3 num_groups {groups} must be >= 1 and divide num_experts {E}")
        if not 1 <= kept <= groups:
            raise ValueError(f"{what}: deepseek_v3 topk_groups {kept} must be in [1, num_groups={groups}]")
        if groups > 1 and E // groups < 2:
            raise ValueError(f"{what}: deepseek_v3 groups need >= 2 experts each")
        if k > kept * (E // groups):
            raise ValueError(f"{what}: top_k {k} exceeds the {kept * (E // groups)} experts of the kept groups")
        if not float(scale) > 0:
            raise ValueError(f"{what}: routed_scaling_factor must be > 0, got {scale}")
    elif routing["score_bias"]:
        raise ValueError(f"{what}: a score bias is only used by deepseek_v3 (method {method!r})")
    return routing


def _check_model_layers(layers, what: str) -> List[int]:
    if not isinstance(layers, (list, tuple)) or not layers:
        raise ValueError(f"{what}: model_layers must be a non-empty list (a capture needs >= 1 MoE layer)")
    out = [_int_in(l, 0, _MAX_INT, f"{what}: model_layers entry") for l in layers]
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"{what}: model_layers must increase, got {out}")
    return out


def _tensor_entries(header: Dict, data_size: int, path) -> Dict[str, tuple]:
    """name -> (dtype, shape, begin, end) of every tensor entry, validated as the C++ safetensors reader does."""
    entries = {}
    for name, t in header.items():
        where = f"{path}: tensor {name!r:.80}"
        if name == "":
            raise ValueError(f"{path}: a tensor has an empty name")
        if not isinstance(t, dict):
            raise ValueError(f"{where}: header entry is not an object")
        dt, shape, off = t.get("dtype"), t.get("shape"), t.get("data_offsets")
        if not isinstance(dt, str) or dt not in _ELEMENT_BYTES:
            raise ValueError(f"{where}: unknown or missing dtype {dt!r:.20}")
        if not isinstance(shape, list) or not all(_is_int(d) and 0 <= d <= _MAX_INT64 for d in shape):
            raise ValueError(f"{where}: shape must be a list of non-negative integers, got {shape!r:.80}")
        if not isinstance(off, list) or len(off) != 2 or not all(_is_int(o) and 0 <= o < 2 ** 64 for o in off):
            raise ValueError(f"{where}: 'data_offsets' must be two non-negative integers")
        need = _ELEMENT_BYTES[dt] * math.prod(shape)
        begin, end = off
        if end < begin:
            raise ValueError(f"{where}: data_offsets [{begin}, {end}) ends before it begins")
        if end - begin != need:
            raise ValueError(f"{where}: data_offsets [{begin}, {end}) holds {end - begin} bytes, but {dt} x {shape} "
                             f"needs {need}")
        if end > data_size:
            raise ValueError(f"{where}: data_offsets [{begin}, {end}) extends past the data section ({data_size} "
                             "bytes; truncated file?)")
        entries[name] = (dt, shape, begin, end)
    spans = sorted((b, e, n) for n, (_, _, b, e) in entries.items() if e > b)
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ValueError(f"{path}: tensor {n1!r:.80} (bytes [{b1}, {e1})) overlaps tensor {n0!r:.80} "
                             f"(bytes [{b0}, {e0}))")
    return entries


def read_capture(path) -> Capture:
    """Reads a capture file of version 1 or 2; ValueError names what is wrong. It accepts exactly the files
    the C++ reader accepts (moekit.read_capture_file with check_ids=True)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: {len(blob)} bytes is too short for a safetensors file (the header length alone "
                         "takes 8)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"{path}: header length {n} runs past the end of the file ({len(blob) - 8} bytes after "
                         "the length field; truncated or not safetensors)")
    if n > _MAX_HEADER_BYTES:
        raise ValueError(f"{path}: header length {n} exceeds the format's limit of {_MAX_HEADER_BYTES}")
    header = _json(blob[8:8 + n], f"{path}: header")
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError(f"{path}: '__metadata__' must be an object of strings")
    entries = _tensor_entries(header, len(data), path)

    def value(key):
        if key not in meta:
            raise ValueError(f"{path}: capture metadata lacks {key!r}")
        return meta[key]

    def int_value(key, lo, hi):
        return _int_in(_json(value(key), f"{path}: capture metadata {key!r}"), lo, hi,
                       f"{path}: capture metadata {key!r}")

    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a moekit capture file (format {meta.get('format')!r:.40})")
    version = _json(value("format_version"), f"{path}: capture metadata 'format_version'")
    if not _is_int(version) or version not in (1, 2):
        raise ValueError(f"{path}: capture format version {value('format_version')!r:.40} (this reader reads 1 and 2)")
    spec = int_value("routing_spec_version", 0, _MAX_INT)
    E = int_value("num_experts", 1, _MAX_INT)
    k = int_value("top_k", 1, _MAX_INT)
    routing = _json(value("routing"), f"{path}: capture metadata 'routing'")
    model_layers = _json(value("model_layers"), f"{path}: capture metadata 'model_layers'")
    if not isinstance(model_layers, list):
        raise ValueError(f"{path}: model_layers must be a JSON array of integers")
    model_layers = [_int_in(l, 0, _MAX_INT, f"{path}: model_layers entry") for l in model_layers]
    L = int_value("num_moe_layers", 1, _MAX_INT)
    _check_routing(routing, E, str(path))
    if k != routing["top_k"]:
        raise ValueError(f"{path}: top_k ({k}) disagrees with the routing's top_k ({routing['top_k']})")
    if L != len(model_layers):
        raise ValueError(f"{path}: num_moe_layers ({L}) disagrees with model_layers ({len(model_layers)} entries)")
    _check_model_layers(model_layers, str(path))
    if value("id_space") != "logical":
        raise ValueError(f"{path}: id_space must be 'logical', got {meta['id_space']!r:.40}")
    if value("id_order") != ID_ORDER:
        raise ValueError(f"{path}: id order {meta['id_order']!r:.40} (this reader reads {ID_ORDER})")
    st_dtype, id_dtype, sentinel = stored_id_dtype(E, version)
    wdtype, backend = "none", meta.get("backend", "")
    if version >= 2:
        if value("id_dtype") != id_dtype:
            raise ValueError(f"{path}: id_dtype {meta['id_dtype']!r:.20} but E = {E} stores ids as {id_dtype}")
        if int_value("id_sentinel", 0, 0xFFFF) != sentinel:
            raise ValueError(f"{path}: id_sentinel {meta['id_sentinel']!r:.20}, expected {sentinel} for {id_dtype} ids")
        backend = value("backend")
        wdtype = value("router_weights")
        if wdtype not in ("none", "f32", "bf16"):
            raise ValueError(f"{path}: router_weights must be 'none', 'f32' or 'bf16', got {wdtype!r:.20}")

    def tensor(name, want_dtype, shape, what):
        if not isinstance(name, str) or name not in entries:
            raise ValueError(f"{what}: tensor {name!r:.60} is not in the file")
        dt, got_shape, a, b = entries[name]
        if dt != want_dtype or got_shape != list(shape):
            raise ValueError(f"{what}: tensor {name!r:.60} must be {want_dtype} {list(shape)}, got {dt} {got_shape}")
        return np.frombuffer(data[a:b], np.dtype(_NP[want_dtype]).newbyteorder("<")).reshape(shape)

    def field_of(r, key, what, lo=0, hi=_MAX_INT64):
        if key not in r:
            raise ValueError(f"{what}: missing field {key!r}")
        return _int_in(r[key], lo, hi, f"{what}: field {key!r}")

    cap = Capture(num_experts=E, model_layers=model_layers, routing=routing, backend=backend,
                  routing_spec_version=spec, format_version=version,
                  router_weights_dtype=None if wdtype == "none" else wdtype,
                  extra_metadata={key: v for key, v in meta.items() if key not in _OWN_KEYS})
    requests = _json(value("requests"), f"{path}: capture metadata 'requests'")
    if not isinstance(requests, list):
        raise ValueError(f"{path}: 'requests' must be a JSON array")
    names, used = set(), set()
    for i, r in enumerate(requests):
        what = f"{path}: requests[{i}]"
        if not isinstance(r, dict):
            raise ValueError(f"{what}: must be a JSON object")
        for key in ("request", "tensor"):
            if not isinstance(r.get(key), str):
                raise ValueError(f"{what}: field {key!r} must be a string")
        first = field_of(r, "first_token", what)
        tokens = field_of(r, "num_tokens", what)
        fg = -1
        if version >= 2:
            if "first_generated_token" not in r:
                raise ValueError(f"{what}: missing field 'first_generated_token'")
            if r["first_generated_token"] is not None:
                fg = field_of(r, "first_generated_token", what, lo=first)
        if r["request"] in names:
            raise ValueError(f"{what}: request {r['request']!r:.60} appears twice")
        names.add(r["request"])
        if r["tensor"] in used:
            raise ValueError(f"{what}: tensor {r['tensor']!r:.60} belongs to an earlier request too")
        used.add(r["tensor"])
        stored = tensor(r["tensor"], st_dtype, (tokens, L, k), what).astype(np.int64)
        unwritten = stored == sentinel if sentinel is not None else np.zeros(stored.shape, bool)
        bad = ~unwritten & ((stored < 0) | (stored >= E))
        if bad.any():
            t, l, j = (int(x) for x in np.argwhere(bad)[0])
            raise ValueError(f"{what}: request {r['request']!r:.60}, row {t}, MoE layer {l}, slot {j}: id "
                             f"{stored[t, l, j]} outside [0, {E})"
                             + (f" (and not the sentinel {sentinel})" if sentinel is not None else ""))
        stored[unwritten] = SENTINEL
        ids = stored.astype(np.int16)  # every value is now in [-1, E), E <= 32767: exact
        weights = None
        if cap.router_weights_dtype is not None:
            wname = r.get("router_weights_tensor")
            if not isinstance(wname, str) or wname in used:
                raise ValueError(f"{what}: router weights tensor {wname!r:.60} must be a tensor of this request only")
            used.add(wname)
            w = tensor(wname, {"f32": "F32", "bf16": "BF16"}[wdtype], ids.shape, what)
            weights = _bf16_to_f32(w) if wdtype == "bf16" else w.astype(np.float32)
        cap.requests.append(RequestRoutes(r["request"], ids, first, fg, weights))
    return cap


def write_capture(path, cap: Capture) -> None:
    """Writes `cap` as a version-2 capture file, atomically (a temporary file, then a rename). ValueError
    names anything the C++ reader would refuse (nothing is written then); an existing path that is not a
    regular file (a device node, a folder, a FIFO) is never replaced."""
    E = cap.num_experts
    if not _is_int(E):
        raise ValueError(f"num_experts must be an integer, got {E!r:.40}")
    E = int(E)
    routing = _check_routing(cap.routing, E, "write_capture")
    model_layers = _check_model_layers(list(cap.model_layers) if isinstance(cap.model_layers, (list, tuple))
                                       else cap.model_layers, "write_capture")
    L, k = len(model_layers), int(routing["top_k"])
    if not _is_int(cap.routing_spec_version) or not 0 <= cap.routing_spec_version <= _MAX_INT:
        raise ValueError(f"routing_spec_version must be an integer in [0, {_MAX_INT}], got {cap.routing_spec_version!r}")
    _utf8(cap.backend, "backend")
    st_dtype, id_dtype, sentinel = stored_id_dtype(E)
    tensors, requests = [], []
    wdtype = cap.router_weights_dtype
    if wdtype not in (None, "f32", "bf16"):
        raise ValueError(f"router_weights_dtype must be None, 'f32' or 'bf16', got {wdtype!r}")
    names = set()
    for i, r in enumerate(cap.requests):
        _utf8(r.request, "request names")
        if r.request in names:
            raise ValueError(f"request {r.request!r} appears twice")
        names.add(r.request)
        if not _is_int(r.first_token) or not 0 <= r.first_token <= _MAX_INT64:
            raise ValueError(f"request {r.request!r}: first_token must be an integer >= 0, got {r.first_token!r}")
        fg = r.first_generated_token
        if not _is_int(fg) or not (fg == -1 or r.first_token <= fg <= _MAX_INT64):
            raise ValueError(f"request {r.request!r}: first_generated_token {fg!r} must be -1 (not known) or "
                             f">= first_token {r.first_token}")
        ids = np.asarray(r.ids)
        if ids.ndim != 3 or ids.shape[1:] != (L, k):
            raise ValueError(f"request {r.request!r}: ids must be [tokens, {L}, {k}], got {list(ids.shape)}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"request {r.request!r}: ids must be integers, got {ids.dtype}")
        bad = (ids != SENTINEL) & ((ids < 0) | (ids >= E))
        if bad.any():
            t, l, j = np.argwhere(bad)[0]
            raise ValueError(f"request {r.request!r}, token {r.first_token + t}, MoE layer {l}, slot {j}: "
                             f"id {ids[t, l, j]} outside [0, {E}) and not the sentinel -1")
        # Every id is in [-1, E) now; widen before the sentinel goes in (no Python int is cast into a narrow type).
        wide = ids.astype(np.int64)
        wide[wide == SENTINEL] = sentinel
        stored = wide.astype(_NP[st_dtype])
        tensors.append((f"routed_experts.{i}", st_dtype, stored))
        entry = {"request": r.request, "tensor": f"routed_experts.{i}", "first_token": int(r.first_token),
                 "num_tokens": int(ids.shape[0]), "first_generated_token": None if fg < 0 else int(fg)}
        if wdtype is not None:
            if r.router_weights is None or np.shape(r.router_weights) != ids.shape:
                raise ValueError(f"request {r.request!r}: router_weights must be {list(ids.shape)}")
            w = np.asarray(r.router_weights)
            if not (np.issubdtype(w.dtype, np.floating) or np.issubdtype(w.dtype, np.integer)):
                raise ValueError(f"request {r.request!r}: router_weights must be numbers, got {w.dtype}")
            w = w.astype(np.float32)
            tensors.append((f"router_weights.{i}", "F32" if wdtype == "f32" else "BF16",
                            w if wdtype == "f32" else _f32_to_bf16_bits(w)))
            entry["router_weights_tensor"] = f"router_weights.{i}"
        elif r.router_weights is not None:
            raise ValueError(f"request {r.request!r} has router weights but the capture's router_weights_dtype "
                             "is not set")
        requests.append(entry)
    meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION),
            "routing_spec_version": str(int(cap.routing_spec_version)),
            "routing": _dumps(routing, "routing"), "num_experts": str(E), "top_k": str(k),
            "num_moe_layers": str(L), "model_layers": json.dumps(model_layers, separators=(",", ":")),
            "id_space": "logical", "id_order": ID_ORDER, "id_dtype": id_dtype, "id_sentinel": str(sentinel),
            "layout": LAYOUT, "backend": cap.backend, "router_weights": wdtype or "none",
            "requests": json.dumps(requests, separators=(",", ":"))}
    for key, v in cap.extra_metadata.items():
        _utf8(key, "extra metadata keys")
        _utf8(v, f"extra metadata {key!r:.40}")
        if key in meta or key in _OWN_KEYS:
            raise ValueError(f"extra metadata key {key!r} is one of the format's own keys")
        meta[key] = v
    _check_destination(path)
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


def _utf8(text, what: str) -> None:
    """Names and metadata are strings the file can hold as UTF-8 (the C++ writer's rule)."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be strings, got {text!r:.60}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} must be valid UTF-8 text, got {text!r:.60}") from None


def _dumps(value, what: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} cannot be written as JSON: {e}") from None


def _check_destination(path) -> None:
    """What the rename could replace must be a regular file (as the C++ writer checks): a device node, a FIFO
    or a folder at the path is refused, never replaced."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.fspath(path).endswith(os.sep):
            raise ValueError(f"{path}: names a folder, not a file") from None
        return
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a regular file, cannot be replaced")

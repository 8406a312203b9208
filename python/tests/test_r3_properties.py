"""Property-based tests (Hypothesis) of moekit.r3's readers and converters: random captures round-trip
exactly through write_capture/read_capture (and the C++ reader) and through each to_X/from_X pair; random
or damaged bytes are refused with ValueError, never another exception, and the NumPy reader accepts a
damaged file exactly when the C++ reader does."""
import base64
import struct

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import moekit  # noqa: E402
from moekit import r3  # noqa: E402

# Deterministic runs (no example database, derandomized): CI sees the same examples on every run.
PROPS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
METHODS = ["softmax_topk", "renormalize", "renormalize_naive", "topk", "sigmoid", "sigmoid_renorm", "llama4",
           "deepseek_v3"]


@st.composite
def request_ids(draw, E, L, k, max_tokens=6):
    """ids [T, L, k] int16: distinct experts per row, some rows (or slots) the sentinel -1."""
    T = draw(st.integers(0, max_tokens))
    rows = [draw(st.permutations(range(E)))[:k] if E <= 64 else
            draw(st.lists(st.integers(0, E - 1), min_size=k, max_size=k, unique=True)) for _ in range(T * L)]
    ids = np.array(rows, np.int16).reshape(T, L, k)
    if T and draw(st.booleans()):
        t, l = draw(st.integers(0, T - 1)), draw(st.integers(0, L - 1))
        ids[t, l, draw(st.integers(0, k - 1)) if draw(st.booleans()) else slice(None)] = -1
    return ids


@st.composite
def captures(draw, max_requests=4):
    E = draw(st.sampled_from([1, 2, 7, 64, 254, 255, 256, 300, 4097, 32767]))
    k = draw(st.integers(1, min(E, 5)))
    L = draw(st.integers(1, 4))
    model_layers = sorted(draw(st.sets(st.integers(0, 40), min_size=L, max_size=L)))
    method = draw(st.sampled_from(METHODS))
    routing = r3.routing_dict(method, k, routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])),
                              score_bias=method == "deepseek_v3" and draw(st.booleans()),
                              renormalize=draw(st.booleans()))
    wdtype = draw(st.sampled_from([None, "f32", "bf16"]))
    names = draw(st.lists(st.text(min_size=0, max_size=8), max_size=max_requests, unique=True))
    reqs = []
    for name in names:
        ids = draw(request_ids(E, L, k))
        first = draw(st.integers(0, 1000))
        fg = draw(st.one_of(st.just(-1), st.integers(first, first + ids.shape[0] + 3)))
        w = None
        if wdtype:
            w = np.array(draw(st.lists(st.floats(-4, 4, width=16), min_size=ids.size, max_size=ids.size)),
                         np.float32).reshape(ids.shape)  # f16 values are exact in bf16 only sometimes:
            if wdtype == "bf16":  # keep the bits bf16 holds, so the round trip is exact
                w = ((w.view(np.uint32) >> 16) << 16).view(np.float32)
        reqs.append(r3.RequestRoutes(name, ids, first, fg, w))
    extra = draw(st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda s: s not in r3.format._OWN_KEYS),
                                 st.text(max_size=6), max_size=2))
    return r3.Capture(E, model_layers, routing, reqs, backend=draw(st.text(max_size=6)),
                      router_weights_dtype=wdtype, extra_metadata=extra)


def same_routes(a: r3.RequestRoutes, b: r3.RequestRoutes):
    assert (a.request, a.first_token, a.first_generated_token) == (b.request, b.first_token, b.first_generated_token)
    assert b.ids.dtype == np.int16 and b.ids.shape == a.ids.shape and np.array_equal(a.ids, b.ids)


@PROPS
@given(cap=captures())
def test_capture_files_round_trip_exactly(tmp_path_factory, cap):
    path = tmp_path_factory.mktemp("rt") / "c.safetensors"
    r3.write_capture(path, cap)
    back = r3.read_capture(path)
    assert (back.num_experts, back.model_layers, back.routing, back.backend, back.router_weights_dtype,
            back.extra_metadata) == (cap.num_experts, cap.model_layers, cap.routing, cap.backend,
                                     cap.router_weights_dtype, cap.extra_metadata)
    assert len(back.requests) == len(cap.requests)
    for a, b in zip(cap.requests, back.requests):
        same_routes(a, b)
        if cap.router_weights_dtype:
            assert b.router_weights.dtype == np.float32
            assert np.array_equal(a.router_weights.view(np.uint32), b.router_weights.view(np.uint32))
    cs = moekit.read_capture_file(path)  # the C++ reader agrees on every id
    assert [r.request for r in cs.requests] == [r.request for r in cap.requests]
    for a, c in zip(cap.requests, cs.requests):
        assert np.array_equal(c.ids.numpy(), a.ids) and c.first_generated_token == a.first_generated_token


@st.composite
def routes(draw):
    E = draw(st.sampled_from([3, 16, 255, 256, 1000, 32767]))
    k = draw(st.integers(1, min(E, 4)))
    L = draw(st.integers(1, 3))
    ids = draw(request_ids(E, L, k, max_tokens=8))
    first = draw(st.integers(0, 50))
    fg = draw(st.one_of(st.just(-1), st.integers(first, first + ids.shape[0])))
    return E, r3.RequestRoutes(draw(st.text(max_size=5)), ids, first, fg)


@PROPS
@given(data=routes(), encoding=st.sampled_from(["array", "base64_npy"]), extra=st.integers(0, 3))
def test_vllm_round_trip(data, encoding, extra):
    E, req = data
    assume((req.ids >= 0).all())  # vLLM's arrays have no sentinel
    L = req.ids.shape[1]
    layers = list(range(extra, extra + L))  # the first `extra` hidden layers are dense
    out = r3.to_vllm(req, num_hidden_layers=L + extra, model_layers=layers, num_experts=E, encoding=encoding)
    same_routes(req, r3.from_vllm(req.request, out, layers, prompt_start=req.first_token,
                                  num_prompt_tokens=req.first_generated_token))


@PROPS
@given(data=routes(), extra=st.integers(0, 3), fill=st.sampled_from([-1, 0, 7]), seed=st.integers(0, 2 ** 32 - 1))
def test_sglang_round_trip(data, extra, fill, seed):
    _, req = data
    L = req.ids.shape[1]
    n = L + extra
    layers = sorted(np.random.default_rng(seed).permutation(n)[:L].tolist())
    flat, start = r3.to_sglang(req, layers, n, dense_fill=fill)
    assert flat.dtype == np.int32 and flat.size == req.ids.size // L * n
    same_routes(req, r3.from_sglang(req.request, flat, start, n, layers, req.ids.shape[2],
                                    req.first_generated_token))


@PROPS
@given(data=routes(), more=st.integers(0, 4), dtype=st.sampled_from([np.int16, np.int32, np.int64]))
def test_megatron_round_trip(data, more, dtype):
    _, req = data
    T = req.num_tokens
    sample = r3.to_megatron(req, seq_len=req.first_token + T + more, dtype=dtype)
    assert sample.dtype == dtype and (sample[:req.first_token] == -1).all() and (sample[req.first_token + T:] == -1).all()
    same_routes(req, r3.from_megatron(req.request, sample, req.first_token, T, req.first_generated_token))


@PROPS
@given(batch=st.lists(routes(), min_size=1, max_size=4), side=st.sampled_from(["left", "right"]),
       more=st.integers(0, 3))
def test_padded_batch_round_trip(batch, side, more):
    shape = batch[0][1].ids.shape[1:]
    reqs = [req for _, req in batch if req.ids.shape[1:] == shape]
    names = [f"r{i}" for i in range(len(reqs))]
    reqs = [r3.RequestRoutes(n, r.ids, r.first_token, r.first_generated_token) for n, r in zip(names, reqs)]
    S = max(r.num_tokens for r in reqs) + more
    out, lengths = r3.to_padded_batch(reqs, seq_len=S, side=side)
    back = r3.from_padded_batch(out, lengths, names, side=side, first_tokens=[r.first_token for r in reqs],
                                first_generated_tokens=[r.first_generated_token for r in reqs])
    for a, b in zip(reqs, back):
        same_routes(a, b)


def _read_both(path):
    """(NumPy reader's outcome, C++ reader's outcome): a Capture/CaptureSet or the ValueError raised."""
    outcomes = []
    for read in (r3.read_capture, moekit.read_capture_file):
        try:
            outcomes.append(read(path))
        except ValueError as e:  # anything else fails the test
            outcomes.append(e)
    return outcomes


@PROPS
@given(blob=st.binary(max_size=200))
def test_random_bytes_are_refused_with_value_error(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("rb") / "x"
    path.write_bytes(blob)
    py, cpp = _read_both(path)
    assert isinstance(py, ValueError) and isinstance(cpp, ValueError)


@PROPS
@given(blob=st.binary(max_size=120))
def test_random_header_text_is_refused_with_value_error(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("rh") / "x"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)
    py, cpp = _read_both(path)
    assert isinstance(py, ValueError) and isinstance(cpp, ValueError)


@st.composite
def damaged_files(draw):
    """A valid capture file's bytes, then a few bytes overwritten, dropped or inserted (mostly in the header)."""
    cap = draw(captures(max_requests=2))
    return cap, draw(st.lists(st.tuples(st.sampled_from(["set", "drop", "insert"]), st.integers(0, 10 ** 6),
                                        st.binary(min_size=1, max_size=3)), min_size=1, max_size=3))


@PROPS
@given(case=damaged_files())
def test_damaged_files_are_read_exactly_when_the_cpp_reader_reads_them(tmp_path_factory, case):
    cap, edits = case
    path = tmp_path_factory.mktemp("dm") / "c.safetensors"
    r3.write_capture(path, cap)
    blob = bytearray(path.read_bytes())
    for op, at, b in edits:
        at %= max(len(blob), 1)
        if op == "set":
            blob[at:at + len(b)] = b
        elif op == "drop":
            del blob[at:at + len(b)]
        else:
            blob[at:at] = b
    path.write_bytes(bytes(blob))
    py, cpp = _read_both(path)
    assert isinstance(py, ValueError) == isinstance(cpp, ValueError), (py, cpp)
    if not isinstance(py, ValueError):
        assert [r.request for r in py.requests] == [r.request for r in cpp.requests]
        for a, c in zip(py.requests, cpp.requests):
            assert np.array_equal(a.ids, c.ids.numpy())


@PROPS
@given(text=st.one_of(st.text(max_size=40), st.binary(max_size=60).map(lambda b: base64.b64encode(b).decode())))
def test_from_vllm_refuses_random_text_with_value_error(text):
    try:
        r3.from_vllm("q", text, [0])
    except ValueError:
        pass


@PROPS
@given(values=st.lists(st.integers(-2 ** 40, 2 ** 40), max_size=24),
       dtype=st.sampled_from([np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64, np.uint64, np.float32]),
       n=st.integers(0, 3), k=st.integers(0, 3))
def test_from_sglang_takes_ids_in_range_or_raises_value_error(values, dtype, n, k):
    flat = np.array(values).astype(dtype) if values else np.zeros(0, dtype)
    try:
        got = r3.from_sglang("q", flat, 0, n, list(range(n)), k)
    except ValueError:
        return
    wide = flat.astype(np.float64)
    assert np.issubdtype(dtype, np.integer) and ((wide >= -1) & (wide <= 32767)).all()
    assert np.array_equal(got.ids.reshape(-1), flat.astype(np.int64))


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2 ** 65, 2 ** 65), st.floats(allow_nan=False, allow_infinity=False),
              st.sampled_from(["", "u8", "u16", "i16", "logical", "none", "f32", "bf16", "renormalize", "deepseek_v3",
                               "routed_experts.0", "routed_experts.1", "router_weights.0", "U8", "U16", "F32"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["method", "top_k", "request", "tensor", "first_token", "num_tokens", "first_generated_token", "dtype",
         "shape", "data_offsets", "num_groups", "topk_groups", "routed_scaling_factor", "score_bias"]), inner,
        max_size=4)), max_leaves=6)
# A metadata value is a string; these are the texts a careless writer produces.
META_TEXTS = st.one_of(JSON_VALUES.map(lambda v: __import__("json").dumps(v)),
                       st.sampled_from(["2.0", "2_0", " 2", "02", "1e0", "-1", "NaN", "true", "", "[0, 0]", "[1.0]",
                                        "4294967298", "65535", "255", "32768", "[1,2,3]", "[3,2]"]))


@st.composite
def edited_headers(draw):
    """A valid capture's header with one metadata value, request field or tensor field replaced or deleted."""
    import json
    cap = draw(captures(max_requests=2))
    where = draw(st.sampled_from(["meta", "routing", "request", "tensor"]))
    if where == "meta":
        key = draw(st.sampled_from(sorted(r3.format._OWN_KEYS - {"format"})))
        return cap, where, key, draw(st.one_of(st.none(), META_TEXTS))
    if where == "routing":
        key = draw(st.sampled_from(["method", "top_k", "num_groups", "topk_groups", "routed_scaling_factor",
                                    "score_bias", "renormalize"]))
    elif where == "request":
        key = draw(st.sampled_from(["request", "tensor", "first_token", "num_tokens", "first_generated_token",
                                    "router_weights_tensor"]))
    else:
        key = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
    return cap, where, key, draw(st.one_of(st.none(), JSON_VALUES.map(lambda v: ("value", v))))


@PROPS
@given(case=edited_headers())
def test_edited_headers_are_read_exactly_when_the_cpp_reader_reads_them(tmp_path_factory, case):
    import json
    cap, where, key, new = case
    path = tmp_path_factory.mktemp("eh") / "c.safetensors"
    r3.write_capture(path, cap)
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header["__metadata__"]
    if where == "meta":
        if new is None:
            meta.pop(key, None)
        else:
            meta[key] = new
    else:
        if where == "routing":
            target = json.loads(meta["routing"])
        elif where == "request":
            reqs = json.loads(meta["requests"])
            assume(reqs)
            target = reqs[0]
        else:
            assume("routed_experts.0" in header)
            target = header["routed_experts.0"]
        if new is None:
            target.pop(key, None)
        else:
            target[key] = new[1]
        if where == "routing":
            meta["routing"] = json.dumps(target)
        elif where == "request":
            meta["requests"] = json.dumps(reqs)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + blob[8 + n:])
    py, cpp = _read_both(path)
    assert isinstance(py, ValueError) == isinstance(cpp, ValueError), (py, cpp)
    if not isinstance(py, ValueError):
        assert py.num_experts == cpp.num_experts and py.model_layers == list(cpp.model_layers)
        for a, c in zip(py.requests, cpp.requests):
            assert a.request == c.request and np.array_equal(a.ids, c.ids.numpy())

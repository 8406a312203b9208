"""moekit.r3 and the capturer on bad input: every case raises ValueError naming the problem (or, for the
validator, reports a finding) instead of wrapping, truncating or overwriting ids, and no edge input reaches
ZeroDivisionError, EOFError, KeyError or TypeError."""
import base64
import io
import json
import os
import stat
import struct

import numpy as np
import pytest

import moekit
from moekit import r3


def ids_of(T=5, L=2, k=3, E=20, seed=0):
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(E)[:k] for _ in range(T * L)]).reshape(T, L, k).astype(np.int16)


def capture(E=20, T=5, L=2, k=3, **kw):
    req = r3.RequestRoutes("q", ids_of(T, L, k, E), kw.pop("first_token", 0), kw.pop("first_generated_token", 3))
    return r3.Capture(E, list(range(1, L + 1)), r3.routing_dict("renormalize", k), [req], **kw)


# ---------------------------------------------------------------- item 3: no wrapping, truncation or overwrite

def test_write_capture_refuses_more_experts_than_int16_ids_hold(tmp_path):
    cap = capture(E=40000)
    with pytest.raises(ValueError, match=r"num_experts must be in \[1, 32767\]"):
        r3.write_capture(tmp_path / "c.safetensors", cap)
    assert list(tmp_path.iterdir()) == []


def test_write_capture_refuses_float_ids(tmp_path):
    cap = capture()
    cap.requests[0].ids = cap.requests[0].ids.astype(np.float32) + 0.5
    with pytest.raises(ValueError, match="ids must be integers, got float32"):
        r3.write_capture(tmp_path / "c.safetensors", cap)
    assert list(tmp_path.iterdir()) == []


def test_write_capture_refuses_a_prompt_boundary_before_the_first_token(tmp_path):
    cap = capture(first_token=4, first_generated_token=2)
    with pytest.raises(ValueError, match="first_generated_token 2 must be -1 .* >= first_token 4"):
        r3.write_capture(tmp_path / "c.safetensors", cap)


@pytest.mark.parametrize("E", [16, 300])
def test_to_vllm_refuses_ids_outside_num_experts(E):
    req = r3.RequestRoutes("q", ids_of(E=E), 0, 2)
    req.ids[3, 1, 2] = E  # u8 would store 16 as 16, u16 300 as 300: both not an expert of E
    with pytest.raises(ValueError, match=rf"id {E} at \[3, 1, 2\] outside \[0, num_experts={E}\)"):
        r3.to_vllm(req, num_hidden_layers=2, model_layers=[0, 1], num_experts=E)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.uint16])
def test_narrow_output_dtypes_are_refused(dtype):
    req = r3.RequestRoutes("q", ids_of(E=300) if dtype == np.int8 else ids_of(E=20), 1, 3)
    with pytest.raises(ValueError, match="(do not fit|does not fit)"):
        r3.to_megatron(req, dtype=dtype)
    with pytest.raises(ValueError, match="(do not fit|does not fit)"):
        r3.to_padded_batch([req], dtype=dtype)


def test_unsigned_output_dtypes_work_when_pad_and_ids_fit():
    req = r3.RequestRoutes("q", ids_of(E=20), 0, 3)
    sample = r3.to_megatron(req, seq_len=7, pad=255, dtype=np.uint8)
    assert sample.dtype == np.uint8 and (sample[5:] == 255).all() and np.array_equal(sample[:5], req.ids)
    with pytest.raises(ValueError, match="dtype must be an integer type"):
        r3.to_megatron(req, dtype=np.float32)
    with pytest.raises(ValueError, match="the sentinel -1 needs a signed type"):
        req.ids[0, 0, 0] = -1
        r3.to_padded_batch([req], pad=0, dtype=np.uint16)


def test_from_sglang_refuses_float_ids():
    flat = np.arange(2 * 3 * 2, dtype=np.float64) + 0.7
    with pytest.raises(ValueError, match="sglang ids must be integers, got float64"):
        r3.from_sglang("q", flat, 0, num_model_layers=3, model_layers=[0, 2], top_k=2)


@pytest.mark.parametrize("convert", [
    lambda a: r3.from_vllm("q", a, list(range(a.shape[1]))),
    lambda a: r3.from_megatron("q", a),
    lambda a: r3.from_padded_batch(a[None], [a.shape[0]], ["q"])[0],
])
def test_from_converters_refuse_wide_and_float_ids(convert):
    a = ids_of().astype(np.int64)
    a[1, 0, 2] = 2 ** 16 + 3  # would wrap to expert 3 in int16
    with pytest.raises(ValueError, match=r"id 65539 at \[1, 0, 2\] (outside|is not)"):
        convert(a)
    with pytest.raises(ValueError, match="integer"):
        convert(ids_of().astype(np.float32))


def test_to_sglang_refuses_a_layer_named_twice():
    req = r3.RequestRoutes("q", ids_of(L=3), 0, 3)
    with pytest.raises(ValueError, match="names model layer 2 twice"):
        r3.to_sglang(req, [0, 2, 2], 4)
    with pytest.raises(ValueError, match="names model layer 1 twice"):
        r3.from_sglang("q", np.zeros(5 * 4 * 3, np.int32), 0, 4, [1, 1, 3], 3)


@pytest.mark.parametrize("bad", [40000, -5, 32768])
def test_store_refuses_ids_outside_the_id_range(bad):
    s = r3.RoutingStore(2, 3, 4)
    s.add_request("a", prompt_len=4)
    rows = ids_of(T=4).astype(np.int32)
    rows[2, 1, 0] = bad
    with pytest.raises(ValueError, match=rf"append: row 2, MoE layer 1, slot 0: id {bad} outside \[0, 32767\]"):
        s.append("a", 0, rows)
    with pytest.raises(ValueError, match=rf"id {bad} outside"):
        s.splice("a", rows)
    assert s.num_tokens("a") == 0  # nothing was written
    strict = r3.RoutingStore(2, 3, 4, num_experts=20)
    strict.add_request("a", prompt_len=4)
    rows[2, 1, 0] = 20
    with pytest.raises(ValueError, match=r"id 20 outside \[0, 20\)"):
        strict.append("a", 0, rows)


def test_store_refuses_a_first_token_past_the_prompt():
    s = r3.RoutingStore(2, 3, 4)
    with pytest.raises(ValueError, match="first_token 10 lies past the prompt's end \\(prompt_len 5\\)"):
        s.add_request("a", prompt_len=5, first_token=10)
    s.add_request("a", prompt_len=5, first_token=5)  # the whole prompt captured before: fine
    with pytest.raises(ValueError, match="integers"):
        s.add_request("b", prompt_len=5.5)


def test_capturer_refuses_a_skip_past_the_prompt():
    cap = moekit.RoutedExpertsCapturer(1, 8, 2)
    with pytest.raises(ValueError, match=r"skip_prompt_tokens 7 lies past the prompt's end \(prompt_tokens 3\)"):
        cap.add_request("r", skip_prompt_tokens=7, prompt_tokens=3)
    cap.add_request("r", skip_prompt_tokens=3, prompt_tokens=3)
    cap.add_request("s", skip_prompt_tokens=7)  # prompt length not known: nothing to contradict


# ---------------------------------------------------------------- item 5: the validator never says "ok" wrongly

def test_check_reports_an_expected_request_the_capture_lacks(tmp_path):
    rep = r3.check({"a": ids_of(seed=1)}, num_experts=20, expected_tokens={"a": 5, "ghost": 7})
    assert not rep.ok and rep.counts == {"token_count": 1}
    assert "request 'ghost'" in rep.findings[0]["message"] and "not in the capture" in rep.findings[0]["message"]
    path = tmp_path / "c.safetensors"
    r3.write_capture(path, capture())
    assert r3.check(path, expected_tokens={"q": 5}).ok
    assert r3.check(path, expected_tokens={"missing": 1}).counts == {"token_count": 1}


def test_check_refuses_impossible_eplb_maps():
    a = ids_of(seed=2)
    a[1, 0, 0] = 21
    with pytest.raises(ValueError, match=r"physical_to_logical\[21\] = 1000000 is not a logical expert \(E = 20\)"):
        r3.check({"x": a}, num_experts=20, physical_to_logical=list(range(20)) + [3, 1000000])
    with pytest.raises(ValueError, match=r"physical_to_logical\[2\] = -1"):
        r3.check({"x": a}, num_experts=20, physical_to_logical=[0, 1, -1] + list(range(3, 22)))
    with pytest.raises(ValueError, match="fewer than the 20 logical"):
        r3.check({"x": a}, num_experts=20, physical_to_logical=list(range(10)))
    rep = r3.check({"x": a}, num_experts=20, physical_to_logical=list(range(20)) + [3, 7])
    assert rep.counts == {"physical_id": 1} and "(logical expert 7)" in rep.findings[0]["message"]


def test_check_refuses_float_ids():
    with pytest.raises(ValueError, match="ids must be integers"):
        r3.check({"x": ids_of().astype(np.float64) + 0.5}, num_experts=20)


# ---------------------------------------------------------------- item 6: the reader refuses what C++ refuses

def raw_file(path, meta_changes=None, header_changes=None, requests=None, data=None):
    """A valid capture written by write_capture, then its header edited (None deletes a key)."""
    r3.write_capture(path, capture())
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    body = blob[8 + n:] if data is None else data
    meta = header["__metadata__"]
    if requests is not None:
        reqs = json.loads(meta["requests"])
        requests(reqs)
        meta["requests"] = json.dumps(reqs)
    for key, v in (meta_changes or {}).items():
        if v is None:
            meta.pop(key, None)
        else:
            meta[key] = v
    for key, v in (header_changes or {}).items():
        header[key] = v
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)
    return path


BAD_FILES = [
    ("format_version", dict(meta_changes={"format_version": "2.0"}), "format version"),
    ("format_version_int_suffix", dict(meta_changes={"format_version": "2_0"}), "not valid JSON"),
    ("num_experts_float", dict(meta_changes={"num_experts": "20.0"}), "'num_experts' must be an integer"),
    ("num_experts_too_many", dict(meta_changes={"num_experts": "40000"}), r"num_experts must be in \[1, 32767\]"),
    ("top_k_gt_E", dict(meta_changes={"num_experts": "2", "id_dtype": "u8"}), r"top_k must be in \[1, num_experts=2\]"),
    ("no_routing", dict(meta_changes={"routing": None}), "lacks 'routing'"),
    ("routing_method", dict(meta_changes={"routing": json.dumps(dict(r3.routing_dict("renormalize", 3), method="x"))}),
     "unknown routing method"),
    ("routing_nan", dict(meta_changes={"routing": '{"method":"renormalize","top_k":3,"num_groups":1,"topk_groups":1,'
                                                  '"routed_scaling_factor":NaN,"score_bias":false}'}), "not valid JSON"),
    ("routing_dup_key", dict(meta_changes={"routing": '{"method":"renormalize","top_k":3,"top_k":3,"num_groups":1,'
                                                       '"topk_groups":1,"routed_scaling_factor":1,"score_bias":false}'}),
     "appears twice"),
    ("layers_decrease", dict(meta_changes={"model_layers": "[2,1]"}), "model_layers must increase"),
    ("no_layers", dict(meta_changes={"model_layers": "[]", "num_moe_layers": "0"}), "num_moe_layers"),
    ("id_dtype", dict(meta_changes={"id_dtype": "u16"}), "id_dtype 'u16' but E = 20 stores ids as u8"),
    ("id_sentinel", dict(meta_changes={"id_sentinel": "65535"}), "id_sentinel '65535', expected 255"),
    ("no_id_sentinel", dict(meta_changes={"id_sentinel": None}), "lacks 'id_sentinel'"),
    ("id_space", dict(meta_changes={"id_space": "physical"}), "id_space must be 'logical'"),
    ("weights", dict(meta_changes={"router_weights": "f16"}), "router_weights must be"),
    ("requests_not_list", dict(meta_changes={"requests": "{}"}), "'requests' must be a JSON array"),
    ("request_no_tensor", dict(requests=lambda rs: rs[0].pop("tensor")), "field 'tensor' must be a string"),
    ("request_ghost_tensor", dict(requests=lambda rs: rs[0].update(tensor="nope")), "tensor 'nope' is not in the file"),
    ("request_float_tokens", dict(requests=lambda rs: rs[0].update(num_tokens=5.0)), "'num_tokens' must be an integer"),
    ("request_fg_before_first", dict(requests=lambda rs: rs[0].update(first_token=4, first_generated_token=2)),
     "'first_generated_token' must be an integer in \\[4,"),
    ("request_no_fg", dict(requests=lambda rs: rs[0].pop("first_generated_token")), "missing field 'first_generated_token'"),
    ("request_twice", dict(requests=lambda rs: rs.append(dict(rs[0]))), "appears twice"),
    ("request_shared_tensor", dict(requests=lambda rs: rs.append(dict(rs[0], request="other"))),
     "belongs to an earlier request too"),
    ("tensor_bad_offsets", dict(header_changes={"routed_experts.0": {"dtype": "U8", "shape": [5, 2, 3],
                                                                     "data_offsets": [0, 29]}}), "holds 29 bytes"),
    ("tensor_past_end", dict(header_changes={"routed_experts.0": {"dtype": "U8", "shape": [5, 2, 3],
                                                                  "data_offsets": [8, 38]}}), "extends past the data"),
    ("tensor_float_shape", dict(header_changes={"routed_experts.0": {"dtype": "U8", "shape": [5.0, 2, 3],
                                                                     "data_offsets": [0, 30]}}), "shape must be a list"),
    ("tensor_overlap", dict(header_changes={"extra": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}), "overlaps"),
    ("tensor_not_object", dict(header_changes={"extra": [1, 2]}), "header entry is not an object"),
    ("metadata_not_strings", dict(header_changes={"__metadata__": {"format": 1}}), "must be an object of strings"),
    ("truncated_data", dict(data=b""), "extends past the data section"),
]


@pytest.mark.parametrize("name,edit,message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_read_capture_refuses_what_the_cpp_reader_refuses(tmp_path, name, edit, message):
    path = raw_file(tmp_path / "bad.safetensors", **edit)
    with pytest.raises(ValueError, match=message):
        r3.read_capture(path)
    with pytest.raises(ValueError):  # the C++ reader refuses the same file
        moekit.read_capture_file(path)


def test_read_capture_refuses_out_of_range_and_v1_negative_ids(tmp_path):
    path = raw_file(tmp_path / "c.safetensors", data=bytes([21] * 30))
    with pytest.raises(ValueError, match=r"id 21 outside \[0, 20\) \(and not the sentinel 255\)"):
        r3.read_capture(path)
    ids = np.full(30, -1, np.int16).tobytes()  # version 1 has no sentinel: -1 is not an expert
    v1 = raw_file(tmp_path / "v1.safetensors", data=ids,
                  meta_changes={"format_version": "1", "num_experts": "300", "id_dtype": None, "id_sentinel": None},
                  header_changes={"routed_experts.0": {"dtype": "I16", "shape": [5, 2, 3], "data_offsets": [0, 60]}})
    with pytest.raises(ValueError, match=r"id -1 outside \[0, 300\)$"):
        r3.read_capture(v1)
    with pytest.raises(ValueError):
        moekit.read_capture_file(v1)


@pytest.mark.parametrize("blob", [b"", b"\x01\x00", struct.pack("<Q", 2) + b"[]", struct.pack("<Q", 3) + b"\xff{}",
                                  struct.pack("<Q", 2 ** 63) + b"{}", struct.pack("<Q", 4) + b"null"])
def test_read_capture_refuses_bytes_that_are_no_safetensors(tmp_path, blob):
    (tmp_path / "x").write_bytes(blob)
    with pytest.raises(ValueError):
        r3.read_capture(tmp_path / "x")


def test_write_capture_never_replaces_a_device_node_or_folder(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file, cannot be replaced"):
        r3.write_capture(fifo, capture())
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(ValueError, match="is a directory, not a file"):
        r3.write_capture(tmp_path, capture())
    if os.path.exists("/dev/null"):
        with pytest.raises(ValueError, match="not a regular file"):
            r3.write_capture("/dev/null", capture())
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]  # no temporary file left behind
    link = tmp_path / "link"  # a link to a regular file is replaced as the C++ writer replaces it
    (tmp_path / "target").write_bytes(b"old")
    link.symlink_to(tmp_path / "target")
    r3.write_capture(link, capture())
    assert r3.read_capture(link).requests[0].request == "q"


# ---------------------------------------------------------------- item 7: edge inputs are ValueErrors

def test_from_sglang_with_zero_layers_or_k_is_a_value_error():
    with pytest.raises(ValueError, match="num_model_layers must be an integer >= 1"):
        r3.from_sglang("q", np.zeros(0, np.int32), 0, num_model_layers=0, model_layers=[], top_k=2)
    with pytest.raises(ValueError, match="top_k must be an integer >= 1"):
        r3.from_sglang("q", np.zeros(0, np.int32), 0, num_model_layers=2, model_layers=[0], top_k=0)
    with pytest.raises(ValueError, match="model_layers is empty"):
        r3.from_sglang("q", np.zeros(4, np.int32), 0, num_model_layers=2, model_layers=[], top_k=2)


@pytest.mark.parametrize("text", ["", "AAAA", base64.b64encode(b"\x93NUMPY\x01\x00").decode(), "not base64!",
                                  base64.b64encode(b"\x93NUMPY\x01\x00v\x00{'descr': '<u2', 'fortran_order': False, "
                                                   b"'shape': (4, 2, 3), }" + b" " * 60 + b"\n\x01").decode()])
def test_from_vllm_refuses_truncated_or_foreign_bytes(text):
    with pytest.raises(ValueError, match="routed_experts: not"):
        r3.from_vllm("q", text, [0])


def test_from_vllm_base64_round_trips_u16_ids():
    req = r3.RequestRoutes("q", ids_of(E=300), 0, 2)
    text = r3.to_vllm(req, num_hidden_layers=2, model_layers=[0, 1], num_experts=300, encoding="base64_npy")
    raw = np.load(io.BytesIO(base64.b64decode(text)))
    assert raw.dtype == np.uint16
    back = r3.from_vllm("q", text, [0, 1], num_prompt_tokens=2)
    assert np.array_equal(back.ids, req.ids)


def test_empty_captures_and_requests_are_fine_or_value_errors(tmp_path):
    empty = r3.Capture(20, [0], r3.routing_dict("renormalize", 3), [])
    r3.write_capture(tmp_path / "e.safetensors", empty)
    back = r3.read_capture(tmp_path / "e.safetensors")
    assert back.requests == [] and r3.check(back).ok
    none = r3.RequestRoutes("q", np.zeros((0, 2, 3), np.int16), 0, 0)
    assert r3.to_megatron(none).shape == (0, 2, 3)
    flat, start = r3.to_sglang(none, [0, 1], 2)
    assert flat.shape == (0,) and r3.from_sglang("q", flat, start, 2, [0, 1], 3, 0).num_tokens == 0
    with pytest.raises(ValueError, match="no requests"):
        r3.to_padded_batch([])
    with pytest.raises(ValueError, match="a capture needs >= 1 MoE layer"):
        r3.write_capture(tmp_path / "z.safetensors", r3.Capture(20, [], r3.routing_dict("renormalize", 3), []))
    with pytest.raises(ValueError, match="every request needs ids"):
        r3.check({}, num_experts=20)


def test_from_vllm_refuses_an_npy_header_its_tokenizer_rejects():
    # Found by fuzz/python/fuzz_r3.py: np.load raised tokenize.TokenError on this header.
    text = base64.b64encode(b'\x93NUMPY\x01\x00\x01\x00)\xd7t"')
    with pytest.raises(ValueError, match="not an .npy array"):
        r3.from_vllm("r", text, [0])

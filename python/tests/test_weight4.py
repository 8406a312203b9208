"""4-bit expert weights through the Python package (docs/weights_4bit.md): packed
uint8 weights with their scales, against a torch decoding written here (e2m1 by its
fields, int4 as nibble - 8) and a float64 layer on the decoded weights; bad scales
refused by name."""
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import moekit
from conftest import seed_of, tie_free_logits, torch_ref_route

E, K, H, I, M = 4, 2, 256, 128, 9
GROUP = {"mxfp4": 32, "int4_g32": 32, "int4_g128": 128}


def e2m1(nibble: torch.Tensor) -> torch.Tensor:
    sign = torch.where(nibble >= 8, -1.0, 1.0).double()
    exp, man = (nibble >> 1) & 3, (nibble & 1).double()
    mag = torch.where(exp == 0, 0.5 * man, torch.pow(2.0, exp.double() - 1) * (1 + 0.5 * man))
    return sign * mag


def decode(packed: torch.Tensor, scales: torch.Tensor, scheme: str) -> torch.Tensor:
    """[..., N, K/2] uint8 + [..., N, K/g] scales -> [..., N, K] float64."""
    n = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2).long()  # even column in the low nibble
    v = e2m1(n) if scheme == "mxfp4" else (n - 8).double()
    s = torch.pow(2.0, scales.double() - 127) if scheme == "mxfp4" else scales.double()
    return v * s.repeat_interleave(GROUP[scheme], dim=-1)


def silu_layer_f64(hidden, ids, weights, w13, w2):
    """The float64 silu MoE layer on decoded weights w13 [E, 2I, H], w2 [E, H, I]."""
    inter = w2.shape[2]
    ref = torch.zeros((hidden.shape[0], w2.shape[1]), dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            z = w13[e] @ hidden[t].double()
            g, u = z[:inter], z[inter:]
            ref[t] += weights[t, j].double() * (w2[e] @ (g * torch.sigmoid(g) * u))
    return ref


def random_packed(shape, scheme, gen):
    packed = torch.randint(0, 256, (*shape[:-1], shape[-1] // 2), generator=gen, dtype=torch.uint8)
    groups = (*shape[:-1], shape[-1] // GROUP[scheme])
    if scheme == "mxfp4":
        scales = torch.randint(127 - 7, 127 - 2, groups, generator=gen, dtype=torch.uint8)
    else:
        scales = (torch.rand(groups, generator=gen) * 0.016 + 0.004).bfloat16().float()  # bf16 values, as checkpoints
    return packed, scales


def packed_layer_inputs(scheme, seed):
    """A silu layer's config, packed weights with scales, bf16 hidden and tie-free logits."""
    gen = torch.Generator().manual_seed(seed)
    p13, s13 = random_packed((E, 2 * I, H), scheme, gen)
    p2, s2 = random_packed((E, H, I), scheme, gen)
    hidden = torch.randn((M, H), generator=gen).bfloat16()
    logits = tie_free_logits(M, E, gen)
    cfg = moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="renormalize",
                           max_num_tokens=M, quant=scheme)
    return cfg, p13, s13, p2, s2, hidden, logits


@pytest.mark.parametrize("scheme", ["mxfp4", "int4_g32", "int4_g128"])
def test_weight4_layer_matches_the_decoded_float64_layer(scheme):
    cfg, p13, s13, p2, s2, hidden, logits = packed_layer_inputs(scheme, seed_of("weight4", scheme))
    assert cfg.quant == scheme and cfg.weight_dtype == "u8"
    layer = moekit.MoeLayer(cfg, p13, p2, w13_scale=s13, w2_scale=s2, device="cpu")
    out, ids = layer(hidden, logits, return_ids=True)
    ref_ids, ref_w = torch_ref_route(logits, cfg, None)
    assert torch.equal(ids.long(), ref_ids.long())
    ref = silu_layer_f64(hidden, ref_ids, ref_w, decode(p13, s13, scheme), decode(p2, s2, scheme))
    err = ((out.double() - ref).norm() / ref.norm()).item()
    # The decoded weights are exact in f32 (bf16-valued scales); bf16 output rounding
    # (2^-8) plus fp32 arithmetic (tests/experts/test_cpu_weight4.cpp states the same).
    assert err <= 2 ** -8 + 2e-5, err


def test_weight4_bad_scales_are_refused_by_name():
    gen = torch.Generator().manual_seed(seed_of("weight4 bad"))
    p13, s13 = random_packed((E, 2 * I, H), "mxfp4", gen)
    p2, s2 = random_packed((E, H, I), "mxfp4", gen)
    cfg = moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="renormalize",
                           max_num_tokens=M, quant="mxfp4")
    bad = s2.clone()
    bad.view(-1)[3] = 255
    with pytest.raises(ValueError, match="w2_scale: element 3 is 255, the E8M0 code of NaN"):
        moekit.MoeLayer(cfg, p13, p2, w13_scale=s13, w2_scale=bad, device="cpu")
    with pytest.raises(ValueError, match="w13_scale: expected dtype u8, got f32"):
        moekit.MoeLayer(cfg, p13, p2, w13_scale=s13.float(), w2_scale=s2, device="cpu")
    with pytest.raises(ValueError, match="w13: "):
        moekit.MoeLayer(cfg, torch.zeros((E, 2 * I, H), dtype=torch.uint8), p2, w13_scale=s13, w2_scale=s2,
                        device="cpu")
    with pytest.raises(ValueError, match="intermediate: 48 is not a multiple of mxfp4's group of 32"):
        moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=48, quant="mxfp4")


@pytest.mark.parametrize("scheme", ["mxfp4", "int4_g32", "int4_g128"])
def test_weight4_layer_refuses_activation_scales_it_would_ignore(scheme):
    """4-bit schemes quantize weights only: a static activation scale (fp8 per-tensor's a13/a2_scale)
    would not be applied, so it is refused by name instead of being dropped."""
    cfg, p13, s13, p2, s2, *_ = packed_layer_inputs(scheme, seed_of("weight4 act scale", scheme))
    for name in ("a13_scale", "a2_scale"):
        with pytest.raises(ValueError, match=re.escape(f"{name}: given, but quant {{method={scheme},")):
            moekit.MoeLayer(cfg, p13, p2, w13_scale=s13, w2_scale=s2, device="cpu", **{name: torch.ones(E)})


def test_weight4_layer_says_which_dtype_it_computes_in():
    """A 4-bit layer (a gpt-oss MXFP4 folder whose config says float32 too) computes in bf16: f32
    hidden states are refused with that reason, not only "expected dtype bf16"."""
    cfg, p13, s13, p2, s2, hidden, logits = packed_layer_inputs("mxfp4", seed_of("weight4 dtype"))
    layer = moekit.MoeLayer(cfg, p13, p2, w13_scale=s13, w2_scale=s2, device="cpu")
    with pytest.raises(ValueError, match=re.escape("hidden: expected dtype bf16, got f32 (this layer computes in "
                                                   "bf16: mxfp4 weights take bf16 activations;")):
        layer(hidden.float(), logits)


@pytest.mark.parametrize("scheme", ["mxfp4", "int4_g32"])
def test_weight4_scales_that_take_a_weight_past_f32_are_refused(scheme):
    """Every scale is valid alone (E8M0 254 = 2^127; an int4 3e38), but e2m1 6.0 or
    int4 -8 times it is infinite: the layer and update_weights refuse it by name."""
    cfg, p13, s13, p2, s2, hidden, logits = packed_layer_inputs(scheme, seed_of("weight4 overflow", scheme))
    bad_p2, bad_s2 = p2.clone(), s2.clone()
    bad_p2[0, 0, :GROUP[scheme] // 2] = 0x77 if scheme == "mxfp4" else 0x00  # e2m1 6.0 / int4 -8
    bad_s2[0, 0, 0] = 254 if scheme == "mxfp4" else 3e38
    value, scale = ("6", "2\\^127") if scheme == "mxfp4" else ("-8", "3e\\+38")
    msg = f"w2: a value {value} times its scale w2_scale\\[0, 0, 0\\] = {scale} leaves f32's range"
    with pytest.raises(ValueError, match=msg):
        moekit.MoeLayer(cfg, p13, bad_p2, w13_scale=s13, w2_scale=bad_s2, device="cpu")
    layer = moekit.MoeLayer(cfg, p13, p2, w13_scale=s13, w2_scale=s2, device="cpu")
    with pytest.raises(ValueError, match=msg):
        layer.update_weights(p13, bad_p2, w13_scale=s13, w2_scale=bad_s2)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["mxfp4", "int4_g32", "int4_g128"])
def test_weight4_cuda_layer_matches_the_cpu_layer_and_replays(scheme):
    """The same packed weights on cuda_sm90 (unpacked in registers) and on the cpu
    backend (decoded once to f32): the same ids, outputs within the bound of
    tests/cuda/test_weight4_cuda.cpp (fp32 order plus three bf16 roundings), replay
    bit for bit."""
    cfg, p13, s13, p2, s2, hidden, logits = packed_layer_inputs(scheme, seed_of("weight4 cuda", scheme))
    cpu = moekit.MoeLayer(cfg, p13, p2, w13_scale=s13, w2_scale=s2, device="cpu")
    gpu = moekit.MoeLayer(cfg, p13.cuda(), p2.cuda(), w13_scale=s13.cuda(), w2_scale=s2.cuda(), device="cuda")
    assert gpu.backend == "cuda_sm90"
    out_cpu, ids_cpu = cpu(hidden, logits, return_ids=True)
    out, ids = gpu(hidden.cuda(), logits.cuda(), return_ids=True)
    assert torch.equal(ids.cpu().long(), ids_cpu.long())
    err = ((out.cpu().double() - out_cpu.double()).norm() / out_cpu.double().norm()).item()
    assert err <= 3 * 2 ** -8 + 2.3e-5, err
    assert torch.equal(gpu(hidden.cuda(), logits.cuda(), forced_ids=ids), out)



def test_int4_folder_packed_by_compressed_tensors_matches_the_dequantized_layer(tmp_path):
    """A Qwen3-MoE-shaped folder whose experts compressed-tensors' own packer
    (pack_to_int32) wrote in its pack-quantized format: from_pretrained reads it as
    int4_g32, and the layer equals a float64 evaluation on q * scale computed here from
    the unpacked integers (ids exact; bf16 output rounding plus fp32 arithmetic)."""
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    import json
    from safetensors.torch import save_file
    h, i, e, g = 64, 32, 4, 32
    gen = torch.Generator().manual_seed(seed_of("compressed-tensors int4"))
    config = {"model_type": "qwen3_moe", "num_hidden_layers": 1, "hidden_size": h, "num_experts": e,
              "num_experts_per_tok": 2, "moe_intermediate_size": i, "hidden_act": "silu", "norm_topk_prob": True,
              "quantization_config": {
                  "quant_method": "compressed-tensors", "format": "pack-quantized",
                  "quantization_status": "compressed", "kv_cache_scheme": None,
                  "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp.gate$"],
                  "config_groups": {"group_0": {
                      "targets": ["Linear"], "input_activations": None, "output_activations": None,
                      "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                  "group_size": g, "dynamic": False, "actorder": None, "observer": "minmax",
                                  "observer_kwargs": {}}}}}}
    tensors, values = {}, {}
    for j in range(e):
        for proj, (n, k) in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
            q = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
            scale = (torch.rand((n, k // g), generator=gen) * 0.05 + 0.002).bfloat16()
            base = f"model.layers.0.mlp.experts.{j}.{proj}"
            tensors[base + ".weight_packed"] = helpers.pack_to_int32(q, 4)
            tensors[base + ".weight_scale"] = scale
            tensors[base + ".weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
            values[(j, proj)] = q.double() * scale.double().repeat_interleave(g, dim=1)
    router = torch.randn((e, h), generator=gen).bfloat16()
    tensors["model.layers.0.mlp.gate.weight"] = router
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    layer = moekit.MoeLayer.from_pretrained(tmp_path, layer=0, max_num_tokens=16)
    assert layer.config.quant == "int4_g32" and layer.config.weight_dtype == "u8"
    x = torch.randn((11, h), generator=gen).bfloat16()
    logits = tie_free_logits(11, e, gen)
    out, ids = layer(x, logits, return_ids=True)
    ref_ids, ref_w = torch_ref_route(logits, layer.config, None)
    assert torch.equal(ids.long(), ref_ids.long())
    ref = torch.zeros((11, h), dtype=torch.float64)
    for t in range(11):
        for s in range(2):
            j = int(ref_ids[t, s])
            gate, up = values[(j, "gate_proj")] @ x[t].double(), values[(j, "up_proj")] @ x[t].double()
            ref[t] += ref_w[t, s].double() * (values[(j, "down_proj")] @ (gate * torch.sigmoid(gate) * up))
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err <= 2 ** -8 + 2e-5, err


@settings(max_examples=30, deadline=None)
@given(scheme=st.sampled_from(sorted(GROUP)), groups_h=st.integers(1, 3), groups_i=st.integers(1, 2),
       experts=st.integers(1, 6), tokens=st.integers(1, 7), seed=st.integers(0, 2 ** 31 - 1))
def test_weight4_property_any_shape_matches_the_torch_decoding(scheme, groups_h, groups_i, experts, tokens, seed):
    """Any shape the format allows (H, I multiples of the group), any bytes and scales:
    the layer equals the float64 layer on this file's own decoding of the same bytes."""
    h, i = GROUP[scheme] * groups_h, GROUP[scheme] * groups_i
    k = min(2, experts)
    gen = torch.Generator().manual_seed(seed)
    p13, s13 = random_packed((experts, 2 * i, h), scheme, gen)
    p2, s2 = random_packed((experts, h, i), scheme, gen)
    hidden = torch.randn((tokens, h), generator=gen).float()
    logits = tie_free_logits(tokens, experts, gen)
    cfg = moekit.MoeConfig(num_experts=experts, top_k=k, hidden_size=h, intermediate_size=i, routing="renormalize",
                           max_num_tokens=tokens, quant=scheme, act_dtype="f32")
    out, ids = moekit.MoeLayer(cfg, p13, p2, w13_scale=s13, w2_scale=s2, device="cpu")(hidden, logits,
                                                                                        return_ids=True)
    ref_ids, ref_w = torch_ref_route(logits, cfg, None)
    assert torch.equal(ids.long(), ref_ids.long())
    ref = silu_layer_f64(hidden, ref_ids, ref_w, decode(p13, s13, scheme), decode(p2, s2, scheme))
    # f32 activations: fp32 accumulation over K <= 384 (3 groups of 128) and the activation.
    assert ((out.double() - ref).norm() <= 3e-5 * ref.norm() + 1e-30), (out, ref)

"""The fp8 schemes through the Python package (docs/fp8.md): torch.float8_e4m3fn
weights with float32 scales, against a torch emulation of the same scheme written
here (torch's own e4m3 rounding), and bad scales refused by name."""
import math

import pytest
import torch

import moekit
from conftest import seed_of, tie_free_logits, torch_ref_route

E, K, H, I, M = 4, 2, 256, 160, 12  # I = 160: a partial 128-block
FP8_MAX = 448.0


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3(x / scale) as float32: f32 quotient, saturation, round to nearest even."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def act_scale(amax: torch.Tensor) -> torch.Tensor:
    return amax.clamp_min(1e-10) / FP8_MAX  # f32, as the scheme states


def quantize_weight(w: torch.Tensor, block: bool):
    """One [N, K] matrix: e4m3 bytes and its scale(s) (block: [ceil(N/128), ceil(K/128)])."""
    if not block:
        s = act_scale(w.abs().max()).reshape(1)
        return quantize(w, s), s
    N, Kd = w.shape
    s = torch.empty((math.ceil(N / 128), math.ceil(Kd / 128)))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            s[i, j] = act_scale(w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].abs().max())
    full = s.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :Kd]
    return quantize(w, full), s


def fake_quant_rows(x: torch.Tensor, block: bool, tensor_scale=None) -> torch.Tensor:
    """Activations [R, C] f32 through e4m3, as float64 values."""
    if not block:
        return quantize(x, tensor_scale).double() * tensor_scale.double()
    out = torch.empty(x.shape, dtype=torch.float64)
    for c0 in range(0, x.shape[1], 128):
        g = x[:, c0:c0 + 128]
        s = act_scale(g.abs().amax(dim=1, keepdim=True))
        out[:, c0:c0 + 128] = quantize(g, s).double() * s.double()
    return out


def build(block: bool, gen: torch.Generator):
    w13 = torch.randn((E, 2 * I, H), generator=gen) / math.sqrt(H)
    w2 = torch.randn((E, H, I), generator=gen) / math.sqrt(I)
    q13, q2, s13, s2 = [], [], [], []
    for e in range(E):
        parts = [quantize_weight(w13[e, p * I:(p + 1) * I], block) for p in range(2)]
        q13.append(torch.cat([q for q, _ in parts]))
        s13.append(torch.cat([s for _, s in parts]))  # block: part rows stacked; per tensor: [2]
        q, s = quantize_weight(w2[e], block)
        q2.append(q)
        s2.append(s)
    return torch.stack(q13), torch.stack(q2), torch.stack(s13), torch.stack(s2).reshape(E, *s2[0].shape[:2]) \
        if block else torch.stack(s2).reshape(E)


def dequantize(q: torch.Tensor, s: torch.Tensor, part_rows: int, block: bool) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float64)
    for e in range(q.shape[0]):
        for p in range(q.shape[1] // part_rows):
            rows = q[e, p * part_rows:(p + 1) * part_rows].double()
            if block:
                rb = math.ceil(part_rows / 128)
                sc = s[e, p * rb:(p + 1) * rb].double().repeat_interleave(128, 0)[:part_rows]
                sc = sc.repeat_interleave(128, 1)[:, :q.shape[2]]
            else:
                sc = s[e, p].double() if s.dim() == 2 else s[e].double()
            out[e, p * part_rows:(p + 1) * part_rows] = rows * sc
    return out


def emulate(hidden, ids, weights, q13, s13, q2, s2, block):
    w13 = dequantize(q13, s13, I, block)
    w2 = dequantize(q2, s2, H, block)
    x = hidden.float()
    pairs = [(t, j) for t in range(M) for j in range(K)]
    xs = torch.stack([x[t] for t, _ in pairs])
    xq = fake_quant_rows(xs, block, None if block else act_scale(xs.abs().max()))
    acts = []
    for r, (t, j) in enumerate(pairs):
        z = w13[ids[t, j]] @ xq[r]
        g, u = z[:I], z[I:]
        acts.append((g * torch.sigmoid(g) * u).float())  # the kernel holds activations in f32
    a = torch.stack(acts)
    aq = fake_quant_rows(a, block, None if block else act_scale(a.abs().max()))
    out = torch.zeros((M, H), dtype=torch.float64)
    for r, (t, j) in enumerate(pairs):
        out[t] += weights[t, j].double() * (w2[ids[t, j]] @ aq[r])
    return out


@pytest.mark.parametrize("scheme", ["fp8_block128", "fp8_per_tensor"])
def test_fp8_layer_matches_torch_emulation(scheme):
    block = scheme == "fp8_block128"
    gen = torch.Generator().manual_seed(seed_of("fp8", scheme))
    q13, q2, s13, s2 = build(block, gen)
    hidden = torch.randn((M, H), generator=gen).bfloat16()
    logits = tie_free_logits(M, E, gen)
    cfg = moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="renormalize",
                           max_num_tokens=M, quant=scheme)
    assert cfg.quant == scheme and cfg.weight_dtype == "f8_e4m3" and cfg.act_scale == "dynamic"
    layer = moekit.MoeLayer(cfg, q13, q2, w13_scale=s13, w2_scale=s2, device="cpu")
    out, ids = layer(hidden, logits, return_ids=True)
    ref_ids, ref_w = torch_ref_route(logits, cfg, None)
    assert torch.equal(ids.long(), ref_ids.long())
    ref = emulate(hidden, ref_ids.long(), ref_w, q13, s13, q2, s2, block)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    # bf16 output rounding (2^-8) plus fp32 arithmetic and a rare one-step e4m3 flip at
    # GEMM2's input (tests/experts/test_cpu_fp8.cpp states the same bound).
    assert err <= 2 ** -8 + 2e-5 + 1e-3, err


def test_fp8_bad_scales_are_refused_by_name():
    gen = torch.Generator().manual_seed(seed_of("fp8 bad"))
    q13, q2, s13, s2 = build(True, gen)
    cfg = moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="renormalize",
                           max_num_tokens=M, quant="fp8_block128")
    with pytest.raises(ValueError, match="w13_scale: required tensor is missing"):
        moekit.MoeLayer(cfg, q13, q2, w2_scale=s2, device="cpu")
    bad = s2.clone()
    bad.view(-1)[3] = float("nan")
    with pytest.raises(ValueError, match="w2_scale: element 3 is nan"):
        moekit.MoeLayer(cfg, q13, q2, w13_scale=s13, w2_scale=bad, device="cpu")
    with pytest.raises(ValueError, match="w13_scale: expected dtype f32, got bf16"):
        moekit.MoeLayer(cfg, q13, q2, w13_scale=s13.bfloat16(), w2_scale=s2, device="cpu")
    with pytest.raises(ValueError, match="quant: unknown method 'fp8'"):
        moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, quant="fp8")

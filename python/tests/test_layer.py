"""The layer and route() against the fp64 reference (tests/reference.py), on fresh
seeded inputs, for every routing method; bounds as in docs/testing.md."""
import os

import pytest
import torch

import moekit
from conftest import Case, E, H, I, K, seed_of, tie_free_logits
from reference import METHODS, moe, rel_l2

# CPU layer, bf16: one bf16 rounding of the output (<= 2^-8 relative) plus fp32
# sums of length <= 64 (~4e-6); a wrong expert, row or weight gives O(1).
CPU_BF16_BOUND = 2 ** -8 + 1e-5
# Routing weights: a few fp32 exp/sigmoid and one division per weight (docs/testing.md).
WEIGHT_ATOL, WEIGHT_RTOL = 1e-7, 2e-5


@pytest.mark.parametrize("routing", METHODS)
def test_route_matches_reference(routing):
    case = Case(routing, M=32)
    ids, weights = moekit.route(case.logits, case.config, score_bias=case.bias)
    ref_ids, ref_w = case.reference_route()
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(weights.double(), ref_w, atol=WEIGHT_ATOL, rtol=WEIGHT_RTOL)


@pytest.mark.parametrize("routing", METHODS)
def test_layer_matches_reference(routing):
    case = Case(routing)
    layer = case.layer()
    out, ids = layer(case.hidden, case.logits, return_ids=True)
    ref_ids, ref_w = case.reference_route()
    assert torch.equal(ids, ref_ids), "the layer chose other experts than the spec"
    ref = moe(case.hidden, case.w13, case.w2, ref_ids, ref_w)
    err = rel_l2(out, ref)
    assert err <= CPU_BF16_BOUND, f"normalized error {err:.3g} > {CPU_BF16_BOUND:.3g}"


def test_layer_f32_and_bf16_logits():
    gen = torch.Generator().manual_seed(seed_of("f32"))
    cfg = moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="renormalize",
                           weight_dtype="f32", act_dtype="f32", logits_dtype="bf16", max_num_tokens=16)
    w13 = torch.randn((E, 2 * I, H), generator=gen) * 0.1
    w2 = torch.randn((E, H, I), generator=gen) * 0.1
    hidden = torch.randn((16, H), generator=gen)
    logits = tie_free_logits(16, E, gen).bfloat16()
    layer = moekit.MoeLayer(cfg, w13, w2, device="cpu")
    out, ids = layer(hidden, logits, return_ids=True)
    ref_ids, ref_w = moekit_ref_route(logits.float(), "renormalize")
    assert torch.equal(ids, ref_ids)
    # fp32 throughout: sums of length <= 64 (docs/testing.md: CPU layer f32).
    assert rel_l2(out, moe(hidden, w13, w2, ref_ids, ref_w)) <= 1e-5


def moekit_ref_route(logits, method):
    from reference import route
    return route(logits, method, K)


def test_custom_routing_takes_the_callers_ids_and_weights():
    gen = torch.Generator().manual_seed(seed_of("custom"))
    cfg = moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="custom",
                           max_num_tokens=16)
    case = Case("renormalize", M=8)
    layer = moekit.MoeLayer(cfg, case.w13, case.w2, device="cpu")
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(8)]).int()
    weights = torch.rand((8, K), generator=gen)
    out = layer(case.hidden, None, topk_ids=ids, topk_weights=weights)
    assert layer.kernel == "CpuModular"
    assert rel_l2(out, moe(case.hidden, case.w13, case.w2, ids, weights.double())) <= CPU_BF16_BOUND


def test_layer_reports_its_choice():
    layer = Case("deepseek_v3").layer()
    assert (layer.backend, layer.kernel) == ("cpu", "CpuMonolithic")
    report = layer.selection_report
    assert [r["kernel"] for r in report] == ["CpuMonolithic", "CpuModular"]
    assert report[0]["verdict"] == "chosen" and report[1]["verdict"] == "supported"
    assert set(report[0]) == {"backend", "kernel", "kind", "verdict", "reason"}
    assert moekit.select_backend(Case("renormalize").config, device="cpu")[0]["verdict"] == "chosen"


def test_kernel_options_force_a_path_and_the_layer_says_which():
    """MoeConfig(kernel={...}) forces a GEMM path (here the CPU's f32 BLAS for bf16
    weights); the layer's gemm_plan names it, and both paths compute the layer
    within the CPU bf16 bound. Unknown names and values are ValueErrors."""
    case = Case("renormalize", M=8)
    forced_cfg = moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I,
                                  routing="renormalize", max_num_tokens=16, kernel={"cpu_gemm": "blas"})
    assert forced_cfg.kernel == "cpu_gemm=blas" and "kernel{cpu_gemm=blas}" in repr(forced_cfg)
    forced = moekit.MoeLayer(forced_cfg, case.w13, case.w2, device="cpu")
    assert "blas_f32 (bf16 weights, forced by kernel.cpu_gemm)" in forced.gemm_plan(8)
    assert f"resolved: cpu / {forced.kernel}" in forced.report
    assert f"gemm plan ({forced.kernel}):" in forced.report and "forced by kernel.cpu_gemm" in forced.report
    default = case.layer()
    assert "forced" not in default.gemm_plan(8)
    ref = moe(case.hidden, case.w13, case.w2, *case.reference_route())
    for layer in (forced, default):
        assert rel_l2(layer(case.hidden, case.logits), ref) <= CPU_BF16_BOUND
    with pytest.raises(ValueError, match="kernel option 'cpu_gem': unknown"):
        moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, kernel={"cpu_gem": "blas"})
    with pytest.raises(ValueError, match="'cutlas' is not one of reference, streaming, cutlass"):
        moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, kernel={"sm90_gemm": "cutlas"})


def test_set_num_threads_keeps_the_results():
    """moekit's CPU threads follow torch's on import; any count computes the same bits
    (chunks never change what a row computes), and a bad count is a ValueError."""
    import moekit
    import torch
    assert "MOEKIT_NUM_THREADS" in os.environ or moekit.get_num_threads() == min(max(1, torch.get_num_threads()), 1024)
    cfg = moekit.MoeConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32, max_num_tokens=32)
    gen = torch.Generator().manual_seed(11)
    w13 = (torch.randn(8, 64, 64, generator=gen) / 8).bfloat16()
    w2 = (torch.randn(8, 64, 32, generator=gen) / 6).bfloat16()
    x = torch.randn(32, 64, generator=gen).bfloat16()
    logits = torch.randn(32, 8, generator=gen)
    before = moekit.get_num_threads()
    try:
        outs = []
        for n in (1, 3):
            moekit.set_num_threads(n)
            assert moekit.get_num_threads() == n
            outs.append(moekit.MoeLayer(cfg, w13, w2, device="cpu")(x, logits))
        assert torch.equal(outs[0], outs[1])
        with pytest.raises(ValueError, match=r"num_threads: .*\[1, 1024\]"):
            moekit.set_num_threads(0)
    finally:
        moekit.set_num_threads(before)


def test_cpu_work_runs_on_torchs_openmp_threads_with_the_same_bits():
    """Inside torch, moekit's CPU chunks run on the OpenMP runtime torch loaded (so a layer call
    right after a torch op does not wait behind torch's spinning workers); MOEKIT_THREAD_POOL=own
    keeps moekit's own pool, a bad value is an error at import, and both pools compute the same bits."""
    import subprocess
    import sys
    script = """
import torch, moekit
from moekit import _moekit
cfg = moekit.MoeConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32, max_num_tokens=32)
gen = torch.Generator().manual_seed(5)
w13 = (torch.randn(8, 64, 64, generator=gen) / 8).bfloat16()
w2 = (torch.randn(8, 64, 32, generator=gen) / 6).bfloat16()
x = torch.randn(32, 64, generator=gen).bfloat16()
torch.set_num_threads(2); moekit.set_num_threads(2)
torch.mm(torch.randn(64, 64), torch.randn(64, 64))  # torch's workers are up and spinning
out = moekit.MoeLayer(cfg, w13, w2, device="cpu")(x, torch.randn(32, 8, generator=gen))
print(_moekit.openmp_runtime() or "-")
print(out.float().sum().item(), out.float().abs().sum().item(), out.view(torch.int16).long().sum().item())
"""
    def run(pool):
        env = {k: v for k, v in os.environ.items() if k != "MOEKIT_THREAD_POOL"}
        if pool is not None:
            env["MOEKIT_THREAD_POOL"] = pool
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)

    default, own = run(None), run("own")
    assert default.returncode == 0 and own.returncode == 0, default.stderr + own.stderr
    runtime = default.stdout.splitlines()[0]
    torch_dir = os.path.dirname(torch.__file__)
    assert os.path.basename(runtime).startswith(("libgomp", "libomp", "libiomp")), runtime
    assert runtime.startswith(torch_dir) or not any(
        f.startswith(("libgomp", "libomp", "libiomp")) for f in os.listdir(os.path.join(torch_dir, "lib")))
    assert own.stdout.splitlines()[0] == "-"
    assert default.stdout.splitlines()[1] == own.stdout.splitlines()[1]
    bad = run("threads")
    assert bad.returncode != 0 and "MOEKIT_THREAD_POOL='threads'" in bad.stderr
    with pytest.raises(ValueError, match="not loaded in this process"):
        moekit._moekit.use_openmp_runtime("/nonexistent/libgomp.so.1")


def test_update_weights_in_place_equals_a_layer_made_with_them():
    """update_weights: the same layer object computes what a layer made with the new weights
    computes, bit for bit (deepseek_v3: its selection bias too); a NaN weight is refused by
    name, and the layer then refuses to run, saying why, until an update succeeds."""
    a, b = Case("deepseek_v3", seed_extra=("a",)), Case("deepseek_v3", seed_extra=("b",))
    layer, made_b = a.layer(), b.layer()
    out_a = layer(a.hidden, a.logits)
    out_b = made_b(a.hidden, a.logits)
    assert not torch.equal(out_a, out_b)
    layer.update_weights(b.w13, b.w2, score_bias=b.bias)
    assert torch.equal(layer(a.hidden, a.logits), out_b)
    bad = b.w2.clone()
    bad[3, 2, 1] = float("nan")
    with pytest.raises(ValueError, match="w2"):
        layer.update_weights(b.w13, bad, score_bias=b.bias)
    with pytest.raises(Exception, match="last update_weights failed"):
        layer(a.hidden, a.logits)
    with pytest.raises(TypeError, match="unknown tensor"):
        layer.update_weights(a.w13, a.w2, score_bias=a.bias, w3=a.w2)
    layer.update_weights(a.w13, a.w2, score_bias=a.bias)
    assert torch.equal(layer(a.hidden, a.logits), out_a)

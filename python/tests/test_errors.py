"""Bad input raises ValueError naming the problem (the library's Status message),
before anything is written; never a crash, never silent zeros."""
import subprocess
import sys

import pytest
import torch

import moekit
from conftest import E, H, I, K, small_config


def test_wrong_shape(case, layer):
    with pytest.raises(ValueError, match="hidden: expected shape"):
        layer(case.hidden[:, :-1], case.logits)
    with pytest.raises(ValueError, match="router_logits: expected shape"):
        layer(case.hidden, case.logits[:-1])


def test_wrong_dtype(case, layer):
    with pytest.raises(ValueError, match="hidden: expected dtype bf16, got f32"):
        layer(case.hidden.float(), case.logits)
    with pytest.raises(ValueError, match="router_logits: dtype float64 is not supported"):
        layer(case.hidden, case.logits.double())
    with pytest.raises(ValueError, match="forced_ids: expected dtype i32, got f32"):
        layer(case.hidden, case.logits, forced_ids=torch.zeros((8, K), dtype=torch.float32))


def test_int64_forced_ids_are_checked_before_they_are_narrowed(case, layer):
    """int64 ids (what torch indexes with) replay as their int32 selves; 2**32 + 3 is refused, not expert 3."""
    ids = torch.stack([torch.randperm(E, generator=torch.Generator().manual_seed(r))[:K] for r in range(8)])
    want = layer(case.hidden, case.logits, forced_ids=ids.to(torch.int32))
    assert torch.equal(layer(case.hidden, case.logits, forced_ids=ids), want)
    ids[2, 1] = 2 ** 32 + 3
    with pytest.raises(ValueError, match=f"forced_ids: {2 ** 32 + 3} is not an expert id"):
        layer(case.hidden, case.logits, forced_ids=ids)


def test_non_contiguous(case, layer):
    wide = torch.zeros((8, 2 * H), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="hidden: must be contiguous"):
        layer(wide[:, ::2], case.logits)
    out = torch.zeros((H, 8), dtype=torch.bfloat16).t()
    with pytest.raises(ValueError, match="out: must be contiguous"):
        layer(case.hidden, case.logits, out=out)


def test_too_many_tokens(layer):
    with pytest.raises(ValueError, match="max_num_tokens"):
        layer(torch.zeros((65, H), dtype=torch.bfloat16), torch.zeros((65, E)))


def test_forced_ids_out_of_range_duplicated_or_sentinel(case, layer):
    out = torch.full((8, H), 7.0, dtype=torch.bfloat16)
    ids = torch.arange(K, dtype=torch.int32).repeat(8, 1)
    for bad, what in [(E, "out of range|\\[0, 16\\)"), (-1, "sentinel|-1"), ("dup", "duplicate|repeated")]:
        forced = ids.clone()
        if bad == "dup":
            forced[3, 1] = forced[3, 0]
        else:
            forced[3, 1] = bad
        with pytest.raises(ValueError, match=what):
            layer(case.hidden, case.logits, forced_ids=forced, out=out)
        assert bool((out == 7.0).all()), "a rejected call wrote its output"


def test_nan_logits(case, layer):
    logits = case.logits.clone()
    logits[2, 5] = float("nan")
    with pytest.raises(ValueError, match="(?i)nan|finite"):
        layer(case.hidden, logits)


def test_bad_config():
    with pytest.raises(ValueError, match="routing: unknown routing method 'nope'"):
        moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="nope")
    with pytest.raises(ValueError, match="top_k"):
        moekit.MoeConfig(num_experts=E, top_k=E + 1, hidden_size=H, intermediate_size=I)
    with pytest.raises(ValueError, match="weight_dtype: unknown dtype"):
        moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, weight_dtype="f13")
    with pytest.raises(TypeError):
        moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, not_a_field=1)


def test_bad_weights():
    cfg = small_config("renormalize")
    w13 = torch.zeros((E, 2 * I, H), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="w2"):
        moekit.MoeLayer(cfg, w13, torch.zeros((E, H, I + 1), dtype=torch.bfloat16), device="cpu")
    with pytest.raises(ValueError, match="score_bias"):
        moekit.MoeLayer(small_config("deepseek_v3"), w13, torch.zeros((E, H, I), dtype=torch.bfloat16),
                        score_bias=torch.zeros(E + 1), device="cpu")


def test_unknown_backend_and_device():
    with pytest.raises(ValueError, match="backend 'nope'"):
        moekit.select_backend(small_config("renormalize", backend="nope"), device="cpu")
    with pytest.raises(ValueError, match="device: 'mps' is not supported"):
        moekit.MoeLayer(small_config("renormalize"), torch.zeros((E, 2 * I, H), dtype=torch.bfloat16),
                        torch.zeros((E, H, I), dtype=torch.bfloat16), device="mps")
    with pytest.raises(ValueError, match="device: .*tpu"):  # a string torch itself cannot parse
        moekit.select_backend(small_config("renormalize"), device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer of a machine without a CUDA device")
def test_cuda_layer_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match="no backend of this build runs on a CUDA device"):
        moekit.select_backend(small_config("renormalize"), device="cuda")


def test_requires_grad_is_refused(case, layer):
    h = case.hidden.clone().requires_grad_(True)
    with pytest.raises(ValueError, match="no backward"):
        layer(h, case.logits)
    with torch.no_grad():
        assert layer(h, case.logits).shape == (8, H)


def test_route_errors(case):
    with pytest.raises(ValueError, match="router_logits: 17 experts per row"):
        moekit.route(torch.zeros((4, E + 1)), case.config)
    with pytest.raises(ValueError, match="score_bias"):
        moekit.route(case.logits, small_config("renormalize"), score_bias=torch.zeros(E))


def test_vocabularies_come_from_the_library_and_errors_list_them():
    """Each vocabulary is spelled once, in the library: every name it lists is
    accepted, and an unknown one is refused with the whole list named."""
    from moekit import _moekit
    acts, quants = _moekit.activations(), _moekit.quant_methods()
    assert {"silu", "swiglu_oai", "relu2"} <= set(acts) and {"none", "fp8_block128"} <= set(quants)
    for a in acts:
        moekit.MoeConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=128, activation=a)
    for q in quants:
        moekit.MoeConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=128, quant=q)
    with pytest.raises(ValueError) as e:
        moekit.MoeConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=128, activation="swish")
    assert ", ".join(acts) in str(e.value)
    with pytest.raises(ValueError) as e:
        moekit.MoeConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=128, quant="int4")
    assert ", ".join(quants) in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a usable CUDA device")
def test_cuda_without_a_device_is_moekits_answer():
    cfg = small_config("softmax_topk")
    w13, w2 = torch.zeros(E, 2 * I, H, dtype=torch.bfloat16), torch.zeros(E, H, I, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"device 'cuda': moekit sees no usable CUDA device here \(cpu threads="):
        moekit.MoeLayer(cfg, w13, w2, device="cuda")


@pytest.mark.parametrize("value", ["abc", "0", "-4", "2x", "99999"])
def test_a_bad_moekit_num_threads_is_refused_when_a_cpu_layer_is_made(value):
    """The pool would silently use every hardware thread; the CPU backend refuses instead."""
    import os
    import subprocess
    import sys
    script = ("import torch, moekit\n"
              "cfg = moekit.MoeConfig(num_experts=4, top_k=2, hidden_size=16, intermediate_size=8)\n"
              "try:\n"
              "    moekit.MoeLayer(cfg, torch.zeros(4, 16, 16, dtype=torch.bfloat16),\n"
              "                    torch.zeros(4, 16, 8, dtype=torch.bfloat16), device='cpu')\n"
              "except ValueError as e:\n"
              "    print(e)\n")
    env = dict(os.environ, MOEKIT_NUM_THREADS=value)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"MOEKIT_NUM_THREADS='{value}': must be an integer in [1, 1024]" in r.stdout, r.stdout + r.stderr


_OUT_OF_MEMORY = """
import resource, sys, torch, transformers, moekit
folder = sys.argv[1]
cfg = transformers.Qwen3MoeConfig(vocab_size=32, hidden_size=512, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, moe_intermediate_size=512, intermediate_size=512, num_experts=64,
    num_experts_per_tok=2)
transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)
moekit.MoeLayer.from_pretrained(folder, 0, max_num_tokens=16)  # the thread pool and the allocator's arenas up
size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
# Room to map the 100 MB shard, not to hold its tensors and the layer's copy as well.
resource.setrlimit(resource.RLIMIT_AS, (size + 150 * 2**20, resource.RLIM_INFINITY))
try:
    moekit.MoeLayer.from_pretrained(folder, 0)
except MemoryError as e:
    print(e)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
def test_a_layer_too_big_for_memory_says_its_size(tmp_path):
    """from_pretrained's MemoryError named no size (std::bad_alloc's message); now it names the layer
    and the bytes of its tensors."""
    pytest.importorskip("transformers")
    run = subprocess.run([sys.executable, "-c", _OUT_OF_MEMORY, str(tmp_path / "m")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    message = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert message.startswith(f"layer 0 of {tmp_path / 'm'}: its tensors are 100728832 bytes in the shards"), message

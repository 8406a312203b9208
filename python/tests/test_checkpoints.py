"""`moekit layer --model DIR` against transformers' own MoE blocks: small seeded
models of each family, saved by save_pretrained (the names real checkpoints
carry), loaded by moekit from the folder and run on the CPU backend.

Bounds (‖out − ref‖/‖ref‖): f32 1e-5 (both sides compute in fp32; they differ
only in summation order, ~1e-7 here); bf16 1e-2 (transformers rounds its
intermediates to bf16 at several places moekit keeps in fp32: ~5e-3 here). Expert
ids compare exactly as sets per token (transformers' DeepSeek-V3 router does not
sort them); with f32 weights moekit computes the router logits itself, with bf16
it is given transformers' own (bf16 logits rounded differently could reorder
near-ties, which is not what this test is about).
"""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import seed_of  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
LAYER = 1
H = 64


def _cli():
    candidates = [os.environ.get("MOEKIT_CLI", "")]
    candidates += [str(REPO / d / "moekit") for d in (os.environ.get("MOEKIT_BUILD_DIR", "build"), "build-cpu")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    pytest.skip("no moekit command line binary (set MOEKIT_CLI or build into build/)")


COMMON = dict(vocab_size=32, hidden_size=H, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64)

# family -> (config class, model class, config fields, router attribute)
FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(intermediate_size=48, num_local_experts=8, num_experts_per_tok=2), "gate"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(intermediate_size=96, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=3,
                       head_dim=16, norm_topk_prob=True), "gate"),
    "qwen3_moe_no_norm": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                          dict(intermediate_size=96, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=3,
                               head_dim=16, norm_topk_prob=False), "gate"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=16, num_experts_per_tok=4,
                         n_shared_experts=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                         first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                         qk_nope_head_dim=8, v_head_dim=16), "gate"),
    "deepseek_v3_no_norm": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                            dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=16,
                                 num_experts_per_tok=4, n_shared_experts=1, n_group=4, topk_group=2,
                                 routed_scaling_factor=1.5, norm_topk_prob=False, first_k_dense_replace=1,
                                 q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                 v_head_dim=16), "gate"),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=16, num_experts_per_tok=4,
                      n_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=1.8,
                      first_k_dense_replace=1, head_dim=16), "gate"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(intermediate_size=48, num_local_experts=8, num_experts_per_tok=2, head_dim=16,
                     layer_types=["full_attention"] * 2), "router"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                       num_experts=8, num_experts_per_tok=2), "gate"),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
BOUND = {"f32": 1e-5, "bf16": 1e-2}


def build(family, dtype_name, folder):
    """A seeded 2-layer model of `family` saved to `folder`; returns its layer-1 MoE block."""
    cfg_name, model_name, fields, _ = FAMILIES[family]
    gen = torch.Generator().manual_seed(seed_of(family, dtype_name))
    torch.manual_seed(seed_of(family, dtype_name))
    cfg = getattr(transformers, cfg_name)(**COMMON, **fields)
    model = getattr(transformers, model_name)(cfg).eval()
    block = model.model.layers[LAYER].mlp
    with torch.no_grad():
        # Weights of O(1) effect (the library's init is ~0.02), biases nonzero.
        for name, p in list(block.named_parameters()) + list(block.named_buffers()):
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            if name.endswith("gate_up_proj") and family == "gpt_oss":
                fan_in = p.shape[1]  # stored [E, H, 2I]
            p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    model = model.to(DTYPES[dtype_name])
    # Small shards: the index file and more than one shard are exercised.
    model.save_pretrained(folder, max_shard_size="64KB")
    return model.model.layers[LAYER].mlp


def reference(family, block, x):
    """transformers' block output [M, H] and its selected ids [M, k] for hidden x [M, H]."""
    router = getattr(block, FAMILIES[family][3])
    with torch.no_grad():
        logits, _, ids = router(x)
        out = block(x[None])
    if isinstance(out, tuple):  # gpt-oss also returns its router scores
        out = out[0]
    return out[0], ids, logits


def run_moekit(folder, tmp, x, logits=None, extra=()):
    paths = {k: str(tmp / f"{k}.npy") for k in ("hidden", "out", "ids", "logits")}
    np.save(paths["hidden"], x.float().numpy())
    cmd = [_cli(), "layer", "--model", str(folder), "--layer", str(LAYER), "--hidden", paths["hidden"],
           "--out", paths["out"], "--capture", paths["ids"], "--backend", "cpu", *extra]
    if logits is not None:
        np.save(paths["logits"], logits.float().numpy())
        cmd += ["--logits", paths["logits"]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return torch.from_numpy(np.load(paths["out"])), torch.from_numpy(np.load(paths["ids"])), r.stdout


class Built:
    """One saved model, its transformers block and a reference run on fresh hidden states."""

    def __init__(self, family, dtype_name, folder):
        self.family, self.dtype_name, self.folder = family, dtype_name, folder
        block = build(family, dtype_name, folder)
        gen = torch.Generator().manual_seed(seed_of(family, dtype_name, "x"))
        self.x = torch.randn((24, H), generator=gen).to(DTYPES[dtype_name])
        self.ref, self.ref_ids, self.ref_logits = reference(family, block, self.x)
        # bf16: transformers' own logits (see the module docstring); f32: moekit's.
        self.logits = self.ref_logits if dtype_name == "bf16" else None

    def check(self, out, ids):
        assert torch.equal(ids.long().sort(dim=1).values, self.ref_ids.long().sort(dim=1).values), (ids, self.ref_ids)
        ref = self.ref.double()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err <= BOUND[self.dtype_name], f"{self.family} {self.dtype_name}: normalized error {err:.3e}"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cache = {}

    def get(family, dtype_name):
        if (family, dtype_name) not in cache:
            cache[family, dtype_name] = Built(family, dtype_name, tmp_path_factory.mktemp(f"{family}_{dtype_name}"))
        return cache[family, dtype_name]
    return get


PARAMS = [(f, d) for f in FAMILIES for d in DTYPES]


@pytest.mark.parametrize("family,dtype_name", PARAMS)
def test_command_line_matches_transformers(models, family, dtype_name, tmp_path):
    m = models(family, dtype_name)
    assert (m.folder / "model.safetensors.index.json").exists()
    out, ids, report = run_moekit(m.folder, tmp_path, m.x, logits=m.logits)
    assert f"layer {LAYER} of 2" in report, report
    m.check(out, ids)


@pytest.mark.parametrize("family,dtype_name", PARAMS)
def test_from_pretrained_matches_transformers(models, family, dtype_name):
    import moekit
    m = models(family, dtype_name)
    layer = moekit.MoeLayer.from_pretrained(m.folder, layer=LAYER, device="cpu", max_num_tokens=64)
    assert layer.config.num_experts == m.ref_logits.shape[1]
    out, ids = layer(m.x, None if m.logits is None else m.logits.float(), return_ids=True)
    m.check(out, ids)


def _fp8_copy(folder, to):
    """`folder`'s model with its routed experts in F8_E4M3, block-128 scales, as
    DeepSeek-V3 ships fp8 (per-expert weight_scale_inv, quantization_config);
    quantized here independently of moekit: one 128x128 block per matrix (H, I
    <= 128), scale = amax / 448, values rounded by torch's own e4m3 cast."""
    from safetensors.torch import load_file, save_file
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(folder / shard)))
    out = {}
    for name, t in tensors.items():
        if ".experts." in name and name.endswith("_proj.weight") and "shared" not in name:
            scale = t.float().abs().amax().clamp(min=1e-30) / 448.0
            out[name] = (t.float() / scale).to(torch.float8_e4m3fn)
            out[name[:-len("weight")] + "weight_scale_inv"] = scale.reshape(1, 1)
        else:
            out[name] = t.contiguous()
    to.mkdir()
    save_file(out, str(to / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    (to / "config.json").write_text(json.dumps(config))
    return to


def test_fp8_folder_loads_in_python_and_on_the_command_line(models, tmp_path):
    """An fp8 model folder reaches from_pretrained and `moekit layer --model`
    through the same reader: the same fp8 layer, bit for bit; ids exact (the
    router stays f32); output within fp8's rounding of the f32 reference:
    e4m3 keeps 3 mantissa bits (relative error <= 2^-4 per weight and per
    activation, ~3.6% rms), through two GEMMs: 0.1 normalized."""
    import moekit
    m = models("qwen3_moe", "f32")
    folder = _fp8_copy(m.folder, tmp_path / "fp8")
    layer = moekit.MoeLayer.from_pretrained(folder, layer=LAYER, device="cpu", max_num_tokens=64)
    assert (layer.config.quant, layer.config.weight_dtype, layer.config.act_dtype) == ("fp8_block128", "f8_e4m3",
                                                                                        "bf16")
    out, ids = layer(m.x.to(torch.bfloat16), return_ids=True)
    assert torch.equal(ids.long().sort(dim=1).values, m.ref_ids.long().sort(dim=1).values)
    err = ((out.double() - m.ref.double()).norm() / m.ref.double().norm()).item()
    print(f"fp8 folder: normalized error {err:.3e}")
    assert 1e-4 < err <= 0.1, err  # above f32's noise: the experts really ran in fp8
    cli_out, cli_ids, report = run_moekit(folder, tmp_path, m.x)
    assert "fp8_block128" in report, report
    assert torch.equal(cli_ids, ids.to(cli_ids.dtype))
    assert torch.equal(cli_out.float(), out.float())


@pytest.fixture(scope="module")
def deepseek_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepseek")
    build("deepseek_v3", "f32", folder)
    return folder


def _error(args):
    r = subprocess.run([_cli(), "layer", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    return r.stdout + r.stderr


@pytest.mark.parametrize("case,args,message", [
    ("dense layer", ["--layer", "0"], "layer 0 is a dense (non-MoE) layer: first_k_dense_replace = 1"),
    ("past the last", ["--layer", "2"], "the model has 2 layers"),
    ("routing flag", ["--layer", "1", "--top-k", "2"], "--top-k: with --model the layer is described by"),
])
def test_model_errors_name_the_problem(deepseek_folder, tmp_path, case, args, message):
    hidden = str(tmp_path / "h.npy")
    np.save(hidden, np.zeros((2, H), np.float32))
    out = _error(["--model", str(deepseek_folder), "--hidden", hidden, "--out", str(tmp_path / "o.npy"), *args])
    assert message in out, out
    assert not (tmp_path / "o.npy").exists()


def test_folder_without_config(tmp_path):
    hidden = str(tmp_path / "h.npy")
    np.save(hidden, np.zeros((2, H), np.float32))
    out = _error(["--model", str(tmp_path), "--layer", "0", "--hidden", hidden, "--out", str(tmp_path / "o.npy")])
    assert "no config.json" in out, out


@pytest.mark.gpu
@pytest.mark.parametrize("family", list(FAMILIES))
def test_from_pretrained_on_the_gpu_matches_transformers(models, family):
    """The same bf16 folders through the cuda_sm90 backend (biases, shared experts, gate on the GPU)."""
    import moekit
    m = models(family, "bf16")
    layer = moekit.MoeLayer.from_pretrained(m.folder, layer=LAYER, device="cuda", max_num_tokens=64)
    assert layer.backend == "cuda_sm90", layer.backend
    out, ids = layer(m.x.cuda(), m.logits.float().cuda(), return_ids=True)
    m.check(out.cpu(), ids.cpu())


def test_from_pretrained_errors_are_value_errors(deepseek_folder, tmp_path):
    import moekit
    with pytest.raises(ValueError, match=r"layer 0 is a dense \(non-MoE\) layer"):
        moekit.MoeLayer.from_pretrained(deepseek_folder, layer=0)
    with pytest.raises(ValueError, match="no config.json"):
        moekit.MoeLayer.from_pretrained(tmp_path, layer=0)


def test_backends_of_a_model_folder_layer(models):
    """`moekit backends --model DIR --layer N`: the oracle's report for the layer the
    folder describes (its summary first); flags that describe a layer are refused."""
    m = models("deepseek_v3", "bf16")
    r = subprocess.run([_cli(), "backends", "--model", str(m.folder), "--layer", str(LAYER), "--cpu-only",
                        "--capture"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "deepseek_v3, layer 1 of 2" in r.stdout and "routing={method=deepseek_v3" in r.stdout, r.stdout
    assert "shared:   one shared expert" in r.stdout and "chosen" in r.stdout, r.stdout
    bad = subprocess.run([_cli(), "backends", "--model", str(m.folder), "--layer", str(LAYER), "--top-k", "2"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--top-k: with --model the layer is described by" in bad.stderr, bad.stderr


def test_mxfp4_gpt_oss_folder_equals_transformers_dequantization(tmp_path):
    """A gpt-oss folder with MXFP4 experts (blocks/scales, quantization_config mxfp4)
    loads as the folder whose experts are transformers' own dequantization of the
    same bytes (transformers.integrations.mxfp4.convert_moe_packed_tensors): the
    same layer, bit for bit (MXFP4 values are exact in bf16)."""
    from safetensors.torch import load_file, save_file
    convert = pytest.importorskip("transformers.integrations.mxfp4").convert_moe_packed_tensors
    import moekit
    # MXFP4 needs H and I in multiples of 32 (gpt-oss: 2880 both): I = 64 here.
    cfg_name, model_name, fields, _ = FAMILIES["gpt_oss"]
    torch.manual_seed(seed_of("mxfp4 model"))
    model = getattr(transformers, model_name)(getattr(transformers, cfg_name)(**COMMON, **{**fields,
                                                                                          "intermediate_size": 64}))
    model.to(torch.bfloat16).save_pretrained(tmp_path / "base", max_shard_size="64KB")
    base = tmp_path / "base"
    x = torch.randn((24, H), generator=torch.Generator().manual_seed(seed_of("mxfp4 x"))).to(torch.bfloat16)
    index = json.loads((base / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(base / shard)))
    gen = torch.Generator().manual_seed(seed_of("mxfp4"))
    packed, dequantized = {}, {}
    for name, t in tensors.items():
        for part, rows_dim, k_dim in (("gate_up_proj", 2, 1), ("down_proj", 2, 1)):
            if name.endswith(f"experts.{part}"):
                E, rows, K = t.shape[0], t.shape[rows_dim], t.shape[k_dim]  # stored [E, K, rows]
                blocks = torch.randint(0, 256, (E, rows, K // 32, 16), generator=gen, dtype=torch.uint8)
                scales = torch.randint(122, 130, (E, rows, K // 32), generator=gen, dtype=torch.uint8)
                packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
                dequantized[name] = convert(blocks, scales, dtype=torch.bfloat16)  # [E, K, rows], as transformers loads
    assert len(dequantized) == 2 * 2  # both projections of both layers
    config = json.loads((base / "config.json").read_text())
    folders = {}
    for kind, experts in (("mxfp4", packed), ("bf16", dequantized)):
        out = {n: t for n, t in tensors.items() if n not in dequantized}
        out.update(experts)
        folder = tmp_path / kind
        folder.mkdir()
        save_file({n: t.contiguous() for n, t in out.items()}, str(folder / "model.safetensors"))
        cfg = dict(config)
        if kind == "mxfp4":
            cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
        (folder / "config.json").write_text(json.dumps(cfg))
        folders[kind] = folder
    a = moekit.MoeLayer.from_pretrained(folders["mxfp4"], layer=LAYER, max_num_tokens=64)
    b = moekit.MoeLayer.from_pretrained(folders["bf16"], layer=LAYER, max_num_tokens=64)
    assert "MXFP4" in a.summary, a.summary
    out = a(x)
    assert out.float().abs().sum() > 0 and torch.equal(out, b(x))
    # Kept packed (quant mxfp4): the same weight values, decoded in the kernel's
    # preparation; the same ids, and the output within fp32 accumulation order plus
    # one bf16 rounding of each element (docs/weights_4bit.md).
    c = moekit.MoeLayer.from_pretrained(folders["mxfp4"], layer=LAYER, max_num_tokens=64, keep_packed_weights=True)
    assert c.config.quant == "mxfp4" and c.config.weight_dtype == "u8"
    out_c, ids_c = c(x, return_ids=True)
    _, ids_b = b(x, return_ids=True)
    assert torch.equal(ids_c, ids_b)
    err = ((out_c.double() - out.double()).norm() / out.double().norm()).item()
    assert err <= 2 ** -8 + 2e-5, err
    # The command line keeps them packed too: the same layer, bit for bit.
    import numpy as np
    np.save(tmp_path / "x.npy", x.float().numpy())
    r = subprocess.run([_cli(), "layer", "--model", str(folders["mxfp4"]), "--layer", str(LAYER), "--hidden",
                        str(tmp_path / "x.npy"), "--out", str(tmp_path / "out.npy"), "--keep-packed-weights"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert torch.equal(torch.from_numpy(np.load(tmp_path / "out.npy")), out_c.float())


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "gpt_oss"])
def test_run_serves_every_moe_layer_of_a_folder_and_replays_it(family, tmp_path):
    """`moekit run --model DIR`: every MoE layer of the folder (deepseek_v3's dense first
    layer skipped), each routed by its own checkpoint router (gpt-oss's with its bias);
    the capture replays bit for bit in the run and again through `moekit replay`, and its
    layer map names the folder's layers. Flags that describe a synthetic model are refused."""
    folder = tmp_path / "model"
    build(family, "bf16", folder)
    cap = tmp_path / "cap.safetensors"
    run = subprocess.run([_cli(), "run", "--model", str(folder), "--tokens", "24", "--requests", "2", "--decode", "2",
                          "--backend", "cpu", "--capture", str(cap)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    moe_layers = [1] if family == "deepseek_v3" else [0, 1]
    assert f"(model layers {' '.join(map(str, moe_layers))})" in run.stdout, run.stdout
    assert "outputs matched bit for bit" in run.stdout, run.stdout
    again = subprocess.run([_cli(), "replay", "--captures", str(cap)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"MoE layers of {folder}" in again.stdout and "outputs matched bit for bit" in again.stdout
    stats = subprocess.run([_cli(), "capture", "stats", str(cap)], capture_output=True, text=True, timeout=60)
    assert stats.returncode == 0, stats.stderr
    assert all(f"model layer {l}:" in stats.stdout for l in moe_layers), stats.stdout
    bad = subprocess.run([_cli(), "run", "--model", str(folder), "--experts", "4"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--model excludes --experts" in bad.stderr, bad.stderr
    empty = subprocess.run([_cli(), "run", "--model", ""], capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "--model: the option is empty" in empty.stderr, empty.stderr

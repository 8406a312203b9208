"""moekit.vllm inside the real vLLM (the CPU build of vllm-cpu 0.32; scripts/setup_vllm.sh makes its
venv, .venv-vllm): tiny f32 model folders built here (Qwen3-MoE, Mixtral, DeepSeek-V3 with shared
experts and a dense first layer) served by vLLM with and without the plugin.

Checked: greedy tokens identical (f32: both compute in fp32, differing in summation order only; bf16
can flip a near-tie, so exactness is asked in f32); vLLM's own RoutedExpertsCapturer records the same
ids in the same order from moekit's kernel as from vLLM's; report() names every MoE layer; routes
forced per request in vLLM reproduce the captured ids and tokens; vLLM's ids through moekit.r3 replay
in the transformers model and give its capture-free logits; a weight reload reaches moekit's layers.
Skipped, with the reason, where vLLM is not installed (the main .venv)."""
import gc
import os
import sys

import numpy as np
import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (scripts/setup_vllm.sh makes .venv-vllm)")
transformers = pytest.importorskip("transformers")

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import moekit.vllm  # noqa: E402
from moekit import r3  # noqa: E402

COMMON = dict(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
              max_position_embeddings=256, bos_token_id=2, eos_token_id=1)
FAMILIES = {  # head_dim >= 32 and expert sizes in multiples of 32, as vLLM's CPU kernels need
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(head_dim=32, intermediate_size=128, moe_intermediate_size=64, num_experts=8,
                       num_experts_per_tok=2, norm_topk_prob=True), [0, 1]),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(head_dim=32, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2), [0, 1]),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(intermediate_size=128, moe_intermediate_size=64, n_routed_experts=16, num_experts_per_tok=4,
                         n_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                         first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=512, qk_rope_head_dim=64,
                         qk_nope_head_dim=32, v_head_dim=32,
                         topk_method="noaux_tc", scoring_func="sigmoid", num_key_value_heads=2), [1]),  # as DeepSeek-V3's config.json says
}
PROMPTS = [[3, 4, 5, 6, 7], [9, 10, 11], [20, 21, 22, 23, 24, 25, 26]]
NEW_TOKENS = 6


def num_experts(family):
    fields = FAMILIES[family][2]
    return fields.get("num_experts") or fields.get("num_local_experts") or fields["n_routed_experts"]


def build(family, folder):
    from tokenizers import Tokenizer, models, pre_tokenizers
    cfg_name, model_name, fields, _ = FAMILIES[family]
    torch.manual_seed(sum(map(ord, family)))
    model = getattr(transformers, model_name)(getattr(transformers, cfg_name)(**{**COMMON, **fields})).eval()
    with torch.no_grad():  # weights of O(1) effect, biases nonzero (the library's init is ~0.02)
        for _, p in list(model.named_parameters()) + list(model.named_buffers()):
            if p.is_floating_point():
                p.copy_(torch.randn(p.shape) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 10))
    model.save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1",
                                         bos_token="t2").save_pretrained(folder)
    return model


class Engine:
    """One vLLM LLM in this process, with vLLM's RoutedExpertsCapturer bound as its worker binds it, and each
    request's rows collected from the capturer's per-step snapshots into vLLM's output layout
    ([tokens, num_hidden_layers, k], every token a forward computed)."""

    def __init__(self, folder, plugin: bool, mla: bool = False):
        from vllm import LLM
        from vllm.model_executor.layers.fused_moe.routed_experts_capturer import (RoutedExpertsCapturer,
                                                                                  bind_routed_experts_capturer)
        # The registry the fused-MoE method class is looked up in (vLLM 0.32 has a second, unrelated one).
        from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import CustomOp
        registry = sys.modules[CustomOp.__module__].op_registry_oot
        key = "UnquantizedFusedMoEMethod"
        saved = registry.pop(key, None)
        enabled = os.environ.get("MOEKIT_VLLM")
        os.environ["MOEKIT_VLLM"] = "1" if plugin else "0"  # register() and the installed entry point read it
        try:
            if plugin:
                moekit.vllm.register()  # registers once per process: put the class back when it already had
                if key not in registry and saved is not None:
                    registry[key] = saved
                assert key in registry
            self.report_start = len(moekit.vllm.report())
            # DeepSeek's MLA on CPU: vLLM's reference CPU_MLA backend runs f32 (the AMX one, its default, bf16 only);
            # its kernel is built for a latent of 512 + 64 (kv_lora_rank + qk_rope_head_dim, as DeepSeek-V3 has).
            self.llm = LLM(str(folder), dtype="float32", enforce_eager=True, distributed_executor_backend="uni",
                           max_model_len=128, max_num_seqs=8, seed=0, attention_backend="CPU_MLA" if mla else None)
        finally:
            os.environ["MOEKIT_VLLM"] = enabled or ""
            if saved is not None:
                registry[key] = saved
        self.runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
        self.capturer = RoutedExpertsCapturer(self.runner.scheduler_config.max_num_batched_tokens,
                                              self.runner.vllm_config)
        bind_routed_experts_capturer(self.runner.model, self.capturer)

    def generate(self, params=None):
        from vllm import SamplingParams
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        rows = {}
        forward = GPUModelRunner._model_forward
        capturer = self.capturer

        def collecting(runner, input_ids=None, positions=None, *a, **kw):
            out = forward(runner, input_ids, positions, *a, **kw)
            n = runner.input_batch.num_reqs
            bounds = runner.query_start_loc.np[:n + 1]
            snap = capturer.snapshot_routing_data(int(bounds[-1])).numpy()  # the engine's ids are "<request>-<suffix>"
            for i, req in enumerate(runner.input_batch.req_ids[:n]):
                rows.setdefault(req.rsplit("-", 1)[0], []).append(snap[bounds[i]:bounds[i + 1]].copy())
            return out

        GPUModelRunner._model_forward = collecting
        try:
            params = params or [SamplingParams(max_tokens=NEW_TOKENS, temperature=0)] * len(PROMPTS)
            outs = self.llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        finally:
            GPUModelRunner._model_forward = forward
        return ([list(o.outputs[0].token_ids) for o in outs],
                [np.concatenate(rows[o.request_id]) for o in outs])

    def report(self):
        return moekit.vllm.report()[self.report_start:]

    def close(self):
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel
        del self.llm, self.runner, self.capturer
        gc.collect()
        destroy_model_parallel()
        destroy_distributed_environment()


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request, tmp_path_factory):
    """(family, folder, the transformers model, vLLM's tokens and ids, the plugin engine, its tokens and ids)."""
    family = request.param
    folder = tmp_path_factory.mktemp(family)
    model = build(family, folder)
    mla = family == "deepseek_v3"
    plain = Engine(folder, plugin=False, mla=mla)
    tokens, ids = plain.generate()
    assert plain.report() == []
    plain.close()
    engine = Engine(folder, plugin=True, mla=mla)
    yield family, folder, model, tokens, ids, engine
    engine.close()


def same_routes(family, a, b):
    """Equal ids; in the same order where vLLM's router fixes one. Its grouped top-k (DeepSeek) takes
    torch.topk(sorted=False) unless VLLM_BATCH_INVARIANT, an order torch does not define: each row's set
    there (moekit's order is by selection score)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if family == "deepseek_v3":
        a, b = np.sort(a, -1), np.sort(b, -1)
    return np.array_equal(a, b)


def test_tokens_and_captured_ids_equal_vllms_own(served):
    family, _, _, tokens, ids, engine = served
    got_tokens, got_ids = engine.generate()
    assert got_tokens == tokens
    for a, b in zip(ids, got_ids):
        assert a.dtype == np.uint8 and same_routes(family, a, b)
    moe_layers = FAMILIES[family][3]
    dense = [l for l in range(COMMON["num_hidden_layers"]) if l not in moe_layers]
    assert all((a[:, dense] == 0).all() for a in ids)  # vLLM writes dense layers as zeros


def test_report_names_every_moe_layer(served):
    family, _, _, _, _, engine = served
    report = engine.report()
    block = "block_sparse_moe" if family == "mixtral" else "mlp"  # vLLM's module names
    assert [r["layer"] for r in report] == [f"model.layers.{l}.{block}.experts" for l in FAMILIES[family][3]]
    assert all(r["replaced"] and r["backend"] == "cpu" for r in report), report


def test_routes_forced_in_vllm_reproduce_the_capture(served):
    """Routes through SamplingParams.extra_args (base64 .npy, as they cross processes): the captured
    ids of a forced run equal the forced ones; one request without routes routes live."""
    from vllm import SamplingParams
    family, _, _, tokens, ids, engine = served
    moe_layers = FAMILIES[family][3]
    routes = [r3.to_vllm(r3.from_vllm(str(i), a, moe_layers), COMMON["num_hidden_layers"], moe_layers,
                         num_experts(family), encoding="base64_npy") for i, a in enumerate(ids)]
    params = [SamplingParams(max_tokens=NEW_TOKENS, temperature=0, extra_args={"moekit_routes": r}) for r in routes]
    params[1] = SamplingParams(max_tokens=NEW_TOKENS, temperature=0)
    got_tokens, got_ids = engine.generate(params)
    assert got_tokens == tokens
    assert all(same_routes(family, a, b) for a, b in zip(ids, got_ids))
    assert np.array_equal(ids[0], got_ids[0])  # forced: in the order given


def patched_copy(family, model):
    """A copy of the transformers model with every MoE block on moekit."""
    import copy
    import moekit.transformers as mt
    patched = copy.deepcopy(model)
    assert [p["layer"] for p in mt.patch(patched, strict=True)["patched"]] == FAMILIES[family][3]
    return patched


def vllm_routes(family, ids, tokens):
    import moekit.transformers as mt
    moe_layers = FAMILIES[family][3]
    seqs = [p + t for p, t in zip(PROMPTS, tokens)]
    return seqs, mt.Routes.from_ids({str(i): r3.from_vllm(str(i), a, moe_layers).ids for i, a in enumerate(ids)},
                                    {str(i): s for i, s in enumerate(seqs)}, moe_layers, num_experts(family))


def test_vllms_routes_replay_in_the_patched_transformers_model(served):
    """The rollout's ids (vLLM's arrays, through moekit.r3) forced in the moekit-patched transformers model:
    the ids it runs are vLLM's; its logits are the capture-free forward's bit for bit where the routing
    order is vLLM's own (Qwen3, Mixtral: the same ids in the same order, so the same sums). DeepSeek's
    ids are the same set in another order (same_routes), so its k products are summed in another order:
    f32 rounding, |d| <= 1e-6 relative (k = 4 terms of O(1), a few ulps through two layers).
    Its greedy tokens at the generated positions are the ones vLLM generated under the same routes forced
    (test_routes_forced_in_vllm_reproduce_the_capture), so forced replay in vLLM equals transformers'."""
    import moekit.transformers as mt
    family, _, model, tokens, ids, _ = served
    patched = patched_copy(family, model)
    seqs, routes = vllm_routes(family, ids, tokens)
    for i, seq in enumerate(seqs):
        x = torch.tensor([seq])
        with torch.no_grad(), mt.capture(patched) as ran, mt.replay(patched, routes.select([str(i)])):
            forced = patched(x).logits
        with torch.no_grad():
            plain = patched(x).logits
        routed = routes.ids(i).shape[0]  # every token a forward computed (not the last generated one)
        assert same_routes(family, ran.ids(0)[:routed].numpy(), routes.ids(i).numpy())
        if family == "deepseek_v3":
            assert (forced - plain).norm() <= 1e-6 * plain.norm()
        else:
            assert torch.equal(forced, plain)
        generated = forced[0, len(PROMPTS[i]) - 1:-1].argmax(-1).tolist()
        assert generated == tokens[i]


def test_replay_in_the_patched_model_gives_the_router_a_gradient(served):
    """Training under the rollout's routes: the loss's gradient reaches the router's weight (finite, nonzero)
    and equals the gradient without replay (the same routing: vLLM's ids are the live ones), to f32
    rounding of the forced weights (replay_routing recomputes them from the logits: relative 1e-5)."""
    import moekit.transformers as mt
    from moekit.nn import router_of
    family, _, model, tokens, ids, _ = served
    patched = patched_copy(family, model).train()
    seqs, routes = vllm_routes(family, ids, tokens)
    x = torch.tensor([seqs[0]])
    layer = FAMILIES[family][3][0]
    router = router_of(patched.model.layers[layer].mlp)

    def grad(replaying):
        patched.zero_grad()
        if replaying:
            with mt.replay(patched, routes.select(["0"])):
                patched(x).logits.square().mean().backward()
        else:
            patched(x).logits.square().mean().backward()
        return router.weight.grad.clone()

    forced, plain = grad(True), grad(False)
    assert torch.isfinite(forced).all() and forced.abs().max() > 0
    assert (forced - plain).norm() <= 1e-5 * plain.norm()


def test_a_weight_reload_reaches_moekits_layers(served):
    """vLLM's in-place reload (RL weight sync) with scaled expert weights changes the tokens as vLLM's own
    path does after the same reload; reloading the originals gives the first tokens back."""
    family, folder, model, tokens, _, engine = served
    from safetensors.torch import load_file
    weights = load_file(str(folder / "model.safetensors"))
    scaled = [(n, t * 3 if ".experts." in n else t) for n, t in weights.items()]
    engine.runner.reload_weights(weights_iterator=iter(scaled))
    changed, _ = engine.generate()
    assert changed != tokens
    engine.runner.reload_weights(weights_iterator=iter(weights.items()))
    back, _ = engine.generate()
    assert back == tokens


def test_routes_are_refused_on_model_runner_v2(served):
    """vLLM's Model Runner V2 (the GPU runner behind enable_return_routed_experts) does not apply forced
    routes: a request carrying them is refused as it is added, not run with live routing."""
    from types import SimpleNamespace
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2
    from moekit.vllm import _replay

    def scheduled(extra_args):
        new = SimpleNamespace(req_id="r0", sampling_params=SimpleNamespace(extra_args=extra_args))
        return SimpleNamespace(scheduled_new_reqs=[new])

    assert _replay.check_no_routes(scheduled(None)) is None
    assert _replay.check_no_routes(scheduled({"other": 1})) is None
    with pytest.raises(ValueError, match="r0.*Model Runner V2"):
        RunnerV2.add_requests(None, scheduled({_replay.ROUTES_KEY: "..."}))

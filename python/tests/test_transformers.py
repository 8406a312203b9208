"""moekit.transformers.patch on small seeded models of every family the loader reads:
the patched model computes what the unpatched one computes, keeps its parameters,
state_dict, training path and router-logit outputs, and follows weight updates.

Bounds: f32 logits within 1e-5 relative (both sides compute in fp32 and differ in
summation order only: ~4e-7 here); greedy generation identical token for token in
f32. bf16: the patched model's error against the f32 model within twice the
unpatched bf16 model's own error plus 1e-3 (transformers rounds intermediates to
bf16 where moekit keeps fp32, so moekit is usually closer; measured here).
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import moekit  # noqa: E402
import moekit.transformers as mt  # noqa: E402
from conftest import seed_of  # noqa: E402
from test_checkpoints import COMMON, FAMILIES  # noqa: E402

FAMILY_NAMES = [f for f in FAMILIES if not f.endswith("_no_norm")]


def make_model(family, dtype=torch.float32):
    """A seeded 2-layer model; expert and shared weights of O(1) effect (the library's init is ~0.02)."""
    cfg_name, model_name, fields, _ = FAMILIES[family]
    torch.manual_seed(seed_of(family, "model"))
    model = getattr(transformers, model_name)(getattr(transformers, cfg_name)(**COMMON, **fields)).eval()
    gen = torch.Generator().manual_seed(seed_of(family, "weights"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mlp." in name and p.dim() > 1:
                fan_in = p.shape[1] if (family == "gpt_oss" and name.endswith("gate_up_proj")) else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
    return model.to(dtype)


def input_ids(family, batch=2, seq=12):
    gen = torch.Generator().manual_seed(seed_of(family, "ids"))
    return torch.randint(0, COMMON["vocab_size"], (batch, seq), generator=gen)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_patched_model_matches_and_keeps_its_parameters(family):
    model = make_model(family)
    ids = input_ids(family)
    with torch.no_grad():
        ref = model(ids).logits
    keys = list(model.state_dict().keys())
    params = [(n, p.data_ptr()) for n, p in model.named_parameters()]
    report = mt.patch(model)
    moe_layers = [i for i, layer in enumerate(model.model.layers) if isinstance(layer.mlp, moekit.nn.MoE)]
    assert [r["layer"] for r in report["patched"]] == moe_layers and moe_layers
    assert all(r["backend"] == "cpu" for r in report["patched"]), report
    assert all(r["reason"].startswith("not a sparse-MoE block") for r in report["left"]), report
    assert len(report["patched"]) + len(report["left"]) == len(model.model.layers)
    # The same parameters (the same tensors), under the same names.
    assert list(model.state_dict().keys()) == keys
    assert [(n, p.data_ptr()) for n, p in model.named_parameters()] == params
    # The patched layers share one kernel workspace (they run one at a time), the largest.
    moes = [model.model.layers[i].mlp for i in moe_layers]
    assert len({m.layer._layer.workspace_id for m in moes}) == 1
    with torch.no_grad():
        got = model(ids).logits
    assert rel(got, ref) <= 1e-5, rel(got, ref)
    # Greedy generation of 32 tokens, token for token.
    patched = model.generate(ids[:1], max_new_tokens=32, do_sample=False)
    assert mt.unpatch(model) == len(moe_layers)
    assert not any(isinstance(layer.mlp, moekit.nn.MoE) for layer in model.model.layers)
    plain = model.generate(ids[:1], max_new_tokens=32, do_sample=False)
    assert torch.equal(patched, plain)


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "gpt_oss"])
def test_bf16_within_the_unpatched_models_own_noise(family):
    exact = make_model(family)
    ids = input_ids(family)
    with torch.no_grad():
        ref = exact(ids).logits
    model = make_model(family, torch.bfloat16)
    with torch.no_grad():
        own = rel(model(ids).logits, ref)
        mt.patch(model)
        got = rel(model(ids).logits, ref)
    assert got <= 2 * own + 1e-3, (got, own)


def _loss_and_grads(model, ids):
    model.train()
    out = model(ids, labels=ids, output_router_logits=True)
    aux = getattr(out, "aux_loss", None)  # deepseek_v3, glm4_moe: none (transformers 5.17: no such field)
    (out.loss if aux is None else out.loss + aux).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def test_training_forward_on_the_transformers_path_is_transformers_own():
    """train_path="transformers": a forward that needs gradients runs the block's own
    forward; loss, router-logit outputs (output_router_logits=True, the load-balancing
    loss) and every gradient equal the unpatched model's exactly."""
    family = "qwen3_moe"
    ids = input_ids(family)
    plain, plain_grads = _loss_and_grads(make_model(family), ids)
    model = make_model(family)
    mt.patch(model, train_path="transformers")
    patched, patched_grads = _loss_and_grads(model, ids)
    assert torch.equal(patched.loss, plain.loss) and torch.equal(patched.aux_loss, plain.aux_loss)
    assert all(torch.equal(a, b) for a, b in zip(patched.router_logits, plain.router_logits))
    assert patched_grads.keys() == plain_grads.keys() and any("experts" in n for n in plain_grads)
    assert all(torch.equal(patched_grads[n], plain_grads[n]) for n in plain_grads)


# Gradients of the moekit training path against the unpatched model's (f32). The backward is the
# block's own torch code at moekit's forward values, which differ from transformers' by f32
# summation order (logits within 1e-5, measured ~4e-7); a later layer's backward sees those values,
# so an earlier layer's gradient moves by about as much relatively: measured at most 1.5e-6 over the
# six families (qwen3_moe, a k_norm weight); 1e-5 leaves room for another BLAS's summation order.
GRAD_BOUND = 1e-5


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_training_forward_is_moekits_value_with_the_blocks_gradients(family):
    """train_path="moekit" (the default): the training forward's logits are the
    inference forward's bit for bit (the same moekit layer on the same ids), the router
    logits are the router's own, and every parameter gets the unpatched model's
    gradient within GRAD_BOUND: routers, experts, shared experts and their gates,
    attention and embeddings (through the hidden states' gradient)."""
    ids = input_ids(family)
    plain, plain_grads = _loss_and_grads(make_model(family), ids)
    model = make_model(family)
    mt.patch(model)
    patched, patched_grads = _loss_and_grads(model, ids)
    model.eval()
    with torch.no_grad():
        inference = model(ids).logits
    assert torch.equal(patched.logits, inference)
    assert rel(patched.loss, plain.loss) <= 1e-5
    assert all(rel(a, b) <= 1e-5 for a, b in zip(getattr(patched, "router_logits", None) or (),
                                                        getattr(plain, "router_logits", None) or ()))
    assert patched_grads.keys() == plain_grads.keys()
    assert any("experts" in n for n in plain_grads) and any(n.endswith((".gate.weight", ".router.weight"))
                                                          for n in plain_grads)
    worst = max((rel(patched_grads[n], plain_grads[n]), n) for n in plain_grads)
    assert worst[0] <= GRAD_BOUND, worst


def test_compiled_training_step_equals_eager():
    """torch.compile of a patched model's training step (default mode: graph breaks at
    moekit's training forward, which compares ids on the host): loss and every gradient
    within 1e-5 of the eager step's (inductor's summation order)."""
    family = "qwen3_moe"
    ids = input_ids(family)
    model = make_model(family)
    mt.patch(model)
    eager, eager_grads = _loss_and_grads(model, ids)
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    compiled, compiled_grads = _loss_and_grads(torch.compile(model), ids)
    torch._dynamo.reset()
    compiled_grads = {n.removeprefix("_orig_mod."): g for n, g in compiled_grads.items()}
    assert rel(compiled.loss, eager.loss) <= 1e-5
    assert compiled_grads.keys() == eager_grads.keys()
    worst = max((rel(compiled_grads[n], eager_grads[n]), n) for n in eager_grads)
    assert worst[0] <= 1e-5, worst


def test_training_path_under_gradient_checkpointing():
    """Gradient checkpointing (non-reentrant, as trainers enable it) re-runs each decoder
    layer, moekit's training forward included: loss and every gradient bit for bit those of
    the same patched model without checkpointing."""
    family = "qwen3_moe"
    ids = input_ids(family)
    runs = []
    for checkpointing in (False, True):
        model = make_model(family)
        mt.patch(model)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        runs.append(_loss_and_grads(model, ids))
    (plain, plain_grads), (ckpt, ckpt_grads) = runs
    assert torch.equal(ckpt.loss, plain.loss)
    assert ckpt_grads.keys() == plain_grads.keys()
    assert all(torch.equal(ckpt_grads[n], plain_grads[n]) for n in plain_grads)


@pytest.mark.parametrize("family", ["qwen2_moe", "gpt_oss"])
def test_one_blocks_training_gradient_is_the_blocks_own(family):
    """One block alone, loss linear in its output: the upstream gradient is the same on
    both sides, so hidden, router and expert gradients equal the transformers block's
    (bit for bit for the parameters, each reached by one path; the hidden states' within
    1e-6, a sum of branches in another order)."""
    model = make_model(family)
    block = model.model.layers[1].mlp
    moe = moekit.nn.MoE.from_transformers(block, model.config, 1)
    gen = torch.Generator().manual_seed(seed_of(family, "block"))
    h = torch.randn(2, 7, model.config.hidden_size, generator=gen)
    r = torch.randn(2, 7, model.config.hidden_size, generator=gen)

    def grads(module):
        module.zero_grad()
        x = h.clone().requires_grad_()
        out = module(x)
        out = out[0] if isinstance(out, tuple) else out
        (out * r).sum().backward()
        return out.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}

    want_out, want_dx, want = grads(block)
    got_out, got_dx, got = grads(moe)
    assert rel(got_out, want_out) <= 1e-5
    assert rel(got_dx, want_dx) <= 1e-6
    assert got.keys() == want.keys() and len(want) >= 3
    assert all(torch.equal(got[n], want[n]) for n in want), [n for n in want if not torch.equal(got[n], want[n])]


def test_router_logits_are_recorded_by_the_moekit_path_too():
    family = "mixtral"
    ids = input_ids(family)
    model = make_model(family)
    with torch.no_grad():
        plain = model(ids, output_router_logits=True)
        mt.patch(model)
        patched = model(ids, output_router_logits=True)
    assert len(patched.router_logits) == len(plain.router_logits) == 2
    assert all(rel(a, b) <= 1e-6 for a, b in zip(patched.router_logits, plain.router_logits))
    assert rel(patched.aux_loss, plain.aux_loss) <= 1e-5


def test_weight_updates_reach_moekit_without_a_disk_round_trip():
    """An optimizer step updates the transformers parameters in place; the next
    moekit forward uses them (automatic refit), as an unpatched copy does."""
    family = "qwen2_moe"
    ids = input_ids(family)
    model = make_model(family)
    mt.patch(model)
    moes = [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, moekit.nn.MoE)]
    shared = {m.layer._layer.workspace_id for m in moes}
    natives = [m.layer._layer for m in moes]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    model(ids, labels=ids).loss.backward()
    opt.step()
    model.eval()
    twin = copy.deepcopy(model)  # deepcopy works, and gives an independent patched model
    mt.unpatch(twin)
    with torch.no_grad():
        got, want = model(ids).logits, twin(ids).logits
    assert rel(got, want) <= 1e-5, rel(got, want)
    # The refit layers kept the one workspace the model's layers share.
    assert len(shared) == 1 and {m.layer._layer.workspace_id for m in moes} == shared
    # In place: the same native layers (their buffers, and a CUDA graph over them, stay valid).
    assert all(m.layer._layer is n for m, n in zip(moes, natives))
    # Updated weights, not the old ones.
    fresh = make_model(family)
    with torch.no_grad():
        assert rel(fresh(ids).logits, want) > 1e-3


def test_state_dict_round_trip_and_dtype_change(tmp_path):
    family = "deepseek_v3"
    ids = input_ids(family)
    model = make_model(family)
    mt.patch(model)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    missing = loaded.load_state_dict(model.state_dict(), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    with torch.no_grad():
        assert rel(model(ids).logits, loaded(ids).logits) <= 1e-5
    model.to(torch.bfloat16)  # the prepared copy follows
    moe = model.model.layers[1].mlp
    assert moe.layer.config.act_dtype == "bf16" and moe.layer.config.weight_dtype == "bf16"
    plain16 = copy.deepcopy(loaded).to(torch.bfloat16)
    with torch.no_grad():
        ref = loaded(ids).logits
        own = rel(plain16(ids).logits, ref)  # the whole model in bf16: its own noise
        assert rel(model(ids).logits, ref) <= 2 * own + 1e-3


def test_patch_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="is not a sparse-MoE block moekit runs"):
        moekit.nn.MoE(torch.nn.Linear(4, 4), None, 0)
    with pytest.raises(ValueError, match="no decoder layers"):
        mt.patch(torch.nn.Linear(4, 4))


def test_a_backend_name_moekit_does_not_run_is_refused_once_not_every_block_left():
    """Before: a typo in backend= left every block to transformers, each with the same reason."""
    model = make_model("qwen3_moe")
    with pytest.raises(ValueError, match=r"patch: backend 'cpu_monolitic' is not one moekit runs on cpu here "
                                         r"\(available: cpu; or .auto.\)"):
        mt.patch(model, backend="cpu_monolitic")
    assert not any(isinstance(layer.mlp, moekit.nn.MoE) for layer in model.model.layers)  # nothing half-patched


def test_patched_model_compiles_with_fullgraph():
    """torch.compile(fullgraph=True) of a patched model: no graph break (moekit's layer
    is a registered op), the same logits as the eager patched model (f32, 1e-5)."""
    model = make_model("qwen3_moe")
    ids = input_ids("qwen3_moe")
    mt.patch(model)
    with torch.no_grad():
        eager = model(ids).logits
        assert torch._dynamo.explain(model)(ids).graph_break_count == 0
        compiled = torch.compile(model, fullgraph=True)(ids).logits
    assert rel(compiled, eager) <= 1e-5


def test_patch_leaves_what_moekit_cannot_run_with_the_reason():
    """An f16 model: the loader takes bf16/f32/fp8 weights, so every MoE block stays
    transformers' and the report says why; strict=True raises; bad options raise."""
    model = make_model("qwen3_moe", torch.float16)
    report = mt.patch(model)
    assert report["patched"] == []
    assert [p["layer"] for p in report["left"]] == list(range(model.config.num_hidden_layers))
    assert all("dtype F16" in p["reason"] for p in report["left"]), report
    assert not any(isinstance(layer.mlp, moekit.nn.MoE) for layer in model.model.layers)
    with pytest.raises(ValueError, match="dtype F16"):
        mt.patch(model, strict=True)
    with pytest.raises(ValueError, match="max_num_tokens must be > 0"):
        mt.patch(model, max_num_tokens=0)
    with pytest.raises(TypeError, match="unknown layer option 'batch_invariants'"):
        mt.patch(model, batch_invariants=True)
    with pytest.raises(ValueError, match="train_path must be one of moekit, transformers"):
        mt.patch(model, train_path="torch")


ROLLOUT_PROMPT = 6


def _rollout(family, patched, new_tokens):
    """A seeded model (patched or not) and what capture() recorded while it generated:
    (model, routes, seq, logits): logits [B, new_tokens, V] of each generated token's step."""
    model = make_model(family)
    if patched:
        mt.patch(model)
    prompt = input_ids(family, batch=2, seq=ROLLOUT_PROMPT)
    with torch.no_grad(), mt.capture(model) as routes:
        out = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    return model, routes, out.sequences, torch.stack(out.logits, dim=1)


def _move_routers(model):
    """A training step's worth of change to every router matrix (seeded), in place."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith((".gate.weight", ".router.weight")) and ".layers." in n:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed_of(n))) * p.std())


@pytest.mark.parametrize("patched", [True, False])
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_capture_in_generate_then_replay_in_training(family, patched):
    """Capture during generate, replay in a training forward: the forward's ids equal
    the captured ones exactly (where captured; generate's last token was never
    computed and routes live), its logits equal an un-replayed forward's (f32: the
    same routing) and generation's own at the generated positions (f32 within 1e-5: the
    cached decode sums attention in another order); after a router change the replay
    still forces the captured ids, the training forward's logits equal the replayed
    inference forward's bit for bit, and the router and experts get finite gradients
    (their values against torch: the training-path tests; the weights' gradient:
    gradcheck in f64 below)."""
    model, routes, seq, generated_logits = _rollout(family, patched, new_tokens=5)
    assert routes.num_requests == 2
    captured = routes.batch()
    L = len(routes.model_layers)
    assert captured.shape == (2, seq.shape[1] - 1, L, routes.top_k)  # the last token was never computed
    with mt.capture(model) as again, mt.replay(model, routes), torch.no_grad():
        replayed_logits = model(seq).logits
    ran = again.batch()
    assert torch.equal(ran[:, :captured.shape[1]], captured)
    with torch.no_grad():
        plain_logits = model(seq).logits
    assert rel(replayed_logits, plain_logits) <= 1e-5
    at_generation = replayed_logits[:, ROLLOUT_PROMPT - 1:-1]  # position t's logits chose token t + 1
    assert rel(at_generation, generated_logits) <= 1e-5, rel(at_generation, generated_logits)
    # A changed router (a training step later): live routing moves, a replay does not.
    _move_routers(model)
    with mt.capture(model) as live, torch.no_grad():
        model(seq)
    assert not torch.equal(live.batch()[:, :captured.shape[1]], captured)
    with mt.capture(model) as forced, mt.replay(model, routes), torch.no_grad():
        forced_logits = model(seq).logits
    assert torch.equal(forced.batch()[:, :captured.shape[1]], captured)
    if patched:  # moekit's layer ran the forced experts: as transformers' blocks run them under the same replay
        twin = copy.deepcopy(model)
        mt.unpatch(twin)
        with mt.replay(twin, routes), torch.no_grad():
            assert rel(forced_logits, twin(seq).logits) <= 1e-5

    # Training step under replay: the forward computes what the replayed inference forward
    # computed (bit for bit: the same layers on the same ids), and gradients reach the router
    # through replay_routing.
    model.train()
    with mt.replay(model, routes):
        out = model(seq, labels=seq)
    assert torch.equal(out.logits, forced_logits)
    out.loss.backward()
    router_grads = [p.grad for n, p in model.named_parameters() if n.endswith((".gate.weight", ".router.weight"))
                    and ".layers." in n and p.grad is not None]
    assert len(router_grads) == L and all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in router_grads)
    expert_grads = [p.grad for n, p in model.named_parameters() if "experts." in n]
    assert expert_grads and all(g is not None and torch.isfinite(g).all() for g in expert_grads)


@pytest.mark.parametrize("patched", [True, False])
# deepseek_v3's tiny attention does not compile in transformers itself (sdpa's fake-tensor shapes);
# glm4_moe has its routing method (sigmoid scores, selection bias, groups).
@pytest.mark.parametrize("family", ["qwen3_moe", "glm4_moe", "gpt_oss"])
def test_replay_compiles_with_fullgraph(family, patched):
    """A model under replay compiles with torch.compile(fullgraph=True) (no graph break:
    the forced ids are a tensor the hooks slice, their weights one registered op, no branch
    on values) and computes what the eager replay computes (f32, 1e-5: inductor's
    summation order). With the router changed afterwards, live routing moves and the
    compiled replay still equals the eager one: it forces the captured ids."""
    model, routes, seq, _ = _rollout(family, patched, new_tokens=4)
    _move_routers(model)
    with torch.no_grad():
        if patched:
            for layer in model.model.layers:
                if isinstance(layer.mlp, moekit.nn.MoE):
                    layer.mlp.refit()  # a compiled model does not look at weight versions
        live = model(seq).logits
        with mt.replay(model, routes):
            eager = model(seq).logits
            assert torch._dynamo.explain(model)(seq).graph_break_count == 0
            torch._dynamo.reset()
            compiled = torch.compile(model, fullgraph=True)(seq).logits
    torch._dynamo.reset()
    assert rel(compiled, eager) <= 1e-5, rel(compiled, eager)
    assert rel(live, eager) > 1e-3  # the replay forced other experts than live routing picks now


def test_replay_weights_have_the_torch_gradient_of_the_forced_routing():
    """The replayed weights' gradient w.r.t. the router logits equals a hand-written
    torch evaluation of the same forced routing (renormalize_naive: softmax over E,
    the forced ids' probabilities divided by their sum), checked by gradcheck in f64."""
    from moekit.torch import replay_routing
    family = "qwen3_moe"
    model = make_model(family)
    cfg = mt._blocks(model)[0].config
    gen = torch.Generator().manual_seed(seed_of("replay-grad"))
    logits = torch.randn(5, cfg.num_experts, generator=gen, dtype=torch.float64, requires_grad=True)
    forced = torch.stack([torch.randperm(cfg.num_experts, generator=gen)[:cfg.top_k] for _ in range(5)])

    def by_hand(x):
        p = torch.softmax(x, dim=-1).gather(1, forced)
        return p / p.sum(dim=-1, keepdim=True)

    got = replay_routing(logits, forced, cfg)
    assert torch.allclose(got, by_hand(logits), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: replay_routing(x, forced, cfg), (logits,))


def _example_main():
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "transformers_r3.py"
    spec = importlib.util.spec_from_file_location("transformers_r3", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_example_on_cpu(family, capsys):
    assert _example_main()(["--device", "cpu", "--family", family]) == 0
    out = capsys.readouterr().out
    assert "identical to the unpatched model's" in out and "ran the captured experts: yes" in out, out


@pytest.mark.gpu
def test_example_on_cuda(capsys):
    assert _example_main()(["--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "moekit cuda_sm90/" in out and "ran the captured experts: yes" in out, out


@pytest.mark.gpu
def test_a_cuda_graph_captured_before_a_weight_update_runs_the_new_weights():
    """The RL loop: decode steps captured in a CUDA graph, then an optimizer step on the
    transformers parameters. The refit updates moekit's layers in place, so replaying the
    same graph runs the new weights: bit for bit an eager forward after the step."""
    family = "qwen3_moe"
    model = make_model(family, torch.bfloat16).cuda()
    mt.patch(model)
    moes = [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, moekit.nn.MoE)]
    natives = [m.layer._layer for m in moes]
    x = torch.randn((2, 5, COMMON["hidden_size"]), dtype=torch.bfloat16, device="cuda")
    moe = moes[0]
    with torch.no_grad():
        before = moe(x).clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            moe(x)  # warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe(x)
        for p in moe.parameters():  # an optimizer-like in-place step
            p.mul_(0.5)
        moe.refit()
        graph.replay()
        torch.cuda.synchronize()
        eager = moe(x)
    assert all(m.layer._layer is n for m, n in zip(moes, natives))
    assert not torch.equal(eager, before)
    assert torch.equal(out, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_bf16_training_gradients_on_cuda_within_the_unpatched_models_own_noise(family):
    """bf16 on the GPU, moekit's sm90 layer in the training forward: every parameter's
    gradient against the f32 unpatched model's within twice the bf16 unpatched model's own
    distance to it, plus 1e-2 (the gradients of near-tie rows, which pick other experts in
    bf16 on either side, are O(1) apart; measured on the H200, see the message), and the
    loss within twice the unpatched bf16 loss's own error plus 1e-3."""
    ids = input_ids(family).cuda()
    exact, exact_grads = _loss_and_grads(make_model(family).cuda(), ids)
    plain, plain_grads = _loss_and_grads(make_model(family, torch.bfloat16).cuda(), ids)
    model = make_model(family, torch.bfloat16).cuda()
    report = mt.patch(model)
    assert report["patched"] and all(r["backend"] == "cuda_sm90" for r in report["patched"]), report
    patched, patched_grads = _loss_and_grads(model, ids)
    assert patched_grads.keys() == exact_grads.keys()
    own_loss, got_loss = abs(plain.loss.item() - exact.loss.item()), abs(patched.loss.item() - exact.loss.item())
    assert got_loss <= 2 * own_loss + 1e-3, (got_loss, own_loss)
    errors = {n: (rel(patched_grads[n], exact_grads[n]), rel(plain_grads[n], exact_grads[n])) for n in exact_grads}
    bad = {n: e for n, e in errors.items() if not e[0] <= 2 * e[1] + 1e-2}
    assert not bad, (bad, max(errors.values()))


def test_layer_constructor_takes_what_the_loader_builds():
    """MoeLayer(config, w13, w2, shared_w13=, shared_w2=, shared_gate=) from a live
    Qwen2-MoE block's tensors computes what the loader-built layer computes, bit for
    bit; the config follows the extras given."""
    family = "qwen2_moe"
    model = make_model(family)
    block = model.model.layers[1].mlp
    moe = moekit.nn.MoE(block, model.config, 1)
    loaded = moe.layer
    shared = block.shared_expert
    layer = moekit.MoeLayer(
        moekit.MoeConfig(num_experts=loaded.config.num_experts, top_k=loaded.config.top_k, hidden_size=64,
                         intermediate_size=loaded.config.intermediate_size, routing=loaded.config.routing,
                         weight_dtype="f32", act_dtype="f32"),
        block.experts.gate_up_proj, block.experts.down_proj,
        shared_w13=torch.cat([shared.gate_proj.weight, shared.up_proj.weight]), shared_w2=shared.down_proj.weight,
        shared_gate=block.shared_expert_gate.weight[0])
    assert (layer.config.shared_intermediate_size, layer.config.shared_gate) == (
        loaded.config.shared_intermediate_size, True)
    gen = torch.Generator().manual_seed(seed_of("constructor"))
    x = torch.randn(10, 64, generator=gen)
    logits = block.gate(x)[0].detach()
    assert torch.equal(layer(x, logits), loaded(x, logits))
    with pytest.raises(ValueError, match="given without shared_w2"):
        moekit.MoeLayer(layer.config, block.experts.gate_up_proj, block.experts.down_proj,
                        shared_gate=block.shared_expert_gate.weight[0])

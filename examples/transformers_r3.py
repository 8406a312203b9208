"""moekit inside a transformers model, and routing replay for its training step.

A tiny seeded Qwen3-MoE model (random weights, real code paths): patch it, generate
with capture, then run a training step with the captured experts forced, and print
what matched. On the CPU (f32) by default; --device cuda runs the model in bf16 with
the patched layers on the GPU (greedy tokens are then compared, not required equal).

  python examples/transformers_r3.py [--device cuda] [--family qwen3_moe|mixtral]
"""
import argparse
import sys

import torch
import transformers

import moekit
import moekit.transformers as mt

FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(moe_intermediate_size=48, num_experts=8, num_experts_per_tok=3, head_dim=16)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=8, num_experts_per_tok=2)),
}


def tiny_model(family: str, device: str):
    cfg_name, model_name, fields = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, cfg_name)(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=128, **fields)
    # The GPU backend takes bf16 weights (f32 layers would be left to transformers).
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    return getattr(transformers, model_name)(config).to(device=device, dtype=dtype).eval()


def main(argv=None) -> int:
    with torch.enable_grad():  # the training step needs autograd, whatever the caller switched off
        return run(argv)


def run(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--family", default="qwen3_moe", choices=sorted(FAMILIES))
    args = ap.parse_args(argv)
    model = tiny_model(args.family, args.device)
    prompt = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1)).to(args.device)
    with torch.no_grad():
        plain = model.generate(prompt, max_new_tokens=16, do_sample=False)

    report = mt.patch(model)
    for p in report["patched"]:
        print(f"patched:  layer {p['layer']} {p['block']} -> moekit {p['backend']}/{p['kernel']}")
    for p in report["left"]:
        print(f"left:     layer {p['layer']} {p['block']}: {p['reason']}")

    # Rollout: generate with the patched model, capturing every MoE layer's experts.
    with torch.no_grad(), mt.capture(model) as routes:
        seq = model.generate(prompt, max_new_tokens=16, do_sample=False)
    same_tokens = torch.equal(seq, plain)
    new_tokens = seq.shape[1] - prompt.shape[1]
    agree = int((seq[:, prompt.shape[1]:] == plain[:, prompt.shape[1]:]).sum())
    exact = model.dtype == torch.float32  # bf16 sums in another order may flip a near-tie greedy pick
    print(f"generate: {new_tokens} new tokens per request, "
          + (f"{'identical to' if same_tokens else 'DIFFERENT from'} the unpatched model's" if exact else
             f"{agree} of {seq[:, prompt.shape[1]:].numel()} equal to the unpatched model's (bf16)"))
    captured = routes.batch()  # [requests, tokens, moe_layers, k]
    print(f"capture:  {tuple(captured.shape)} ids (requests, tokens, MoE layers {routes.model_layers}, top-k)")

    # Training step: the same experts forced. The forward's value is moekit's layer on the
    # captured ids; the backward re-runs the blocks' own modules on that routing, so the
    # hidden states, the routers (through replay_routing's weights) and every expert
    # parameter get the gradients of the transformers model under the forced routing.
    model.train()
    with mt.capture(model) as trained, mt.replay(model, routes):
        loss = model(seq, labels=seq).loss
    loss.backward()
    forced = trained.batch()[:, :captured.shape[1]]
    same_ids = torch.equal(forced, captured)
    routers = [p.grad for n, p in model.named_parameters() if n.endswith("gate.weight") and ".layers." in n]
    experts = [p.grad for n, p in model.named_parameters() if "experts." in n]
    grads_ok = all(g is not None and bool(torch.isfinite(g).all()) and float(g.abs().sum()) > 0
                   for g in routers + experts)
    print(f"replay:   training forward ran the captured experts: {'yes' if same_ids else 'NO'}; loss "
          f"{float(loss.detach()):.4f}; router and expert gradients finite and nonzero: {'yes' if grads_ok else 'NO'}")
    mt.unpatch(model)
    return 0 if ((same_tokens or not exact) and same_ids and grads_ok) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Rollout routing replay (R3), the whole loop on a tiny MoE language model:

1. the engine generates for three requests with batch-invariant moekit layers, each step's routed
   expert ids (the kernel's capture target) going into a RoutingStore, on the way: a prefix-cache hit,
   a speculative-decoding step whose drafts are rejected (trim), and a preemption with recompute;
2. the finished routes are written as a capture file, converted to a trainer's padded batch, and
   validated (moekit.r3.check);
3. the trainer runs each sample in one batch (not the engine's batches) through
   moekit.torch.replayed_moe: the moekit layer with the captured experts forced as the value, the
   gradients of the same forced routing in torch (router weights from moekit.torch.replay_routing,
   experts from moekit.torch.forced_experts on the model's expert parameters), so the loss has
   gradients to the router matrices, the expert weights and every layer's input;
4. every MoE layer output of the training forward equals the rollout's for the same token prefix, bit
   for bit.

    .venv/bin/python examples/r3_loop.py [--device cpu|cuda]

Exit 0 when everything holds. (docs/r3.md)
"""
import argparse
import functools
import os
import sys
import tempfile

import torch

import moekit
from moekit import r3

VOCAB, H, E, K, I, LAYERS, BLOCK = 61, 64, 16, 4, 32, 2, 2


def rms_norm(x):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()


def rowwise(f, x):
    """f on each row alone: torch's own ops then cannot depend on the batch either."""
    return torch.cat([f(x[i:i + 1]) for i in range(x.shape[0])]) if x.shape[0] else f(x)


class TinyLM:
    """Embedding, a causal prefix-mean mixer, and LAYERS MoE blocks (model layers 1, 3: 0 and 2 are dense)."""

    def __init__(self, device, batch_invariant=True, seed=7):
        g = torch.Generator().manual_seed(seed)
        self.device = device
        self.embed = torch.randn((VOCAB, H), generator=g).bfloat16().to(device)
        self.head = (torch.randn((VOCAB, H), generator=g) / H ** 0.5).to(device)
        self.cfg = moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I,
                                    routing="deepseek_v3", num_groups=4, topk_groups=2, routed_scaling_factor=2.5,
                                    max_num_tokens=64, batch_invariant=batch_invariant)
        self.routers, self.bias, self.layers, self.experts = [], [], [], []
        for _ in range(LAYERS):
            w13 = (torch.randn((E, 2 * I, H), generator=g) / H ** 0.5).bfloat16()
            w2 = (torch.randn((E, H, I), generator=g) / I ** 0.5).bfloat16()
            bias = (torch.rand(E, generator=g) * 1e-3).to(device)
            self.routers.append(torch.nn.Parameter((torch.randn((E, H), generator=g) / H ** 0.5).to(device)))
            self.bias.append(bias)
            self.layers.append(moekit.MoeLayer(self.cfg, w13, w2, score_bias=bias, device=device))
            # The trainer's copy of the same experts, as parameters: the torch side of replayed_moe.
            p13 = torch.nn.Parameter(w13.float().to(device))
            p2 = torch.nn.Parameter(w2.float().to(device))
            self.experts.append((p13, p2))
        self.model_layers = [1, 3]

    def inputs(self, seq, positions):
        """x of each position p: its token's embedding plus the mean embedding of the tokens before it."""
        rows = []
        for p in positions:
            prev = self.embed[torch.tensor(seq[:p], device=self.device)].float().mean(0) if p else \
                torch.zeros(H, device=self.device)
            rows.append((self.embed[seq[p]].float() + prev).bfloat16())
        return torch.stack(rows)


def rollout_forward(model, seqs, segments, outputs):
    """One engine step: rows (request, positions) of every segment; returns per-row next-token logits and
    the ids of each layer [M, k]. Records each MoE output under its token prefix in `outputs`."""
    x = torch.cat([model.inputs(seqs[r], ps) for r, ps in segments])
    keys = [tuple(seqs[r][:p + 1]) for r, ps in segments for p in ps]
    ids_per_layer = []
    with torch.no_grad():
        for l, layer in enumerate(model.layers):
            h = rowwise(rms_norm, x)
            logits = rowwise(lambda v: v.float() @ model.routers[l].t(), h)
            out, ids = layer(h, logits, return_ids=True)
            for key, row in zip(keys, out):
                prev = outputs.setdefault((key, l), row.clone())
                assert torch.equal(prev.view(torch.int16), row.view(torch.int16)), \
                    f"layer {l}: a recompute of prefix {key} differs from its first computation"
            x = x + out
            ids_per_layer.append(ids)
        next_logits = rowwise(lambda v: rms_norm(v).float() @ model.head.t(), x)
    return next_logits, torch.stack(ids_per_layer, dim=1).cpu().numpy()  # ids [M, L, k]


def engine(model, store):
    """A scripted scheduler: returns each request's tokens and the MoE outputs it computed."""
    prompts = {"a": [3, 14, 15, 9, 26, 5], "b": [3, 14, 15, 9, 2, 6], "c": [27, 18, 28]}
    seqs = {r: list(p) for r, p in prompts.items()}
    outputs = {}
    for r, p in prompts.items():
        store.add_request(r, prompt_len=len(p))
    block_hash = lambda seq, i: tuple(seq[:(i + 1) * BLOCK])  # a prefix cache keys blocks by their prefix

    def step(segments):
        logits, ids = rollout_forward(model, seqs, segments, outputs)
        row = 0
        for r, ps in segments:
            store.append(r, ps[0], ids[row:row + len(ps)])
            row += len(ps)
        return logits

    def decode(requests):
        logits = step([(r, [len(seqs[r]) - 1]) for r in requests])
        for i, r in enumerate(requests):
            seqs[r].append(int(logits[i].argmax()))

    # Step 1: prefill a and c (the last prompt row samples the first token).
    logits = step([("a", list(range(6))), ("c", list(range(3)))])
    seqs["a"].append(int(logits[5].argmax()))
    seqs["c"].append(int(logits[8].argmax()))
    store.publish_blocks("a", [block_hash(seqs["a"], i) for i in range(3)])
    # Step 2: b hits a's first two blocks (tokens 0-3): only tokens 4, 5 run; a and c decode.
    hit = store.hydrate("b", [block_hash(seqs["b"], i) for i in range(2)])
    logits = step([("b", list(range(hit, 6))), ("a", [6]), ("c", [3])])
    seqs["b"].append(int(logits[1].argmax()))
    seqs["a"].append(int(logits[2].argmax()))
    seqs["c"].append(int(logits[3].argmax()))
    # Step 3: c is preempted (its KV cache freed); a verifies two draft tokens, both rejected.
    store.preempt("c")
    p = len(seqs["a"]) - 1
    drafts = [(seqs["a"][-1] + 1) % VOCAB, 0]
    seqs["a"].extend(drafts)
    logits = step([("a", [p, p + 1, p + 2]), ("b", [6])])
    seqs["b"].append(int(logits[3].argmax()))
    greedy = int(logits[0].argmax())
    accepted = 0 if drafts[0] != greedy else 1 + (drafts[1] == int(logits[1].argmax()))
    del seqs["a"][p + 1 + accepted:]
    store.trim("a", p + 1 + accepted)
    seqs["a"].append(greedy if accepted == 0 else int(logits[accepted].argmax()))
    # Step 4: c resumes by recomputing all its tokens (prefill again); a, b decode.
    store.resume("c")
    n = len(seqs["c"])
    logits = step([("c", list(range(n))), ("a", [len(seqs["a"]) - 1]), ("b", [len(seqs["b"]) - 1])])
    seqs["c"].append(int(logits[n - 1].argmax()))
    seqs["a"].append(int(logits[n].argmax()))
    seqs["b"].append(int(logits[n + 1].argmax()))
    assert store.conflicts("c") == 0, "the recompute routed differently (the layers are not batch invariant)"
    for _ in range(2):
        decode(["a", "b", "c"])
    return prompts, seqs, outputs, accepted


def train_forward(model, sample_tokens, ids, rows):
    """One sample in one batch: positions [0, rows) with the captured experts forced; returns the final
    hidden states and each layer's MoE output."""
    x = model.inputs(sample_tokens, range(rows))
    forced = torch.from_numpy(ids[:rows]).to(torch.int32)  # [rows, L, k]
    outs = []
    for l, layer in enumerate(model.layers):
        h = rowwise(rms_norm, x)
        logits = rowwise(lambda v: v.float() @ model.routers[l].t(), h)       # differentiable in the router
        f = forced[:, l].contiguous().to(logits.device)
        w13, w2 = model.experts[l]
        experts = functools.partial(moekit.torch.forced_experts, w13=w13, w2=w2, activation="silu")
        out = moekit.torch.replayed_moe(layer, h, logits, f, experts, score_bias=model.bias[l])
        outs.append(out)
        x = x + out
    return x, outs


def main(argv=None) -> int:
    with torch.enable_grad():  # the trainer part needs autograd, whatever the caller switched off
        return run(argv)


def run(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--capture", default=None, help="capture file to write (default: a temporary file)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    model = TinyLM(device)
    print(f"moekit {model.layers[0].backend}/{model.layers[0].kernel} on {device}, batch_invariant=True; "
          f"{LAYERS} MoE layers (model layers {model.model_layers}), E={E}, k={K}")

    store = r3.RoutingStore(LAYERS, K, block_size=BLOCK, on_conflict="error")
    prompts, seqs, outputs, accepted = engine(model, store)
    print(f"engine: prefix hit of {2 * BLOCK} tokens for b, {2 - accepted} of 2 drafts rejected and trimmed, "
          "c preempted and recomputed with no conflicting rows")
    routes = [store.finish(r) for r in prompts]
    for q in routes:
        assert q.num_tokens == len(seqs[q.request]) - 1  # every fed token, not the last sampled one
    cap = r3.Capture(E, model.model_layers, r3.routing_dict("deepseek_v3", K, 4, 2, 2.5, True), routes,
                     backend=f"{model.layers[0].backend}/{model.layers[0].kernel}")
    path = args.capture or os.path.join(tempfile.mkdtemp(), "r3_loop.safetensors")
    r3.write_capture(path, cap)
    report = r3.check(path, expected_tokens={r: len(s) - 1 for r, s in seqs.items()}, dense_layers=[0, 2])
    report.raise_if_bad()
    print(f"capture {path}: {len(routes)} requests, check: {report}")

    # The trainer: read with NumPy only, convert to a padded batch, train with the experts forced.
    back = r3.read_capture(path)
    batch, lengths = r3.to_padded_batch(back.requests, side="right")
    print(f"trainer batch {list(batch.shape)} [B, S, moe_layers, k], -1 padded, lengths {lengths.tolist()}")
    equal = total = 0
    loss = 0
    for b, q in enumerate(back.requests):
        tokens = seqs[q.request]
        x, outs = train_forward(model, tokens, batch[b], int(lengths[b]))
        for l, out in enumerate(outs):
            for p in range(int(lengths[b])):
                want = outputs[(tuple(tokens[:p + 1]), l)]
                total += 1
                equal += torch.equal(out[p].detach().view(torch.int16), want.view(torch.int16))
        gen = slice(q.first_generated_token - 1, None)  # rows whose next token was generated
        logp = torch.log_softmax(rowwise(lambda v: rms_norm(v).float() @ model.head.t(), x)[gen], -1)
        targets = torch.tensor(tokens[q.first_generated_token:], device=device)
        loss = loss - logp.gather(1, targets[:, None]).sum()
    loss.backward()
    size = lambda t: float(t.grad.abs().sum()) if t.grad is not None else 0.0  # noqa: E731
    grads = [size(rt) for rt in model.routers]
    expert_grads = [size(w) for pair in model.experts for w in pair]
    print(f"training forward: {equal}/{total} MoE layer rows equal to the rollout's bit for bit; "
          f"loss {float(loss.detach()):.4f}; |d loss / d router| per layer {[f'{g:.3e}' for g in grads]}; "
          f"|d loss / d experts| (w13, w2 per layer) {[f'{g:.3e}' for g in expert_grads]}")
    ok = equal == total and all(g > 0 and g == g for g in grads + expert_grads)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

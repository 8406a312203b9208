"""A small MoE decoder in torch, served with moekit: generate a few tokens for
three requests with routed-expert capture on (continuous batching: prefill
chunks and decode tokens share steps), write the capture file, then replay it
in a "training" forward over the same rollout and check that every MoE layer's
output matches the generation's bit for bit.

    .venv/bin/python examples/moe_decoder.py [--device cpu|cuda] [--capture FILE]

It also shows why replay exists: a trainer whose router drifted slightly from the
engine's would send some tokens to other experts; with the capture forced, it
uses exactly the experts the engine used.
"""
import argparse
import os
import sys
import tempfile

import torch

import moekit

VOCAB, H, E, K, I, LAYERS = 97, 64, 16, 4, 32, 2
DRIFT = 0.005  # router weights are ~N(0, 1/H): this is a ~4% drift


class Block(torch.nn.Module):
    """Pre-norm decoder block: single-head causal attention with a KV cache, then the MoE layer."""

    def __init__(self, gen: torch.Generator, device: torch.device):
        super().__init__()
        rnd = lambda *shape: (torch.randn(shape, generator=gen) / shape[-1] ** 0.5)
        self.qkv = rnd(3 * H, H).bfloat16().to(device)
        self.o = rnd(H, H).bfloat16().to(device)
        self.router = rnd(E, H).to(device)  # f32: the logits are f32
        cfg = moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="deepseek_v3",
                               num_groups=4, topk_groups=2, routed_scaling_factor=2.5, max_num_tokens=64)
        bias = (torch.rand(E, generator=gen) * 2 ** -12).to(device)
        self.moe = moekit.MoeLayer(cfg, rnd(E, 2 * I, H).bfloat16(), rnd(E, H, I).bfloat16(), score_bias=bias,
                                   device=device)

    def attention(self, x, segments, cache):
        q, k, v = (x @ self.qkv.t()).split(H, dim=1)
        outs, row = [], 0
        for request, rows in segments:
            past_k, past_v = cache.get(request, (k[:0], v[:0]))
            keys = torch.cat([past_k, k[row:row + rows]])
            vals = torch.cat([past_v, v[row:row + rows]])
            cache[request] = (keys, vals)
            n = keys.shape[0]
            scores = (q[row:row + rows].float() @ keys.float().t()) / H ** 0.5
            # query i (position n - rows + i) sees keys 0 .. n - rows + i
            mask = torch.arange(n, device=x.device)[None, :] > (n - rows + torch.arange(rows, device=x.device))[:, None]
            outs.append((scores.masked_fill(mask, float("-inf")).softmax(-1) @ vals.float()).bfloat16())
            row += rows
        return torch.cat(outs) @ self.o.t()

    def forward(self, x, segments, cache, forced_ids=None, router_drift=None):
        x = x + self.attention(rms_norm(x), segments, cache)
        h = rms_norm(x)
        router = self.router if router_drift is None else self.router + router_drift
        logits = h.float() @ router.t()
        moe_out, ids = self.moe(h, logits, return_ids=True, forced_ids=forced_ids)
        return x + moe_out, moe_out, ids


def rms_norm(x):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()


class TinyMoeLM(torch.nn.Module):
    def __init__(self, device: torch.device, seed: int = 1234):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.embed = torch.randn((VOCAB, H), generator=gen).bfloat16().to(device)
        self.blocks = [Block(gen, device) for _ in range(LAYERS)]
        self.head = (torch.randn((VOCAB, H), generator=gen) / H ** 0.5).bfloat16().to(device)
        # model layers: attention-only layer 0, then the MoE blocks at 1, 2, ...
        self.moe_model = moekit.Model([(b.moe, l + 1) for l, b in enumerate(self.blocks)])

    def step(self, tokens, segments, cache, replayer=None, router_drift=None):
        """One step over the rows of `segments`; returns next-token logits of every row,
        each MoE layer's output and ids."""
        x = self.embed[tokens]
        moe_outs, ids = [], []
        for l, block in enumerate(self.blocks):
            forced = None if replayer is None else replayer.forced_ids(l)
            drift = None if router_drift is None else router_drift[l]
            x, out, i = block(x, segments, cache.setdefault(l, {}), forced, drift)
            moe_outs.append(out)
            ids.append(i)
        return rms_norm(x).float() @ self.head.float().t(), moe_outs, ids


# The engine's schedule: prompts of different lengths; b arrives one step late.
PROMPTS = {"a": [5, 17, 42, 8, 61, 3], "b": [11, 29, 7], "c": [90, 1, 56, 33]}
SCHEDULE = [["a", "c"], ["a", "c", "b"], ["a", "c", "b"], ["a", "c", "b"], ["a", "c", "b"]]


def generate(model, capturer, device):
    """Continuous batching: each step decodes the running requests and prefills new ones."""
    seqs = {r: list(p) for r, p in PROMPTS.items()}
    fed = {r: 0 for r in PROMPTS}  # tokens of each request already run
    cache, steps = {}, []
    for r in PROMPTS:
        capturer.add_request(r)
    for running in SCHEDULE:
        segments = [(r, len(seqs[r]) - fed[r]) for r in running]
        tokens = torch.tensor([t for r in running for t in seqs[r][fed[r]:]], device=device)
        capturer.begin_step(segments)
        logits, moe_outs, _ = model.step(tokens, segments, cache)
        capturer.end_step()
        row = 0
        for r, rows in segments:
            row += rows
            fed[r] = len(seqs[r])
            seqs[r].append(int(logits[row - 1].argmax()))
        steps.append((segments, tokens, [o.clone() for o in moe_outs]))
    return seqs, steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--capture", default=None, help="capture file to write (default: a temporary file)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.set_grad_enabled(False)

    model = TinyMoeLM(device)
    b0 = model.blocks[0].moe
    print(f"moekit: {b0.backend}/{b0.kernel} on {device}; {LAYERS} MoE layers, E={E}, top-{K}, H={H}")

    capturer = moekit.RoutedExpertsCapturer(num_moe_layers=LAYERS, max_num_tokens=64, top_k=K, device=device)
    moekit.bind(model.moe_model, capturer)
    seqs, steps = generate(model, capturer, device)
    for r, s in seqs.items():
        print(f"  request {r}: prompt {PROMPTS[r]} -> generated {s[len(PROMPTS[r]):]}; "
              f"captured ids {tuple(capturer.routed_experts(r).shape)} [tokens, layers, k]")

    path = args.capture or os.path.join(tempfile.mkdtemp(), "moe_decoder_capture.safetensors")
    moekit.write_capture_file(path, capturer.snapshot())
    captures = moekit.read_capture_file(path)
    print(f"capture file {path}: {len(captures.requests)} requests, routing {captures.routing_method}, "
          f"ids {captures.id_space}, order {captures.id_order}")

    # The trainer: the same rollout, experts forced from the capture file.
    replayer = moekit.RoutedExpertsReplayer(captures, model.moe_model)
    cache, equal, total = {}, 0, 0
    for segments, tokens, recorded in steps:
        replayer.begin_step(segments)
        _, moe_outs, _ = model.step(tokens, segments, cache, replayer=replayer)
        for got, want in zip(moe_outs, recorded):
            total += 1
            equal += torch.equal(got.view(torch.int16), want.view(torch.int16))
    print(f"training forward with the capture replayed: {equal}/{total} MoE layer outputs match bit for bit")

    # Why: a router that drifted a little (as a trainer's does) picks other experts for some tokens.
    gen = torch.Generator().manual_seed(7)
    drift = [(torch.randn((E, H), generator=gen) * DRIFT).to(device) for _ in range(LAYERS)]
    cache, moved, rows = {}, 0, 0
    replayer = moekit.RoutedExpertsReplayer(captures, model.moe_model)
    for segments, tokens, _ in steps:
        replayer.begin_step(segments)
        _, _, ids = model.step(tokens, segments, cache, router_drift=drift)
        for l in range(LAYERS):
            forced = replayer.forced_ids(l).to(ids[l].device)
            moved += int((ids[l].sort(dim=1).values != forced.sort(dim=1).values).any(dim=1).sum())
            rows += ids[l].shape[0]
    print(f"without replay, a router drifted by N(0, {DRIFT}^2) per weight would route {moved}/{rows} "
          "token-layers to other experts")
    return 0 if equal == total else 1


if __name__ == "__main__":
    sys.exit(main())

"""Shared fixtures: seeded tie-free inputs and layer factories; `gpu` tests skip
(reported as skipped, with the reason) unless moekit can run on an sm_90 device here."""
import zlib

import pytest
import torch

import moekit


def _gpu_reason():
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        moekit.select_backend(small_config("renormalize"), device="cuda")
    except ValueError as e:
        return f"moekit has no CUDA backend for this device: {e}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))


def seed_of(*params) -> int:
    """A seed derived from the test's parameters (never from the time)."""
    return zlib.crc32(repr(params).encode())


def tie_free_logits(M: int, E: int, gen: torch.Generator) -> torch.Tensor:
    """[M, E] f32 whose values in a row are >= 0.03 apart: the spec's choice is unambiguous."""
    rows = [torch.randperm(E, generator=gen).float() * 0.05 for _ in range(M)]
    x = torch.stack(rows) + torch.rand((M, E), generator=gen) * 0.02
    return (x - x.mean(dim=1, keepdim=True)).float()


E, K, H, I = 16, 4, 64, 32


def small_config(routing: str, **kw) -> moekit.MoeConfig:
    groups = dict(num_groups=4, topk_groups=2, routed_scaling_factor=2.5) if routing == "deepseek_v3" else {}
    kw.setdefault("max_num_tokens", 64)
    return moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing=routing,
                            **groups, **kw)


class Case:
    """Weights and inputs of one layer test (bf16 weights/activations, f32 logits)."""

    def __init__(self, routing: str, M: int = 24, device: str = "cpu", seed_extra=()):
        gen = torch.Generator().manual_seed(seed_of(routing, M, *seed_extra))
        self.routing = routing
        self.w13 = (torch.randn((E, 2 * I, H), generator=gen) * 0.1).bfloat16()
        self.w2 = (torch.randn((E, H, I), generator=gen) * 0.1).bfloat16()
        self.bias = (torch.rand((E,), generator=gen) * 2 ** -12) if routing == "deepseek_v3" else None
        self.hidden = torch.randn((M, H), generator=gen).bfloat16()
        self.logits = tie_free_logits(M, E, gen)
        self.config = small_config(routing)
        if device != "cpu":
            for name in ("w13", "w2", "bias", "hidden", "logits"):
                t = getattr(self, name)
                setattr(self, name, None if t is None else t.to(device))
        self.device = device

    def layer(self, **kw) -> moekit.MoeLayer:
        return moekit.MoeLayer(kw.pop("config", self.config), self.w13, self.w2, score_bias=self.bias,
                               device=self.device)

    def reference_route(self):
        cfg = self.config
        return torch_ref_route(self.logits.cpu(), cfg, None if self.bias is None else self.bias.cpu())


def torch_ref_route(logits, cfg, bias):
    from reference import route
    return route(logits, cfg.routing, cfg.top_k, cfg.num_groups, cfg.topk_groups, cfg.routed_scaling_factor, bias)


# The bad-input tests' layer (test_errors.py, test_bad_input_battery.py): one per module.
@pytest.fixture(scope="module")
def case():
    return Case("renormalize", M=8)


@pytest.fixture(scope="module")
def layer(case):
    return case.layer()


@pytest.fixture(autouse=True)
def _grad_enabled():
    """Every test starts with autograd on: examples run in-process switch it off
    process-wide (torch.set_grad_enabled(False)), and tests of the training path need it."""
    with torch.enable_grad():
        yield

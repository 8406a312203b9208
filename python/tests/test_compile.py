"""torch.compile(fullgraph=True) sees the layer as one registered op with a fake
implementation and declared mutations; the compiled model equals eager bit for bit."""
import torch

import moekit
from conftest import Case


class Block(torch.nn.Module):
    """A residual MoE block: router linear -> moekit layer."""

    def __init__(self, case):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.router = torch.nn.Parameter(torch.randn((16, 64), generator=g) * 0.1, requires_grad=False)
        self.moe = case.layer()

    def forward(self, x):
        logits = x.float() @ self.router.t()
        return x + self.moe(x, logits)


def test_fullgraph_compile_matches_eager():
    case = Case("deepseek_v3", M=12)
    block = Block(case)
    eager = block(case.hidden)
    compiled = torch.compile(block, fullgraph=True)
    assert torch.equal(compiled(case.hidden), eager)
    assert torch.equal(compiled(case.hidden[:5]), block(case.hidden[:5]))


def test_compiled_return_ids_and_out():
    case = Case("renormalize", M=8)
    layer = case.layer()
    ref_out, ref_ids = layer(case.hidden, case.logits, return_ids=True)

    @torch.compile(fullgraph=True)
    def f(h, l, out):
        return layer(h, l, return_ids=True, out=out)

    out = torch.empty_like(ref_out)
    got, ids = f(case.hidden, case.logits, out)
    assert torch.equal(got, ref_out) and torch.equal(ids, ref_ids) and torch.equal(out, ref_out)


def test_opcheck():
    """torch's own checks of a custom op: schema, fake tensor, mutations, dispatch."""
    case = Case("renormalize", M=4)
    layer = case.layer()
    out = torch.empty_like(case.hidden)
    ids = torch.empty((4, 4), dtype=torch.int16)
    torch.library.opcheck(torch.ops.moekit.moe_forward.default,
                          (layer._handle, case.hidden, case.logits, out, ids, None, None, None))

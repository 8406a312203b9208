"""The CUDA backend through torch (marked gpu: skipped, with the reason, without an
sm_90 device): against the fp64 reference, replay, torch's current stream,
torch.compile and CUDA graph capture."""
import pytest
import torch

import moekit
from conftest import Case, K
from reference import METHODS, moe, rel_l2

pytestmark = pytest.mark.gpu

# CUDA layer: bf16 intermediate, expert outputs and final output each rounded
# (~2e-3 rms together); a wrong row, column, expert or weight gives O(1) (docs/testing.md).
CUDA_BOUND = 1e-2


@pytest.mark.parametrize("routing", METHODS)
def test_cuda_layer_matches_reference_and_replays(routing):
    case = Case(routing, M=24, device="cuda")
    layer = case.layer()
    assert layer.backend == "cuda_sm90"
    out, ids = layer(case.hidden, case.logits, return_ids=True)
    ref_ids, ref_w = case.reference_route()
    assert ids.is_cuda and torch.equal(ids.cpu(), ref_ids)
    ref = moe(case.hidden.cpu(), case.w13.cpu(), case.w2.cpu(), ref_ids, ref_w)
    assert rel_l2(out.cpu(), ref) <= CUDA_BOUND
    again = layer(case.hidden, case.logits, forced_ids=ids)
    assert torch.equal(out, again)
    dev_ids, _ = moekit.route(case.logits, case.config, score_bias=case.bias)
    assert torch.equal(dev_ids.cpu(), ref_ids)


def test_runs_on_torchs_current_stream():
    case = Case("deepseek_v3", M=32, device="cuda")
    layer = case.layer()
    expected = layer(case.hidden, case.logits)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        hidden = torch.zeros_like(case.hidden)
        out = torch.empty_like(expected)
        torch.cuda._sleep(50_000_000)  # the side stream is busy for a while ...
        hidden.copy_(case.hidden)      # ... and only then holds the input:
        layer(hidden, case.logits, out=out)  # work enqueued on another stream would read zeros
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    assert torch.equal(out, expected)


def test_cuda_graph_capture_and_replay():
    case = Case("renormalize", M=16, device="cuda")
    layer = case.layer()
    static_h, static_l = case.hidden.clone(), case.logits.clone()
    static_out = torch.empty_like(static_h)
    layer(static_h, static_l, out=static_out)  # warm-up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(static_h, static_l, out=static_out)
    fresh = Case("renormalize", M=16, device="cuda", seed_extra=("fresh",))
    static_h.copy_(fresh.hidden)
    static_l.copy_(fresh.logits)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, layer(fresh.hidden, fresh.logits))


def test_compiled_model_in_a_cuda_graph():
    case = Case("sigmoid", M=8, device="cuda")
    layer = case.layer()

    def f(h, l):
        return h + layer(h, l)

    compiled = torch.compile(f, fullgraph=True, mode="reduce-overhead")
    expected = f(case.hidden, case.logits)
    for _ in range(3):  # reduce-overhead records a CUDA graph after warm-up
        got = compiled(case.hidden, case.logits)
    assert torch.equal(got, expected)


def test_capture_on_the_device():
    case = Case("deepseek_v3", M=12, device="cuda")
    model = moekit.Model([(case.layer(), 0)])
    capturer = moekit.RoutedExpertsCapturer(1, 64, K, device="cuda")
    moekit.bind(model, capturer)
    capturer.add_request("r")
    capturer.begin_step([("r", 12)])
    _, ids = model.layers[0](case.hidden, case.logits, return_ids=True)
    capturer.end_step()
    assert torch.equal(capturer.routed_experts("r")[:, 0].int(), ids.cpu())


def test_device_mismatch_is_a_value_error():
    case = Case("renormalize", M=4, device="cuda")
    layer = case.layer()
    with pytest.raises(ValueError, match="hidden: expected on cuda:0, got cpu"):
        layer(case.hidden.cpu(), case.logits)

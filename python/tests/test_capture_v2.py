"""The capturer's format-v2 facts from Python: prompt boundary, producing backend, end_step_async, and the
capture file read back by the NumPy-only reader; router weights attached by the caller."""
import numpy as np
import torch

import moekit
from moekit import r3
from conftest import Case


def test_capturer_records_v2_facts_and_async_steps(tmp_path):
    case = Case("renormalize", M=8)
    layer = case.layer()
    model = moekit.Model([(layer, 2)])
    cap = moekit.RoutedExpertsCapturer(1, 64, case.config.top_k)
    moekit.bind(model, cap)
    cap.add_request("a", prompt_tokens=5)
    cap.add_request("b")
    outs = []
    for segments, rows in ([("a", 5), ("b", 3)], slice(0, 8)), ([("a", 1), ("b", 1)], slice(0, 2)):
        cap.begin_step(segments)
        _, ids = layer(case.hidden[rows], case.logits[rows], return_ids=True)
        outs.append(ids)
        cap.end_step_async()
    cap.collect()
    a = cap.routed_experts("a")
    assert torch.equal(a[:, 0].int(), torch.cat([outs[0][:5], outs[1][:1]]))
    snap = cap.snapshot()
    assert snap.backend.startswith("cpu/") and snap.find("a").first_generated_token == 5
    assert snap.find("b").first_generated_token == -1
    moekit.write_capture_file(tmp_path / "c.safetensors", snap)
    back = r3.read_capture(tmp_path / "c.safetensors")
    assert back.model_layers == [2] and back.find("a").first_generated_token == 5
    assert np.array_equal(back.find("a").ids, a.numpy())
    # Router weights attached by the caller (here: the kernel's weights for the captured ids).
    _, w = moekit.route(case.logits[:6], case.config, forced_ids=a[:, 0].int().contiguous())
    back.router_weights_dtype = "f32"
    back.find("a").router_weights = w.numpy()[:, None, :]
    back.find("b").router_weights = np.zeros(back.find("b").ids.shape, np.float32)
    r3.write_capture(tmp_path / "w.safetensors", back)
    cs = moekit.read_capture_file(tmp_path / "w.safetensors")
    assert torch.equal(cs.find("a").router_weights[:, 0], w)

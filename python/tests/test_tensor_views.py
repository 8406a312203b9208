"""moekit.nn's tensor views (what MoE.refit hands the loader, read in place): for any
tensors of the dtypes it names, the (name, dtype, shape, bytes) entries give back the
same dtypes, shapes and bits, whatever the element sizes and strides; and a block read
through them builds the same layer as its safetensors image."""
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
safetensors_torch = pytest.importorskip("safetensors.torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from moekit import _moekit  # noqa: E402
from moekit.layer import MoeLayer  # noqa: E402
from moekit.nn import _SAFETENSORS_DTYPES, _tensor_views  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int32, torch.int64, torch.float64]
BY_NAME = {name: dtype for dtype, name in _SAFETENSORS_DTYPES.items()}
PROPS = settings(max_examples=60, deadline=None, derandomize=True, database=None)


@st.composite
def tensor_sets(draw):
    n = draw(st.integers(1, 6))
    out = {}
    for i in range(n):
        dtype = draw(st.sampled_from(DTYPES))
        shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
        gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
        t = torch.randint(0, 250, shape, generator=gen).to(dtype) if dtype in (torch.uint8, torch.int32, torch.int64) \
            else torch.randn(shape, generator=gen).to(dtype)
        if draw(st.booleans()) and t.dim() == 2:
            t = t.t()  # a non-contiguous view: its entry holds it in row-major order
        out[f"model.layers.0.mlp.t{i}"] = t
    return out


@PROPS
@given(tensor_sets())
def test_views_give_back_every_tensor_bit_for_bit(tensors):
    views = _tensor_views(tensors)
    assert [v[0] for v in views] == list(tensors)
    for (name, dtype_name, shape, data), t in zip(views, tensors.values()):
        assert data.dtype == torch.uint8 and data.dim() == 1 and data.is_contiguous(), name
        assert BY_NAME[dtype_name] == t.dtype and shape == list(t.shape), name
        back = data.view(t.dtype).reshape(shape) if data.numel() else torch.empty(shape, dtype=t.dtype)
        assert torch.equal(back.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name
        if t.is_contiguous() and t.numel():
            assert data.data_ptr() == t.data_ptr(), f"{name}: a contiguous CPU tensor is read in place"


def test_a_block_read_through_views_is_the_block_read_from_its_image():
    """The same Qwen3-MoE-like block as views and as safetensors.torch.save's bytes:
    the same layer, bit for bit."""
    import json
    E, H, I, k = 8, 64, 32, 2
    gen = torch.Generator().manual_seed(5)
    prefix = "model.layers.0.mlp."
    tensors = {prefix + "gate.weight": torch.randn(E, H, generator=gen),
               prefix + "experts.gate_up_proj": torch.randn(E, 2 * I, H, generator=gen) / 8,
               prefix + "experts.down_proj": torch.randn(E, H, I, generator=gen) / 8}
    config = json.dumps({"model_type": "qwen3_moe", "hidden_size": H, "moe_intermediate_size": I,
                         "num_experts": E, "num_experts_per_tok": k, "norm_topk_prob": True,
                         "num_hidden_layers": 1, "decoder_sparse_step": 1, "mlp_only_layers": [],
                         "hidden_act": "silu"})
    args = (0, 16, "cpu", 0, "auto", False, True)
    from_views = _moekit.load_checkpoint_layer_in_memory(config, _tensor_views(tensors), *args)
    from_image = _moekit.load_checkpoint_layer_in_memory(config, safetensors_torch.save(tensors), *args)
    x = torch.randn(5, H, generator=gen)
    logits = x @ tensors[prefix + "gate.weight"].t()
    outs = [MoeLayer._of_checkpoint(torch.device("cpu"), loaded)(x, logits) for loaded in (from_views, from_image)]
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(from_views[2], from_image[2])  # the router weight


def test_an_unnamed_dtype_is_a_value_error():
    with pytest.raises(ValueError, match="complex64 has no safetensors name"):
        _tensor_views({"x": torch.zeros(2, dtype=torch.complex64)})

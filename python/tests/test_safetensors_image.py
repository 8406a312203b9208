"""moekit.nn's in-memory safetensors image (what MoE.refit hands the loader): for any
tensors of the dtypes it names, safetensors' own reader gives back the same names,
dtypes, shapes and bits, whatever the order, the element sizes and the strides."""
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
safetensors_torch = pytest.importorskip("safetensors.torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from moekit.nn import _safetensors_image  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int32, torch.int64, torch.float64]
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
            t = t.t()  # a non-contiguous view: the image holds it in row-major order
        out[f"model.layers.0.mlp.t{i}"] = t
    return out


@PROPS
@given(tensor_sets())
def test_image_reads_back_bit_for_bit(tensors):
    image = _safetensors_image(tensors)
    assert image.dtype == torch.uint8 and image.dim() == 1
    back = safetensors_torch.load(bytes(image.numpy().tobytes()))
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        got = back[name]
        assert got.dtype == t.dtype and got.shape == t.shape, name
        assert torch.equal(got.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name


def test_an_unnamed_dtype_is_a_value_error():
    with pytest.raises(ValueError, match="complex64 has no safetensors name"):
        _safetensors_image({"x": torch.zeros(2, dtype=torch.complex64)})

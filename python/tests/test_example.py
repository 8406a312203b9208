"""examples/moe_decoder.py runs, and its replayed training forward matches bit for bit."""
import importlib.util
import pathlib

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "moe_decoder.py"


def _main():
    spec = importlib.util.spec_from_file_location("moe_decoder", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_example_on_cpu(tmp_path, capsys):
    assert _main()(["--device", "cpu", "--capture", str(tmp_path / "c.safetensors")]) == 0
    assert "10/10 MoE layer outputs match bit for bit" in capsys.readouterr().out


@pytest.mark.gpu
def test_example_on_cuda(tmp_path, capsys):
    assert _main()(["--device", "cuda", "--capture", str(tmp_path / "c.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "cuda_sm90" in out and "10/10 MoE layer outputs match bit for bit" in out

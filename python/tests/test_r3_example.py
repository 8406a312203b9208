"""examples/r3_loop.py: the whole R3 loop on the CPU (CI), and on a GPU where batch-invariant CUDA
kernels exist."""
import importlib.util
import pathlib

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "r3_loop.py"


def _main():
    spec = importlib.util.spec_from_file_location("r3_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_r3_loop_on_cpu(tmp_path, capsys):
    assert _main()(["--device", "cpu", "--capture", str(tmp_path / "r3.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "check: ok: no findings" in out and "OK" in out.splitlines()[-1]


@pytest.mark.gpu
def test_r3_loop_on_cuda_with_batch_invariant_kernels(tmp_path, capsys):
    assert _main()(["--device", "cuda", "--capture", str(tmp_path / "r3.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "cuda_sm90" in out and "OK" in out.splitlines()[-1]

"""Fuzz target (atheris) for moekit.r3's readers: the NumPy capture reader
(`read_capture`) on arbitrary file bytes, and the vLLM decoder (`from_vllm`) on
arbitrary base64 `.npy` text and arrays. Each must return or raise ValueError;
any other exception is a finding.

  python fuzz/python/fuzz_r3.py -max_total_time=60 -max_len=65536 fuzz/corpus/capture_file

r3's format and convert modules import only the standard library and NumPy,
so they are loaded here by path, without the compiled extension.
"""
import base64
import importlib.util
import os
import sys
import tempfile
import types

import atheris

R3 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "moekit", "r3")


def load_r3():
    package = types.ModuleType("r3fuzz")
    package.__path__ = [R3]  # the submodules' relative imports resolve here; r3/__init__.py is not run
    sys.modules["r3fuzz"] = package
    modules = {}
    for name in ("format", "convert"):
        spec = importlib.util.spec_from_file_location(f"r3fuzz.{name}", os.path.join(R3, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        modules[name] = module
    return modules["format"], modules["convert"]


with atheris.instrument_imports():
    import numpy as np
    fmt, convert = load_r3()

WORK = tempfile.mkdtemp(prefix="fuzz_r3_")
PATH = os.path.join(WORK, "capture.safetensors")


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 2)
    try:
        if mode == 0:  # a capture file
            with open(PATH, "wb") as f:
                f.write(fdp.ConsumeBytes(fdp.remaining_bytes()))
            fmt.read_capture(PATH)
        elif mode == 1:  # base64 .npy text
            text = base64.b64encode(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096)))
            convert.from_vllm("r", text, [fdp.ConsumeIntInRange(0, 3)])
        else:  # arrays of any integer dtype and shape
            dtype = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64][fdp.ConsumeIntInRange(0, 5)]
            dims = [fdp.ConsumeIntInRange(0, 6) for _ in range(fdp.ConsumeIntInRange(0, 4))]
            count = int(np.prod(dims)) if dims else 1
            raw = fdp.ConsumeBytes(count * np.dtype(dtype).itemsize)
            raw = raw + bytes(count * np.dtype(dtype).itemsize - len(raw))
            a = np.frombuffer(raw, dtype=dtype).reshape(dims)
            convert.from_vllm("r", a, [fdp.ConsumeIntInRange(0, 3)])
    except ValueError:
        pass


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

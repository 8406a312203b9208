"""moekit: the Mixture-of-Experts layer of LLMs for PyTorch programs.

A thin skin over moekit's C++ library: tensors cross through DLPack without
copies, GPU work runs on torch's current CUDA stream, a failed check raises
ValueError (bad input) or RuntimeError (internal error) with the library's
message. See docs/python.md.
"""
from ._moekit import CAPTURE_FORMAT_VERSION, UNWRITTEN_EXPERT_ID, CaptureSet, MoeConfig, RequestCapture
import atexit as _atexit
import os as _os
import sys as _sys

import torch as _pytorch

from . import _moekit
from ._moekit import platform as _platform
from .capture import RoutedExpertsCapturer, RoutedExpertsReplayer, bind, read_capture_file, write_capture_file
from .layer import MoeLayer, Model, route, select_backend
from . import ops  # registers torch.ops.moekit.moe_forward
# moekit.r3 (routing replay glue) and moekit.torch.replay_routing; "torch" stays out of __all__
# so that `from moekit import *` never shadows the real torch.
from . import nn, r3, torch

__version__ = "0.1.0"


def set_num_threads(num_threads: int) -> None:
    """The CPU threads moekit computes with (its pool and OpenBLAS's), in [1, 1024]."""
    _moekit.set_num_threads(num_threads)


def get_num_threads() -> int:
    return _moekit.num_threads()


def _torch_openmp_runtime() -> str:
    """The OpenMP runtime torch's CPU ops run on (the libgomp or libomp it loaded), or ""."""
    try:
        with open("/proc/self/maps") as maps:
            loaded = {line.split()[-1] for line in maps if "omp" in line and ".so" in line}
    except OSError:  # not Linux: moekit's own pool
        return ""
    torch_dir = _os.path.dirname(_pytorch.__file__)
    runtimes = sorted(p for p in loaded if _os.path.basename(p).startswith(("libgomp", "libiomp", "libomp")))
    return next((p for p in runtimes if p.startswith(torch_dir)), runtimes[0] if runtimes else "")


# Inside a torch process moekit's CPU threads follow torch's intra-op threads (torch.set_num_threads,
# OMP_NUM_THREADS; MOEKIT_NUM_THREADS overrides), and they are the same threads: moekit's work runs on
# torch's OpenMP runtime, so neither waits behind the other's workers spinning on the same cores
# (MOEKIT_THREAD_POOL=own keeps moekit's own pool). docs/cpu_backend.md, Threads.
if "MOEKIT_NUM_THREADS" not in _os.environ:
    set_num_threads(min(max(1, _pytorch.get_num_threads()), 1024))
if _os.environ.get("MOEKIT_THREAD_POOL", "torch") not in ("torch", "own"):
    raise ValueError(f"MOEKIT_THREAD_POOL={_os.environ['MOEKIT_THREAD_POOL']!r}: must be 'torch' (run on torch's "
                     "OpenMP threads, the default) or 'own' (moekit's own pool)")
if _os.environ.get("MOEKIT_THREAD_POOL", "torch") == "torch" and (_runtime := _torch_openmp_runtime()):
    _moekit.use_openmp_runtime(_runtime)


def _release_dynamo_guard_scopes() -> None:
    """At exit, nanobind reports every moekit object still alive as "leaked". After torch.compile has
    compiled a frame, a script's module-level MoeLayer or MoeConfig would always be: dynamo's guards
    keep the globals dict of every frame they guard in a {'G': globals} scope, held by guard
    functions that torch's C++ guard managers own. Those references form a cycle the garbage
    collector cannot see (globals -> the compiled module's code -> its cache entry -> guards -> the
    scope -> globals), and torch._dynamo.reset() leaves the guard functions alive. So at exit, once
    no guard will run again, empty those scopes: the globals are then freed with their module, as in
    a process that compiled nothing, and the leak report stays on for real leaks."""
    if "torch._dynamo" not in _sys.modules:
        return
    import gc
    for obj in gc.get_objects():
        if (type(obj) is dict and "G" in obj and obj.keys() <= {"G", "__builtins__"}
                and type(obj["G"]) is dict and "__name__" in obj["G"]):
            obj.clear()


_atexit.register(_release_dynamo_guard_scopes)


def platform() -> str:
    """What this process can run on (CPU threads, CUDA devices), as the oracle sees it."""
    return _platform()


__all__ = [
    "CAPTURE_FORMAT_VERSION", "UNWRITTEN_EXPERT_ID", "CaptureSet", "MoeConfig", "MoeLayer", "Model",
    "RequestCapture", "RoutedExpertsCapturer", "RoutedExpertsReplayer", "bind", "platform",
    "get_num_threads", "nn", "r3", "read_capture_file", "route", "select_backend", "set_num_threads",
    "write_capture_file",
]

"""moekit: the Mixture-of-Experts layer of LLMs for PyTorch programs.

A thin skin over moekit's C++ library: tensors cross through DLPack without
copies, GPU work runs on torch's current CUDA stream, a failed check raises
ValueError (bad input) or RuntimeError (internal error) with the library's
message. See docs/python.md.
"""
from ._moekit import CAPTURE_FORMAT_VERSION, UNWRITTEN_EXPERT_ID, CaptureSet, MoeConfig, RequestCapture
from ._moekit import platform as _platform
from .capture import RoutedExpertsCapturer, RoutedExpertsReplayer, bind, read_capture_file, write_capture_file
from .layer import MoeLayer, Model, route, select_backend
from . import ops  # registers torch.ops.moekit.moe_forward
# moekit.r3 (routing replay glue) and moekit.torch.replay_routing; "torch" stays out of __all__
# so that `from moekit import *` never shadows the real torch.
from . import r3, torch

__version__ = "0.1.0"


def platform() -> str:
    """What this process can run on (CPU threads, CUDA devices), as the oracle sees it."""
    return _platform()


__all__ = [
    "CAPTURE_FORMAT_VERSION", "UNWRITTEN_EXPERT_ID", "CaptureSet", "MoeConfig", "MoeLayer", "Model",
    "RequestCapture", "RoutedExpertsCapturer", "RoutedExpertsReplayer", "bind", "platform",
    "r3", "read_capture_file", "route", "select_backend", "write_capture_file",
]

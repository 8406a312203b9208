"""The two facts the C++ side needs from torch: a device, and its current stream."""
from typing import Optional, Union

import torch

DeviceLike = Union[str, int, torch.device, None]

try:  # the raw pointer, without building a torch.cuda.Stream object per call
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # pragma: no cover - torch builds without CUDA
    _raw_stream = None


def parse_device(device: DeviceLike) -> torch.device:
    """torch.device(device), with a string torch cannot parse a ValueError like every other bad argument."""
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device: {e}") from None


def to_device(device: DeviceLike, default: Optional[torch.device] = None) -> torch.device:
    """A torch.device with its index filled in for CUDA (the current device).
    A string torch cannot parse is a ValueError, like every other bad argument."""
    d = parse_device(device) if device is not None else (default or torch.device("cpu"))
    if d.type == "cuda" and not torch.cuda.is_available():
        # moekit's answer, not the driver's: what this build and machine have.
        from . import _moekit
        raise ValueError(f"device {str(d)!r}: moekit sees no usable CUDA device here ({_moekit.platform()}); "
                         "run on the CPU (device='cpu')")
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def stream_of(device: torch.device) -> int:
    """torch's current stream on `device` as an integer (0 for the CPU)."""
    if device.type != "cuda":
        return 0
    if _raw_stream is not None:
        return _raw_stream(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def tensor_arg(name: str, t, optional: bool = True) -> Optional[torch.Tensor]:
    """t itself when it is a torch.Tensor (or None where that is allowed); any other type (a NumPy array,
    a list) is a TypeError naming the argument and the expected type, not an AttributeError from inside."""
    if t is None and optional:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor{' or None' if optional else ''}, got {type(t).__module__}."
                        f"{type(t).__qualname__} (convert it, e.g. torch.from_numpy)")
    return t


def on_a_real_device(name: str, t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A tensor with no memory moekit can read (the meta device, say) is a ValueError naming its device,
    not the module's 'incompatible function arguments' (DLPack cannot export it)."""
    if t is not None and t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: tensors on device '{t.device.type}' are not supported (cpu, cuda)")
    return t


def no_grad_needed(name: str, t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """moekit has no backward: refuse a tensor that would need one, instead of silently cutting the graph."""
    if t is not None and t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name}: requires grad, but moekit's MoE layer has no backward pass; "
                         f"call it under torch.no_grad() or pass {name}.detach()")
    return t


def weight(name: str, t: Optional[torch.Tensor], optional: bool = True) -> Optional[torch.Tensor]:
    """Parameters cross as plain tensors (DLPack refuses tensors that require grad); no copy.
    Anything but a torch.Tensor (or None where allowed) is a TypeError naming `name`."""
    t = on_a_real_device(name, tensor_arg(name, t, optional))
    return t.detach() if t is not None and t.requires_grad else t


def flag(name: str, value) -> bool:
    """A yes/no option: True or False (a NumPy bool too), never a truth value of something else
    (capture="no" is not True)."""
    if isinstance(value, bool) or type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    raise TypeError(f"{name}: expected True or False, got {value!r}")

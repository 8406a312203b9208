"""Routed-expert capture (record) and replay (force): the Python face of
include/moekit/capture.h. A step's layout is a list of (request, rows)
segments in batch order."""
import os
from typing import List, Sequence, Tuple, Union

import torch

from . import _moekit
from ._moekit import CaptureSet, RequestCapture
from ._torch import DeviceLike, stream_of, to_device
from .layer import Model

Segments = Sequence[Tuple[str, int]]
PathLike = Union[str, os.PathLike]


class RoutedExpertsCapturer:
    """The capture buffer [num_moe_layers, max_num_tokens, top_k] int16 on `device`,
    allocated once here (never when enabled=False). Per step: begin_step(segments),
    run every layer, end_step(); then routed_experts(request) ->
    [num_tokens, num_moe_layers, top_k] int16."""

    def __init__(self, num_moe_layers: int, max_num_tokens: int, top_k: int, device: DeviceLike = "cpu",
                 enabled: bool = True):
        self.device = to_device(device)
        self._capturer = _moekit.create_capturer(num_moe_layers, max_num_tokens, top_k, self.device.type,
                                                 self.device.index or 0, enabled)

    enabled = property(lambda self: self._capturer.enabled)
    num_moe_layers = property(lambda self: self._capturer.num_moe_layers)
    max_num_tokens = property(lambda self: self._capturer.max_num_tokens)
    top_k = property(lambda self: self._capturer.top_k)
    allocated_bytes = property(lambda self: self._capturer.allocated_bytes)
    bound = property(lambda self: self._capturer.bound)

    def add_request(self, request: str, skip_prompt_tokens: int = 0, prompt_tokens: int = -1) -> None:
        """prompt_tokens (when known) marks where generated tokens start (first_generated_token)."""
        self._capturer.add_request(request, skip_prompt_tokens, prompt_tokens)

    def begin_step(self, segments: Segments) -> None:
        self._capturer.begin_step(list(segments), stream_of(self.device))

    def end_step(self) -> None:
        self._capturer.end_step(stream_of(self.device))

    def end_step_async(self) -> None:
        """end_step without waiting for the device: the rows are checked and appended by the next
        end_step_async, collect(), or a reader (routed_experts, finish_request, snapshot)."""
        self._capturer.end_step_async(stream_of(self.device))

    def collect(self) -> None:
        self._capturer.collect()

    def routed_experts(self, request: str) -> torch.Tensor:
        return self._capturer.routed_experts(request)

    def finish_request(self, request: str) -> RequestCapture:
        return self._capturer.finish_request(request)

    def snapshot(self) -> CaptureSet:
        return self._capturer.snapshot()


def bind(model: Model, capturer: RoutedExpertsCapturer) -> None:
    """Every MoE layer of `model` gets its slice of the capture buffer as its capture target."""
    if not isinstance(model, Model):
        raise TypeError(f"model: expected a moekit.Model, got {type(model).__module__}.{type(model).__qualname__}")
    if not isinstance(capturer, RoutedExpertsCapturer):
        raise TypeError("capturer: expected a moekit.RoutedExpertsCapturer, got "
                        f"{type(capturer).__module__}.{type(capturer).__qualname__}")
    _moekit.bind(model._model, capturer._capturer)


class RoutedExpertsReplayer:
    """Replays a capture: per step, begin_step(segments), then each layer's
    forced_ids(layer) [M, k] int32 (host) go to layer(..., forced_ids=...)."""

    def __init__(self, captures: CaptureSet, model: Model):
        if not isinstance(model, Model):
            raise TypeError(f"model: expected a moekit.Model, got {type(model).__module__}.{type(model).__qualname__}")
        self._replayer = _moekit.create_replayer(captures, model._model)

    def begin_step(self, segments: Segments) -> None:
        self._replayer.begin_step(list(segments))

    def forced_ids(self, layer: int) -> torch.Tensor:
        """[M, k] int32 (host) of the current step; [0, k] after begin_step([]). Before the first
        begin_step there is no step: ValueError."""
        return self._replayer.forced_ids(layer)

    def start_token(self, request: str, token: int) -> None:
        self._replayer.start_token(request, token)

    @property
    def captures(self) -> CaptureSet:
        return self._replayer.captures


def write_capture_file(path: PathLike, captures: CaptureSet) -> None:
    """The self-describing capture file (docs/capture.md); written atomically."""
    _moekit.write_capture_file(os.fspath(path), captures)


def read_capture_file(path: PathLike, check_ids: bool = True) -> CaptureSet:
    """Reads a capture file of version 1 or 2. check_ids=False keeps ids outside [0, E) (for moekit.r3.check)."""
    return _moekit.read_capture_file(os.fspath(path), check_ids)


__all__: List[str] = ["RoutedExpertsCapturer", "RoutedExpertsReplayer", "bind", "read_capture_file",
                      "write_capture_file", "CaptureSet", "RequestCapture"]

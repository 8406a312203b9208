"""Per-request forced routes inside vLLM (replay): a request carries the expert ids to run in
SamplingParams.extra_args, and every moekit layer of the step forces them on that request's rows.

    SamplingParams(extra_args={"moekit_routes": ids, "moekit_routes_start": 0})

ids: what vLLM returns as CompletionOutput.routed_experts, [rows, num_hidden_layers, k] (uint8/uint16;
dense layers' columns are ignored), as an array or as base64 text of its .npy (the OpenAI server's
encoding, which also survives vLLM's msgpack between processes). Row r forces the token at position
moekit_routes_start + r; tokens outside the rows route live, as do requests without routes.

The step's rows are mapped to (request, position) from the model runner's input batch, around
GPUModelRunner._model_forward (the one call through which every forward of vLLM 0.32's runner goes).
vLLM's Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1) is not followed: a request with routes is
refused there, rather than routed live.
"""
import base64
import io
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

ROUTES_KEY = "moekit_routes"
START_KEY = "moekit_routes_start"

_step = threading.local()  # .requests: [(rows slice, positions int64 [n], routes [T, L, k] int32 or None, start)]
_decoded: Dict[str, Tuple[int, np.ndarray]] = {}  # request id -> (id of the extra_args value, routes)


def decode_routes(value, request: str) -> np.ndarray:
    """extra_args["moekit_routes"] as int32 [rows, layers, k]: an integer array (or nested lists), or base64 .npy."""
    if isinstance(value, (str, bytes)):
        try:
            value = np.load(io.BytesIO(base64.b64decode(value, validate=True)), allow_pickle=False)
        except Exception as e:  # noqa: BLE001 - untrusted text: every parser failure means "not a .npy"
            raise ValueError(f"request {request!r}: {ROUTES_KEY} is not base64 .npy text ({type(e).__name__}: {e})") \
                from None
    a = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if a.ndim != 3 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"request {request!r}: {ROUTES_KEY} must be integer ids [rows, num_hidden_layers, k], "
                         f"got {a.dtype} {list(a.shape)}")
    return a.astype(np.int32)


def _routes_of(runner, req_id: str) -> Optional[Tuple[np.ndarray, int]]:
    state = runner.requests.get(req_id)
    params = getattr(state, "sampling_params", None)
    extra = getattr(params, "extra_args", None) or {}
    if ROUTES_KEY not in extra:
        return None
    value = extra[ROUTES_KEY]
    cached = _decoded.get(req_id)
    if cached is None or cached[0] != id(value):
        cached = (id(value), decode_routes(value, req_id))
        _decoded[req_id] = cached
    start = extra.get(START_KEY, 0)
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise ValueError(f"request {req_id!r}: {START_KEY} must be an integer >= 0, got {start!r}")
    return cached[1], start


def _begin_step(runner, positions: Optional[torch.Tensor]) -> None:
    _step.requests = []
    num_reqs = runner.input_batch.num_reqs
    if positions is None or num_reqs == 0:
        return
    bounds = runner.query_start_loc.np[:num_reqs + 1]
    pos = None
    for i, req_id in enumerate(runner.input_batch.req_ids[:num_reqs]):
        routes = _routes_of(runner, req_id)
        if routes is None:
            continue
        if pos is None:
            pos = positions[:int(bounds[-1])].to("cpu", torch.int64).numpy()
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        _step.requests.append((slice(lo, hi), pos[lo:hi], routes[0], routes[1], req_id))
    for req_id in [r for r in _decoded if r not in runner.requests]:
        del _decoded[req_id]  # finished requests


def forced_ids(layer_id: int, num_rows: int, top_k: int) -> Optional[torch.Tensor]:
    """[num_rows, k] int32 ids to force in model layer `layer_id` this step (-1: route live), or None."""
    requests: List = getattr(_step, "requests", None) or []
    if not requests:
        return None
    forced = np.full((num_rows, top_k), -1, dtype=np.int32)
    for rows, pos, routes, start, req_id in requests:
        if routes.shape[1] <= layer_id or routes.shape[2] != top_k:
            raise ValueError(f"request {req_id!r}: {ROUTES_KEY} is {list(routes.shape)}, but layer {layer_id} "
                             f"needs [rows, > {layer_id}, {top_k}]")
        r = pos - start
        have = (r >= 0) & (r < routes.shape[0])
        forced[rows][have] = routes[r[have], layer_id]
    return torch.from_numpy(forced)


def install() -> None:
    """Wraps the model runner's forward so that each step knows its requests' routes (once per process)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    if getattr(GPUModelRunner._model_forward, "_moekit_replay", False):
        return
    forward = GPUModelRunner._model_forward

    def _model_forward(self, input_ids=None, positions=None, *args, **kwargs):
        _begin_step(self, positions)
        try:
            return forward(self, input_ids, positions, *args, **kwargs)
        finally:
            _step.requests = []

    _model_forward._moekit_replay = True
    GPUModelRunner._model_forward = _model_forward
    _refuse_routes_on_runner_v2()


def check_no_routes(scheduler_output) -> None:
    """ValueError when a new request carries routes: the runner it reaches does not apply them."""
    for new in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
        extra = getattr(getattr(new, "sampling_params", None), "extra_args", None) or {}
        if ROUTES_KEY in extra:
            raise ValueError(f"request {new.req_id!r}: {ROUTES_KEY} is not applied by vLLM's Model Runner V2 "
                             "(VLLM_USE_V2_MODEL_RUNNER=1); forced routes run on the V1 runner")


def _refuse_routes_on_runner_v2() -> None:
    try:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2
    except ImportError:
        return
    if getattr(RunnerV2.add_requests, "_moekit_replay", False):
        return
    add = RunnerV2.add_requests

    def add_requests(self, scheduler_output):
        check_no_routes(scheduler_output)
        return add(self, scheduler_output)

    add_requests._moekit_replay = True
    RunnerV2.add_requests = add_requests

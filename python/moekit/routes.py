"""Routes: the expert ids a trainer forces, per request, keyed by the request's token ids.

One request = ids [tokens, moe_layers, k] int16 (logical ids in the routing spec's order;
-1 where nothing was captured) of its tokens 0, 1, ... and the token ids themselves. A
replay checks a batch row's token ids against its request's before forcing anything, so
a reordered or repacked batch is an error naming the request, never another sample's
experts. Built by moekit.transformers.capture, from an engine's ids (from_ids), from an
r3 capture or a capture file (from_capture, load); written as a capture file (save).
"""
import hashlib
import json
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from .r3.format import Capture, RequestRoutes, read_capture, routing_dict, write_capture

TOKENS_KEY = "moekit.token_ids"  # capture-file metadata: {request: [token ids]} (JSON)
IdsLike = Union[torch.Tensor, np.ndarray, Sequence]


def _as_tensor(x, what: str) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{what}: expected integers, got {t.dtype}")
    return t.detach().to("cpu")


def token_digest(tokens: torch.Tensor) -> str:
    """sha256 of the token ids as little-endian int64: equal digests, equal sequences."""
    return hashlib.sha256(tokens.to(torch.int64).numpy().astype("<i8").tobytes()).hexdigest()


def _agrees(tokens: torch.Tensor, row: torch.Tensor, start: int) -> bool:
    """Whether a request's tokens from `start` equal the batch row where the request knows them (-1: unknown,
    a capture of embeddings)."""
    known = tokens[start:start + row.numel()]
    row = row[:known.numel()]
    return bool(((known == row) | (known < 0)).all())


class Routes:
    """Per request (in order): its name, ids [T, L, k] int16 and token ids [N] int64 (N >= T: a
    generated sequence's last token was never a forward's input, so it has no ids row)."""

    def __init__(self, model_layers: Sequence[int], top_k: int, num_experts: int, routing: Optional[Dict] = None):
        self.model_layers = [int(l) for l in model_layers]
        self.top_k, self.num_experts = int(top_k), int(num_experts)
        self.routing = dict(routing) if routing is not None else routing_dict("custom", top_k)
        self._names: List[str] = []
        self._ids: List[torch.Tensor] = []
        self._tokens: List[torch.Tensor] = []

    # ---- building
    def add(self, request: str, ids: IdsLike, tokens: IdsLike) -> None:
        """Appends one request: ids [T, moe_layers, k] (ids in [0, E), -1 where not captured), token ids [N >= T]."""
        if not isinstance(request, str) or request in self._names:
            raise ValueError(f"request name {request!r}: expected a new string (names key the routes)")
        ids = _as_tensor(ids, f"request {request!r}: ids")
        tokens = _as_tensor(tokens, f"request {request!r}: tokens").reshape(-1).to(torch.int64)
        L, k = len(self.model_layers), self.top_k
        if ids.dim() != 3 or ids.shape[1:] != (L, k):
            raise ValueError(f"request {request!r}: ids must be [tokens, {L} MoE layers, k={k}], got {list(ids.shape)}")
        wide = ids.to(torch.int64)
        bad = (wide < -1) | (wide >= self.num_experts)
        if bad.any():
            t, l, j = bad.nonzero()[0].tolist()
            raise ValueError(f"request {request!r}: id {int(wide[t, l, j])} at [{t}, {l}, {j}] is not an expert id "
                             f"in [0, {self.num_experts}) nor -1")
        part = (wide < 0).any(-1) & ~(wide < 0).all(-1)
        if part.any():
            t, l = part.nonzero()[0].tolist()
            raise ValueError(f"request {request!r}: row [{t}, {l}] is partly -1 ({wide[t, l].tolist()}): a row is "
                             "forced whole, or all -1 to route live")
        if tokens.numel() < ids.shape[0]:
            raise ValueError(f"request {request!r}: {ids.shape[0]} rows of ids but {tokens.numel()} token ids")
        self._names.append(request)
        self._ids.append(wide.to(torch.int16))
        self._tokens.append(tokens)

    @classmethod
    def from_ids(cls, ids: Union[Mapping[str, IdsLike], Sequence[IdsLike]], tokens: Union[Mapping, Sequence],
                 model_layers: Sequence[int], num_experts: int, routing: Optional[Dict] = None) -> "Routes":
        """An engine's ids: per request [T, moe_layers, k] (e.g. moekit.r3.from_vllm(...).ids), keyed by name (a
        mapping) or in order (named "0", "1", ...), with each request's token ids (prompt + generated)."""
        named = list(ids.items()) if isinstance(ids, Mapping) else [(str(i), v) for i, v in enumerate(ids)]
        token_of = tokens if isinstance(tokens, Mapping) else dict(zip((n for n, _ in named), tokens))
        if len(token_of) != len(named) or any(n not in token_of for n, _ in named):
            raise ValueError(f"tokens: expected token ids for each of the {len(named)} requests")
        if not named:
            raise ValueError("ids: no requests")
        first = _as_tensor(named[0][1], "ids")
        routes = cls(model_layers, first.shape[-1], num_experts, routing)
        for name, v in named:
            routes.add(name, v, token_of[name])
        return routes

    @classmethod
    def from_capture(cls, capture: Union[Capture, str], tokens: Optional[Mapping[str, IdsLike]] = None) -> "Routes":
        """An r3 Capture (or a capture file's path): its requests, whose rows must start at token 0, with their
        token ids from `tokens` or, for a file that Routes.save wrote, from the file."""
        cap = read_capture(capture) if not isinstance(capture, Capture) else capture
        stored = json.loads(cap.extra_metadata.get(TOKENS_KEY, "{}"))
        routes = cls(cap.model_layers, cap.top_k, cap.num_experts, cap.routing)
        for r in cap.requests:
            if r.first_token != 0:
                raise ValueError(f"request {r.request!r}: its rows start at token {r.first_token}; replay needs "
                                 "every token from the first (capture without skipping the prompt)")
            t = (tokens or {}).get(r.request, stored.get(r.request))
            if t is None:
                raise ValueError(f"request {r.request!r}: no token ids (give tokens={{name: ids}}); replay checks "
                                 "each batch row against them")
            routes.add(r.request, r.ids, t)
        return routes

    load = from_capture

    def to_capture(self, backend: str = "") -> Capture:
        return Capture(self.num_experts, self.model_layers, self.routing,
                       [RequestRoutes(n, i.numpy(), 0, -1) for n, i in zip(self._names, self._ids)], backend=backend,
                       extra_metadata={TOKENS_KEY: json.dumps({n: t.tolist() for n, t in zip(self._names, self._tokens)})})

    def save(self, path) -> None:
        """A capture file (docs/capture.md) with the token ids in its metadata: Routes.load reads it back."""
        write_capture(path, self.to_capture())

    # ---- reading
    @property
    def requests(self) -> List[str]:
        return list(self._names)

    @property
    def num_requests(self) -> int:
        return len(self._names)

    def _index(self, request: Union[int, str]) -> int:
        if isinstance(request, str):
            if request not in self._names:
                raise KeyError(f"no request {request!r} in these routes ({', '.join(self._names[:8])}...)")
            return self._names.index(request)
        if not -len(self._names) <= request < len(self._names):
            raise IndexError(f"request {request} of {len(self._names)}")
        return request

    def ids(self, request: Union[int, str]) -> torch.Tensor:
        """[tokens, moe_layers, k] int16 of a request (by position or name)."""
        return self._ids[self._index(request)]

    def tokens(self, request: Union[int, str]) -> torch.Tensor:
        return self._tokens[self._index(request)]

    def digest(self, request: Union[int, str]) -> str:
        return token_digest(self.tokens(request))

    def select(self, requests: Sequence[Union[int, str]]) -> "Routes":
        """These requests in this order (e.g. a trainer batch's): a new Routes sharing the tensors."""
        out = Routes(self.model_layers, self.top_k, self.num_experts, self.routing)
        for r in requests:
            i = self._index(r)
            out._names.append(self._names[i])
            out._ids.append(self._ids[i])
            out._tokens.append(self._tokens[i])
        if len(set(out._names)) != len(out._names):
            raise ValueError(f"select: a request named twice in {list(requests)}")
        return out

    def batch(self) -> torch.Tensor:
        """[requests, tokens, moe_layers, k] int16: every request's ids, shorter ones padded with -1 rows."""
        T = max((i.shape[0] for i in self._ids), default=0)
        out = torch.full((len(self._ids), T, len(self.model_layers), self.top_k), -1, dtype=torch.int16)
        for r, i in enumerate(self._ids):
            out[r, :i.shape[0]] = i
        return out

    def check_batch(self, input_ids: torch.Tensor, start: int = 0, live_tail: int = 1) -> None:
        """ValueError unless batch row b's tokens start..start+S are request b's (where it knows them), and at
        most live_tail tokens of a row lie past the request's ids (they route live: generate's last token)."""
        input_ids = input_ids.detach().to("cpu", torch.int64)
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected [batch, tokens], got {list(input_ids.shape)}")
        B, S = input_ids.shape
        if B > len(self._names):
            raise ValueError(f"replay: a batch of {B} rows, but the routes hold {len(self._names)} requests")
        for b in range(B):
            if not _agrees(self._tokens[b], input_ids[b], start):
                match = [n for n, t in zip(self._names, self._tokens) if _agrees(t, input_ids[b], start)]
                hint = f"; they are request {match[0]!r}'s: select() the routes in the batch's order" if match else ""
                raise ValueError(f"replay: batch row {b}'s tokens {start}..{start + S - 1} are not request "
                                 f"{self._names[b]!r}'s (digest {self.digest(b)[:12]}){hint}")
            past = start + S - self._ids[b].shape[0]
            if past > live_tail:
                raise ValueError(f"replay: batch row {b} runs to token {start + S - 1}, {past} tokens past request "
                                 f"{self._names[b]!r}'s {self._ids[b].shape[0]} routed tokens (at most {live_tail} may "
                                 "route live: replay(..., live_tail=N) allows more)")

    def __repr__(self) -> str:
        return (f"Routes({self.num_requests} requests, MoE layers {self.model_layers}, k={self.top_k}, "
                f"E={self.num_experts})")

"""A host-side per-request store of routed experts for an engine's scheduler (docs/r3.md, "The store").

Each request owns rows [tokens, moe_layers, k] int16, indexed by the token's position in the request;
-1 marks a position whose routing the store has not received. The scheduler tells the store what
happened to a request, step by step:

    store.add_request("r", prompt_len=100)
    store.hydrate("r", [h0, h1])        # prefix-cache hit: rows of cached blocks, no forward ran for them
    store.append("r", start=32, rows)   # a step computed tokens 32.. of "r" (rows from the capturer)
    store.trim("r", 130)                # speculative decoding rejected draft tokens >= 130
    store.preempt("r"); store.resume("r")   # rows survive; a recompute's rows do not overwrite them
    store.splice("r", rows, start=0)    # prompt rows computed elsewhere (prefill/decode disaggregation)
    store.publish_blocks("r", [h0, h1, h2])  # full blocks become hits for later requests
    routes = store.finish("r")          # RequestRoutes; -1 rows left are an error, never passed on

Nothing here synchronizes a device: rows arrive as host arrays (the capturer's end_step copies them).
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from .format import SENTINEL, RequestRoutes

_MAX_ID = 32767  # ids are int16 (docs/routing.md)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


@dataclass
class _Request:
    prompt_len: int
    first_token: int
    rows: np.ndarray                     # [capacity, L, k] int16, position p at p - first_token
    length: int = 0                      # positions [first_token, first_token + length) are in range
    preempted: bool = False
    conflicts: int = 0                   # recomputed rows that differed from the kept ones
    hydrated_blocks: List[object] = field(default_factory=list)


class RoutingStore:
    """Routed-expert rows per request. block_size: tokens per prefix-cache block (as the engine's KV
    cache). num_experts (optional): ids must be in [0, num_experts) (else moekit's id range [0, 32767]).
    on_conflict: what append() does with a position that already holds rows that differ
    (a recompute after preemption on a batch-variant kernel): "keep" (default: the rows that produced
    the sampled tokens stay), "overwrite", or "error"."""

    def __init__(self, num_moe_layers: int, top_k: int, block_size: int, on_conflict: str = "keep",
                 num_experts: Optional[int] = None):
        if not all(_is_int(v) and v >= 1 for v in (num_moe_layers, top_k, block_size)):
            raise ValueError("num_moe_layers, top_k and block_size must be integers >= 1")
        if num_experts is not None and not (_is_int(num_experts) and 1 <= num_experts <= _MAX_ID + 1):
            raise ValueError(f"num_experts must be an integer in [1, {_MAX_ID + 1}], got {num_experts!r}")
        if on_conflict not in ("keep", "overwrite", "error"):
            raise ValueError(f"on_conflict must be 'keep', 'overwrite' or 'error', got {on_conflict!r}")
        self.num_moe_layers, self.top_k, self.block_size = num_moe_layers, top_k, block_size
        self.on_conflict = on_conflict
        self.num_experts = num_experts  # when given, ids must be in [0, num_experts); else in [0, 32767]
        self._requests: Dict[str, _Request] = {}
        self._blocks: Dict[object, np.ndarray] = {}  # block hash -> [block_size, L, k] int16

    # ------------------------------------------------------------ requests
    def add_request(self, request: str, prompt_len: int, first_token: int = 0) -> None:
        """first_token > 0: positions before it are not kept (earlier turns captured before)."""
        if request in self._requests:
            raise ValueError(f"request {request!r} was already added")
        if not (_is_int(prompt_len) and _is_int(first_token)) or prompt_len < 0 or first_token < 0:
            raise ValueError(f"request {request!r}: prompt_len and first_token must be integers >= 0, got "
                             f"{prompt_len!r} and {first_token!r}")
        if first_token > prompt_len:
            # The routes' first_generated_token (= prompt_len) would lie before their first token.
            raise ValueError(f"request {request!r}: first_token {first_token} lies past the prompt's end "
                             f"(prompt_len {prompt_len}): only prompt tokens can have been captured before")
        self._requests[request] = _Request(prompt_len, first_token, self._empty(max(prompt_len - first_token, 16)))

    def _empty(self, n: int) -> np.ndarray:
        return np.full((n, self.num_moe_layers, self.top_k), SENTINEL, np.int16)

    def _get(self, request: str) -> _Request:
        try:
            return self._requests[request]
        except KeyError:
            raise ValueError(f"request {request!r} is not in the store") from None

    def _reserve(self, r: _Request, end: int) -> None:
        n = end - r.first_token
        if n > r.rows.shape[0]:
            grown = self._empty(max(n, 2 * r.rows.shape[0]))
            grown[:r.rows.shape[0]] = r.rows
            r.rows = grown
        r.length = max(r.length, n)

    def _check_rows(self, rows, what: str) -> np.ndarray:
        a = np.asarray(rows)
        if a.ndim != 3 or a.shape[1:] != (self.num_moe_layers, self.top_k):
            raise ValueError(f"{what}: rows must be [n, {self.num_moe_layers}, {self.top_k}], got {list(a.shape)}")
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{what}: rows must be integer ids, got {a.dtype}")
        hi = _MAX_ID if self.num_experts is None else self.num_experts - 1
        bad = (a != SENTINEL) & ((a < 0) | (a > hi))  # checked before the cast to int16 could wrap 40000
        if bad.any():
            t, l, j = (int(x) for x in np.argwhere(bad)[0])
            span = f"[0, {_MAX_ID}]" if self.num_experts is None else f"[0, {self.num_experts})"
            raise ValueError(f"{what}: row {t}, MoE layer {l}, slot {j}: id {a[t, l, j]} outside {span}")
        return a.astype(np.int16)

    def _write(self, r: _Request, request: str, start: int, a: np.ndarray, what: str, policy: str) -> None:
        if not _is_int(start) or start < 0:
            raise ValueError(f"{what}: start must be an integer >= 0, got {start!r}")
        if (a == SENTINEL).all(axis=(1, 2)).any():
            t = int(np.flatnonzero((a == SENTINEL).all(axis=(1, 2)))[0])
            raise ValueError(f"{what}: request {request!r}, token {start + t}: the row is the sentinel -1 "
                             "(the layer did not write it)")
        lo = max(start, r.first_token)  # positions before first_token are not kept
        a = a[lo - start:]
        if a.shape[0] == 0:
            return
        self._reserve(r, lo + a.shape[0])
        dst = r.rows[lo - r.first_token: lo - r.first_token + a.shape[0]]
        held = (dst != SENTINEL).any(axis=(1, 2))
        differ = held & (dst != a).any(axis=(1, 2))
        if differ.any():
            r.conflicts += int(differ.sum())
            if policy == "error":
                t = lo + int(np.flatnonzero(differ)[0])
                raise ValueError(f"{what}: request {request!r}, token {t}: new rows differ from the rows held")
        write = ~held | (differ if policy == "overwrite" else np.zeros_like(held))
        dst[write] = a[write]

    def append(self, request: str, start: int, rows) -> None:
        """A step computed positions [start, start + n) of the request: rows [n, L, k] (e.g. its segment of
        the capturer's step). Positions already held keep their rows unless on_conflict says otherwise."""
        r = self._get(request)
        if r.preempted:
            raise ValueError(f"append: request {request!r} is preempted; resume() it first")
        a = self._check_rows(rows, "append")
        if start > r.first_token + r.length:
            raise ValueError(f"append: request {request!r}: start {start} leaves a gap after the "
                             f"{r.first_token + r.length} tokens held")
        self._write(r, request, start, a, "append", self.on_conflict)

    def splice(self, request: str, rows, start: int = 0) -> None:
        """Rows computed elsewhere (a prefill instance) for positions [start, start + n): they replace
        what the store holds there (the decode instance never ran those tokens)."""
        r = self._get(request)
        self._write(r, request, start, self._check_rows(rows, "splice"), "splice", "overwrite")

    def trim(self, request: str, num_tokens: int) -> None:
        """Keeps positions [0, num_tokens): the rest were rejected draft tokens (speculative decoding) or
        tokens to recompute. Their rows become -1 again."""
        r = self._get(request)
        if not _is_int(num_tokens):
            raise ValueError(f"trim: num_tokens must be an integer, got {num_tokens!r}")
        if num_tokens < r.first_token:
            raise ValueError(f"trim: request {request!r}: cannot trim below first_token {r.first_token}")
        keep = num_tokens - r.first_token
        if keep < r.length:
            r.rows[keep:r.length] = SENTINEL
            r.length = keep

    def preempt(self, request: str) -> None:
        """The engine freed the request's KV cache; its rows stay here."""
        self._get(request).preempted = True

    def resume(self, request: str) -> None:
        """The request runs again; a recompute's append() of held positions keeps the held rows."""
        self._get(request).preempted = False

    # ------------------------------------------------------------ prefix cache
    def publish_blocks(self, request: str, block_hashes: Sequence[object]) -> None:
        """Block i (positions [i * block_size, (i + 1) * block_size)) of the request becomes a prefix-cache
        entry under block_hashes[i]; only blocks the store holds completely are published."""
        r = self._get(request)
        B = self.block_size
        for i, h in enumerate(block_hashes):
            lo, hi = i * B - r.first_token, (i + 1) * B - r.first_token
            if lo < 0 or hi > r.length:
                continue
            rows = r.rows[lo:hi]
            if (rows == SENTINEL).any():
                continue
            self._blocks[h] = rows.copy()

    def hydrate(self, request: str, block_hashes: Sequence[object]) -> int:
        """A prefix-cache hit of len(block_hashes) blocks: their rows are copied in (no forward will compute
        them). Every block must be known to the store (a hit must not leave -1 rows); returns the tokens
        hydrated."""
        r = self._get(request)
        missing = [i for i, h in enumerate(block_hashes) if h not in self._blocks]
        if missing:
            raise ValueError(f"hydrate: request {request!r}: blocks {missing} of the prefix hit have no rows in the "
                             "store (publish_blocks() them when they are filled)")
        B = self.block_size
        for i, h in enumerate(block_hashes):
            self._write(r, request, i * B, self._blocks[h], "hydrate", "overwrite")
        r.hydrated_blocks = list(block_hashes)
        return len(block_hashes) * B

    def evict_blocks(self, block_hashes: Sequence[object]) -> None:
        for h in block_hashes:
            self._blocks.pop(h, None)

    # ------------------------------------------------------------ results
    def num_tokens(self, request: str) -> int:
        r = self._get(request)
        return r.first_token + r.length

    def conflicts(self, request: str) -> int:
        return self._get(request).conflicts

    def routes(self, request: str, allow_missing: bool = False) -> RequestRoutes:
        """The request's rows so far as RequestRoutes (first_generated_token = prompt_len). A -1 row is an
        error naming the token unless allow_missing."""
        r = self._get(request)
        rows = r.rows[:r.length].copy()
        if not allow_missing:
            missing = (rows == SENTINEL).any(axis=(1, 2))
            if missing.any():
                t = r.first_token + int(np.flatnonzero(missing)[0])
                raise ValueError(f"request {request!r}: token {t} has no routed experts "
                                 f"({int(missing.sum())} of {r.length} tokens missing)")
        return RequestRoutes(request, rows, r.first_token, r.prompt_len)

    def finish(self, request: str, allow_missing: bool = False) -> RequestRoutes:
        out = self.routes(request, allow_missing)
        del self._requests[request]
        return out

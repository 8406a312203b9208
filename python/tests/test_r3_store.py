"""moekit.r3.RoutingStore against scripted scheduler traces: whatever the scheduler does (chunked
prefill, prefix-cache hits, speculative rejections, preemption with recompute, rows spliced from a
prefill instance), the finished request holds exactly the rows of the forwards that produced its
tokens, with no -1 and no stale row."""
import numpy as np
import pytest

from moekit import r3

L, K, E, B = 2, 3, 32, 4  # layers, top-k, experts, block size


def truth(prompt_seed: int, pos: int, variant: int = 0) -> np.ndarray:
    """The routing of position `pos` of a sequence, a deterministic function of the prefix (as a model's)."""
    rng = np.random.default_rng([prompt_seed, pos, variant])
    return np.stack([rng.permutation(E)[:K] for _ in range(L)]).astype(np.int16)


def rows(seed, lo, hi, variant=0):
    return np.stack([truth(seed, p, variant) for p in range(lo, hi)])


def test_chunked_prefill_decode_and_prefix_hit():
    s = r3.RoutingStore(L, K, B)
    s.add_request("a", prompt_len=10)
    s.append("a", 0, rows(1, 0, 6))       # chunk 1
    s.append("a", 6, rows(1, 6, 10))      # chunk 2
    s.append("a", 10, rows(1, 10, 11))    # decode
    s.publish_blocks("a", ["h0", "h1", "h2"])  # 11 tokens: blocks 0 and 1 full, block 2 not
    # "b" shares a's first 8 tokens: the engine hits two blocks and runs only tokens 8.. forward
    s.add_request("b", prompt_len=9)
    with pytest.raises(ValueError, match=r"blocks \[2\]"):
        s.hydrate("b", ["h0", "h1", "h2"])  # a hit on an unpublished block must not leave -1 rows
    assert s.hydrate("b", ["h0", "h1"]) == 8
    s.append("b", 8, rows(1, 8, 9, variant=1))
    got = s.finish("b")
    assert np.array_equal(got.ids[:8], rows(1, 0, 8)) and np.array_equal(got.ids[8:], rows(1, 8, 9, 1))
    assert got.first_generated_token == 9
    assert np.array_equal(s.finish("a").ids, rows(1, 0, 11))


def test_speculative_trim_leaves_no_stale_rows():
    s = r3.RoutingStore(L, K, B)
    s.add_request("a", prompt_len=5)
    s.append("a", 0, rows(2, 0, 5))
    s.append("a", 5, rows(2, 5, 9, variant=7))  # verify 4 draft tokens; 2 accepted
    s.trim("a", 7)
    assert s.num_tokens("a") == 7
    s.append("a", 7, rows(2, 7, 9))            # the next step recomputes 7, 8 with the real tokens
    got = s.finish("a").ids
    assert np.array_equal(got[:5], rows(2, 0, 5)) and np.array_equal(got[5:7], rows(2, 5, 7, 7))
    assert np.array_equal(got[7:], rows(2, 7, 9))  # not the rejected drafts' rows


def test_preemption_recompute_keeps_the_rows_that_produced_the_tokens():
    s = r3.RoutingStore(L, K, B)
    s.add_request("a", prompt_len=6)
    s.append("a", 0, rows(3, 0, 6))
    s.append("a", 6, rows(3, 6, 7))
    s.preempt("a")
    with pytest.raises(ValueError, match="preempted"):
        s.append("a", 7, rows(3, 7, 8))
    s.resume("a")
    s.append("a", 0, rows(3, 0, 8, variant=9))  # recompute in another batch: differs (batch-variant kernel)
    assert s.conflicts("a") == 7
    got = s.finish("a").ids
    assert np.array_equal(got[:7], rows(3, 0, 7)) and np.array_equal(got[7], truth(3, 7, 9))
    strict = r3.RoutingStore(L, K, B, on_conflict="error")
    strict.add_request("a", 2)
    strict.append("a", 0, rows(3, 0, 2))
    with pytest.raises(ValueError, match="token 0: new rows differ"):
        strict.append("a", 0, rows(3, 0, 2, variant=1))


def test_disaggregated_prefill_is_spliced_and_gaps_are_errors():
    s = r3.RoutingStore(L, K, B)
    s.add_request("a", prompt_len=12, first_token=2)  # a multi-turn request: tokens 0, 1 captured before
    with pytest.raises(ValueError, match="leaves a gap"):
        s.append("a", 12, rows(4, 12, 13))
    s.splice("a", rows(4, 0, 12))  # the prefill instance's rows; 0, 1 are dropped (first_token)
    s.append("a", 12, rows(4, 12, 14))
    got = s.finish("a")
    assert got.first_token == 2 and np.array_equal(got.ids, rows(4, 2, 14))
    s.add_request("b", prompt_len=3)
    s.append("b", 0, rows(5, 0, 1))
    s.trim("b", 0)
    s.append("b", 0, rows(5, 0, 3))
    bad = rows(5, 3, 4)
    bad[0] = -1
    with pytest.raises(ValueError, match="token 3: the row is the sentinel"):
        s.append("b", 3, bad)
    assert s.num_tokens("b") == 3


def test_missing_rows_are_named():
    s = r3.RoutingStore(L, K, B)
    s.add_request("a", prompt_len=4)
    s.append("a", 0, rows(6, 0, 4))
    s.trim("a", 4)
    r = s.routes("a")
    assert r.num_tokens == 4
    s2 = r3.RoutingStore(L, K, B)
    s2.add_request("x", prompt_len=4)
    s2.splice("x", rows(6, 2, 4), start=2)
    with pytest.raises(ValueError, match="token 0 has no routed experts"):
        s2.finish("x")

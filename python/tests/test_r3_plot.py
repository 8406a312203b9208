"""moekit.r3.plot: the numbers it draws, each against a count written out here by loops over the ids, and
the PNG it writes (read back: its size, and not blank)."""
import numpy as np
import pytest

from moekit import r3
from moekit.r3 import plot as r3plot

E, K, L = 16, 4, 3


def capture(seed, requests=(("a", 40, 0), ("b", 25, 3)), skew=0.0):
    rng = np.random.default_rng(seed)
    p = np.exp(-skew * np.arange(E)); p /= p.sum()
    reqs = []
    for name, T, first in requests:
        ids = np.stack([rng.choice(E, K, replace=False, p=p) for _ in range(T * L)]).astype(np.int16).reshape(T, L, K)
        reqs.append(r3.RequestRoutes(name, ids, first))
    return r3.Capture(E, [1, 3, 5], r3.routing_dict("renormalize", K), reqs)


def counted_load(cap):
    load = np.zeros((L, E), np.int64)
    for r in cap.requests:
        for t in range(r.num_tokens):
            for layer in range(L):
                for e in r.ids[t, layer]:
                    if e >= 0:
                        load[layer, e] += 1
    return load


def test_expert_load_counts_every_captured_pair_and_skips_uncaptured_rows():
    cap = capture(1, skew=0.3)
    cap.requests[0].ids[5, 1, :] = -1  # a token never captured in layer 1
    load = r3plot.expert_load(cap)
    assert np.array_equal(load, counted_load(cap))
    assert load[0].sum() == 65 * K and load[1].sum() == 64 * K
    ratio = r3plot.busiest_over_mean(load)
    assert np.allclose(ratio, load.max(axis=1) / (load.sum(axis=1) / E))
    assert (ratio > 1.5).all()  # skewed routing: the busiest expert well above the mean


def test_route_difference_is_the_fraction_of_tokens_whose_set_changed():
    a = capture(2)
    b = capture(2)
    # Same sets in another order do not count; a changed set does, per layer.
    b.requests[0].ids[:, 0, :] = b.requests[0].ids[:, 0, ::-1]
    changed = [(0, 3, 1), (0, 10, 1), (1, 4, 2)]  # (request, token, layer)
    for r, t, layer in changed:
        row = b.requests[r].ids[t, layer]
        row[0] = next(e for e in range(E) if e not in row)
    differ = r3plot.route_difference(a, b)
    assert np.allclose(differ, [0.0, 2 / 65, 1 / 65])
    # Request "b" starts at token 3 in a; a capture of it from token 0 is aligned by position.
    shifted = capture(2)
    shifted.requests[1] = r3.RequestRoutes("b", np.concatenate([np.full((3, L, K), -1, np.int16),
                                                                a.requests[1].ids]), 0)
    assert np.allclose(r3plot.route_difference(a, shifted), 0.0)


def test_route_difference_refuses_captures_that_cannot_be_compared():
    a = capture(3)
    with pytest.raises(ValueError, match="share no captured token"):
        r3plot.route_difference(a, capture(3, requests=(("other", 5, 0),)))
    wide = r3.Capture(2 * E, a.model_layers, a.routing, a.requests)
    with pytest.raises(ValueError, match="differ in shape"):
        r3plot.route_difference(a, wide)


def test_load_over_steps_is_the_ratio_in_each_window():
    cap = capture(4, skew=0.2)
    steps = r3plot.load_over_steps(cap, window=16)
    assert steps.shape == (-(-65 // 16), L)
    ids = np.concatenate([r.ids for r in cap.requests])
    first = ids[:16]
    for layer in range(L):
        load = np.bincount(first[:, layer].reshape(-1), minlength=E)
        assert steps[0, layer] == pytest.approx(load.max() / load.mean())
    with pytest.raises(ValueError, match="window"):
        r3plot.load_over_steps(cap, 0)


def test_plot_writes_a_picture_of_those_numbers(tmp_path):
    mpl_image = pytest.importorskip("matplotlib.image")
    a, b = capture(5, skew=0.3), capture(6, skew=0.3)
    path_a = tmp_path / "a.safetensors"
    r3.write_capture(path_a, a)
    out = tmp_path / "load.png"
    numbers = r3plot.plot(path_a, out, vs=b, window=16)
    assert np.array_equal(numbers["load"], counted_load(a))
    assert numbers["differ"].shape == (L,) and (numbers["differ"] > 0.5).all()  # unrelated captures
    img = mpl_image.imread(out)
    assert img.shape[0] >= 400 and img.shape[1] >= 1500  # three panels at 100 dpi
    assert img[..., :3].std() > 0.05  # not blank
    single = tmp_path / "single.png"
    r3plot.main([str(path_a), "-o", str(single)])
    assert mpl_image.imread(single).shape[1] < img.shape[1]  # two panels without --vs

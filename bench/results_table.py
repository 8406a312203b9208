#!/usr/bin/env python3
"""Side-by-side table of benchmark results: moekit (this run), the previous
version, the floor and the Triton peer of the same run, and optionally a
reference column of published times.

  python3 bench/results_table.py --moekit R/moekit_balanced.json --peer R/triton_balanced.json \
      [--previous OLD/moekit_balanced.json] [--reference ref.json]

ref.json: {"shape": {"M": time_us, ...}, ...}. Times in us; ratios are moekit / other.
"""
import argparse
import json


def cases(path):
    with open(path) as f:
        return {(c["shape"], c["m"]): c for c in json.load(f)["cases"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moekit", required=True)
    ap.add_argument("--peer", default="")
    ap.add_argument("--previous", default="")
    ap.add_argument("--reference", default="", help="published times: {shape: {M: us}}")
    a = ap.parse_args()
    mk = cases(a.moekit)
    peer = cases(a.peer) if a.peer else {}
    prev = cases(a.previous) if a.previous else {}
    ref = json.load(open(a.reference)) if a.reference else {}
    print(f"{'shape':<18} {'M':>6} {'exp':>6} {'max/mu':>6} {'floor_us':>9} {'moekit_us':>10} {'%floor':>7}"
          f" {'prev_us':>9} {'mk/prev':>7} {'triton_us':>10} {'mk/tri':>7} {'ref_us':>8} {'mk/ref':>7}")
    for (shape, m), c in mk.items():
        t = c["time_us"]
        p = prev.get((shape, m), {}).get("time_us")
        q = peer.get((shape, m), {}).get("time_us")
        r = ref.get(shape, {}).get(str(m))
        fmt = lambda v, w, d=1: f"{v:>{w}.{d}f}" if v else f"{'-':>{w}}"
        print(f"{shape:<18} {m:>6} {c['touched_experts']:>6.1f} {c.get('max_over_mean_tokens', 0):>6.2f}"
              f" {c['floor_us']:>9.1f} {t:>10.1f} {100 * c['frac_floor']:>6.1f}%"
              f" {fmt(p, 9)} {fmt(p and t / p, 7, 2)} {fmt(q, 10)} {fmt(q and t / q, 7, 2)}"
              f" {fmt(r, 8)} {fmt(r and t / r, 7, 2)}")


if __name__ == "__main__":
    main()

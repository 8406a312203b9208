#!/usr/bin/env python3
"""The 4-bit table of one benchmark run: for each shape and M, each 4-bit
scheme's time, its share of its floor (max of packed bytes + scales over the
read ceiling, FLOPs over the bf16 matmul rate), and its speed-up over the bf16
and fp8-block layers timed in the same run (gpu_moe_bench JSON files).

    bench/weight4_table.py DIR     (DIR holds bf16.json, fp8-block.json, mxfp4.json, int4_g128.json, ...)
"""
import json
import pathlib
import sys


def cases(path):
    if not path.exists():
        return {}
    return {(c["shape"], c["m"]): c for c in json.loads(path.read_text())["cases"]}


def main(folder):
    folder = pathlib.Path(folder)
    bf16, fp8 = cases(folder / "bf16.json"), cases(folder / "fp8-block.json")
    for scheme in ("mxfp4", "int4_g32", "int4_g128"):
        w4 = cases(folder / f"{scheme}.json")
        if not w4:
            continue
        print(f"\n{scheme}: time, % of its floor, speed-up over bf16 and fp8-block (same run)")
        print(f"{'shape':<20}{'M':>6}{'us':>10}{'%floor':>8}{'x bf16':>8}{'x fp8':>8}")
        for (shape, m), c in sorted(w4.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            t = c["time_us"]
            vs = [f"{d[(shape, m)]['time_us'] / t:8.2f}" if (shape, m) in d else f"{'-':>8}" for d in (bf16, fp8)]
            print(f"{shape:<20}{m:>6}{t:>10.1f}{100 * c['frac_floor']:>8.1f}{vs[0]}{vs[1]}")
    for scheme in ("mxfp4", "int4_g32", "int4_g128"):
        paths = {p: cases(folder / f"{scheme}_{p}.json") for p in ("streaming", "mixed", "dequant")}
        paths = {p: d for p, d in paths.items() if d}
        if not paths:
            continue
        auto = cases(folder / f"{scheme}.json")
        print(f"\n{scheme} by GEMM path (each forced in its own process): us, and bf16's")
        print(f"{'shape':<20}{'M':>6}{'auto':>10}" + "".join(f"{p:>10}" for p in paths) + f"{'bf16':>10}")
        for key in sorted(next(iter(paths.values())), key=lambda k: (k[0], k[1])):
            row = [d[key]["time_us"] if key in d else float("nan") for d in (auto, *paths.values(), bf16)]
            print(f"{key[0]:<20}{key[1]:>6}" + "".join(f"{v:>10.1f}" for v in row))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/latest")

"""The table of scripts/ab_trees.sh: per case, each tree's median over its
rounds of the CUDA-graph launch time and of the eager host cost, the new/base
ratio, and each tree's run-to-run spread (max/min over its rounds)."""
import glob
import json
import os
import statistics
import sys


def load(folder, side):
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, f"{side}_*.json"))):
        with open(path) as f:
            runs.append({(c["shape"], c["m"]): c for c in json.load(f)["cases"]})
    return runs


def main():
    folder = sys.argv[1]
    base, new = load(folder, "base"), load(folder, "new")
    if not base or not new:
        sys.exit(f"ab_table: no base_*.json / new_*.json in {folder}")
    keys = [k for k in base[0] if all(k in r for r in base + new)]
    print(f"{'case':<28}{'base us':>9}{'new us':>9}{'new/base':>9}{'spread b':>9}{'spread n':>9}"
          f"{'host b':>8}{'host n':>8}")
    worst = []
    for key in keys:
        tb = [r[key]["time_us"] for r in base]
        tn = [r[key]["time_us"] for r in new]
        hb = statistics.median(r[key]["enqueue_us"] for r in base)
        hn = statistics.median(r[key]["enqueue_us"] for r in new)
        ratio = statistics.median(tn) / statistics.median(tb)
        spread = max(max(tb) / min(tb), max(tn) / min(tn))
        worst.append((ratio / spread, key))
        print(f"{key[0] + ' M=' + str(key[1]):<28}{statistics.median(tb):>9.2f}{statistics.median(tn):>9.2f}"
              f"{ratio:>9.3f}{max(tb) / min(tb):>9.3f}{max(tn) / min(tn):>9.3f}{hb:>8.1f}{hn:>8.1f}")
    slower = [k for r, k in worst if r > 1.0]
    print(f"{len(keys)} cases; slower than base by more than the run-to-run spread: "
          f"{len(slower)}{' (' + ', '.join(f'{s} M={m}' for s, m in slower) + ')' if slower else ''}")


if __name__ == "__main__":
    main()

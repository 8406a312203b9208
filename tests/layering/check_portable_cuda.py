#!/usr/bin/env python3
"""Checks the CUDA architecture split of the build (compile_commands.json):
every .cu of src/ is compiled for each portable architecture (SASS) and the
portable PTX, except the CUTLASS sm90 sources (*_cutlass_sm90*.cu), which are
sm_90a alone. Every other .cu of src/ must appear in the build (the CUTLASS
ones, *_cutlass*.cu, are optional: MOEKIT_CUTLASS_KERNELS, headers found).

  check_portable_cuda.py COMPILE_COMMANDS SRC_DIR "80;89" 89
"""
import json
import pathlib
import sys


def main() -> int:
    commands, src, archs, ptx = sys.argv[1], pathlib.Path(sys.argv[2]).resolve(), sys.argv[3], sys.argv[4]
    want = [f"code=sm_{a}" for a in archs.split(";") if a] + ([f"code=compute_{ptx}"] if ptx else [])
    built = {}
    for entry in json.load(open(commands)):
        path = pathlib.Path(entry["file"]).resolve()
        if path.suffix == ".cu" and src in path.parents:
            built[path] = entry.get("command") or " ".join(entry.get("arguments", []))
    problems = []
    for path in sorted(src.rglob("*.cu")):
        rel = path.relative_to(src)
        cutlass = "_cutlass_sm90" in path.name
        if path not in built:
            if "_cutlass" not in path.name:
                problems.append(f"{rel}: not in the build")
            continue
        has = [w for w in want if w in built[path]]
        if cutlass:
            if has:
                problems.append(f"{rel}: a CUTLASS sm90 source compiled for the portable architectures too ({has})")
        elif len(has) != len(want):
            problems.append(f"{rel}: lacks {[w for w in want if w not in has]} (moekit_portable_cuda_sources)")
    for p in problems:
        print("FAIL", p)
    print(f"{len(built)} CUDA sources of src/ checked against {want}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

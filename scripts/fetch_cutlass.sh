#!/usr/bin/env bash
# Puts the CUTLASS/CuTe headers of PyPI nvidia-cutlass (pinned) into
# .deps/cutlass/include, where cmake/deps.cmake looks for them. Needs pip with
# network. Used by scripts/setup.sh (when nvcc is present) and vendor_deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly CUTLASS_VERSION=4.2.0.0
readonly DEST=.deps/cutlass

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_cutlass: CUTLASS headers from nvidia-cutlass==$CUTLASS_VERSION"
python3 -m pip download --quiet --no-deps --dest "$tmp/whl" "nvidia-cutlass==$CUTLASS_VERSION"
rm -rf "$DEST"
mkdir -p "$DEST"
# The wheel holds the headers under cutlass_library/source/include/{cutlass,cute}.
python3 - "$tmp"/whl/nvidia_cutlass-*.whl "$DEST" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix + "include/") and not name.endswith("/"):
            out = os.path.join(dest, name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as src, open(out, "wb") as dst:
                dst.write(src.read())
PY
test -f "$DEST/include/cutlass/cutlass.h"
test -f "$DEST/include/cute/tensor.hpp"

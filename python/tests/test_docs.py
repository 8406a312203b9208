"""Every code block of README.md and docs/*.md is run or checked against what runs, so none can rot.

The note above a block (doc_blocks.py reads it) says how:
- python: the block runs as written, on the CPU, in a fresh working folder, after its `setup:`
  code (what it needs but does not define: tensors, a model, a file).
- sh / bash: the same, through bash (`set -euo pipefail`), with this Python first on PATH;
  `setup:` is Python code run before it in the same folder. Or, with `synopsis: moekit`, a
  command-line synopsis: every subcommand exists and every option it shows is in that
  subcommand's --help. Or, with `run-by: SCRIPT`, a command the test command runs: SCRIPT
  runs the block itself (`doc_blocks.py NAME` with the block's `name:`), or every line of the
  block is a line of SCRIPT.
- cpp / cmake: `from: FILE`, a file the test command builds and runs: every line of the block
  is a line of FILE, in the same order (leading spaces aside), so it compiles and runs there.
`needs:` names a requirement (`vllm`: the vllm package; `vllm-gpu`: a vLLM engine on a GPU;
`gpu`: a CUDA GPU; `matplotlib`), and the block is skipped, with that reason, where it is not met.
"""
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from doc_blocks import ROOT, blocks

BLOCKS = list(blocks())
CODE = {"python", "sh", "bash", "cpp", "cmake"}


def _params(select):
    return [pytest.param(b, id=b.id) for b in BLOCKS if select(b)]


def _missing(need):
    if need == "vllm":
        return None if importlib.util.find_spec("vllm") else "needs vLLM installed"
    if need == "vllm-gpu":  # a rollout on a GPU engine (Model Runner V2): no such engine runs in this suite
        return "needs vLLM serving on a GPU; not run by this suite"
    if need == "matplotlib":  # the package's `plot` extra
        return None if importlib.util.find_spec("matplotlib") else "needs matplotlib (the plot extra)"
    if need == "gpu":
        return None if shutil.which("nvidia-smi") else "needs a CUDA GPU"
    raise AssertionError(f"unknown doctest requirement {need!r}")


def _skip_unmet(block):
    for need in block.needs:
        reason = _missing(need)
        if reason:
            pytest.skip(reason)


def _lines(text):
    """Non-blank lines without their indentation."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def test_the_pages_have_code_blocks_and_every_one_is_covered():
    assert {"README.md", "docs/capture.md", "docs/r3.md", "docs/vllm.md"} <= {b.page for b in BLOCKS}
    for b in BLOCKS:
        if b.lang:
            assert b.lang in CODE, f"{b.id}: a ```{b.lang} block, which this test does not know how to run"
        if b.lang in ("cpp", "cmake"):
            assert "from" in b.keys, f"{b.id}: a {b.lang} block needs `from: FILE`, the source it is quoted from"
        if "run-by" in b.keys or "synopsis" in b.keys or "from" in b.keys:
            assert len({"run-by", "synopsis", "from"} & b.keys.keys()) == 1, f"{b.id}: one of run-by/synopsis/from"


@pytest.mark.parametrize("block", _params(lambda b: b.lang == "python"))
def test_python_block_runs(block, tmp_path, monkeypatch):
    _skip_unmet(block)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(block.setup, "doctest setup", "exec"), namespace)
    exec(compile(block.code, "doc block", "exec"), namespace)


@pytest.mark.parametrize("block", _params(lambda b: b.lang in ("sh", "bash") and not b.keys.keys() - {"name"}))
def test_shell_block_runs(block, tmp_path, monkeypatch):
    _skip_unmet(block)
    monkeypatch.chdir(tmp_path)
    exec(compile(block.setup, "doctest setup", "exec"), {})
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run(["bash", "-c", "set -euo pipefail\n" + block.code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"


def _built_and_run(source):
    """Where the test command builds and runs `source` (a path under the repository), or None."""
    cpp_package = (ROOT / "scripts/check_cpp_package.sh").read_text()
    if source == "examples/cpp/CMakeLists.txt":
        return "scripts/check_cpp_package.sh" if "-S examples/cpp" in cpp_package else None
    if m := re.fullmatch(r"examples/cpp/(\w+)\.cpp", source):
        built = f"add_executable({m[1]} {m[1]}.cpp)" in (ROOT / "examples/cpp/CMakeLists.txt").read_text()
        return "scripts/check_cpp_package.sh" if built and f"/example/{m[1]}\"" in cpp_package else None
    if m := re.fullmatch(r"tests/(\w+)/(\w+)\.cpp", source):  # a unit test, which ctest -L unit runs
        listed = (ROOT / "tests" / m[1] / "CMakeLists.txt").read_text()
        return "ctest -L unit" if re.search(rf"LABEL unit SOURCES {m[2]}\.cpp\b", listed) else None
    if m := re.fullmatch(r"tools/(\w+\.cpp)", source):  # the moekit binary, which the CLI tests run
        return "tools/CMakeLists.txt" if m[1] in (ROOT / "tools/CMakeLists.txt").read_text() else None
    return None


@pytest.mark.parametrize("block", _params(lambda b: "from" in b.keys))
def test_quoted_block_is_in_a_source_the_tests_build_and_run(block):
    source = block.keys["from"]
    assert _built_and_run(source), f"{block.id}: {source} is not a file the test command builds and runs"
    have = _lines((ROOT / source).read_text())
    at = 0
    for line in _lines(block.code):
        try:
            at = have.index(line, at) + 1
        except ValueError:
            pytest.fail(f"{block.id}: {line!r} is not in {source} (after the block's earlier lines)")


@pytest.mark.parametrize("block", _params(lambda b: "run-by" in b.keys))
def test_run_by_block_is_what_the_test_command_runs(block):
    script = block.keys["run-by"]
    text = (ROOT / script).read_text()
    runner = (ROOT / ".ci/run").read_text() + (ROOT / "scripts/test.sh").read_text()
    assert script == ".ci/run" or script in runner, f"{block.id}: the test command does not run {script}"
    if "name" in block.keys:
        ran = re.search(rf"doc_blocks\.py\"?\s+{re.escape(block.keys['name'])}\b", text)
        assert ran, f"{script} does not run block {block.keys['name']} (doc_blocks.py {block.keys['name']})"
    else:
        have = _lines(text)
        for line in _lines(block.code):
            assert line in have, f"{block.id}: {line!r} is not a line of {script}"


def _cli():
    for c in (os.environ.get("MOEKIT_CLI", ""), shutil.which("moekit") or "",
              str(ROOT / os.environ.get("MOEKIT_BUILD_DIR", "build") / "moekit")):
        if c and os.access(c, os.X_OK):
            return c
    pytest.skip("no moekit command line binary (set MOEKIT_CLI, install the package, or build into build/)")


@pytest.mark.parametrize("block", _params(lambda b: b.keys.get("synopsis") == "moekit"))
def test_cli_synopsis_matches_the_command_line(block):
    cli = _cli()
    commands = re.split(r"^(?=moekit )", block.code, flags=re.M)
    checked = 0
    for text in filter(None, commands):
        text = re.sub(r"#.*", "", text)  # comments
        words = text.split()
        sub = [w for w in words[1:3] if re.fullmatch(r"[a-z]+", w)][: 2 if words[1] == "capture" else 1]
        r = subprocess.run([cli, *sub, "--help"], capture_output=True, text=True)
        assert r.returncode == 0, f"{block.id}: `moekit {' '.join(sub)} --help` failed: {r.stderr}"
        offered = set(re.findall(r"--[a-z0-9-]+", r.stdout))
        if offered == {"--help"}:  # a subcommand whose options this build leaves out (bench: GPU builds)
            continue
        for option in re.findall(r"(?<![\w-])--[a-z0-9-]+", text):
            assert option in offered, f"{block.id}: `moekit {' '.join(sub)}` has no {option}"
            checked += 1
    assert checked > 20, f"{block.id}: only {checked} options checked"

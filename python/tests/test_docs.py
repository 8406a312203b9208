"""Every Python block of README.md and docs/*.md runs as written, on the CPU, so none can rot.

A block may be preceded by a comment the rendered page does not show, giving what the block
needs but does not define (tensors, a model, a file) and what it cannot run without:

    <!-- doctest
    needs: vllm
    setup:
    import torch
    hidden = torch.randn(4, 64)
    -->

`setup:` code runs first, in the block's namespace and in a fresh working folder (`setup: as
above` repeats the previous block's setup on that page); `needs:`
names a requirement (`vllm`: the vllm package; `vllm-gpu`: a vLLM engine on a GPU, which this suite
never has), and the block is skipped, with that reason, where it is not met. A block without a comment runs alone.
"""
import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"(?:<!-- doctest\n(?P<note>(?:(?!-->).)*)-->\n\s*)?^```python\n(?P<code>.*?)^```", re.M | re.S)


def _blocks():
    for page in PAGES:
        text, previous = page.read_text(), ""
        for m in BLOCK.finditer(text):
            line = text[: m.start("code")].count("\n")
            needs = []
            note = (m.group("note") or "").replace("setup: as above\n", "setup:\n" + previous)
            head, _, setup = note.partition("setup:\n")
            previous = setup
            for entry in head.splitlines():
                if entry.startswith("needs:"):
                    needs += entry[len("needs:"):].split()
            yield pytest.param(m.group("code"), setup, needs, id=f"{page.relative_to(ROOT)}:{line}")


BLOCKS = list(_blocks())


def _missing(need):
    if need == "vllm":
        return None if importlib.util.find_spec("vllm") else "needs vLLM installed"
    if need == "vllm-gpu":  # a rollout on a GPU engine (Model Runner V2): no such engine runs in this suite
        return "needs vLLM serving on a GPU; not run by this suite"
    raise AssertionError(f"unknown doctest requirement {need!r}")


def test_the_pages_have_python_blocks():
    pages = {p.id.split(":")[0] for p in BLOCKS}
    assert "README.md" in pages and len(pages) >= 6, pages


@pytest.mark.parametrize("code, setup, needs", BLOCKS)
def test_doc_block_runs(code, setup, needs, tmp_path, monkeypatch):
    for need in needs:
        reason = _missing(need)
        if reason:
            pytest.skip(reason)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(setup, "doctest setup", "exec"), namespace)
    exec(compile(code, "doc block", "exec"), namespace)

"""The fenced code blocks of README.md and docs/*.md, each with the doctest note above it.

A note is an HTML comment the rendered page does not show, right before the block:

    <!-- doctest
    needs: vllm
    name: readme-install
    from: examples/cpp/capture_requests.cpp
    run-by: scripts/check_wheel.sh
    synopsis: moekit
    setup:
    import torch
    hidden = torch.randn(4, 64)
    -->

What each key means is test_docs.py's business; this module only reads them.
`setup: as above` repeats the previous block's setup on that page.

    python3 python/tests/doc_blocks.py NAME    # prints the block named NAME (a script runs it)
"""
import dataclasses
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"(?:<!-- doctest\n(?P<note>(?:(?!-->).)*)-->\n\s*)?^```(?P<lang>[\w+]*)\n(?P<code>.*?)^```",
                   re.M | re.S)
KEYS = ("needs", "name", "from", "run-by", "synopsis")


@dataclasses.dataclass
class Block:
    page: str   # relative to the repository root
    line: int   # of the block's first code line, 1-based
    lang: str   # the fence's language tag, "" for none
    code: str
    setup: str = ""
    needs: list = dataclasses.field(default_factory=list)
    keys: dict = dataclasses.field(default_factory=dict)  # name, from, run-by, synopsis

    @property
    def id(self):
        return f"{self.page}:{self.line}"


def blocks():
    for page in PAGES:
        text, previous = page.read_text(), ""
        for m in FENCE.finditer(text):
            note = (m.group("note") or "").replace("setup: as above\n", "setup:\n" + previous)
            head, _, setup = note.partition("setup:\n")
            previous = setup
            b = Block(str(page.relative_to(ROOT)), text[: m.start("code")].count("\n") + 1, m.group("lang"),
                      m.group("code"), setup)
            for entry in head.splitlines():
                key, sep, value = entry.partition(":")
                if not entry.strip():
                    continue
                if not sep or key not in KEYS:
                    raise ValueError(f"{b.id}: unknown doctest note line {entry!r} (keys: {', '.join(KEYS)}, setup)")
                if key == "needs":
                    b.needs += value.split()
                else:
                    b.keys[key] = value.strip()
            yield b


def named(name):
    found = [b for b in blocks() if b.keys.get("name") == name]
    if len(found) != 1:
        raise LookupError(f"{len(found)} doc blocks are named {name!r}, expected one")
    return found[0]


if __name__ == "__main__":
    sys.stdout.write(named(sys.argv[1]).code)

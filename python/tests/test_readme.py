"""The README's Python snippets run as written, on the CPU, so none can rot."""
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_snippets():
    assert SNIPPETS, "README.md has no ```python block"


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index):
    exec(compile(SNIPPETS[index], f"README.md python block {index}", "exec"), {})

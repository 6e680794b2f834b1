"""The Python code blocks of the README and of the docs it moved to run as written.

Each ```python block runs on its own, in a scratch folder. README.md's five examples, and
the blocks of docs/user-guide.md and docs/special_activations.md (which were the README's
before 0.3) are run, so an example in them cannot rot.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = ("README.md", "docs/user-guide.md", "docs/special_activations.md")


def _blocks(name):
    text = (ROOT / name).read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


BLOCKS = [(name, index, code) for name in FILES for index, code in enumerate(_blocks(name))]


def test_readme_has_python_blocks():
    assert len(_blocks("README.md")) >= 5
    assert len(_blocks("docs/user-guide.md")) >= 5


@pytest.mark.parametrize("name, index, code", BLOCKS,
                         ids=[f"{name}-{index}" for name, index, _ in BLOCKS])
def test_readme_block_runs(name, index, code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)          # blocks that save files write here
    # blocks that generate kernels must not write into the user's real cache
    monkeypatch.setenv("SYMQUAD_CACHE_DIR", str(tmp_path / "kernel-cache"))
    exec(compile(code, f"{name} python block {index}", "exec"), {"__name__": "__readme__"})

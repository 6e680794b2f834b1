"""The README's Python code blocks run as written (each block on its own, in a scratch folder)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)          # blocks that save files write here
    # blocks that generate kernels must not write into the user's real cache
    monkeypatch.setenv("SYMQUAD_CACHE_DIR", str(tmp_path / "kernel-cache"))
    code = BLOCKS[index]
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})

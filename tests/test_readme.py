"""The Python code blocks of the README and of the docs it moved to run as written.

Each ```python block runs on its own, in a scratch folder. README.md's five examples, and
the blocks of docs/user-guide.md and docs/special_activations.md (which were the README's
before 0.3) are run, so an example in them cannot rot.
"""

import os
import re
from pathlib import Path

import pytest

from conftest import session_cache_dir

ROOT = Path(__file__).resolve().parents[1]
FILES = ("README.md", "docs/user-guide.md", "docs/special_activations.md")


def _blocks(name):
    text = (ROOT / name).read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


BLOCKS = [(name, index, code) for name in FILES for index, code in enumerate(_blocks(name))]


# Blocks that take more than a few seconds as written on the 2-core reference machine (the
# whole-run SDE of erf at p = 4 alone is ≈ 2.5 min, the resolution's sensitivities ≈ 10 s per
# validate): as written they run with ``-m slow``; the default run runs the same calls at a
# smaller size (N, replicas, time window, p), each substitution matching the block exactly once
# so that an edited block is noticed.
SMALLER = {
    ("README.md", 1): [("N=500, replicas=8, t_max=5.0", "N=200, replicas=4, t_max=1.0")],
    ("docs/user-guide.md", 0): [("N=500, replicas=8, t_max=5.0", "N=200, replicas=4, t_max=1.0")],
    ("README.md", 2): [("N=1000, t_max=30.0, replicas=16", "N=200, t_max=3.0, replicas=16")],
    ("docs/user-guide.md", 1): [("N=1000, t_max=60.0, replicas=24",
                                 "N=200, t_max=3.0, replicas=16")],
    ("README.md", 3): [("t_eval=np.linspace(0, 5, 6)", "t_eval=np.linspace(0, 1, 3)"),
                       ("t_max=5.0, replicas=8", "t_max=1.0, replicas=4")],
    ("docs/user-guide.md", 4): [("t_eval=np.linspace(0, 5, 6)", "t_eval=np.linspace(0, 1, 3)"),
                                ("t_max=5.0, replicas=8", "t_max=1.0, replicas=4"),
                                ("n_samples=32, n_eval=300", "n_samples=8, n_eval=100")],
    ("docs/user-guide.md", 3): [('"plateau", N=12', '"plateau", N=6'),
                                ("N=1000, n_samples=64", "N=1000, n_samples=16")],
    # the optimal schedule's 10 pieces ≈ 4 s of CPU (adjoint gradients), the compare ≈ 2 s
    ("docs/user-guide.md", 7): [("N=1000, t_max=5, replicas=32", "N=1000, t_max=3, replicas=8"),
                                ("n_pieces=10", "n_pieces=3")],
    ("docs/special_activations.md", 0): [
        ('p=4, p_star=2, lr=1.0, activation="erf"', 'p=2, p_star=1, lr=1.0, activation="erf"'),
        # t <= 1 (2 before): still PASS with every stage run; the resolution's sensitivities
        # from the four starts 4.7 -> 2.8 s of CPU
        ("N=2000, replicas=32, start=\"random\", fss=False, t_max=10.0",
         "N=500, replicas=16, start=\"random\", fss=False, t_max=1.0")],
}


def smaller(name, index, code):
    """`code` with the substitutions of :data:`SMALLER` (each must match exactly once)."""
    for old, new in SMALLER[(name, index)]:
        assert code.count(old) == 1, f"{name} block {index} no longer contains {old!r}"
        code = code.replace(old, new)
    return code


def test_readme_has_python_blocks():
    assert len(_blocks("README.md")) >= 5
    assert len(_blocks("docs/user-guide.md")) >= 5


def _run(name, index, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)          # blocks that save files write here
    # Kernels the blocks generate go to the test session's cache (tests/conftest.py points
    # SYMQUAD_CACHE_DIR at a temporary folder, never the user's): shared by the blocks, so a
    # Jacobian module one block derives (≈ 15 s of SymPy at p = 4) is not derived again.
    assert os.environ["SYMQUAD_CACHE_DIR"] == session_cache_dir()
    exec(compile(code, f"{name} python block {index}", "exec"), {"__name__": "__readme__"})


@pytest.mark.parametrize(
    "name, index, code",
    [pytest.param(*b, marks=pytest.mark.slow) if b[:2] in SMALLER else b for b in BLOCKS],
    ids=[f"{name}-{index}" for name, index, _ in BLOCKS])
def test_readme_block_runs(name, index, code, tmp_path, monkeypatch, capsys):
    """Each block as written (the costly ones, :data:`SMALLER`, with ``-m slow``)."""
    _run(name, index, code, tmp_path, monkeypatch)


CHEAP = [b for b in BLOCKS if b[:2] in SMALLER]


@pytest.mark.parametrize("name, index, code", CHEAP,
                         ids=[f"{name}-{index}" for name, index, _ in CHEAP])
def test_readme_block_runs_smaller(name, index, code, tmp_path, monkeypatch, capsys):
    """The costly blocks' calls at the sizes of :data:`SMALLER` (default run)."""
    _run(name, index, smaller(name, index, code), tmp_path, monkeypatch)


def test_every_smaller_block_exists():
    assert set(SMALLER) <= {b[:2] for b in BLOCKS}

"""Every derivation script runs, prints its stage and passes its own cross-check."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "derivations").glob("[0-9]*.py"))


#: Smaller arguments of the costly scripts in the default run (the same derivation and
#: cross-checks at a smaller size; measured CPU on the 2-core machine: 04_manifold 29 s ->
#: 4 s, 05_landscape 17 s -> 9 s, 04_invariant_S 8 s -> 5 s).  ``-m slow`` runs every
#: script as written (its defaults).
SMALLER = {
    "04_manifold.py": ["--p-max", "8"],
    "05_landscape.py": ["--p", "2", "--p-star", "1", "--N", "4"],
    "04_invariant_S.py": ["--p", "2", "--p-star", "1"],
}


def _start_all(args):
    """Every script started at once, as many at a time as there are cores (independent
    processes: the wall time of the module is about the sum over the cores, not over the
    scripts); each test waits for its own."""
    pool = ThreadPoolExecutor(max_workers=max(1, min(len(SCRIPTS), os.cpu_count() or 1)))
    runs = {s: pool.submit(subprocess.run, [sys.executable, str(s), *args(s)],
                           capture_output=True, text=True, timeout=600, cwd=s.parent)
            for s in SCRIPTS}
    return pool, runs


@pytest.fixture(scope="module")
def script_runs():
    pool, runs = _start_all(lambda s: SMALLER.get(s.name, []))
    yield runs
    pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def script_runs_as_written():
    pool, runs = _start_all(lambda s: [])
    yield runs
    pool.shutdown(wait=True)


def _check(out):
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip(), "a derivation script must print what it derives"


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_derivation_script_runs(script, script_runs):
    """Each script at the sizes of :data:`SMALLER` (its defaults where not listed)."""
    _check(script_runs[script].result())


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_derivation_script_runs_as_written(script, script_runs_as_written):
    _check(script_runs_as_written[script].result())


def test_smaller_arguments_name_existing_scripts():
    assert set(SMALLER) <= {s.name for s in SCRIPTS}


def test_stage_scripts_exist():
    names = [s.name for s in SCRIPTS]
    for prefix in ("01_", "02_", "03_"):
        assert any(n.startswith(prefix) for n in names)

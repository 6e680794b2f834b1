"""Every derivation script runs, prints its stage and passes its own cross-check."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "derivations").glob("[0-9]*.py"))


@pytest.fixture(scope="module")
def script_runs():
    """Every script started at once, as many at a time as there are cores (independent
    processes: the wall time of the module is about the sum over the cores, not over the
    scripts); each test waits for its own."""
    pool = ThreadPoolExecutor(max_workers=max(1, min(len(SCRIPTS), os.cpu_count() or 1)))
    runs = {s: pool.submit(subprocess.run, [sys.executable, str(s)], capture_output=True,
                           text=True, timeout=600, cwd=s.parent) for s in SCRIPTS}
    yield runs
    pool.shutdown(wait=True)


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_derivation_script_runs(script, script_runs):
    out = script_runs[script].result()
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip(), "a derivation script must print what it derives"


def test_stage_scripts_exist():
    names = [s.name for s in SCRIPTS]
    for prefix in ("01_", "02_", "03_"):
        assert any(n.startswith(prefix) for n in names)

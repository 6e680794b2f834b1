"""Every derivation script runs, prints its stage and passes its own cross-check."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "derivations").glob("[0-9]*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_derivation_script_runs(script):
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600, cwd=script.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip(), "a derivation script must print what it derives"


def test_stage_scripts_exist():
    names = [s.name for s in SCRIPTS]
    for prefix in ("01_", "02_", "03_"):
        assert any(n.startswith(prefix) for n in names)

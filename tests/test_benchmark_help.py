"""Every benchmark script answers ``--help`` (exit 0) without running its measurement.

A help string holding a bare ``%`` (a label such as "lr +3%") makes argparse raise
``ValueError`` at ``--help``; this test caught that in ``calibrate_verdict.py``.
"""
import runpy
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_script_help_exits_cleanly(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(script), run_name="__main__")
    assert stop.value.code in (0, None)
    assert "usage" in capsys.readouterr().out.lower()

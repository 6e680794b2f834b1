"""Defects of class "data and signals" (issue 25): nothing a run computed or was given is lost.

* SIGTERM of a serial sweep (``--workers 1``): the point in flight is never
  stored as an error row, the sweep stops at once (exit 143, no "done"), and a
  rerun computes that point;
* a report holding non-finite numbers is saved and read back;
* stale-temporary clean-up removes only what is provably a dead process's own
  temporary (owner and kind checked, not the name alone);
* ``table.parquet`` is trusted only for point files whose content it matches.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import symquad as sq

TESTS = os.path.dirname(os.path.abspath(__file__))


def _cli(args, env_extra=None, timeout=120):
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{TESTS}:{env.get('PYTHONPATH', '')}"
    return subprocess.run([sys.executable, "-m", "symquad", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


# ---------------------------------------------------------------------------
# SIGTERM of a serial sweep
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [[], ["--timeout", "60"]])
def test_sigterm_stops_a_serial_sweep_and_the_point_is_recomputed(tmp_path, extra):
    store = tmp_path / "s"
    args = ["sweep", "sweep_tasks:terminates_once", "--grid", "x=0,1,2,3",
            "--grid", f"marker_dir={tmp_path}", "--store", str(store), "--workers", "1", *extra]
    out = _cli(args)
    assert out.returncode == 143, out.stderr
    assert "done" not in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    df = sq.load_sweep(store)
    # only x = 0 finished before the signal; x = 1 (in flight) is no error row, and the
    # sweep stopped there (x = 2, 3 not run)
    assert list(df["x"]) == [0] and list(df["status"]) == ["ok"]
    again = _cli(args)                 # the marker exists: x = 1 now runs to its end
    assert again.returncode == 0, again.stderr
    df = sq.load_sweep(store)
    assert sorted(df["x"]) == [0, 1, 2, 3] and set(df["status"]) == {"ok"}
    assert sorted(df["y"]) == [0, 1, 4, 9]
    assert "1 already in the store, 3 computed" in again.stdout


def test_run_point_reraises_terminated_but_keeps_sys_exit_as_an_error():
    from symquad._signals import Terminated
    from symquad.studies.sweep import run_point

    def stopped():
        raise Terminated()

    def exits():
        raise SystemExit(3)

    with pytest.raises(Terminated):
        run_point(stopped, {})
    assert run_point(exits, {})[2] == "error"


def test_an_interrupted_progress_says_stopped_not_done():
    import io

    from symquad.progress import Progress
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        with Progress(4, "sweep t", "points", stream=stream) as bar:
            bar.update(1)
            raise KeyboardInterrupt
    text = stream.getvalue()
    assert "stopped, 1/4 points" in text and "done" not in text
    stream = io.StringIO()
    bar = Progress(4, "sweep t", "points", stream=stream)
    bar.update(4)
    bar.close()
    assert "done, 4/4 points" in stream.getvalue() or stream.getvalue() == ""

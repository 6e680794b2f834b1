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


# ---------------------------------------------------------------------------
# reports holding non-finite numbers
# ---------------------------------------------------------------------------
def test_nonfinite_numbers_round_trip_through_strict_json():
    import json

    from symquad.studies.report_io import decode_nonfinite, encode_nonfinite
    tree = {"a": math.inf, "b": [-math.inf, 1.5, np.float64("nan")], "c": np.array([1.0, np.inf]),
            "d": {"e": None, "f": "inf", "g": 3}}
    text = json.dumps(encode_nonfinite(tree), allow_nan=False)     # strict JSON: no Infinity
    back = decode_nonfinite(json.loads(text))
    assert back["a"] == math.inf and back["b"][0] == -math.inf and math.isnan(back["b"][2])
    assert back["c"] == [1.0, math.inf] and back["d"] == {"e": None, "f": "inf", "g": 3}
    with pytest.raises(ValueError, match="non-finite"):
        decode_nonfinite({"__float__": "1e5"})


def _inflated_data(tmp_path):
    m = sq.Model(p=2, p_star=1, lr=0.3)
    run = sq.simulate(m, N=500, t_max=2.0, replicas=4, seed=1, t_eval=np.linspace(0, 2, 5))
    Q = run.Q.copy()
    Q[:, -1] *= 1e155          # a valid (PSD) file whose deviations overflow to inf
    path = tmp_path / "data.npz"
    np.savez(path, t=run.t, Q=Q, rho=run.rho)
    return m, run, Q, path


def test_a_data_report_holding_inf_is_written_and_read_back(tmp_path, monkeypatch):
    from symquad.cli import main
    # the figures of overflowing data take seconds to draw and are not what is tested
    monkeypatch.setattr(sq.ValidationReport, "figures", lambda self: {})
    m, run, Q, path = _inflated_data(tmp_path)
    out = tmp_path / "rep"
    with np.errstate(all="ignore"):
        rc = main(["validate", "--data", str(path), "--p", "2", "--p-star", "1", "--lr", "0.3",
                   "--out", str(out), "--no-progress"])
    rep = sq.ValidationReport.load(out)
    assert rc == {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 4}[rep.verdict]
    band = rep.numbers["band_before_escape"]
    assert band["max_abs_mean_risk_deviation"] == math.inf
    assert rep.to_dict()["numbers"]["band_before_escape"]["max_abs_mean_risk_deviation"] \
        == math.inf
    text = (out / "report.json").read_text()
    assert "Infinity" not in text and '"__float__": "inf"' in text


def test_hostile_report_json_is_a_value_error(tmp_path):
    from symquad.studies.report_io import join_arrays
    with pytest.raises(ValueError, match="not in the archive"):
        join_arrays({"x": {"__npz__": "missing"}}, {})


# ---------------------------------------------------------------------------
# stale temporaries: ownership and kind, not the name alone
# ---------------------------------------------------------------------------
def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_clean_up_removes_only_provable_own_temporaries(tmp_path):
    from symquad import _atomic
    pid = _dead_pid()
    stem = f".tmp-{_atomic._host()}-{pid}-"
    own_file = tmp_path / f"{stem}ab_cd123.tmp"
    own_file.write_text("partial")
    own_dir = tmp_path / f"{stem}q1w2e3r4"
    (own_dir / "sub").mkdir(parents=True)
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / f"{stem}zz_zz999.tmp"
    link.symlink_to(target)                         # a link under a temporary's name
    fifo = tmp_path / f"{stem}ff_ff000.tmp"
    os.mkfifo(fifo)
    odd_tail = tmp_path / f"{stem}results-final.csv"    # the name's start only
    odd_tail.write_text("data")
    live = tmp_path / f"{_atomic.temp_prefix('.tmp-')}live1234.tmp"     # this process: alive
    live.write_text("in flight")
    removed = _atomic.remove_stale(tmp_path, ".tmp-")
    assert sorted(removed) == sorted([str(own_file), str(own_dir)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [link.name, fifo.name, odd_tail.name, live.name, target.name])
    assert target.read_text() == "keep me"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a file to another user needs root")
def test_stale_clean_up_leaves_another_users_entry(tmp_path):
    from symquad import _atomic
    name = tmp_path / f".tmp-{_atomic._host()}-{_dead_pid()}-ab_cd123.tmp"
    name.write_text("theirs")
    os.chown(name, 12345, 12345)
    assert _atomic.remove_stale(tmp_path, ".tmp-") == []
    assert name.exists()


# ---------------------------------------------------------------------------
# table.parquet: trusted only for the bytes it was made from
# ---------------------------------------------------------------------------
def test_cache_is_not_trusted_over_an_edited_point_file_with_the_same_mtime(tmp_path,
                                                                           monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    import sweep_tasks
    from symquad.studies import store as store_module
    monkeypatch.setattr(store_module, "_CONSOLIDATE_AFTER", 4)
    store = tmp_path / "s"
    sq.sweep(sweep_tasks.square, {"x": [1, 2, 3, 4, 5]}, store, workers=1, progress=False)
    first = sq.load_sweep(store)                 # 5 fresh rows: writes table.parquet
    assert (store / "table.parquet").exists()
    key = first.loc[first["x"] == 3, "key"].item()
    path = store / "points" / f"{key}.parquet"
    st = os.stat(path)
    row = pq.read_table(path).to_pylist()[0]
    row["y"] = -1                                # an edit the cache knows nothing of ...
    pq.write_table(pa.Table.from_pylist([row]), path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))      # ... with the old mtime
    df = sq.load_sweep(store)
    assert dict(zip(df["x"], df["y"])) == {1: 1, 2: 4, 3: -1, 4: 16, 5: 25}
    assert "_sha256" not in df.columns

"""Faults of the audit of issue 18, one section per class (reliability and security 1-4).

1. Data loss: only folders symquad provably wrote are replaced (manifest);
   one store, one task, even when two sweeps create it at the same moment;
   damaged point files are set aside and recomputed; results a store cannot
   read back are refused when the task returns them.
2. Unbounded waits: a scheduler that accepts and never answers, a scheduler
   without workers, a point that never ends (per-point timeout), numbers of
   the grid, run-time estimates before long work, FIFOs in place of files,
   the memory of escape_time.
3. Resource: zip bombs and lying .npy headers in --data, time grids,
   weight-space Hessians and grid axes are checked before anything is allocated.
4. Signals: SIGTERM stops worker pools and removes temporaries; what a killed
   run left is removed by the next one.

Subprocess tests start interpreters; each stays within a few seconds.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import warnings
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import symquad as sq
from symquad import _atomic
from symquad._safe_io import open_regular, read_npz
from symquad.cli import main
from symquad.studies import report_io
from symquad.studies.store import SweepStore, load_sweep

import sweep_tasks
from conftest import HangGuard

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
M = sq.Model(p=3, p_star=2, lr=0.3)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, TESTS, env.get("PYTHONPATH", "")])
    return env


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of a dead parent is reaped by init; count it as gone
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _wait_gone(pids, seconds=60.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.fixture(scope="module")
def small_report():
    m = sq.Model(p=2, p_star=1, lr=0.3)
    run = sq.simulate(m, N=300, t_max=3.0, replicas=4, seed=1, t_eval=np.linspace(0, 3, 7))
    return sq.compare(m, run.t, run.Q, run.rho)


# =========================================================================== 1. data loss
def test_folder_that_only_looks_like_a_report_is_never_replaced(tmp_path, small_report):
    # the audit case: report.json with config + numbers beside raw data was deleted, exit 0
    dest = tmp_path / "experiment"
    dest.mkdir()
    (dest / "report.json").write_text(json.dumps({"config": {}, "numbers": {},
                                                  "format": "symquad.ValidationReport"}))
    (dest / "raw_data.h5").write_bytes(b"irreplaceable")
    with pytest.raises(ValueError, match="not a symquad report.*no symquad-manifest"):
        small_report.save(dest)
    assert main(["validate", "--out", str(dest), "--quick"]) == 2      # refused before work
    assert (dest / "raw_data.h5").read_bytes() == b"irreplaceable"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experiment"]


def test_a_report_folder_with_anything_added_or_edited_is_not_replaced(tmp_path, small_report):
    dest = tmp_path / "rep"
    small_report.save(dest, figures=False)
    assert report_io.is_report_folder(dest)
    (dest / "my_notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"files symquad did not write: \['my_notes.txt'\]"):
        small_report.save(dest, figures=False)
    (dest / "my_notes.txt").unlink()
    (dest / "summary.txt").write_text("edited by hand")
    with pytest.raises(ValueError, match="'summary.txt' changed since symquad wrote it"):
        small_report.save(dest, figures=False)
    (dest / "summary.txt").unlink()
    (dest / "summary.txt").symlink_to(dest / "report.json")
    with pytest.raises(ValueError, match="links or special files"):
        small_report.save(dest, figures=False)


def test_a_copied_manifest_does_not_make_a_folder_ours(tmp_path, small_report):
    small_report.save(tmp_path / "rep", figures=False)
    fake = tmp_path / "fake"
    fake.mkdir()
    for p in (tmp_path / "rep").iterdir():      # same names, same manifest, other content
        (fake / p.name).write_bytes(p.read_bytes() if p.name == report_io.MANIFEST_NAME
                                    else b"user data")
    with pytest.raises(ValueError, match="changed since symquad wrote it"):
        report_io.check_destination(fake)


def test_what_is_added_during_the_computation_is_kept_not_deleted(tmp_path):
    dest = tmp_path / "rep"
    report_io.write_folder_atomically(dest, lambda d: open(os.path.join(d, "a"), "w").close())

    def write(tmp):
        open(os.path.join(tmp, "a"), "w").close()
        (dest / "raw.dat").write_bytes(b"added after the destination check")

    with pytest.warns(RuntimeWarning, match="kept at"):
        report_io.write_folder_atomically(dest, write)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("rep.replaced-")]
    assert len(kept) == 1 and (kept[0] / "raw.dat").read_bytes().startswith(b"added")
    assert sorted(p.name for p in dest.iterdir()) == ["a", report_io.MANIFEST_NAME]


def test_a_store_being_created_by_another_task_at_the_same_moment_is_refused(tmp_path,
                                                                          monkeypatch):
    # the window of the audit case: between "the store is new" and writing store.json,
    # another sweep creates it for its own task
    store = tmp_path / "s"
    real = SweepStore._refuse_foreign_folder

    def other_sweep_gets_there_first(self):
        real(self)
        monkeypatch.setattr(SweepStore, "_refuse_foreign_folder", real)
        SweepStore(store, "task_b")

    monkeypatch.setattr(SweepStore, "_refuse_foreign_folder", other_sweep_gets_there_first)
    with pytest.raises(ValueError, match="holds task 'task_b', not 'task_a'"):
        SweepStore(store, "task_a")
    assert json.loads((store / "store.json").read_text())["task"] == "task_b"
    assert [p.name for p in store.iterdir() if p.name.startswith(".tmp-")] == []


def test_concurrent_store_creation_by_processes_accepts_one_task(tmp_path):
    """Six processes of two tasks open three new stores at the same instant.

    The instant is set once every process has started and imported (a ready file each,
    then a go file with the start time): however slow the interpreters start on a busy
    machine, they still race.  Each sleeps until just before its instant and spins
    only the last 10 ms.
    """
    script = textwrap.dedent("""
        import os, sys, time
        from symquad.studies.store import SweepStore
        task, ready, go, *stores = sys.argv[1:]
        open(ready, "w").close()
        while not os.path.exists(go):
            time.sleep(0.005)
        start = float(open(go).read())
        for i, store in enumerate(stores):
            target = start + 0.3 * i
            time.sleep(max(0.0, target - time.time() - 0.01))
            while time.time() < target:
                pass
            try:
                SweepStore(store, task)
                print(store, "accepted")
            except ValueError:
                print(store, "refused")
    """)
    stores = [str(tmp_path / f"s{i}") for i in range(3)]
    ready = [tmp_path / f"ready{i}" for i in range(6)]
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", script, f"task_{'ab'[i % 2]}", str(ready[i]),
                               str(go), *stores], stdout=subprocess.PIPE, text=True, env=_env())
             for i in range(6)]
    try:
        guard = HangGuard(240, "six interpreters starting")
        while not all(r.exists() for r in ready):
            assert all(p.poll() is None for p in procs), "a store process ended early"
            guard.check()
            time.sleep(0.02)
        (tmp_path / "go.tmp").write_text(repr(time.time() + 0.2))
        os.replace(tmp_path / "go.tmp", go)                # appears whole
        outs = [(f"task_{'ab'[i % 2]}", p.communicate(timeout=120)[0])
                for i, p in enumerate(procs)]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for store in stores:
        owner = json.loads(open(os.path.join(store, "store.json")).read())["task"]
        accepted = {task for task, out in outs if f"{store} accepted" in out}
        assert accepted == {owner}, (store, outs)


def test_non_store_folder_is_not_filled(tmp_path):
    (tmp_path / "thesis.tex").write_text("...")
    with pytest.raises(ValueError, match="not a sweep store"):
        sq.sweep(sweep_tasks.square, {"x": [1]}, tmp_path, workers=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.tex"]


def test_damaged_point_files_are_set_aside_and_recomputed(tmp_path):
    store = tmp_path / "s"
    grid = {"x": [1, 2, 3, 4]}
    df = sq.sweep(sweep_tasks.square, grid, store, workers=1)
    points = sorted((store / "points").iterdir())
    points[0].write_bytes(b"PAR1 garbage, not a Parquet file")
    points[1].write_bytes(b"")                              # a crash of the file system
    os.unlink(points[2])
    os.mkfifo(points[2])                                     # and a FIFO: must not block
    with pytest.warns(RuntimeWarning, match="cannot be read back"):
        back = load_sweep(store)                             # a reader skips them
    assert len(back) == 1
    with pytest.warns(RuntimeWarning, match="moved to damaged"):
        again = sq.sweep(sweep_tasks.square, grid, store, workers=1)
    info = again.attrs["sweep"]
    assert info.computed == 3 and info.skipped == 1 and info.errors == 0
    assert list(again["y"]) == list(df["y"]) == [1, 4, 9, 16]
    assert len(list((store / "damaged").iterdir())) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_sweep(store)) == 4                   # clean again


def test_damaged_store_json_is_a_clear_error(tmp_path):
    sq.sweep(sweep_tasks.square, {"x": [1]}, tmp_path / "s", workers=1)
    (tmp_path / "s" / "store.json").write_text("{trunc")
    with pytest.raises(ValueError, match="store.json is damaged"):
        load_sweep(tmp_path / "s")


@pytest.mark.parametrize("kind, match", [
    ("object", "'y' is an array of Python objects"),
    ("bigint", "'y' = 1.181e\\+21 is an integer beyond int64"),
    ("uint64", "'y' = 1.845e\\+19 is an integer beyond int64"),
    ("surrogate", "'y' is not valid text"),
    ("longdouble", "'y' must be a scalar"),
])
def test_results_the_store_cannot_read_back_are_error_rows(kind, match, tmp_path):
    df = sq.sweep(sweep_tasks.unstorable, {"x": [1], "kind": [kind, "ok"]}, tmp_path / "s",
                  workers=1)
    bad, good = df.iloc[0], df.iloc[1]
    assert bad["status"] == "error"
    assert re.search(match, bad["error"]), bad["error"]
    assert good["status"] == "ok"
    np.testing.assert_array_equal(sq.load_sweep_arrays(tmp_path / "s", good["key"])["arr"],
                                  np.arange(3.0))
    assert len(load_sweep(tmp_path / "s")) == 2             # the store reads back whole


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(st.characters(), max_size=5),
    st.sampled_from(["\ud800", "a\udfffb"]),                    # unpaired surrogates
    st.builds(np.float32, st.floats(width=32)), st.builds(np.int64, st.integers(-2**63,
                                                                              2**63 - 1)),
    st.builds(np.uint64, st.integers(0, 2**64 - 1)))
_arrays = st.sampled_from([np.arange(3), np.arange(3.0), np.array([True, False]),
                           np.array(["a", "bc"]), np.array([1 + 2j]),
                           np.array([None, 1], dtype=object), np.zeros((2, 0))])


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(_scalars, _arrays))
def test_every_accepted_result_reads_back_exactly(value, tmp_path_factory):
    from symquad.studies.sweep import _split_result
    try:
        scalars, arrays = _split_result({"v": value}, {})
    except (TypeError, ValueError) as exc:
        assert "'v'" in str(exc)
        return
    store = SweepStore(tmp_path_factory.mktemp("s"), "t")
    store.write({"key": "k", "status": "ok", **scalars}, arrays)
    row = store.rows()[0]
    if arrays:
        back = sq.load_sweep_arrays(store.path, "k")["v"]
        assert back.dtype == value.dtype and np.array_equal(back, value)
    else:
        got, want = row["v"], scalars["v"]
        assert got == want or (isinstance(want, float) and np.isnan(want) and np.isnan(got))
        assert type(got) is type(want) or want is None


# =========================================================================== 2. waits
@pytest.fixture
def silent_peer():
    """A TCP port that accepts connections and never says anything."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    thread.join()
    for c in held:
        c.close()
    srv.close()


def test_scheduler_that_accepts_and_never_answers_times_out(silent_peer, tmp_path):
    import dask
    import distributed  # noqa: F401  (its config defaults first: the context restores them)
    from symquad.studies.sweep import connect_scheduler as connect
    # distributed's own connect deadline far beyond the guard: only timeout= can end the wait
    with dask.config.set({"distributed.comm.timeouts.connect": "600s"}):
        guard = HangGuard(60, "connect_scheduler(timeout=1.5) to a silent peer")
        with pytest.raises(TimeoutError, match="no Dask scheduler answered .* within 1.5 s"):
            connect(silent_peer, timeout=1.5)
        guard.check()
    # the command (interpreter start included): a hang ends at the subprocess timeout
    res = subprocess.run([sys.executable, "-m", "symquad", "sweep", "sweep_tasks:square",
                          "--grid", "x=1", "--store", str(tmp_path / "s"), "--scheduler",
                          silent_peer, "--scheduler-timeout", "2"], capture_output=True,
                         text=True, timeout=240, env=_env())
    assert res.returncode == 2 and "within 2 s" in res.stderr and "Traceback" not in res.stderr


@pytest.fixture(scope="module")
def empty_scheduler():
    from distributed import LocalCluster
    cluster = LocalCluster(n_workers=0, processes=False, protocol="tcp",
                           dashboard_address=None, silence_logs=logging.ERROR)
    yield cluster
    cluster.close()


def test_scheduler_without_workers_gives_up_after_worker_timeout(empty_scheduler, tmp_path):
    from symquad.studies.sweep import connect_scheduler as connect
    client = connect(empty_scheduler.scheduler_address, timeout=120)
    try:
        # no worker ever joins: only worker_timeout ends the wait (its default is 300 s)
        guard = HangGuard(120, "a sweep waiting for a worker with worker_timeout=1.5")
        with pytest.raises(TimeoutError, match="no Dask worker joined .* worker_timeout=1.5"):
            sq.sweep(sweep_tasks.square, {"x": [1, 2]}, tmp_path / "s", client=client,
                     worker_timeout=1.5)
        guard.check()
    finally:
        client.close()


def test_workers_lost_mid_sweep_leave_the_rest_as_lost_points(empty_scheduler, tmp_path):
    from symquad.studies.sweep import connect_scheduler as connect

    client = connect(empty_scheduler.scheduler_address, timeout=120)
    try:
        empty_scheduler.scale(1)
        empty_scheduler.wait_for_workers(1, timeout=120)
        closer = threading.Timer(1.5, lambda: empty_scheduler.scale(0))
        closer.start()
        # after the worker is gone only worker_timeout ends the wait (its default is 300 s)
        guard = HangGuard(150, "a sweep whose workers left, with worker_timeout=2")
        df = sq.sweep(sweep_tasks.square, {"x": list(range(8)), "delay": [0.5]},
                      tmp_path / "s", client=client, worker_timeout=2.0)
        closer.join()
        info = df.attrs["sweep"]
        guard.check()
        assert info.lost >= 1 and info.ok + info.lost == 8
        lost = df[df["status"] == "error"]
        assert lost["error"].str.contains("no worker for worker_timeout=2").all()
        assert len(load_sweep(tmp_path / "s")) == info.ok      # lost points are not stored
    finally:
        client.close()


def test_serial_point_timeout_stops_the_point_and_its_process(tmp_path):
    pidfile = tmp_path / "pid"
    # the slow point sleeps 600 s: only the timeout can end it before the guard
    guard = HangGuard(240, "a serial sweep with a point past timeout=1.5")
    df = sq.sweep(sweep_tasks.sleepy, {"x": [1], "duration": [0.05, 600.0],
                                       "pidfile": [str(pidfile)]},
                  tmp_path / "s", workers=1, timeout=1.5)
    guard.check()
    fast, slow = df.iloc[0], df.iloc[1]
    assert fast["status"] == "ok" and fast["y"] == 1
    assert slow["status"] == "error" and slow["error"].startswith(
        "TimeoutError: the point did not finish within timeout=1.5 s")
    assert _wait_gone([int(pidfile.read_text())]) == []        # the sleeping process is gone
    # a busy numpy loop (no Python-level interrupt point needed) is stopped the same way
    df = sq.sweep(sweep_tasks.spin, {"x": [1]}, tmp_path / "s2", workers=1, timeout=1.0)
    assert df.iloc[0]["error"].startswith("TimeoutError")
    # timed-out points are stored error rows: a rerun skips them unless retry_errors
    again = sq.sweep(sweep_tasks.spin, {"x": [1]}, tmp_path / "s2", workers=1, timeout=1.0)
    assert again.attrs["sweep"].skipped == 1


def test_timeout_gives_the_same_numbers_as_in_process(tmp_path):
    grid = {"p": [2, 3], "p_star": [1], "lr": [0.1, 0.2]}
    a = sq.sweep("plateau", grid, tmp_path / "a", workers=1)
    b = sq.sweep("plateau", grid, tmp_path / "b", workers=1, timeout=600)
    cols = ["p", "lr", "q", "risk", "rate", "status"]
    assert a[cols].equals(b[cols])


def test_a_point_that_kills_its_process_is_an_error_row(tmp_path):
    df = sq.sweep(sweep_tasks.exits_hard, {"x": [1]}, tmp_path / "s", workers=1, timeout=600)
    assert df.iloc[0]["error"] == "ChildProcessError: the point's process exited with status 7"


def test_cli_timeout(tmp_path, capsys):
    rc = main(["sweep", "sweep_tasks:sleepy", "--grid", "x=1", "--grid", "duration=60",
               "--store", str(tmp_path / "s"), "--workers", "1", "--timeout", "1",
               "--no-progress"])
    assert rc == 1 and "TimeoutError" in capsys.readouterr().err


@pytest.mark.parametrize("value, match", [
    ("1e999", "must be finite"), ("-1e400", "must be finite"),
    ("9" * 30, r"\[-2\*\*63, 2\*\*63 - 1\]"), ("1" * 5000, "characters"),
])
def test_grid_numbers_are_bounded(value, match, tmp_path):
    from symquad.cli.sweep import parse_grid
    with pytest.raises(ValueError, match=match):
        parse_grid([f"N={value}"])
    assert main(["sweep", "escape", "--grid", f"N={value}", "--grid", "p=2", "--grid",
                 "p_star=1", "--store", str(tmp_path / "s")]) == 2
    assert not (tmp_path / "s").exists()


def test_api_grid_values_are_bounded_and_axes_checked_before_listing(tmp_path, forbid):
    with pytest.raises(ValueError, match=r"parameter 'x' must be an integer in \[-2\*\*63"):
        sq.sweep(sweep_tasks.square, {"x": [2**70]}, tmp_path / "s", workers=1)
    # no value of the axis is looked at (each would be checked by canonical_params) and
    # nothing is listed (memory): the size comes from len() alone
    from symquad.studies import sweep as sweep_module
    looked_at = forbid(sweep_module, "canonical_params")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"1000000000000 points .* more than max_points"):
            sq.sweep(sweep_tasks.square, {"x": range(10**12)}, tmp_path / "s", workers=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert looked_at == [] and peak < 10 * 2**20


def test_huge_N_within_the_step_cap_is_refused_with_an_estimate(forbid):
    # 64 replicas x 1e11 steps: under the 1e13 step cap, but days of work
    from symquad.numeric import simulate as S
    # the first work of a run is its start (N-dimensional weights or their coordinates)
    started = forbid(S, "_initial_coordinates", "_block_initial_coordinates")
    with pytest.raises(ValueError, match=r"estimated to take at least [\d.]+ days"):
        sq.simulate(sq.DEFAULT_MODEL, N=10**9, t_max=100.0, replicas=64)
    forbid(S, "simulate")                      # validate plans every run before the first
    with pytest.raises(ValueError, match=r"validate: main run: .* estimated to take at least"):
        sq.validate(sq.DEFAULT_MODEL, N=10**8, fss=False, invariant=False)
    assert started == []


def test_long_runs_warn_with_their_estimate(monkeypatch):
    from symquad.numeric import simulate as S
    monkeypatch.setattr(S, "WARN_SECONDS", 1e-3)
    with pytest.warns(RuntimeWarning, match="estimated to take at least"):
        sq.simulate(sq.DEFAULT_MODEL, N=200, t_max=1.0, replicas=64)


def test_fss_and_drift_sizes_are_checked_before_any_simulation(monkeypatch):
    from symquad.numeric import simulate as S

    def forbidden(*a, **k):
        raise AssertionError("a simulation started before every run was checked")
    monkeypatch.setattr(S, "simulate", forbidden)
    with pytest.raises(ValueError, match="finite-size scaling at N=1000000000000"):
        sq.validate(M, N=200, fss_N=[100, 1000, 10**12], invariant=False)
    with pytest.raises(ValueError, match=r"drift study of S \(random start\) at N=100000000000"):
        sq.validate(M, N=200, fss=False, invariant_N=(100, 10**11))
    with pytest.raises(ValueError, match=r"n_times must be an integer in \[3, 10000000\]"):
        sq.validate(M, N=200, n_times=10**12)


def test_wide_validate_warns_with_its_estimate_before_simulating(monkeypatch, tmp_path, capsys):
    # the audit: `symquad validate --p 32` ran for minutes with no word of how long
    from symquad.numeric import simulate as S

    class Started(Exception):
        pass

    def started(*a, **k):
        raise Started
    monkeypatch.setattr(S, "simulate", started)
    # the entry point prints the warning as one line and ends the (stubbed) run as an
    # internal error, status 5: the warning came before any simulation
    assert main(["validate", "--p", "32", "--out", str(tmp_path / "rep")]) == 5
    err = capsys.readouterr().err
    assert re.search(r"warning: validate: the SGD runs are estimated to take at least "
                     r"[\d.]+ minutes \(main run", err), err


def test_compare_over_a_very_long_horizon_is_estimated_first(forbid):
    m = sq.Model(p=2, p_star=1, lr=0.3)
    run = sq.simulate(m, N=300, t_max=3.0, replicas=4, seed=1, t_eval=np.linspace(0, 3, 7))
    t = run.t.copy()
    t[-1] = 1e12                     # the audit: a long t made compare run for hours
    from symquad.numeric import ode_batch
    started = forbid(ode_batch, "integrate_batch")       # the ODE solve is the work
    with pytest.raises(ValueError, match="right-hand-side evaluations.*cut the tail"):
        sq.compare(m, t, run.Q, run.rho)
    assert started == []


def test_ode_cost_estimate_agrees_with_the_solver():
    # independent route: the number of evaluations the batched solver really makes
    from symquad.numeric.landscape import random_start
    from symquad.numeric.ode_batch import estimate_solve, integrate_batch
    for m in (sq.Model(p=4, p_star=2, lr=0.1), sq.Model(p=4, p_star=2, lr=0.1,
                                                        activation="z**3 - 3*z")):
        Q0, r0 = random_start(m, 1000, 3, seed=0)
        sol = integrate_batch(m, Q0, r0, np.eye(m.p_star), 5000.0, np.linspace(0, 5000, 3))
        assert sol.n_diverged == 0
        est = estimate_solve(m, [(Q0[0], r0[0]), (sol.Q[0, -1], sol.rho[0, -1])],
                             np.eye(m.p_star), 5000.0, 3)
        assert 0.5 < est["nfev"] / sol.nfev < 2.0, (m, est, sol.nfev)


def test_fifo_in_place_of_a_cache_file_does_not_block(tmp_path):
    # in a subprocess: if the open blocked, the test would stop at its timeout, not hang
    script = textwrap.dedent("""
        import os, symquad as sq
        from symquad.kernel_files import cached_path
        from symquad.numeric.kernels import activation_key
        import numpy as np
        m = sq.Model(p=2, p_star=1, lr=0.1, activation="z**3 + z**2")
        path = cached_path("tensor", activation_key(m))
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        sq.kernels(m).rhs(np.eye(2), 0.1 * np.ones((2, 1)), np.eye(1))
        print("regular file now:", os.path.isfile(path) and not os.path.islink(path))
    """)
    env = _env()
    env["SYMQUAD_CACHE_DIR"] = str(tmp_path / "cache")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert "regular file now: True" in res.stdout


def test_fifos_and_devices_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, match in ((fifo, "FIFO"), ("/dev/zero", "device"), (tmp_path, "folder")):
        with pytest.raises(ValueError, match=match):
            open_regular(path)
    os.mkfifo(tmp_path / "data.npz")
    assert main(["validate", "--data", str(tmp_path / "data.npz"), "--out",
                 str(tmp_path / "r")]) == 2
    rep = tmp_path / "rep"
    rep.mkdir()
    os.mkfifo(rep / report_io.MANIFEST_NAME)
    with pytest.raises(ValueError, match="not a symquad report"):
        report_io.check_destination(rep)


def test_escape_time_memory_is_bounded_by_chunks(monkeypatch):
    from symquad.numeric import landscape as L
    m = sq.Model(p=4, p_star=2, lr=0.1)
    whole = sq.escape_time(m, 1000, n_samples=32, seed=3, n_eval=1000)
    per_start = L._batch_bytes_per_start(m, 1000)
    monkeypatch.setattr(L, "ESCAPE_BATCH_BYTES", 8 * per_start)      # chunks of 8 starts
    sizes, solve = [], L._escape_crossings

    def spy(m, Q0, rho0, t_max, n_eval, threshold, keep=()):
        sizes.append(Q0.shape[0])
        return solve(m, Q0, rho0, t_max, n_eval, threshold, keep)
    monkeypatch.setattr(L, "_escape_crossings", spy)
    chunked = sq.escape_time(m, 1000, n_samples=32, seed=3, n_eval=1000)
    assert sizes == [8, 8, 8, 8]                 # one chunk of bounded memory at a time
    # same samples, solved in other batches: equal to the integration tolerance
    np.testing.assert_allclose(chunked.samples, whole.samples, rtol=1e-6)
    assert chunked.seed_noise == pytest.approx(whole.seed_noise, rel=1e-9)


def test_escape_time_refuses_what_does_not_fit_in_memory(monkeypatch):
    from symquad import _safe_io
    from symquad.numeric import landscape as L
    monkeypatch.setattr(_safe_io, "available_memory", lambda: 2**20)
    with pytest.raises(ValueError, match=r"needs [\d.]+ GiB .* more than the .* GiB free"):
        L.escape_time(sq.Model(p=8, p_star=2, lr=0.1), 1000, n_samples=4000)


# =========================================================================== 3. resource
def _npy_bytes(arr):
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def test_zip_bomb_is_refused_in_constant_memory(tmp_path, monkeypatch, capsys):
    from symquad import _safe_io
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        for key, arr in (("t", np.arange(3.0)), ("rho", np.zeros((3, 2, 1)))):
            zf.writestr(f"{key}.npy", _npy_bytes(arr))
        with zf.open("Q.npy", "w", force_zip64=True) as fh:
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False,
                                                          "shape": (2**21, 4, 4)})
            fh.write(header.getvalue())               # an honest header ...
            block = bytes(2**20)
            for _ in range(256):                      # ... of 256 MiB of zeros, < 1 MB stored
                fh.write(block)
    assert os.path.getsize(bomb) < 2 * 2**20
    monkeypatch.setattr(_safe_io, "MAX_READ_BYTES", 64 * 2**20)
    tracemalloc.start()
    try:
        rc = main(["validate", "--data", str(bomb), "--p", "2", "--p-star", "1", "--out",
                   str(tmp_path / "r")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert rc == 2 and "256 MiB from" in err and "refused before reading it" in err, err
    assert peak < 16 * 2**20


def test_lying_npy_header_is_refused_before_allocating(tmp_path, capsys):
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for key, arr in (("t", np.arange(3.0)), ("rho", np.zeros((3, 2, 1)))):
            zf.writestr(f"{key}.npy", _npy_bytes(arr))
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False,
                                                   "shape": (10**6, 10**6, 2, 2)})
        zf.writestr("Q.npy", buf.getvalue() + bytes(96))      # 4e12 entries declared
    tracemalloc.start()
    try:
        rc = main(["validate", "--data", str(path), "--p", "2", "--p-star", "1", "--out",
                   str(tmp_path / "r")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert rc == 2 and "declares shape (1000000, 1000000, 2, 2)" in err and peak < 16 * 2**20


def test_archive_with_millions_of_members_is_refused_from_its_directory(tmp_path):
    path = tmp_path / "many.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(5000):
            zf.writestr(f"a{i}.npy", b"")
    with pytest.raises(ValueError, match="lists 5000 members, more than the 4096"):
        read_npz(path)


def test_npz_reader_refuses_objects_and_returns_arrays(tmp_path):
    good = tmp_path / "g.npz"
    np.savez(good, a=np.arange(4), b=np.eye(2))
    arrays, _ = read_npz(good)
    assert set(arrays) == {"a", "b"} and np.array_equal(arrays["b"], np.eye(2))
    bad = tmp_path / "o.npz"
    np.savez(bad, a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(ValueError, match="Python objects"):
        read_npz(bad)


def test_ode_task_and_integrate_check_time_grids_before_allocating():
    from symquad.studies.tasks import ode_task
    with pytest.raises(TypeError, match="n_times must be an integer"):
        ode_task(p=2, p_star=1, n_times=1e10)
    with pytest.raises(ValueError, match=r"n_times must be an integer in \[2, 10000000\]"):
        ode_task(p=2, p_star=1, n_times=10**10)
    m = sq.Model(p=64, p_star=2, lr=0.1)
    with pytest.raises(ValueError, match="integrate: 10000000 output times at p=64 needs"):
        sq.integrate(m, np.eye(64), np.zeros((64, 2)) + 1e-3 * np.arange(128).reshape(64, 2),
                     np.eye(2), 1.0, t_eval=np.linspace(0, 1, 10**7))


def test_weight_hessian_size_is_checked_before_allocating(forbid):
    from symquad.numeric import landscape
    W = np.zeros((4, 10**4))
    started = forbid(landscape, "kernels", "overlaps")    # the risk kernel, the overlaps
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"p\*N = 40000 weights.*allowed p\*N <= 2000"):
            sq.weight_hessian(sq.DEFAULT_MODEL, W, np.zeros((2, 10**4)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the 40000 x 40000 Hessian (12 GiB) and its index arrays were never allocated
    assert started == [] and peak < 10 * 2**20


# =========================================================================== 4. signals
def _start(script, *args):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())


def _wait_for(path, seconds=180.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if os.path.exists(path) and os.path.getsize(path):
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear")


def test_sigterm_stops_the_local_cluster_of_a_sweep(tmp_path):
    piddir = tmp_path / "pids"
    piddir.mkdir()
    proc = _start("""
        import sys, symquad as sq, sweep_tasks
        from symquad.cli import main
        sys.exit(main(["sweep", "sweep_tasks:sleepy", "--grid", "x=0,1,2",
                       "--grid", "duration=120", "--grid", "pidfile=" + sys.argv[1] + "/p",
                       "--store", sys.argv[2], "--workers", "2", "--no-progress"]))
    """, piddir, tmp_path / "s")
    # the same pidfile for every point: the worker running the latest one
    _wait_for(piddir / "p")
    worker = int((piddir / "p").read_text())
    import psutil
    workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    assert worker in workers
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 143, err
    assert "terminated by SIGTERM" in err
    # no traceback through symquad's own code (distributed's logging of the closing
    # cluster, under load, is another matter: see the tracebacks class of issue 18)
    assert not re.search(r'File ".*/symquad/', err), err
    assert _wait_gone(workers) == []
    assert not [p for p in os.listdir(tmp_path / "s" / "points") if p.startswith(".tmp-")]


def test_sigterm_stops_the_point_process_of_a_serial_sweep(tmp_path):
    pidfile = tmp_path / "pid"
    proc = _start("""
        import sys, symquad as sq, sweep_tasks
        sq.sweep(sweep_tasks.sleepy, {"x": [1], "duration": [120.0],
                 "pidfile": [sys.argv[1]]}, sys.argv[2], workers=1, timeout=100)
    """, pidfile, tmp_path / "s")
    _wait_for(pidfile)
    child = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=240)
    assert proc.returncode == 143
    assert _wait_gone([child]) == []


def test_a_killed_driver_leaves_no_point_process_computing(tmp_path):
    pidfile = tmp_path / "pid"
    proc = _start("""
        import sys, symquad as sq, sweep_tasks
        sq.sweep(sweep_tasks.sleepy, {"x": [1], "duration": [120.0],
                 "pidfile": [sys.argv[1]]}, sys.argv[2], workers=1, timeout=100)
    """, pidfile, tmp_path / "s")
    _wait_for(pidfile)
    child = int(pidfile.read_text())
    proc.kill()                                   # SIGKILL: no clean-up code runs
    proc.communicate(timeout=240)
    assert _wait_gone([child]) == []              # the child saw its parent go


def test_sigterm_stops_the_worker_processes_of_validate(tmp_path):
    piddir = tmp_path / "pids"
    piddir.mkdir()
    proc = _start("""
        import sys, time
        from symquad._signals import terminate_cleanly
        from symquad.studies.validation import _StudyRunner
        import sweep_tasks
        jobs = {name: (sweep_tasks.sleepy, {"x": 0, "duration": 600.0,
                                            "pidfile": sys.argv[1] + "/" + name})
                for name in ("finite_size_scaling", "invariant_drift")}
        with terminate_cleanly(), _StudyRunner(jobs, 3, False) as studies:
            studies.results()
    """, piddir)
    for name in ("finite_size_scaling", "invariant_drift"):
        _wait_for(piddir / name)
    pids = [int((piddir / n).read_text()) for n in ("finite_size_scaling", "invariant_drift")]
    proc.send_signal(signal.SIGTERM)
    # the studies sleep 600 s: a driver that waited for them would hit this timeout
    proc.communicate(timeout=240)
    assert proc.returncode == 143
    assert _wait_gone(pids) == []


@pytest.mark.slow
def test_sigterm_stops_symquad_validate_workers_end_to_end(tmp_path):
    """The real command: ``symquad validate --quick --workers 3`` stopped by SIGTERM."""
    import psutil
    proc = subprocess.Popen([sys.executable, "-m", "symquad", "validate", "--quick",
                             "--workers", "3", "--out", str(tmp_path / "rep")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    me = psutil.Process(proc.pid)
    end = time.monotonic() + 120
    while time.monotonic() < end and len(me.children()) < 3:    # tracker + 2 study workers
        time.sleep(0.2)
    time.sleep(3.0)                                             # the studies are running
    children = [c.pid for c in me.children(recursive=True)]
    assert len(children) >= 2
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 143 and "terminated by SIGTERM" in err
    assert _wait_gone(children) == []
    assert list(tmp_path.iterdir()) == []


_SAVE_SCRIPT = """
    import os, sys, time
    from symquad._signals import terminate_cleanly
    from symquad.studies.report_io import write_folder_atomically

    def write(tmp):
        open(os.path.join(tmp, "part"), "w").write("half a report")
        print("writing", flush=True)
        time.sleep(120)

    with terminate_cleanly():
        write_folder_atomically(sys.argv[1], write)
"""


def _start_save(dest):
    proc = _start(_SAVE_SCRIPT, dest)
    assert proc.stdout.readline().strip() == "writing"
    return proc


def test_sigterm_during_a_report_save_removes_its_temporary_folder(tmp_path):
    proc = _start_save(tmp_path / "rep")
    assert any(p.name.startswith(".rep.tmp-") for p in tmp_path.iterdir())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=240)
    assert proc.returncode == 143
    assert list(tmp_path.iterdir()) == []


def test_leftovers_of_a_killed_save_are_removed_by_the_next_one(tmp_path, small_report):
    proc = _start_save(tmp_path / "rep")
    proc.kill()
    proc.communicate(timeout=240)
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".rep.tmp-")       # SIGKILL: nothing ran
    # a live process's temporary (ours, this pid) is not touched; a foreign name neither
    mine = tmp_path / f"{_atomic.temp_prefix('.rep.tmp-')}keep"
    mine.mkdir()
    (tmp_path / ".rep.tmp-not-ours").mkdir()
    small_report.save(tmp_path / "rep", figures=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".rep.tmp-not-ours", mine.name, "rep"])


def test_temp_names_carry_their_owner():
    name = _atomic.temp_prefix(".tmp-") + "abc123.tmp"
    host, pid = _atomic.temp_owner(name, ".tmp-")
    assert pid == os.getpid() and host == _atomic._host()
    assert _atomic.temp_owner(".tmp-garbage", ".tmp-") is None
    assert _atomic.pid_alive(os.getpid())

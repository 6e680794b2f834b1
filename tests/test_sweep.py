"""sq.sweep: tasks, the resumable Parquet store, serial and Dask executors, the CLI.

The distributed tests share one local cluster of 2 single-threaded worker
processes (module-scoped fixture) and use tiny tasks (tests/sweep_tasks.py).
"""

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import symquad as sq
from symquad.cli import main
from symquad.cli.sweep import parse_grid, parse_value
from symquad.studies.store import point_key
from symquad.studies.tasks import get_task

import sweep_tasks
from conftest import HangGuard

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=logging.ERROR)
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()


def _point_files(store):
    folder = os.path.join(store, "points")
    return sorted(f for f in os.listdir(folder) if f.endswith(".parquet")) \
        if os.path.isdir(folder) else []


# ---------------------------------------------------------------------------
# input checks, before anything runs
# ---------------------------------------------------------------------------
def test_grid_values_are_parsed_never_evaluated():
    assert parse_value("3") == 3 and isinstance(parse_value("3"), int)
    assert parse_value("1e3") == 1000.0 and isinstance(parse_value("1e3"), float)
    assert parse_value("0.1") == 0.1 and parse_value("-2.5e-3") == -2.5e-3
    assert parse_value("True") is True and parse_value("false") is False
    assert parse_value("none") is None
    assert parse_value("width") == "width"
    evil = "__import__('os').system('echo pwned')"
    assert parse_value(evil) == evil            # a plain string, not executed
    assert parse_grid(["p=1,2", "lr=0.1"]) == {"p": [1, 2], "lr": [0.1]}
    for bad in (["p"], ["p=1,,2"], ["1p=3"], ["p=1", "p=2"], ["p="]):
        with pytest.raises(ValueError, match="--grid"):
            parse_grid(bad)


def test_bad_parameters_rejected_before_running(tmp_path):
    store = tmp_path / "s"
    with pytest.raises(TypeError, match="no parameter"):
        sq.sweep("plateau", {"p": [1], "p_star": [1], "learning_rate": [0.1]}, store,
                 workers=1)
    with pytest.raises(TypeError, match="needs parameter"):
        sq.sweep("plateau", {"p": [1]}, store, workers=1)
    with pytest.raises(ValueError, match="empty"):
        sq.sweep("plateau", {"p": [], "p_star": [1]}, store, workers=1)
    with pytest.raises(ValueError, match="finite"):
        sq.sweep("plateau", {"p": [1], "p_star": [1], "lr": [float("nan")]}, store, workers=1)
    with pytest.raises(ValueError, match="1000000 points"):
        sq.sweep("plateau", {"p": list(range(1, 101)), "p_star": list(range(1, 101)),
                             "lr": [0.1 * i for i in range(1, 101)]}, store, workers=1,
                 max_points=10**5)
    with pytest.raises(ValueError, match="workers"):
        sq.sweep("plateau", {"p": [1], "p_star": [1]}, store, workers=0)
    assert not store.exists()                    # nothing was written
    for bad in ("no such task", "os;rm", "x.y:z:w", "1abc.f"):
        with pytest.raises(ValueError):
            get_task(bad)
    with pytest.raises(ValueError, match="cannot import"):
        get_task("symquad_no_such_module:f")
    with pytest.raises(ValueError, match="module-level"):
        get_task(lambda x: {"y": x})
    assert get_task("sweep_tasks:square").func is sweep_tasks.square


def test_store_belongs_to_one_task(tmp_path):
    sq.sweep("plateau", {"p": [1], "p_star": [1]}, tmp_path, workers=1)
    with pytest.raises(ValueError, match="holds task 'plateau'"):
        sq.sweep("hessian", {"p": [1], "p_star": [1]}, tmp_path, workers=1)


# ---------------------------------------------------------------------------
# serial executor: values, errors, resuming
# ---------------------------------------------------------------------------
def test_builtin_tasks_equal_direct_calls(tmp_path):
    df = sq.sweep("plateau", {"p": [1, 3], "p_star": [2], "lr": [0.1],
                              "lr_scaling": ["fixed", "width"]}, tmp_path / "pl", workers=1)
    assert len(df) == 4 and (df["status"] == "ok").all()
    for _, row in df.iterrows():
        fp = sq.plateau(sq.Model(p=int(row.p), p_star=int(row.p_star), lr=row.lr,
                                 lr_scaling=row.lr_scaling))
        assert (row.q, row.risk, row.rate) == (fp.q, fp.risk, fp.rate)
    # Hessian at the gradient-flow plateau: p·p* negative directions (closed form)
    dh = sq.sweep("hessian", {"p": [2], "p_star": [1, 2], "N": [8]}, tmp_path / "h",
                  workers=1)
    assert (dh["negative"] == dh["p"] * dh["p_star"]).all()
    assert (dh["negative"] + dh["zero"] + dh["positive"] == dh["p"] * dh["N"]).all()
    # ode task = random_start + integrate, called directly
    do = sq.sweep("ode", {"p": [2], "p_star": [1], "N": [200], "t_max": [40.0],
                          "seed": [3, 4]}, tmp_path / "o", workers=1)
    from symquad.numeric.landscape import random_start
    m = sq.Model(p=2, p_star=1, lr=0.1)
    for _, row in do.iterrows():
        Q0, r0 = random_start(m, 200, 1, seed=int(row.seed))
        sol = sq.integrate(m, Q0[0], r0[0], np.eye(1), 40.0,
                           t_eval=np.linspace(0, 40.0, 201), on_divergence="stop")
        assert row.final_risk == sol.risk[-1]
        arrays = sq.load_sweep_arrays(tmp_path / "o", row.key)
        np.testing.assert_array_equal(arrays["risk"], sol.risk)


def test_validate_task_equals_direct_call(tmp_path):
    kw = dict(N=150, t_max=6.0, replicas=3, start="informed", seed=5)
    df = sq.sweep("validate", {"p": [3], "p_star": [2], "lr": [0.3], **{k: [v] for k, v in
                                                                     kw.items()}},
                  tmp_path, workers=1)
    rep = sq.validate(sq.Model(p=3, p_star=2, lr=0.3), fss=False, invariant=False, **kw)
    row = df.iloc[0]
    assert row.status == "ok", row.error
    assert row.band_inside_fraction == rep.numbers["band"]["ode_inside_fraction"]
    assert row.risk_rms_whole_run == rep.numbers["deviation"]["whole_run"]["risk_rms"]["mean"]
    assert row.replicas_used == rep.numbers["replicas_used"] == 3
    assert ("passed" in df.columns) == hasattr(rep, "passed")


def test_error_rows_rerun_and_retry(tmp_path):
    store = tmp_path / "s"
    df = sq.sweep(sweep_tasks.fails_on_odd, {"x": [0, 1, 2, 3]}, store, workers=1)
    assert list(df["status"]) == ["ok", "error", "ok", "error"]
    assert df.loc[1, "error"] == "ValueError: odd x=1 rejected"
    assert "fails_on_odd" in df.loc[1, "traceback"]
    assert df.loc[2, "y"] == 4 and np.isnan(df.loc[1, "y"])
    info = df.attrs["sweep"]
    assert (info.ok, info.errors, info.computed) == (2, 2, 4)
    again = sq.sweep(sweep_tasks.fails_on_odd, {"x": [0, 1, 2, 3]}, store, workers=1)
    assert again.attrs["sweep"].computed == 0
    retried = sq.sweep(sweep_tasks.fails_on_odd, {"x": [0, 1, 2, 3]}, store, workers=1,
                       retry_errors=True)
    assert retried.attrs["sweep"].computed == 2
    assert len(sq.load_sweep(store)) == 4      # rewritten in place, not duplicated
    bad = sq.sweep(sweep_tasks.bad_result, {"x": [1]}, tmp_path / "b", workers=1)
    assert bad.loc[0, "status"] == "error" and "must be a scalar" in bad.loc[0, "error"]


def test_rerun_recomputes_nothing(tmp_path):
    store, log = tmp_path / "s", str(tmp_path / "calls.log")
    grid = {"x": [1, 2, 3], "log": [log]}
    first = sq.sweep(sweep_tasks.square, grid, store, workers=1)
    mtimes = {f: os.stat(os.path.join(store, "points", f)).st_mtime_ns
              for f in _point_files(store)}
    second = sq.sweep(sweep_tasks.square, grid, store, workers=1)
    assert open(log).read().split() == ["1", "2", "3"]          # each point ran once
    assert second.attrs["sweep"].computed == 0 and second.attrs["sweep"].skipped == 3
    assert {f: os.stat(os.path.join(store, "points", f)).st_mtime_ns
            for f in _point_files(store)} == mtimes
    cols = ["x", "y", "key", "status"]
    assert first[cols].equals(second[cols])
    # a larger grid computes only the new point
    third = sq.sweep(sweep_tasks.square, {"x": [1, 2, 3, 4], "log": [log]}, store, workers=1)
    assert third.attrs["sweep"].computed == 1 and list(third["y"]) == [1, 4, 9, 16]


def test_store_ignores_temporaries_and_damaged_cache(tmp_path):
    store = tmp_path / "s"
    sq.sweep(sweep_tasks.square, {"x": list(range(3))}, store, workers=1)
    # what a killed writer can leave: a half-written temporary file
    (store / "points" / ".tmp-somehost-1-abc").write_bytes(b"PAR1 truncated")
    (store / "table.parquet").write_bytes(b"not parquet")
    df = sq.load_sweep(store)
    assert sorted(df["y"]) == [0, 1, 4] and df["key"].is_unique
    # the key identifies task, version and every parameter (defaults included)
    t = get_task(sweep_tasks.square)
    assert set(df["key"]) == {point_key(t.name, t.version, {"x": x, "delay": 0.0, "log": ""})
                              for x in range(3)}


def test_consolidated_cache_keeps_every_column(tmp_path, monkeypatch):
    from symquad.studies import store as store_module
    monkeypatch.setattr(store_module, "_CONSOLIDATE_AFTER", 16)
    store = tmp_path / "s"
    sq.sweep(sweep_tasks.mostly_fails, {"x": list(range(70))}, store, workers=1)
    first = sq.load_sweep(store)                 # 70 fresh rows: writes table.parquet
    assert (store / "table.parquet").exists()
    second = sq.load_sweep(store)                # now read from the cache
    for df in (first, second):
        ok = df[df["status"] == "ok"]
        assert sorted(ok["x"]) == list(range(0, 70, 10))
        assert list(ok["y"]) == [x * x for x in ok["x"]]
        assert list(ok["label"]) == [f"x{x}" for x in ok["x"]]
        assert (df["status"] == "error").sum() == 63
    assert second.drop(columns="traceback").equals(first.drop(columns="traceback"))


# ---------------------------------------------------------------------------
# Dask: identical numbers, killed worker, killed client
# ---------------------------------------------------------------------------
def test_serial_and_distributed_identical(tmp_path, client):
    grid = {"p": [2], "p_star": [1], "N": [300], "t_max": [20.0], "seed": [1, 2, 3]}
    a = sq.sweep("ode", grid, tmp_path / "serial", workers=1)
    b = sq.sweep("ode", grid, tmp_path / "dask", client=client)
    assert b.attrs["sweep"].executor.startswith("dask")
    assert list(a["key"]) == list(b["key"])
    for col in ("final_risk", "escape_time", "final_q_mean", "final_rho_norm", "min_risk"):
        np.testing.assert_array_equal(a[col].to_numpy(), b[col].to_numpy(), err_msg=col)
    for key in a["key"]:
        np.testing.assert_array_equal(sq.load_sweep_arrays(tmp_path / "serial", key)["risk"],
                                      sq.load_sweep_arrays(tmp_path / "dask", key)["risk"])
    rerun = sq.sweep("ode", grid, tmp_path / "dask", client=client)
    assert rerun.attrs["sweep"].computed == 0
    # the CLI attached to the same running scheduler
    assert main(["sweep", "plateau", "--grid", "p=1,2", "--grid", "p_star=1", "--store",
                 str(tmp_path / "cli"), "--scheduler", client.scheduler.address,
                 "--no-progress"]) == 0
    assert list(sq.load_sweep(tmp_path / "cli")["p"]) == [1, 2]


def test_point_timeout_on_dask_workers(tmp_path, client):
    # the point runs in a child of the worker process, killed at the deadline; the
    # worker itself stays and runs the next points
    grid = {"x": [1, 2], "duration": [0.05, 600.0]}
    # the slow points sleep 600 s: only the timeout ends them before the guard
    guard = HangGuard(240, "a Dask sweep with points past timeout=1.5")
    df = sq.sweep(sweep_tasks.sleepy, grid, tmp_path / "s", client=client, timeout=1.5)
    guard.check()
    assert list(df["status"]) == ["ok", "error", "ok", "error"]
    assert list(df["y"].fillna(-1)) == [1, -1, 2, -1]
    assert df["error"].dropna().str.startswith(
        "TimeoutError: the point did not finish within timeout=1.5 s").all()
    assert len(client.nthreads()) == 2                       # no worker was lost


@pytest.mark.slow
def test_escape_task_serial_and_distributed_identical(tmp_path, client):
    grid = {"p": [2, 3], "p_star": [1], "lr_scaling": ["width"], "N": [300], "replicas": [8],
            "seed": [0, 1]}
    a = sq.sweep("escape", grid, tmp_path / "serial", workers=1)
    b = sq.sweep("escape", grid, tmp_path / "dask", client=client)
    assert (a["status"] == "ok").all() and (b["status"] == "ok").all()
    for col in ("pred_sgd", "pred_ode", "ode_median", "sgd_median", "sgd_median_se"):
        np.testing.assert_array_equal(a[col].to_numpy(), b[col].to_numpy(), err_msg=col)
    # different seeds give different SGD samples (the seed is really used)
    assert a.loc[0, "sgd_median"] != a.loc[1, "sgd_median"]


def test_worker_killed_mid_sweep_loses_nothing(tmp_path, client):
    marker = tmp_path / "markers"
    marker.mkdir()
    df = sq.sweep(sweep_tasks.kill_worker_once, {"x": list(range(6)), "marker_dir": [str(marker)]},
                  tmp_path / "s", client=client)
    assert (marker / "killed-0").exists()        # a worker really was SIGKILLed
    assert (df["status"] == "ok").all(), df[["x", "status", "error"]]
    assert list(df["y"]) == [x * x for x in range(6)]
    assert df.attrs["sweep"].lost == 0 and len(sq.load_sweep(tmp_path / "s")) == 6


def test_client_killed_mid_sweep_then_rerun_completes(tmp_path, client):
    # points x >= 3 wait for a gate file: the client is killed with three points stored and
    # the others in flight, however slowly this machine runs (no race with the clock)
    store, gate = tmp_path / "s", tmp_path / "gate"
    n = 16
    grid = {"x": list(range(n)), "gate": [str(gate)]}
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {TESTS_DIR!r})
        import symquad as sq, sweep_tasks
        from distributed import Client
        c = Client({client.scheduler.address!r})
        sq.sweep(sweep_tasks.gated, {grid!r}, {str(store)!r}, client=c, progress=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        guard = HangGuard(240, "a client storing its first three points")
        while len(_point_files(store)) < 3 and proc.poll() is None:
            guard.check()
            time.sleep(0.05)
        assert proc.poll() is None, "the client ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        before = len(_point_files(store))
        assert before == 3
    finally:
        gate.touch()             # the killed client's points in flight end, whatever happened
        proc.kill()
        proc.wait()
    df = sq.sweep(sweep_tasks.gated, grid, store, client=client)
    info = df.attrs["sweep"]
    assert info.skipped == len(_point_files(store)) - info.computed
    assert info.computed <= n - before
    stored = sq.load_sweep(store)
    assert len(stored) == n and stored["key"].is_unique
    assert sorted(stored["y"]) == sorted(x * x for x in range(n))
    assert (stored["status"] == "ok").all()


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------
def test_cli_sweep_list_run_and_errors(tmp_path, capsys):
    assert main(["sweep", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("plateau(", "escape(", "validate(", "ode(", "hessian("):
        assert name in out
    store = str(tmp_path / "s")
    args = ["sweep", "plateau", "--grid", "p=1,2", "--grid", "p_star=1", "--store", store,
            "--workers", "1", "--no-progress"]
    assert main(args) == 0
    assert "2 points, 0 already in the store, 2 computed (2 ok, 0 error)" in \
        capsys.readouterr().out
    assert main(args) == 0
    assert "2 already in the store, 0 computed" in capsys.readouterr().out
    assert main(["sweep", "plateau", "--grid", "p=1", "--grid", "bogus=2", "--grid",
                 "p_star=1", "--store", store, "--workers", "1"]) == 2
    assert "no parameter(s) ['bogus']" in capsys.readouterr().err
    # a model field's value is read as the model reads it: a bad one exits 2 naming the
    # field, before anything runs or is stored
    assert main(["sweep", "plateau", "--grid", "p=x", "--grid", "p_star=1", "--store",
                 str(tmp_path / "t"), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--grid p (allowed 1..4096): expected an integer" in err and "Traceback" not in err
    assert not (tmp_path / "t").exists()
    # a field the task's analysis was not derived for: an error row naming it (exit 1)
    assert main(["sweep", "plateau", "--grid", "p=2", "--grid", "p_star=1", "--grid",
                 "lr_readout=0,0.1", "--store", str(tmp_path / "u"), "--workers", "1",
                 "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "2 points" in captured.out and "(1 ok, 1 error)" in captured.out
    assert "lr_readout=0.1" in captured.err

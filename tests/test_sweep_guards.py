"""Sweeps: built-in tasks cannot be replaced, and a task's sys.exit is an error row."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import symquad as sq
import sweep_tasks
from symquad.studies import tasks as T

TESTS = Path(__file__).resolve().parent


def _other(p, p_star):
    """A stand-in for a built-in task."""
    return {"y": 0.0}


@pytest.mark.parametrize("name", sorted(T.BUILTIN_TASKS))
def test_builtin_tasks_cannot_be_replaced(name):
    before = T.TASKS[name]
    for kwargs in ({}, {"replace": True}):
        with pytest.raises(ValueError, match="built-in symquad task and cannot be replaced"):
            sq.register_task(name, **kwargs)(_other)
    assert T.TASKS[name] is before
    with pytest.raises(TypeError):
        T.TASKS[name] = T.TASKS["ode"]          # the registry is read-only


def test_user_task_replacement_needs_replace_true(monkeypatch):
    monkeypatch.setattr(T, "_REGISTRY", dict(T._REGISTRY))
    sq.register_task("mine_for_test")(sweep_tasks.square)
    sq.register_task("mine_for_test")(sweep_tasks.square)     # same function again: fine
    with pytest.raises(ValueError, match="already registered .*sweep_tasks.square.*replace=True"):
        sq.register_task("mine_for_test")(sweep_tasks.fails_on_odd)
    assert T._REGISTRY["mine_for_test"].func is sweep_tasks.square
    sq.register_task("mine_for_test", version="2", replace=True)(sweep_tasks.fails_on_odd)
    assert T._REGISTRY["mine_for_test"].func is sweep_tasks.fails_on_odd
    with pytest.raises(TypeError, match="replace must be True or False"):
        sq.register_task("x", replace="yes")


def _check_exit_rows(df):
    rows = {int(r["x"]): r for _, r in df.iterrows()}
    assert rows[0]["status"] == "ok" and rows[0]["y"] == 0
    assert rows[2]["status"] == "ok" and rows[2]["y"] == 4
    assert rows[1]["status"] == "error"
    assert rows[1]["error"] == "SystemExit: the task called sys.exit(3)"


def test_task_sys_exit_is_an_error_row_serially(tmp_path):
    # in a child process: before the fix, sys.exit(3) ended the sweep's process with status 3
    code = textwrap.dedent(f"""
        import symquad as sq, sweep_tasks
        df = sq.sweep(sweep_tasks.calls_exit, {{"x": [0, 1, 2]}}, {str(tmp_path / 's')!r},
                      workers=1, progress=False)
        print("rows", sorted(df["status"]))
    """)
    env = dict(__import__("os").environ)
    env["PYTHONPATH"] = f"{TESTS}:{env.get('PYTHONPATH', '')}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "rows ['error', 'ok', 'ok']" in out.stdout
    _check_exit_rows(sq.load_sweep(tmp_path / "s"))


def test_task_sys_exit_is_an_error_row_on_dask(tmp_path):
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        df = sq.sweep(sweep_tasks.calls_exit, {"x": [0, 1, 2]}, tmp_path / "d", client=client,
                      progress=False)
        _check_exit_rows(df)
        # the worker survived: the same cluster still runs tasks
        assert client.submit(sum, [1, 2]).result(timeout=30) == 3

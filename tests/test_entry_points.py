"""No raw traceback from any documented entry point (symquad.entry.run_main).

The ``symquad`` commands, ``python -m symquad`` and the scripts in examples/
end every failure with one line on stderr and an exit status; Ctrl-C of a run
with worker processes ends quietly; distributed's shutdown noise is muted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import symquad as sq
from symquad.entry import exit_status, quiet_close, run_main
from symquad.numeric.errors import DivergenceError

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS), env.get("PYTHONPATH", "")])
    env.pop("SYMQUAD_TRACEBACK", None)
    return env


def assert_one_clean_line(stderr, prefix):
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(prefix), stderr


# --------------------------------------------------------------------------- the mechanism
@pytest.mark.parametrize("exc, status, kind", [
    (ValueError("bad x"), 2, "error"), (TypeError("bad y"), 2, "error"),
    (OSError("disk full"), 2, "error"), (MemoryError(), 2, "error: out of memory"),
    (DivergenceError("boom", 1.0, {}), 3, "diverged"), (KeyboardInterrupt(), 130, "interrupted"),
    (RuntimeError("unexpected"), 5, "internal error"), (KeyError("k"), 5, "internal error"),
    (OverflowError("int too large"), 5, "internal error"),
])
def test_every_exception_ends_as_one_line_and_a_status(exc, status, kind, capsys):
    def boom():
        raise exc
    assert exit_status(exc) == (status, kind)
    assert run_main(boom, prog="prog") == status
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"prog: {kind}") and err.count("\n") == 1
    assert "Traceback" not in err


def test_internal_errors_say_how_to_get_the_traceback(capsys, monkeypatch):
    def boom():
        raise RuntimeError("deep")
    run_main(boom, prog="p")
    assert "SYMQUAD_TRACEBACK=1" in capsys.readouterr().err
    monkeypatch.setenv("SYMQUAD_TRACEBACK", "1")
    run_main(boom, prog="p")
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_system_exit_keeps_its_status_and_warnings_are_one_line(capsys):
    assert run_main(lambda: sys.exit(7)) == 7
    assert run_main(lambda: None) == 0

    def warns():
        warnings.warn("first line\n  second line", RuntimeWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        run_main(warns, prog="p")
    assert capsys.readouterr().err == "p: warning: first line second line\n"


def test_cli_internal_error_is_one_line(capsys, monkeypatch):
    from symquad import cli

    def boom(args):
        raise ZeroDivisionError("division by zero")
    monkeypatch.setattr("symquad.cli.equations.run", boom)
    assert cli.main(["equations"]) == 5
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("symquad equations: internal error: ZeroDivisionError")


# --------------------------------------------------------------------------- real entry points
def test_broken_pipe_is_quiet():
    # `python -m symquad equations | head -c 1`: the reader goes away at once
    proc = subprocess.Popen([sys.executable, "-m", "symquad", "equations", "--p", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "Exception ignored" not in err and "Broken" not in err


EXAMPLE_FAILURES = [
    ("escape_risk_curves.py", ["--N", "0"], "error: N must be"),
    ("hessian_spectra.py", ["--N", "0"], "error: N must be"),
    ("implicit_bias.py", ["--seed", "-1"], "implicit_bias.py: error: --seed"),
    ("phases.py", ["--N", "0"], "phases.py: error: --N"),
    ("validate_quickstart.py", ["--out", "/proc/symquad-no-such"], "error:"),
    ("escape_sweep.py", ["--part", "ode", "--workers", "0"], "error: workers must be"),
    ("sweep_phase_diagram.py", ["--out", "/proc/symquad-no-such"], "error:"),
]


@pytest.fixture(scope="module")
def example_failures(tmp_path_factory):
    """The failing example runs, started together, as many at a time as there are cores."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1))
    runs = {(script, tuple(args)): pool.submit(
        subprocess.run, [sys.executable, str(ROOT / "examples" / script), *args],
        capture_output=True, text=True, env=_env(), timeout=300,
        cwd=tmp_path_factory.mktemp(script.replace(".", "_")))
        for script, args, _ in EXAMPLE_FAILURES}
    yield runs
    pool.shutdown(wait=True)


@pytest.mark.parametrize("script, args, match", EXAMPLE_FAILURES,
                         ids=[s for s, _, _ in EXAMPLE_FAILURES])
def test_examples_fail_with_one_line_and_status_2(script, args, match, example_failures):
    out = example_failures[(script, tuple(args))].result()
    assert out.returncode == 2, out.stderr
    assert_one_clean_line(out.stderr, script)
    assert match in out.stderr


@contextlib.contextmanager
def _sigint_default_in_children():
    """Children started inside have SIGINT at its default action, whatever this process has.

    An ignored signal stays ignored across ``exec``, and Python installs its
    ``KeyboardInterrupt`` handler only where SIGINT has its default action.  A
    non-interactive shell starts a background job (``python -m pytest ... &`` in
    a script) with SIGINT ignored, so without this every child of such a test
    run ignored the test's SIGINT: the cause of the "lost" Ctrl-C of
    test_ctrl_c_of_a_local_cluster_sweep_is_quiet in full runs started that
    way.  A handler (unlike SIG_IGN) is reset to the default by ``exec``.
    """
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)


def _interrupt(cmd, ready, tmp_path):
    """Start `cmd` in its own process group; once `ready` exists send SIGINT to the group.

    `ready` is written by a task when it starts, so the driver is past the local
    cluster's start-up (where SIGINT is ignored by design) and waits for its
    points: the signal cannot arrive too early.  The waits are bounded.
    """
    with _sigint_default_in_children():
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_env(), cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), f"no task started within 120 s (exit {proc.poll()})"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, err


def test_children_of_the_tests_get_the_default_sigint_even_if_this_process_ignores_it(tmp_path):
    # the mechanism above, checked under the condition that broke it: this process ignores SIGINT
    probe = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) is "
             "signal.default_int_handler)"]
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        plain = subprocess.run(probe, capture_output=True, text=True, timeout=60).stdout
        with _sigint_default_in_children():
            fixed = subprocess.run(probe, capture_output=True, text=True, timeout=60).stdout
    finally:
        signal.signal(signal.SIGINT, saved)
    assert (plain.strip(), fixed.strip()) == ("False", "True")
    assert signal.getsignal(signal.SIGINT) is saved


def test_ctrl_c_of_a_local_cluster_sweep_is_quiet(tmp_path):
    # Ctrl-C (SIGINT to the whole process group, workers included) while tasks run
    log = tmp_path / "started.log"             # the task writes a line when it starts
    rc, err = _interrupt([sys.executable, "-m", "symquad", "sweep", "sweep_tasks:square",
                          "--grid", "x=1,2,3,4", "--grid", "delay=20", "--grid", f"log={log}",
                          "--store", "st", "--workers", "2", "--no-progress"], log, tmp_path)
    assert rc == 130, err
    assert err.strip() == "symquad sweep: interrupted", err


def test_lost_scheduler_closes_without_noise(tmp_path):
    # the scheduler dies during a sweep; closing the client must not print distributed's
    # reconnect tracebacks ("Stream is closed", CommClosedError, ...).  No race with the
    # clock: the cluster is closed once a point has started (an event set by the point,
    # which then runs 0.5 s more), and every wait after that is bounded (the client's
    # reconnect by distributed.comm.timeouts.connect, the sweep's wait for a worker by
    # worker_timeout), far below the subprocess timeout.
    (tmp_path / "lost_tasks.py").write_text(textwrap.dedent("""
        import threading, time
        started = threading.Event()

        def point(x):
            started.set()          # the scheduler is closed while this point runs
            time.sleep(0.5)
            return {"y": x}
    """))
    script = textwrap.dedent("""
        import logging, sys, threading
        import dask
        from distributed import Client, LocalCluster
        import symquad as sq, lost_tasks
        from symquad.entry import quiet_close

        def lose_scheduler(cluster):
            if lost_tasks.started.wait(60):
                cluster.close()

        if __name__ == "__main__":
            dask.config.set({"distributed.comm.timeouts.connect": "3s"})
            cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                   dashboard_address=None, silence_logs=logging.ERROR)
            client = Client(cluster.scheduler_address)
            threading.Thread(target=lose_scheduler, args=(cluster,), daemon=True).start()
            df = sq.sweep(lost_tasks.point, {"x": [1, 2, 3]}, sys.argv[2], client=client,
                          progress=False, worker_timeout=5)
            print("statuses", sorted(df["status"]))
            print("closing the client", file=sys.stderr, flush=True)
            client.close() if sys.argv[1] == "plain" else quiet_close(client)
            print("closed")
    """)
    path = tmp_path / "lost.py"
    path.write_text(script)
    procs = {mode: subprocess.Popen([sys.executable, str(path), mode, str(tmp_path / mode)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=_env(), cwd=tmp_path)
             for mode in ("plain", "quiet")}          # side by side: independent processes
    runs = {}
    for mode, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for other in procs.values():
                other.kill()
            raise
        runs[mode] = (proc.returncode, out, err.partition("closing the client")[2])
    for rc, out, err in runs.values():
        assert rc == 0 and "statuses" in out and "closed" in out, err
    assert "Traceback" not in runs["quiet"][2] and "distributed." not in runs["quiet"][2]
    if "Traceback" not in runs["plain"][2]:
        pytest.skip("this distributed version is quiet at close anyway")


def test_quiet_close_restores_logging(caplog):
    class Noisy:
        def close(self):
            logging.getLogger("distributed.client").error("Stream is closed")
            raise OSError("already gone")
    with caplog.at_level(logging.WARNING):
        quiet_close(Noisy(), None)
        assert not caplog.records
        logging.getLogger("symquad.test").warning("after")
    assert [r.getMessage() for r in caplog.records] == ["after"]


def test_run_main_counts_a_returned_result_as_success():
    """A script's main may return its results (examples/phases.py returns the ODE solution)."""
    assert sq.run_main(lambda: {"risk": 0.1}, prog="x") == 0
    assert sq.run_main(lambda: None, prog="x") == 0
    assert sq.run_main(lambda: 3, prog="x") == 3


def test_phases_example_runs(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "phases.py"), "--t-max", "60",
                          "--out", str(tmp_path / "ph")], capture_output=True, text=True,
                         env=_env(), cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "ph" / "phases.png").is_file()

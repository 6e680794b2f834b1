"""Progress shows in log files: plain lines when stderr is not a terminal (symquad.progress)."""

from __future__ import annotations

import io
import re
import numpy as np
import pytest

import symquad as sq
import symquad.progress as P


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(P.time, "monotonic", c)
    return c


def test_lines_every_tenth_with_elapsed_time_and_estimate(clock):
    log = io.StringIO()                             # not a terminal: a log file
    bar = P.progress(True, 200, "SGD (test)", "steps", stream=log)
    for _ in range(20):
        clock.now += 3.0                            # 10 steps every 3 s
        bar.update(10)
    bar.close()
    lines = log.getvalue().splitlines()
    assert lines[0] == "symquad: SGD (test): 10% (20/200 steps), 6.0 s elapsed, ~54 s left"
    assert lines[4] == "symquad: SGD (test): 50% (100/200 steps), 30 s elapsed, ~30 s left"
    assert len(lines) == 10                        # 10 %, ..., 90 %, then the last line
    assert lines[-1] == "symquad: SGD (test): done, 200/200 steps in 1 min 00 s"


def test_a_line_every_interval_when_tenths_take_long(clock):
    log = io.StringIO()
    bar = P.progress(True, 1000, "ODE", "time", stream=log, integer=False)
    for i in range(1, 13):                          # 1 % per 4 s: 48 s for 12 %
        clock.now += 4.0
        bar.set(10 * i)
    lines = log.getvalue().splitlines()
    # a line after >= 10 s (t = 12 s, 24 s) and at 10 % (t = 40 s, 48 s would be < 10 s later)
    assert [re.search(r"(\d+)% ", line).group(1) for line in lines] == ["3", "6", "9", "10"]
    assert all("elapsed" in line and "left" in line for line in lines)


def test_short_work_prints_nothing(clock):
    log = io.StringIO()
    with P.progress(True, 100, "fast", stream=log) as bar:
        for _ in range(100):
            clock.now += 0.01
            bar.update()
    assert log.getvalue() == ""


def test_a_terminal_gets_a_bar_and_false_gets_nothing(clock):
    tty = Terminal()
    with P.progress(True, 10, "points", stream=tty) as bar:
        bar.update(5)
    assert "points" in tty.getvalue() and "symquad: points:" not in tty.getvalue()
    for enabled, stream in ((False, io.StringIO()), (None, io.StringIO()), (False, Terminal())):
        with P.progress(enabled, 10, "x", stream=stream) as bar:
            clock.now += 100
            bar.update(10)
        P.note(enabled, "stage", stream=stream)
        assert stream.getvalue() == ""
    log = io.StringIO()
    P.note(True, "validate: stage", stream=log)
    assert log.getvalue() == "symquad: validate: stage\n"


@pytest.fixture
def every_line(monkeypatch):
    monkeypatch.setattr(P, "MIN_LINE_GAP_S", 0.0)   # short test runs still print their lines


def _lines(text, desc):
    return [line for line in text.splitlines() if line.startswith(f"symquad: {desc}")]


def test_simulators_and_solvers_report_progress(capsys, every_line):
    m = sq.Model(p=3, p_star=2, lr=0.2)
    rho0 = 1e-2 * np.arange(1, 7).reshape(3, 2) / 6
    sq.simulate(m, N=200, t_max=2.0, replicas=4, seed=0, progress=True)
    sq.integrate(m, np.eye(3), rho0, np.eye(2), 20.0, progress=True)
    from symquad.numeric.ode_batch import integrate_batch
    integrate_batch(m, np.eye(3)[None], rho0[None], np.eye(2), 20.0, progress=True)
    err = capsys.readouterr().err
    for desc in ("SGD (reduced, N=200, 4 replicas)", "ODE (p=3, p*=2", "ODE from 1 start"):
        lines = _lines(err, desc)
        assert len(lines) >= 5 and "done" in lines[-1], (desc, err)


def test_sweep_reports_points(capsys, every_line, tmp_path):
    import sweep_tasks
    sq.sweep(sweep_tasks.square, {"x": list(range(5))}, tmp_path / "s", workers=1,
             progress=True)
    lines = _lines(capsys.readouterr().err, "sweep")
    assert len(lines) == 5 and "20% (1/5 points)" in lines[0]
    assert re.fullmatch(r"symquad: sweep sweep_tasks.square: done, 5/5 points in [\d.]+ s",
                        lines[-1])


def test_validate_command_writes_stage_lines_to_a_log(tmp_path, capsys):
    from symquad import cli
    args = ["validate", "--quick", "--no-fss", "--no-invariant", "--N", "200", "--replicas", "8",
            "--t-max", "5"]
    assert cli.main(args + ["--out", str(tmp_path / "r")]) in (0, 1, 4)
    err = capsys.readouterr().err                   # captured: not a terminal
    assert "symquad: validate: SGD, N = 200, 8 replicas, t <= 5" in err
    assert cli.main(args + ["--no-progress", "--out", str(tmp_path / "r2")]) in (0, 1, 4)
    assert "symquad:" not in capsys.readouterr().err

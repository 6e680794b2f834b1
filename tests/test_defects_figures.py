"""Figure defects of issue 25: a clipped title, a literal "η_a", no plot of a trained
readout a(t), a wrong axis description in docs/paper_map.md."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

import symquad as sq
from symquad.plotting import layout_problems, phases_figure, validation_figures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONG = sq.Model(p=3, p_star=2, lr=0.1, noise=0.25, weight_decay=0.01,
                readout=(1, "1/2", "1/3"), teacher_readout=("3/7", "5/11"), lr_readout=0.3,
                batch_size=4, activation="z**2 + 0.3*z")


@functools.lru_cache(maxsize=None)
def _trained_report():
    m = sq.Model(p=2, p_star=1, lr=0.3, lr_readout=0.3)
    run = sq.simulate(m, N=400, t_max=2.0, replicas=4, seed=2, t_eval=np.linspace(0, 2, 7))
    assert run.readout is not None
    return sq.compare(m, run.t, run.Q, run.rho, None, run.readout, progress=False), run


def test_a_long_title_is_wrapped_inside_the_figure():
    sol = sq.integrate(LONG, np.eye(3), np.full((3, 2), 0.01), np.eye(2), t_max=5.0,
                       warn_symmetric=False)
    fig = phases_figure(LONG, sol, 1.0, 3.0, 1000)
    assert layout_problems(fig) == []
    title = fig._suptitle.get_text()
    assert "\n" in title                          # one line was wider than the figure
    words = " ".join(title.split())
    for part in ("λ = 0.01", "batch = 4", "a = (1, 1/2, 1/3)", r"$\rho(0) \sim N^{-1/2}$"):
        assert part in words                      # nothing lost, no math span broken


def test_wrap_never_breaks_math():
    from symquad.plotting import _wrap_outside_math
    lines = _wrap_outside_math(r"aaa $x = y + z$ bbb ccc ddd", 6)
    assert r"$x = y + z$" in lines and all(line.count("$") % 2 == 0 for line in lines)


def test_eta_a_is_math_in_figures_and_text_in_summaries():
    rep, _ = _trained_report()
    figs = validation_figures(rep)
    texts = [t.get_text() for fig in figs.values() for t in fig.findobj(
        __import__("matplotlib").text.Text)]
    assert not any("η_a" in t.replace(r"$\eta_a$", "") for t in texts)
    assert any(r"$\eta_a$ = 0.3" in t for t in texts)
    assert "lr_readout" in rep.summary() or "η_a" in rep.summary()


def test_a_trained_readout_has_its_trajectory_figure():
    rep, run = _trained_report()
    figs = validation_figures(rep)
    assert "readout" in figs
    fig = figs["readout"]
    assert layout_problems(fig) == []
    left = fig.axes[0]
    solid = [line for line in left.get_lines() if line.get_linestyle() == "-"]
    r0 = int(np.argmax(np.all(np.isfinite(rep.sgd_risk), axis=1)))
    # the plotted SGD lines are the simulator's own readouts (an independent array)
    for k in range(2):
        np.testing.assert_array_equal(solid[k].get_ydata(), run.readout[r0, :, k])
    fixed = sq.compare(sq.Model(p=2, p_star=1, lr=0.3), run.t, run.Q, run.rho,
                       progress=False)
    assert "readout" not in validation_figures(fixed)


def test_paper_map_describes_the_phases_axes():
    text = open(os.path.join(ROOT, "docs", "paper_map.md"), encoding="utf-8").read()
    line = next(ln for ln in text.splitlines() if "phases.png" in ln)
    assert "(log axes)" not in line and "linear `t`" in line
    # the figure itself: t linear on every panel, the risk and |rho| on log y axes
    sol = sq.integrate(sq.Model(p=2, p_star=1, lr=0.3), np.eye(2), np.full((2, 1), 0.01),
                       np.eye(1), t_max=5.0, warn_symmetric=False)
    fig = phases_figure(sq.Model(p=2, p_star=1, lr=0.3), sol, 1.0, 3.0, 1000)
    assert [ax.get_xscale() for ax in fig.axes[:3]] == ["linear"] * 3
    assert [ax.get_yscale() for ax in fig.axes[:3]] == ["log", "linear", "log"]

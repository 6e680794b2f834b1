"""Defects of class "unbounded waits and resources" (issue 25): refused before any work.

Every entry point that can run long or large checks its size and a run-time
estimate first: the order-parameter SDE (``simulate`` and ``escape_time``),
``fluctuations``' output times, ``validate`` (its planner, the width, the
activation pair), the Model's widths and rates, sweeps' grid values.  Each test
asserts the refusal comes fast (well under the seconds the work would take:
no wall-clock bound on another process, only that nothing long ran first).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import symquad as sq
from symquad.numeric import simulate as S
from symquad.spec import DEFAULT_MODEL, MAX_RATE, MAX_WIDTH

M = sq.Model(p=2, p_star=1, lr=0.3)


def test_sde_estimate_is_a_lower_bound_of_a_measured_run():
    # the estimate's own route: at least ceil(t_max/dt) steps, each at least the bound
    run_t0 = time.perf_counter()
    run = sq.simulate(M, N=1000, t_max=4.0, replicas=8, seed=0, method="sde", dt=0.2)
    elapsed = time.perf_counter() - run_t0
    assert run.sde_steps >= 20
    assert S.estimate_sde_seconds(8, 4.0, 0.2) == pytest.approx(
        20 * (S.SDE_STEP_SECONDS + 8 * S.SDE_REPLICA_STEP_SECONDS))
    # a lower bound: the run took at least the estimate (a busy machine only makes it longer)
    assert elapsed >= S.estimate_sde_seconds(8, 4.0, 0.2)


@pytest.mark.parametrize("kwargs", [dict(t_max=1e7, replicas=64),          # ~ 7 days measured
                                    dict(t_max=20.0, replicas=64, dt=1e-9),
                                    dict(t_max=1e9, replicas=1)])
def test_long_sde_runs_are_refused_before_work(kwargs):
    with pytest.raises(ValueError, match="SDE run .* estimated to take at least"):
        sq.simulate(DEFAULT_MODEL, N=1000, method="sde", **kwargs)


@pytest.mark.parametrize("kwargs", [dict(t_max=1e7, n_samples=64), dict(t_max=100.0, dt=1e-9)])
def test_long_sde_escape_laws_are_refused_before_work(kwargs):
    with pytest.raises(ValueError, match="SDE run .* estimated to take at least"):
        sq.escape_time(DEFAULT_MODEL, 1000, method="sde", **kwargs)


def test_a_short_sde_run_is_not_refused():
    assert S.estimate_sde_seconds(64, 20.0, 0.2) < S.WARN_SECONDS
    run = sq.simulate(M, N=500, t_max=1.0, replicas=4, seed=1, method="sde")
    assert run.status.tolist() == ["ok"] * 4


@pytest.mark.parametrize("t_eval, match", [
    (np.linspace(0.0, 10.0, 3 * 10**6), "needs .* GiB"),
    (np.array([0.0, 1.0, 1e12]), "must end by t = 1e"),
    (np.array([0.0, 2.0, 1.0]), "increasing"),
])
def test_fluctuations_times_are_checked_first(t_eval, match):
    m = sq.Model(p=4, p_star=2, lr=0.1)
    with pytest.raises(ValueError, match=match):
        sq.fluctuations(m, np.eye(4), np.full((4, 2), 0.01), np.eye(2), 1000, t_eval)


@pytest.mark.parametrize("field, value", [("p", MAX_WIDTH + 1), ("p_star", 10**7),
                                          ("p", 2**70)])
def test_widths_are_bounded_in_the_model(field, value):
    kwargs = dict(p=2, p_star=1, lr=0.1)
    kwargs[field] = value
    with pytest.raises(ValueError, match=rf"{field} must be an integer in \[1, {MAX_WIDTH}\]"):
        sq.Model(**kwargs)
    kwargs[field] = MAX_WIDTH                    # the bound itself is accepted
    assert getattr(sq.Model(**kwargs), field) == MAX_WIDTH


@pytest.mark.parametrize("field", ["lr_readout", "weight_decay"])
def test_rates_are_bounded_in_the_model(field):
    kwargs = dict(p=2, p_star=1, lr=0.1)
    kwargs[field] = MAX_RATE * 10
    with pytest.raises(ValueError, match=rf"{field} .*must be in .*1e\+12\]"):
        sq.Model(**kwargs)
    kwargs[field] = MAX_RATE
    assert getattr(sq.Model(**kwargs), field) == MAX_RATE


def test_validate_refuses_large_widths_and_unsupported_pairs_before_simulating(monkeypatch):
    calls = []
    monkeypatch.setattr(S, "simulate", lambda *a, **k: calls.append(1))
    from symquad.studies import validation
    with pytest.raises(ValueError, match="needs .* GiB|estimated to take"):
        validation.validate(sq.Model(p=2000, p_star=2, lr=0.1), progress=False)
    with pytest.raises(ValueError, match="ReLU student with a polynomial teacher"):
        validation.validate(sq.Model(p=2, p_star=1, lr=0.1, activation="relu",
                                     teacher_activation="z**2"), progress=False, fss=False,
                            invariant=False)
    assert calls == []


def test_informed_start_of_an_even_activation_needs_no_sign_search():
    from symquad.studies.validation import informed_start
    m = sq.Model(p=300, p_star=2, lr=0.1)
    Q0, rho0 = informed_start(m, 0.5)
    # the same directions as the search would keep: for even σ flipping a row changes nothing
    assert Q0.shape == (300, 300) and rho0.shape == (300, 2)
    odd = sq.Model(p=2, p_star=1, lr=0.1, activation="z**3 - 3*z")
    _, rho_odd = informed_start(odd, 0.5)
    assert np.all(rho_odd[:, 0] > 0)             # the odd case still aligns the signs


def test_sweep_grid_with_huge_exponents_refused_at_once(tmp_path, monkeypatch):
    # Fraction('1e-99999999') alone takes minutes: no such Fraction is ever made
    import re
    from fractions import Fraction
    from symquad import spec
    from symquad.cli import main
    from symquad.studies import tasks
    made = []

    class Guarded(Fraction):
        def __new__(cls, numerator=0, denominator=None):
            if isinstance(numerator, str) and re.search(r"e[+-]?\d{4,}", numerator, re.I):
                made.append(numerator)
                raise AssertionError(f"Fraction({numerator!r}) was started")
            return Fraction(numerator, denominator)
    for module in (spec, tasks):
        monkeypatch.setattr(module, "Fraction", Guarded)
    assert main(["sweep", "plateau", "--grid", "activation=0 1e-99999999 1",
                 "--store", str(tmp_path / "s")]) == 2
    assert main(["sweep", "plateau", "--grid", "lr=1e99999999",
                 "--store", str(tmp_path / "s")]) == 2
    assert made == [] and not (tmp_path / "s").exists()

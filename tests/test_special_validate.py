"""``validate`` with erf(z/√2) and ReLU at (p, p*) = (4, 2) (issue 17, phase 2).

SGD (the exact reduced simulator, general kernels with the activation codes)
against the ODE of the special tensor kernels, from each replica's realised
start: the true model passes from an informed and from a random start, and the
same SGD data against the ODE of a 10 % wrong learning rate fails.  The
plateau/escape analysis and the drift study of ``S`` are skipped with a reason
that names the activation (symquad.applicability).  Cheap versions (N = 1000,
16 replicas, no finite-size scaling) run by default; the full default settings
of ``symquad validate`` (N = 2000, 64 replicas, finite-size scaling) under
``-m slow``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import symquad as sq

CASES = [(act, start) for act in ("erf", "relu") for start in ("informed", "random")]


def _check(report, model, act, wrong_factors=(0.9, 1.1)):
    assert report.verdict == "PASS", report.reasons
    assert f"activation={act!r}" in report.numbers["escape"]["reason"]
    for lr in (f * model.lr for f in wrong_factors):
        wrong = sq.compare(model.replace(lr=lr), report.t, report.sgd_Q, report.sgd_rho)
        assert wrong.verdict == "FAIL", (lr, wrong.reasons)


@pytest.mark.parametrize("act, start", CASES, ids=[f"{a}-{s}" for a, s in CASES])
def test_validate_passes_and_a_wrong_lr_fails(act, start):
    model = sq.Model(p=4, p_star=2, lr=1.0, activation=act)
    report = sq.validate(model, N=1000, replicas=16, start=start, fss=False, invariant=False,
                         n_times=21, t_max=10.0, seed=3)
    _check(report, model, act, wrong_factors=(1.1,))


@pytest.mark.slow
@pytest.mark.parametrize("act, start", CASES, ids=[f"{a}-{s}" for a, s in CASES])
def test_validate_passes_with_the_default_settings(act, start):
    model = sq.Model(p=4, p_star=2, lr=1.0, activation=act)
    report = sq.validate(model, start=start, seed=11)
    assert report.numbers["finite_size_scaling"]["exponent"] == pytest.approx(-0.5, abs=0.12)
    assert "activation" in report.numbers["invariant_drift_skipped"]
    _check(report, model, act)


@pytest.mark.slow
def test_validate_command_line_with_erf(tmp_path):
    out = subprocess.run([sys.executable, "-m", "symquad", "validate", "--activation", "erf",
                          "--lr", "1", "--quick", "--no-progress", "--out",
                          str(tmp_path / "rep")], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "erf(z/√2)" in (tmp_path / "rep" / "summary.txt").read_text()

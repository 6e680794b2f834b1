"""The verdict at finite N: SGD against ODE + c/N, the derived O(1/N) mean correction.

A model with a risk floor (label noise 0.5) from an informed start: the mean SGD risk
sits O(1/N) above the ODE, resolved at 256 replicas (the test asserts that the ODE alone
is rejected, so the data do resolve the bias), the corrected comparison passes, and a
3 % wrong learning rate still fails it.
"""

import numpy as np
import pytest

import symquad as sq

FLOOR = sq.Model(3, 2, 0.3, noise=0.5)


def _mean_check(rep):
    return next(c for c in rep.numbers["verdict"]["checks"] if c["name"] == "mean_deviation")


@pytest.fixture(scope="module")
def floor_report():
    return sq.validate(FLOOR, N=500, replicas=256, start="informed", t_max=30.0, n_times=41,
                       fss=False, invariant=False, whole_run=False, resolution=False, seed=0)


def test_bias_is_resolved_and_predicted(floor_report):
    rep = floor_report
    fb = rep.numbers["finite_n_bias"]
    md = _mean_check(rep)
    # precision first: against the N -> infinity ODE alone the test rejects the true model
    assert fb["applies"] and fb["max_z_against_ode"] > md["critical"], fb
    # ... and N (mean SGD - ODE) agrees with the predicted c where it is resolved
    m, s, c = (np.asarray(fb[k]) for k in ("N_times_mean_deviation", "N_times_se",
                                           "predicted"))
    assert np.all(np.abs(m - c) <= 4 * s), fb
    assert rep.numbers["mean_deviation"]["reference"] == "ODE + c/N"
    assert md["status"] == "pass" and rep.verdict == "PASS", rep.reasons
    assert "N·(mean SGD - ODE) vs the O(1/N) theory c" in rep.summary()


def test_three_percent_wrong_lr_still_fails(floor_report):
    rep = floor_report
    wrong = sq.compare(FLOOR.replace(lr=0.309), rep.t, rep.sgd_Q, rep.sgd_rho, rep.T, N=500,
                       whole_run=False, resolution=False)
    assert _mean_check(wrong)["status"] == "fail" and wrong.verdict == "FAIL", wrong.reasons


def test_without_N_the_comparison_is_with_the_ode_and_says_so(floor_report):
    rep = floor_report
    plain = sq.compare(FLOOR, rep.t[:11], rep.sgd_Q[:32, :11], rep.sgd_rho[:32, :11], rep.T,
                       resolution=False)
    assert not plain.numbers["finite_n_bias"]["applies"]
    assert "input dimension N is not given" in plain.numbers["finite_n_bias"]["reason"]
    assert plain.numbers["mean_deviation"]["reference"] == "ODE"


@pytest.mark.slow
@pytest.mark.parametrize("N", [1000, 4000])
def test_unrepresentable_teacher_with_trained_readout_passes(N):
    """The issue's second case (z² student, z³ − 3z teacher, trained readout 0.2, p = 3,
    p* = 2, lr 0.3, informed start): 11.8 s.e. against the ODE alone at N = 1000, 4.15
    against ODE + c/N with Student's t alone (PASS, critical 4.35), 2.87 with the
    predicted law; at N = 4000 2.69 and 2.16 (64 replicas, seeds 0 and 1)."""
    m = sq.Model(3, 2, 0.3, teacher_activation="z**3 - 3*z", lr_readout=0.2)
    rep = sq.validate(m, N=N, replicas=64, start="informed", fss=False, invariant=False,
                      whole_run=False, resolution=False, finite_n=True,
                      seed={1000: 0, 4000: 1}[N])
    assert _mean_check(rep)["status"] == "pass" and rep.verdict == "PASS", rep.reasons


def test_finite_n_switch(floor_report):
    rep = floor_report
    args = (rep.t[:11], rep.sgd_Q[:32, :11], rep.sgd_rho[:32, :11], rep.T)
    with pytest.raises(ValueError, match="finite_n must be None, True or False"):
        sq.compare(FLOOR, *args, N=500, finite_n="yes")
    off = sq.compare(FLOOR, *args, N=500, finite_n=False, whole_run=False, resolution=False)
    assert "finite_n=False" in off.numbers["finite_n_bias"]["reason"]
    # automatic: skipped, with the estimate, when one right-hand side is too costly
    big = sq.Model(12, 3, 0.1, activation="erf")
    from symquad.studies.validation import _finite_n_correction
    c, valid, reason = _finite_n_correction(big, np.linspace(0, 1, 3), np.eye(12),
                                            np.zeros((12, 3)), np.eye(3), None, 1000)
    assert c is None and "estimated" in reason and "finite_n=True" in reason


@pytest.mark.slow
@pytest.mark.parametrize("seed", [7, 12, 15])
def test_skewed_floor_false_fails_of_students_t_pass_with_the_predicted_law(seed):
    """The calibration's three false FAILs at the z³ − 3z floor (trained readout 0.2,
    N = 1000, 32 replicas, seeds 7, 12, 15; docs/benchmarks.md): Student's t alone
    exceeds the critical value there (measured 5.11, 5.95, 4.79 against 4.70: a sample
    that misses the χ²-like right tail), the test with the predicted second-order law of
    the replica mean does not (3.19, 3.17, 3.31; tests/test_quadratic_law.py for its
    level and power on a synthetic skewed law)."""
    m = sq.Model(3, 2, 0.3, teacher_activation="z**3 - 3*z", lr_readout=0.2)
    rep = sq.validate(m, N=1000, replicas=32, start="informed", fss=False, invariant=False,
                      whole_run=False, resolution=False, seed=seed)
    md, check = rep.numbers["mean_deviation"], _mean_check(rep)
    assert md["reference"] == "ODE + c/N" and md["law_times"] == md["times"]
    assert md["max_z_student"] > check["critical"], md          # the false FAIL is there
    assert check["status"] == "pass" and rep.verdict == "PASS", rep.reasons

"""The resolution a validation run states, and the forward sensitivities it rests on.

Second routes: the sensitivities against central finite differences of the ODE
integrated for perturbed models (symquad.integrate, tight tolerances), the batch
size's exact two-point rule against the drift at a third batch size; the stated
resolution against the verdict itself: data from a model whose learning rate is off
by twice the resolution FAIL the mean-deviation test, by half of it pass.
"""

import numpy as np
import pytest

import symquad as sq
from symquad.numeric.sensitivity import _replaced, _value, risk_sensitivity
from symquad.studies.validation import informed_start

T2 = np.eye(2)


@pytest.fixture(scope="module")
def variant():
    m = sq.Model(3, 2, 0.3, noise=0.1, weight_decay=0.01, batch_size=2,
                 activation="z**2 + 0.5*z")
    Q0, rho0 = informed_start(m)
    t = np.linspace(0, 4, 9)
    return m, Q0, rho0, t, risk_sensitivity(m, Q0, rho0, T2, t)


def _ode_risk(model, Q0, rho0, t):
    return sq.integrate(model, Q0, rho0, T2, float(t[-1]), t_eval=t, rtol=1e-11,
                        atol=1e-13).risk


@pytest.mark.parametrize("name", ["lr", "noise", "weight_decay", "activation[1]",
                                  "activation[2]"])
def test_sensitivity_matches_finite_differences_of_the_ode(variant, name):
    m, Q0, rho0, t, s = variant
    theta = _value(m, name)
    h = 1e-4 * max(abs(theta), 0.1)
    fd = (_ode_risk(_replaced(m, name, theta + h), Q0, rho0, t)
          - _ode_risk(_replaced(m, name, theta - h), Q0, rho0, t)) / (2 * h)
    # central differences: truncation O(h^2 |ε'''|) ~ 1e-8 here, far below the derivative
    assert np.max(np.abs(fd)) > 1e-3
    np.testing.assert_allclose(s.risk_derivative[name], fd, rtol=0, atol=1e-7)


def test_batch_size_enters_the_drift_through_one_over_b(variant):
    """The two-point rule for the batch size assumes f = A + B/b: check it at b = 4."""
    m, Q0, rho0, _, _ = variant
    f = {b: sq.kernels(m.replace(batch_size=b)).rhs(Q0, rho0, T2) for b in (2, 3, 4)}
    B = (f[2][0] - f[3][0]) / (1 / 2 - 1 / 3)      # dQ/dt: the η² term carries 1/b
    assert np.max(np.abs(B)) > 1e-3
    np.testing.assert_allclose(f[4][0], f[2][0] + B * (1 / 4 - 1 / 2), atol=1e-13)
    np.testing.assert_array_equal(f[4][1], f[2][1])   # dρ/dt has no η² term


def test_unknown_parameter_is_refused(variant):
    m, Q0, rho0, t, _ = variant
    with pytest.raises(ValueError, match="parameters: \\['lr_readout'\\] not among"):
        risk_sensitivity(m, Q0, rho0, T2, t, parameters=["lr_readout"])


M = sq.Model(3, 2, 0.3)


def _mean_status(model, data):
    rep = sq.compare(model, data.t, data.Q, data.rho, resolution=False)
    return {c["name"]: c["status"] for c in rep.numbers["verdict"]["checks"]}["mean_deviation"]


def _check_resolution(seeds):
    Q0, rho0 = informed_start(M)
    t_eval = np.linspace(0, 10, 51)
    base = sq.simulate(M, N=1000, t_max=10.0, replicas=32, seed=100, Q0=Q0, rho0=rho0,
                       t_eval=t_eval)
    rep = sq.compare(M, base.t, base.Q, base.rho)
    d = rep.resolution["lr"]
    assert d is not None and 0 < d < 0.1 * M.lr, rep.numbers["resolution"]
    assert "RESOLUTION" in rep.summary() and "lr " in rep.summary()
    fails = {}
    for factor in (2.0, 0.5):
        wrong = M.replace(lr=M.lr + factor * d)
        # the data come from the other model; the theory tested is M
        fails[factor] = sum(
            _mean_status(M, sq.simulate(wrong, N=1000, t_max=10.0, replicas=32, seed=s,
                                        Q0=Q0, rho0=rho0, t_eval=t_eval)) == "fail"
            for s in seeds)
    return fails


def test_twice_the_resolution_fails_half_of_it_passes():
    """At 50 % power for the stated change, twice it gives z ~ 2c (always detected) and
    half of it z ~ c/2 at the most sensitive time: detected only when the noise adds
    about c/2 there (measured: 1 of 6 seeds)."""
    fails = _check_resolution(seeds=(1, 2, 3))
    assert fails[2.0] == 3 and fails[0.5] <= 1, fails


@pytest.mark.slow
def test_twice_the_resolution_fails_in_most_seeds_half_of_it_rarely():
    fails = _check_resolution(seeds=range(1, 13))
    assert fails[2.0] >= 11 and fails[0.5] <= 3, fails


def test_a_parameter_the_risk_does_not_depend_on_is_not_detectable(tmp_path):
    """On the sphere the projection cancels the weight decay: ``resolution`` says "not
    detectable" (None, with the reason) instead of ``c / rounding`` (4.8e9 before).

    Second route: the ODE integrated at two weight decays gives the same risk to rounding,
    while it does move the risk without the constraint, where the resolution stays a number.
    """
    import json
    from symquad.studies.resolution import ZERO_REASON
    sphere = sq.Model(3, 2, 0.3, constraint="sphere", weight_decay=0.01)
    Q0, rho0 = informed_start(sphere)
    t = np.linspace(0, 10, 26)
    risks = [_ode_risk(sphere.replace(weight_decay=wd), Q0, rho0, t) for wd in (0.01, 0.3)]
    assert np.max(np.abs(risks[0] - risks[1])) < 1e-9
    free = sphere.replace(constraint="none")
    free_risks = [_ode_risk(free.replace(weight_decay=wd), Q0, rho0, t) for wd in (0.01, 0.3)]
    assert np.max(np.abs(free_risks[0] - free_risks[1])) > 1e-3

    reports = {}
    for m in (sphere, free):
        run = sq.simulate(m, N=1000, t_max=10.0, replicas=16, seed=3, Q0=Q0, rho0=rho0,
                          t_eval=t)
        reports[m.constraint] = sq.compare(m, run.t, run.Q, run.rho)
    res = reports["sphere"].numbers["resolution"]
    assert reports["sphere"].resolution["weight_decay"] is None, res
    assert res["not_detectable"] == {"weight_decay": ZERO_REASON}
    assert all(v is not None and v > 0 for n, v in res["values"].items() if n != "weight_decay")
    assert "weight_decay not detectable" in reports["sphere"].summary()
    reports["sphere"].save(tmp_path / "rep", figures=False)
    saved = json.loads((tmp_path / "rep" / "report.json").read_text())["numbers"]["resolution"]
    assert saved["values"]["weight_decay"] is None                  # JSON null, with its reason
    assert saved["not_detectable"]["weight_decay"] == ZERO_REASON
    free_res = reports["none"].numbers["resolution"]
    assert free_res["not_detectable"] == {} and free_res["values"]["weight_decay"] > 0


# the resolution with the O(1/N) correction on (N given): a model with a floor, a schedule ---
FLOOR = sq.Model(3, 2, 0.3, noise=0.1)
SCHEDULED = sq.Model(3, 2, 0.3, lr_schedule="inverse:10")
#: the skewed floor (each replica's deviation χ²-like): the readout's rate drives it
SKEWED = sq.Model(3, 2, 0.3, teacher_activation="z**3 - 3*z", lr_readout=0.2)


def _key(value):
    """A hashable stand-in of an argument (arrays by shape, dtype and bytes)."""
    if isinstance(value, np.ndarray):
        return ("array", value.shape, value.dtype.str, value.tobytes())
    return value


def _memoised(function):
    """`function` with its results kept by arguments: every comparison below tests the same
    theory from the same start (the data's starts are the given ``Q0, ρ0``), so the O(1/N)
    correction (:func:`symquad.fluctuations`, half of a comparison's CPU) is the same in
    each.  A deterministic function: the comparisons' numbers are those without the memo."""
    memo = {}

    def call(*args, **kwargs):
        key = (tuple(_key(a) for a in args), tuple(sorted((k, _key(v)) for k, v in
                                                          kwargs.items())))
        if key not in memo:
            memo[key] = function(*args, **kwargs)
        return memo[key]
    return call


def _check_resolution_corrected(model, seeds, N=1000, replicas=32, name="lr", t_max=10.0,
                                n_times=51):
    """Data from ``θ + f·δ*`` (f = 2, ½) against the theory ``θ`` (parameter `name`),
    every comparison with ``N`` given (ODE + c/N, the predicted law where the expansion
    holds); δ* the resolution stated by a run of the true model (seed 100)."""
    from symquad.studies import validation_mean
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(validation_mean, "fluctuations", _memoised(validation_mean.fluctuations))
        return _resolution_corrected_fails(model, seeds, N, replicas, name, t_max, n_times)


def _resolution_corrected_fails(model, seeds, N, replicas, name, t_max, n_times):
    Q0, rho0 = informed_start(model)
    t_eval = np.linspace(0, t_max, n_times)

    def run(m, seed):
        return sq.simulate(m, N=N, t_max=t_max, replicas=replicas, seed=seed, Q0=Q0,
                           rho0=rho0, t_eval=t_eval)

    base = run(model, 100)
    rep = sq.compare(model, base.t, base.Q, base.rho, readout=base.readout, N=N,
                     whole_run=False)
    assert rep.numbers["mean_deviation"]["reference"] == "ODE + c/N"
    assert rep.numbers["mean_deviation"]["law_times"] > 0
    d = rep.resolution[name]
    theta = getattr(model, name)
    assert d is not None and 0 < d < 0.2 * theta, rep.numbers["resolution"]
    fails = {"delta": d}
    for factor in (2.0, 0.5):
        wrong = model.replace(**{name: theta + factor * d})
        fails[factor] = 0
        for s in seeds:
            data = run(wrong, s)
            cmp = sq.compare(model, data.t, data.Q, data.rho, readout=data.readout, N=N,
                             whole_run=False, resolution=False)
            fails[factor] += {c["name"]: c["status"] for c in
                              cmp.numbers["verdict"]["checks"]}["mean_deviation"] == "fail"
    return fails


@pytest.mark.parametrize("model", [FLOOR, SCHEDULED], ids=["floor", "schedule"])
def test_twice_the_corrected_resolution_fails_half_of_it_passes(model):
    fails = _check_resolution_corrected(model, seeds=(1, 2))
    assert fails[2.0] == 2 and fails[0.5] <= 1, fails


@pytest.mark.slow
@pytest.mark.parametrize("model, kw", [(FLOOR, {}), (SCHEDULED, {}),
                                       (SKEWED, dict(name="lr_readout", t_max=10 / 0.3,
                                                     n_times=201))],
                         ids=["floor", "schedule", "skewed-floor"])
def test_twice_the_corrected_resolution_fails_in_most_seeds_half_of_it_rarely(model, kw):
    """Measured (docs/benchmarks.md): 12/12 and 1/12 on the floor and the schedule."""
    fails = _check_resolution_corrected(model, seeds=range(1, 13), **kw)
    print(fails)
    assert fails[2.0] >= 11 and fails[0.5] <= 3, fails

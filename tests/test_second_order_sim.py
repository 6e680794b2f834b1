"""The O(1/N) mean against the exact reduced simulator: N·(mean of the replicas − ODE) = c.

One shared start for all replicas (Σ(0) = 0, c(0) = 0).  At each recorded time the
replicas give ``N (mean ε − ε_ODE)`` with its standard error (the replicas are
independent); it must agree with ``Fluctuations.risk_mean_correction`` within ``Z``
standard errors (Bonferroni over the times and entries, family level ~0.01), after the
precision is asserted, and the bare ODE (c = 0) must be rejected on the same data (so
the check can fail).  The same for every entry of the state (Q, ρ, a) at the last time.
The slow version runs N = 500 ... 4000 with 2000 replicas and checks that the residual
``N (mean − ODE) − c`` is consistent with zero at every N (the remainder is O(1/N) of ``c``).

Measured once (2000 replicas; N(mean − ODE) ± s.e. at the last time, against c_ε):
label noise (t = 4, c_ε = 2.84): 3.34 ± 0.25, 3.15 ± 0.33, 2.91 ± 0.47, 3.91 ± 0.63 at
N = 500, 1000, 2000, 4000 (seed N); trained readout (t = 4, c_ε = 3.11): 3.24 ± 0.16,
2.64 ± 0.22, 3.32 ± 0.32, 3.50 ± 0.44; unrepresentable z³ − 3z teacher (t = 10,
c_ε = 2.70): 2.78 ± 0.08, 2.59 ± 0.06, 2.75 ± 0.06, 2.67 ± 0.06 (seed N); sphere, batch 4
(t = 4, c_ε = 2.03): 1.93 ± 0.35, 2.63 ± 0.49, 0.68 ± 0.65, 3.08 ± 0.96.  Full table in
docs/derivation.md §8.3a.

At those N the remainder ``N (mean − ODE) − c`` is far below the error; the last tests
(issue 22) go to N = 100 … 800 with 10⁴–10⁵ replicas (benchmarks/finite_n_remainder.py,
whose study and fits they run) and show ``N (mean − ODE) = c + d/N``: the fitted ``c`` is
the derived one, the remainder ``d/N`` is resolved, and nothing of order 1/N is left.
"""

import numpy as np
import pytest
from scipy.stats import norm

import symquad as sq

ALPHA = 0.01


def models():
    """The cases of issue 22's "Done when" (informed starts, T = I)."""
    I2, I1 = np.eye(2), np.eye(1)
    return {
        "noise": (sq.Model(2, 2, 0.3, noise=0.5), 0.8 * I2, np.array([[.5, .1], [.1, .5]]),
                  I2),
        "readout": (sq.Model(2, 2, 0.3, noise=0.1, lr_readout=0.3), 0.8 * I2,
                    np.array([[.5, .1], [.1, .5]]), I2),
        "unrepresentable": (sq.Model(3, 2, 0.3, activation="z**2",
                                     teacher_activation="z**3 - 3*z", lr_readout=0.2),
                            np.eye(3), np.array([[.6, .1], [.1, .6], [.3, .3]]), I2),
        "sphere_batch4": (sq.Model(2, 1, 0.5, noise=0.5, batch_size=4, constraint="sphere"),
                          np.array([[1, .3], [.3, 1.]]), np.array([[.5], [.2]]), I1),
    }


def compare(model, Q0, rho0, T, N, replicas, times, seed=1):
    """``(mc, se, theory)`` of N(mean − ODE) for the risk (n,) and the state at the end (dim,)."""
    fl = sq.fluctuations(model, Q0, rho0, T, N, times, second_order=True)
    assert fl.expansion_valid.all()
    run = sq.simulate(model, N=N, t_max=float(times[-1]), replicas=replicas, seed=seed, Q0=Q0,
                      rho0=rho0, T=T, t_eval=times)
    assert run.n_diverged == 0
    assert np.allclose(run.t, times)
    d = N * (run.risk - fl.risk)
    lay = fl.layout
    X = lay.pack(run.Q[:, -1], run.rho[:, -1],
                 run.readout[:, -1] if model.readout_trained else None)
    dx = N * (X - lay.pack(fl.Q[-1], fl.rho[-1],
                           fl.readout[-1] if model.readout_trained else None))
    risk = (d.mean(0), d.std(0, ddof=1) / np.sqrt(replicas), fl.risk_mean_correction)
    state = (dx.mean(0), dx.std(0, ddof=1) / np.sqrt(replicas), fl.mean_correction[-1])
    return risk, state


def check(risk, state, precision=0.3, report=None, resolve=True):
    """Agreement with c, and (`resolve`) precision and rejection of c = 0 on the same data.

    The standard error of N(mean − ODE) grows like √(N/replicas): at fixed replicas the
    resolution is asserted at the smallest N, agreement at every N.
    """
    mc, se, th = (x[1:] for x in risk)              # t = 0: no spread, c = 0
    if report is not None:
        print(report, "N(mean-ODE):", np.round(mc, 3), "+-", np.round(se, 3), "c_eps:",
              np.round(th, 3))
    z_crit = norm.ppf(1 - ALPHA / (2 * (len(mc) + len(state[0]))))
    if resolve:
        assert np.max(se) < precision * np.max(np.abs(th)), "replicas too few to resolve c_eps"
        assert np.max(np.abs(mc) / se) > z_crit       # the bare ODE fails on these data
    assert np.max(np.abs(mc - th) / se) < z_crit, (mc, th, se)
    smc, sse, sth = state
    resolved = sse > 1e-9                            # the sphere's diagonal is exact
    assert np.max(np.abs(smc - sth)[resolved] / sse[resolved]) < z_crit, (smc, sth, sse)
    assert np.all(np.abs(smc - sth)[~resolved] < 1e-6)


def test_label_noise_small_N():
    """Cheap version: N = 200, 4000 replicas, t ≤ 2.4 (seconds; the correction is resolved).

    At N = 100 (t ≤ 3) the O(N⁻²) remainder already shows: N(mean − ODE) = 2.56 ± 0.10
    against c_ε = 2.31 at t = 3 (2.7 s.e.); at N = 200 it is half as large.
    """
    model, Q0, rho0, T = models()["noise"]
    risk, state = compare(model, Q0, rho0, T, 200, 4000, np.linspace(0, 2.4, 5))
    check(risk, state, report="noise N=200")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(models()))
def test_correction_against_simulator(name):
    """N = 500, 1000, 2000, 4000, 2000 replicas, one shared start (numbers in the docstring
    of this module's RESULTS, measured once)."""
    model, Q0, rho0, T = models()[name]
    t_max = 10.0 if name == "unrepresentable" else 4.0
    times = np.linspace(0, t_max, 6)
    # a seed per model and N: the models share widths, and a shared seed would share luck
    _residual_vanishes_at_every_N(model, Q0, rho0, T, times, name,
                                  lambda N: 10 * N + list(models()).index(name))


def _residual_vanishes_at_every_N(model, Q0, rho0, T, times, name, seed_of):
    """At N = 500 … 4000 (2000 replicas): the check of each N, and the residual
    N(mean − ODE) − c at the last time consistent with 0 at every N (remainder O(1/N) of c)."""
    residual = []
    for N in (500, 1000, 2000, 4000):
        risk, state = compare(model, Q0, rho0, T, N, 2000, times, seed=seed_of(N))
        check(risk, state, precision=0.5, report=f"{name} N={N}", resolve=N == 500)
        mc, se, th = (x[-1] for x in risk)
        residual.append((mc - th, se))
    r = np.array(residual)
    assert np.all(np.abs(r[:, 0]) < 3 * r[:, 1])


# --------------------------------------------------------------------------------------------
# the remainder: N·(mean − ODE) = c + d/N + O(N⁻²) at small N (issue 22)
# --------------------------------------------------------------------------------------------
def _remainder_module():
    """benchmarks/finite_n_remainder.py (the study and its fits; one source for both)."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "finite_n_remainder.py"
    spec = importlib.util.spec_from_file_location("finite_n_remainder", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_weighted_fit_recovers_known_coefficients():
    """The fit of the study (weighted least squares) on data made from known c, d, e."""
    rem = _remainder_module()
    Ns = np.array([100, 200, 400, 800, 1600])
    y = 2.5 + 30 / Ns - 900 / Ns ** 2
    se = 0.01 * np.sqrt(Ns / 100)
    beta, cov, chi2, dof = rem.wls(Ns, y, se, (0, 1, 2))
    np.testing.assert_allclose(beta, [2.5, 30, -900], rtol=1e-9)
    assert chi2 < 1e-15 and dof == 2
    # with noise of the stated size the standard errors cover the truth (and χ² is χ²(2))
    rng = np.random.default_rng(4)
    z = []
    for _ in range(400):
        b, c, _, _ = rem.wls(Ns, y + se * rng.standard_normal(5), se, (0, 1, 2))
        z.append((b[0] - 2.5) / np.sqrt(c[0, 0]))
    assert abs(np.std(z) - 1) < 0.1 and abs(np.mean(z)) < 0.15
    # a constant missing from the fixed-c fit is what its χ² detects
    _, _, chi2_wrong, dof = rem.wls(Ns, y - 2.5 + 0.3, se, (1, 2))
    assert rem.chi2_p(chi2_wrong, dof) < 1e-6


def _remainder_checks(res, precision, resolved=False, power=None):
    """The assertions of the study on one case (benchmarks/finite_n_remainder.py).

    Precision first (the fitted ``c`` resolves ``c_ε``; the bare ODE's ``c = 0`` is
    rejected); then at every time and for every state entry at the last time, Bonferroni
    at level ALPHA: ``c + d/N`` fits with ``c`` within its error of the derived
    coefficient, and with the derived ``c`` subtracted ``d/N`` alone fits (no O(1/N) term
    left: the remainder is O(N⁻²)).  `resolved`: the constant-only fit ``N(mean − ODE) = c``
    is rejected at the last time, i.e. the remainder itself is seen and it falls like
    ``1/N``.  `power`: the fitted ``c`` rejects ``(1 ± power)·c_ε``.
    """
    n_times = len(res["risk_fits"])
    entries = [f for f in res["state_fits"] if f is not None]
    z_crit = norm.ppf(1 - ALPHA / (2 * (n_times + len(entries))))
    p_crit = ALPHA / (n_times + len(entries))
    rows = res["rows"]
    assert all(r["diverged"] <= 1e-3 * r["used"] for r in rows), "divergences"
    assert all(all(r["valid"]) for r in rows), "the expansion is flagged invalid"
    c_last = rows[0]["c_risk"][-1]
    last = res["risk_fits"][-1]["c+d/N"]
    assert last["c_se"] < precision * abs(c_last), last
    assert abs(last["c"]) / last["c_se"] > z_crit
    for j, fit in enumerate(res["risk_fits"], start=1):
        assert abs(fit["c+d/N"]["z"]) < z_crit, (j, fit["c+d/N"], rows[0]["c_risk"][j])
        assert fit["fixed c"]["p"] > p_crit, (j, fit["fixed c"])
    for fit in entries:
        assert abs(fit["c+d/N"]["z"]) < z_crit, fit["c+d/N"]
        assert fit["fixed c"]["p"] > p_crit, fit["fixed c"]
    if resolved:
        assert res["risk_fits"][-1]["c only"]["p"] < p_crit, res["risk_fits"][-1]["c only"]
    if power:
        for wrong in (1 + power, 1 - power):
            assert abs(last["c"] - wrong * c_last) > z_crit * last["c_se"], (wrong, last)


def test_remainder_of_the_mean_is_smaller_than_1_over_N_cheap():
    """Cheap version (seconds): label noise, N = 100, 200, 400, 6000 replicas each, t ≤ 2.4.

    ``N·(mean − ODE)`` fitted by ``c + d/N`` gives ``c`` within its error of
    ``risk_mean_correction`` at every time (measured at t = 2.4: 1.92 ± 0.12 against 1.98),
    the bare ODE's ``c = 0`` is rejected, and with ``c_ε`` subtracted ``d/N + e/N²`` fits
    (no O(1/N) term left); the same for the 7 state entries at the last time.
    """
    rem = _remainder_module()
    res = rem.study("noise", (100, 200, 400), 6000, np.linspace(0, 2.4, 6),
                    progress=lambda s: None)
    _remainder_checks(res, precision=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("name, Ns, replicas, t_max", [
    ("noise", (100, 200, 400, 800), 60_000, 3.2),
    ("readout", (100, 200, 400, 800), 40_000, 4.0)])
def test_remainder_of_the_mean_is_smaller_than_1_over_N(name, Ns, replicas, t_max):
    """σ = z² with label noise and a trained readout: ``N(mean − ODE) = c + d/N`` with
    ``c = risk_mean_correction`` (and ``mean_correction`` for each entry of Q, ρ, a), the
    remainder resolved (``c`` alone rejected) and O(N⁻²) (``d/N`` fits once ``c_ε`` is
    subtracted), and ``c_ε ± 10 %`` rejected.  The noise case stops at t = 3.2: at N = 100
    its replicas on their way to a blow-up make the t = 4 mean heavy-tailed (standard error
    3× that of N = 200 with 10⁵ replicas; at t = 3.2 it is still 1.5× in some seeds, which
only widens the test).  Measured 2.4 and 7 min at load ≈ 5 on the shared 2-core machine.
The full
    study (10⁵ replicas, N up to 1600, and the z³ − 3z teacher) is
    benchmarks/finite_n_remainder.py, table in docs/derivation.md §8.3a."""
    rem = _remainder_module()
    res = rem.study(name, Ns, replicas, np.linspace(0, t_max, 5), progress=print)
    _remainder_checks(res, precision=0.03, resolved=True, power=0.1)


@pytest.mark.parametrize("sched", ["inverse:1", "step:1.2025=0.3"])
def test_schedules_small_N(sched):
    """With a learning-rate schedule (every term at η(t), −½ ∂f/∂t, the step's shift of c:
    N·1.2025 = 240.5, δ_N = 0.5): N = 200, 4000 replicas, as test_label_noise_small_N."""
    model, Q0, rho0, T = models()["noise"]
    model = model.replace(lr_schedule=sched)
    risk, state = compare(model, Q0, rho0, T, 200, 4000, np.linspace(0, 2.4, 5), seed=5)
    check(risk, state, report=f"{sched} N=200")


@pytest.mark.slow
@pytest.mark.parametrize("sched", ["inverse:1", "step:1.2025=0.3"])
def test_schedules_against_simulator(sched):
    """N = 500 … 4000, 2000 replicas, t ≤ 4 (the step's δ_N: 0.75, 0.5, 0, 0)."""
    model, Q0, rho0, T = models()["noise"]
    model = model.replace(lr_schedule=sched)
    for N in (500, 1000, 2000, 4000):
        risk, state = compare(model, Q0, rho0, T, N, 2000, np.linspace(0, 4.0, 6),
                              seed=7 * N + len(sched))
        check(risk, state, precision=0.5, report=f"{sched} N={N}", resolve=N == 500)


def erf_models():
    """Item 4: an erf model and a mixed pair (z² student, erf teacher), informed starts."""
    I2 = np.eye(2)
    return {
        # erf outputs are bounded: a large step and label noise make c resolvable
        "erf": (sq.Model(2, 2, 2.0, noise=2.0, activation="erf", lr_readout=0.5), 0.8 * I2,
                np.array([[.5, .1], [.1, .5]]), I2),
        "z2_erf": (sq.Model(3, 2, 0.3, teacher_activation="erf", lr_readout=0.2, noise=0.1),
                   np.eye(3), np.array([[.6, .1], [.1, .6], [.3, .3]]), I2),
    }


@pytest.mark.parametrize("name", list(erf_models()))
def test_erf_and_mixed_small_N(name):
    """Cheap version of the next test: N = 200, 4000 replicas, t ≤ 2.4."""
    model, Q0, rho0, T = erf_models()[name]
    risk, state = compare(model, Q0, rho0, T, 200, 4000, np.linspace(0, 2.4, 5), seed=11)
    check(risk, state, report=f"{name} N=200")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(erf_models()))
def test_erf_and_mixed_against_simulator(name):
    """N·(mean of the exact reduced simulator − ODE) = c for the risk, Q, ρ (and a) at
    N = 500 … 4000, 2000 replicas, one shared start; the residual consistent with 0."""
    model, Q0, rho0, T = erf_models()[name]
    # the mixed pair's transient (t < 2) has a spread larger than c: its times start at 2
    times = np.linspace(0, 6.0, 7) if name == "erf" else np.linspace(0, 10.0, 6)
    _residual_vanishes_at_every_N(model, Q0, rho0, T, times, name,
                                  lambda N: 10 * N + 3 + list(erf_models()).index(name))


def test_sde_with_the_finite_n_drift_small_N():
    """simulate(method='sde', finite_n=True): the SDE with SGD's O(1/N) drift,
    (f₁ − ½ J f)/N, has SGD's O(1/N) mean: N·(mean − ODE) = c (risk and state), while the
    plain SDE (its mean the ODE's plus the curvature only) is rejected on the same seed."""
    model, Q0, rho0, T = models()["noise"]
    N, R, times = 200, 4000, np.linspace(0, 2.4, 5)
    fl = sq.fluctuations(model, Q0, rho0, T, N, times, second_order=True)
    lay = fl.layout
    out = {}
    for finite_n in (True, False):
        run = sq.simulate(model, N=N, t_max=2.4, replicas=R, seed=1, method="sde", Q0=Q0,
                          rho0=rho0, T=T, t_eval=times, finite_n=finite_n)
        d = N * (run.risk - fl.risk)
        dx = N * (lay.pack(run.Q[:, -1], run.rho[:, -1]) - lay.pack(fl.Q[-1], fl.rho[-1]))
        out[finite_n] = ((d.mean(0), d.std(0, ddof=1) / np.sqrt(R), fl.risk_mean_correction),
                         (dx.mean(0), dx.std(0, ddof=1) / np.sqrt(R), fl.mean_correction[-1]))
    check(*out[True], report="SDE + O(1/N) drift, N=200")
    mc, se, th = (x[1:] for x in out[False][0])
    z_crit = norm.ppf(1 - ALPHA / (2 * len(mc)))
    assert np.max(np.abs(mc - th) / se) > z_crit        # the plain SDE misses c
    with pytest.raises(ValueError, match="finite_n.*method='sde' only"):
        sq.simulate(model, N=N, t_max=0.1, replicas=2, finite_n=True)
    with pytest.raises(ValueError, match="finite_n.*constraint='none'"):
        sq.simulate(model.replace(constraint="sphere"), N=N, t_max=0.1, replicas=2,
                    method="sde", finite_n=True)


def test_finite_n_sde_refuses_an_input_spectrum_by_name():
    # the O(1/N) drift is derived per entry of the classic state, not per block (default-deny)
    spectrum, _ = sq.power_law_spectrum(alpha=1.0, L=2)
    m = sq.Model(p=2, p_star=1, lr=0.2, spectrum=spectrum)
    with pytest.raises(ValueError, match="O\\(1/N\\) correction of the mean does not support "
                                         "the model field\\(s\\) spectrum="):
        sq.simulate(m, N=100, t_max=0.1, replicas=2, seed=1, method="sde", finite_n=True)

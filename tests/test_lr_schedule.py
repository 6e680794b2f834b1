r"""Learning-rate schedules ``η(t) = η s(t)`` through the kernels, the solvers and the simulators.

Independent routes: the entry route (``form="entries"``) against the default forms; one
N-dimensional SGD step written here from the definition (numpy only) against the
kernels' drift at ``η(t)``; the reduced simulator against the full one (two-sample
tests); the ODE with the schedule against SGD, and the constant-η ODE rejected by the
same data (power).
"""

import functools
import math

import numpy as np
import pytest
from scipy.stats import norm

import symquad as sq
from symquad.numeric.ode_batch import integrate_batch
from symquad.schedule import parse_schedule

#: one schedule of each family, all with a visible effect before t = 4
FAMILIES = {
    "inverse": "inverse:2",
    "power": "power:1:0.8",
    "step": "step:1=0.5:2.5=0.25",
    "table": (("table", ((0, 1.0), (1.5, 0.4), (3, 0.2)))),
}
ALPHA = 1e-3


def _start(p, ps, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((p + ps, 3 * (p + ps))) / math.sqrt(3 * (p + ps))
    C = X @ X.T
    T = C[p:, p:]
    return C[:p, :p], C[:p, p:], T


# ---- the schedule itself -------------------------------------------------------------

def test_factors_and_breakpoints_of_each_family():
    s = parse_schedule("inverse:2")
    assert s.factor(2.0) == 0.5 and s.breakpoints(0, 10) == ()
    s = parse_schedule(("power", 1, 0.8))
    assert s.factor(0.5) == 1.0 and s.factor(2.0) == pytest.approx(2 ** -0.8, rel=1e-15)
    assert s.breakpoints(0, 10) == (1.0,)
    s = parse_schedule("step:1=0.5:2.5=0.25")
    assert [s.factor(t) for t in (0.9, 1.0, 2.4, 2.5, 9)] == [1, 0.5, 0.5, 0.25, 0.25]
    s = parse_schedule([(0, 1.0), (1.5, 0.4), (3, 0.2)])
    assert s.text == "table:0=1:1.5=0.4:3=0.2"
    assert s.factor(0.75) == pytest.approx(0.7, rel=1e-14) and s.factor(5) == 0.2
    # the vectorised factors are the scalar ones
    for text in ("inverse:2", "power:1:0.8", "step:1=0.5:2.5=0.25", "table:0=1:1.5=0.4:3=0.2"):
        s = parse_schedule(text)
        ts = np.linspace(0, 5, 41)
        assert np.allclose(s.factors(ts), [s.factor(t) for t in ts], rtol=1e-15, atol=0)
        # integral by quadrature (an independent route; O(h) at the step jumps, h = 1e-5)
        fine = np.linspace(0, 4, 400001)
        assert s.integral(4.0) == pytest.approx(np.trapezoid(s.factors(fine), fine), rel=1e-5)


@pytest.mark.parametrize("bad, words", [
    ("inverse:0", "tau must be in (0, inf)"), ("inverse", "takes 1 number"),
    ("power:1", "takes 2 number"), ("power:1:-1", "beta must be in"),
    ("step:2=1:1=0.5", "must increase strictly"), ("step:1=0", "f[0]"),
    ("table:0=1", "needs 2 to"), ("table:0=1:1=inf", "finite"), ("table:0=1:1=nan", "finite"),
    ("cosine:3", "unknown family"), ("step:1", "T=F"), (3.0, "expected a text"),
])
def test_bad_schedules_are_refused_naming_the_parameter(bad, words):
    with pytest.raises((ValueError, TypeError)) as err:
        sq.Model(p=2, p_star=1, lr=0.1, lr_schedule=bad)
    assert "lr_schedule" in str(err.value) and words in str(err.value)


def test_model_round_trips_through_text_repr_and_saved_dict():
    from symquad.numeric.persist import model_from_dict, model_to_dict
    m = sq.Model(p=2, p_star=1, lr=0.1, lr_schedule=("step", ((1, 0.5), (2.5, 0.25))))
    assert m.lr_schedule == "step:1=0.5:2.5=0.25"
    assert eval(repr(m), {"Model": sq.Model}) == m
    assert model_from_dict(model_to_dict(m)) == m
    assert "lr_schedule=on" in m.structure_text()
    assert m.eta_at(3.0) == pytest.approx(0.025, rel=1e-15)


# ---- kernels --------------------------------------------------------------------------

@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("shape", [(2, 1), pytest.param((3, 2), marks=pytest.mark.slow)])
def test_kernels_agree_with_the_entry_route_at_every_time(family, shape):
    p, ps = shape
    m = sq.Model(p=p, p_star=ps, lr=0.3, noise=0.1, weight_decay=0.05,
                 lr_schedule=FAMILIES[family])
    Q, rho, T = _start(p, ps)
    fast, entries = sq.kernels(m), sq.kernels(m, form="entries")
    for t in (0.0, 0.7, 1.0, 2.0, 3.9):
        for a, b in zip(fast.rhs(Q, rho, T, t=t), entries.rhs(Q, rho, T, t=t)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(fast.diffusion(Q, rho, T, t=t),
                                   entries.diffusion(Q, rho, T, t=t), rtol=1e-12, atol=1e-14)
        # and equal to the constant model at the step size eta(t) (the convention)
        const = sq.kernels(m.replace(lr=m.eta_at(t), lr_schedule="constant"), form="entries")
        for a, b in zip(entries.rhs(Q, rho, T, t=t), const.rhs(Q, rho, T)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(entries.jacobian(Q, rho, T, t=t),
                                   const.jacobian(Q, rho, T), rtol=1e-12, atol=1e-14)
    # the schedule acts: at t = 3.9 the drift differs from the constant-lr drift
    plain = sq.kernels(m.replace(lr_schedule="constant"))
    assert not np.allclose(fast.rhs(Q, rho, T, t=3.9)[0], plain.rhs(Q, rho, T)[0])


def test_a_scheduled_kernel_needs_t_and_a_constant_one_keeps_its_signature():
    m = sq.Model(p=2, p_star=1, lr=0.3)
    Q, rho, T = _start(2, 1)
    k = sq.kernels(m)
    np.testing.assert_array_equal(k.rhs(Q, rho, T)[0], k.rhs(Q, rho, T, t=5.0)[0])
    ks = sq.kernels(m.replace(lr_schedule="inverse:2"))
    with pytest.raises(ValueError, match="t .the time. is required"):
        ks.rhs(Q, rho, T)
    with pytest.raises(ValueError, match="t must be a finite time"):
        ks.diffusion(Q, rho, T, t=-1.0)


def _one_step_mc(m, Q, rho, T, t, N, samples, seed):
    """Mean and s.e. of N(Q' − Q), N(ρ' − ρ) over literal N-dimensional SGD steps at time t.

    From the definition: weights with the Gram matrix [[Q, ρ], [ρᵀ, T]], inputs
    x ~ N(0, I_N), λ = Wx/√N, ν = W*x/√N, δ_k = (ŷ − y) a_k σ'(λ_k) with σ = z²,
    W' = (1 − η(t)λ_wd/N) W − (η(t)/√N) δ xᵀ; the new overlaps by the exact expansion.
    The draws do not depend on η(t) (:func:`_step_draws`, shared by the families).
    """
    eta = m.eta * m.schedule.factor(t)
    shrink = 1 - eta * m.weight_decay / N
    out = []
    for lam, nu, xx, d in _step_draws(Q.tobytes(), rho.tobytes(), T.tobytes(), rho.shape,
                                      m.noise, N, samples, seed):
        # W' = s W − (η/√N) δ xᵀ:  Q' = s²Q − sη(δλᵀ + λδᵀ)/N + η² δδᵀ |x|²/N /N
        dQ = (N * (shrink ** 2 - 1) * Q - shrink * eta * (d[:, :, None] * lam[:, None, :]
              + lam[:, :, None] * d[:, None, :]) + eta ** 2 * xx[:, None, None]
              * d[:, :, None] * d[:, None, :])
        dr = N * (shrink - 1) * rho - eta * d[:, :, None] * nu[:, None, :]
        out.append(np.concatenate([dQ.reshape(4000, -1), dr.reshape(4000, -1)], 1))
    out = np.concatenate(out)
    return out.mean(0), out.std(0, ddof=1) / math.sqrt(out.shape[0])


@functools.lru_cache(maxsize=1)
def _step_draws(Q, rho, T, shape, noise, N, samples, seed):
    """The η-free part of :func:`_one_step_mc`'s steps: ``(λ, ν, |x|²/N, δ)`` per chunk.

    The overlaps come as bytes (hashable) with ρ's shape.  The families' tests use the
    same seed, so they share one set of inputs (the N-dimensional draws were 80 % of
    each test's time); their means then differ only through η(t).
    """
    p, ps = shape
    Q, rho = np.frombuffer(Q).reshape(p, p), np.frombuffer(rho).reshape(p, ps)
    T = np.frombuffer(T).reshape(ps, ps)
    rng = np.random.default_rng(seed)
    C = np.block([[Q, rho], [rho.T, T]])
    L = np.linalg.cholesky(C + 1e-300 * np.eye(p + ps))
    frame = np.linalg.qr(rng.standard_normal((N, p + ps)))[0].T * math.sqrt(N)
    Wall = L @ frame                                 # rows: w_k, w*_m (|.|²/N = C)
    a, b = 1.0 / p, 1.0 / ps
    chunks = []
    for _ in range(samples // 4000):
        x = rng.standard_normal((4000, N))
        f = x @ Wall.T / math.sqrt(N)
        lam, nu = f[:, :p], f[:, p:]
        xx = np.sum(x * x, axis=1) / N
        err = a * np.sum(lam ** 2, 1) - b * np.sum(nu ** 2, 1) \
            - math.sqrt(noise) * rng.standard_normal(4000)
        d = err[:, None] * a * 2 * lam                       # δ_k
        chunks.append((lam, nu, xx, d))
    return tuple(chunks)


#: one pytest-xdist worker for the five: they share the draws of :func:`_step_draws`
@pytest.mark.xdist_group("lr-schedule-one-step-draws")
@pytest.mark.parametrize("family", list(FAMILIES) + ["constant"])
def test_kernels_match_a_monte_carlo_of_one_N_dimensional_step_at_p8(family):
    p, ps = 8, 2
    schedule = FAMILIES.get(family, "constant")
    m = sq.Model(p=p, p_star=ps, lr=1.0, noise=0.25, weight_decay=0.2, lr_schedule=schedule)
    Q, rho, T = _start(p, ps, seed=3)
    t = 3.2                                            # every family well below 1 there
    mean, se = _one_step_mc(m, Q, rho, T, t, N=1000, samples=80_000, seed=1)
    k = sq.kernels(m)
    want = np.concatenate([np.ravel(x) for x in k.rhs(Q, rho, T, t=t)])
    # power: the model without the schedule (for the constant family: with one, η/(1 + t/2))
    other = sq.kernels(m.replace(lr_schedule="constant" if family != "constant"
                                 else "inverse:2"))
    wrong = np.concatenate([np.ravel(x) for x in other.rhs(Q, rho, T, t=t)])
    assert np.max(se) < 0.05 * np.max(np.abs(want))     # the test's own precision
    z_limit = norm.isf(ALPHA / (2 * want.size))
    z = np.abs(mean - want) / se
    assert np.max(z) < z_limit, (family, np.max(z))
    # the same samples reject it
    assert np.max(np.abs(mean - wrong) / se) > 3 * z_limit


# ---- solvers ----------------------------------------------------------------------------

@pytest.mark.parametrize("family", list(FAMILIES))
def test_integrate_and_the_batched_solver_agree_and_follow_eta_t(family):
    m = sq.Model(p=2, p_star=1, lr=0.3, lr_schedule=FAMILIES[family])
    Q, rho, T = _start(2, 1)
    t = np.linspace(0, 4, 9)
    one = sq.integrate(m, Q, rho, T, 4.0, t_eval=t, rtol=1e-10, atol=1e-13)
    many = integrate_batch(m, np.stack([Q, Q]), np.stack([rho, rho]), T, 4.0, t_eval=t,
                           rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(many.risk[1], one.risk, rtol=1e-7, atol=1e-10)
    # a fixed-step RK4 with the schedule sampled at the stage times (independent solver)
    k = sq.kernels(m)
    y, h, out = (Q.copy(), rho.copy()), 4e-3, [one.risk[0]]

    def f(s, y):
        return k.rhs(y[0], y[1], T, t=s)
    s = 0.0
    for i in range(1000):
        k1 = f(s, y)
        k2 = f(s + h / 2, tuple(a + h / 2 * b for a, b in zip(y, k1)))
        k3 = f(s + h / 2, tuple(a + h / 2 * b for a, b in zip(y, k2)))
        # the last stage of a step ending on a jump takes the left limit
        k4 = f(s + h - 1e-12, tuple(a + h * b for a, b in zip(y, k3)))
        y = tuple(a + h / 6 * (b1 + 2 * b2 + 2 * b3 + b4)
                  for a, b1, b2, b3, b4 in zip(y, k1, k2, k3, k4))
        s = (i + 1) * h
        if (i + 1) % 125 == 0:
            out.append(k.risk(y[0], y[1], T))
    # kinks fall on grid points of h, so RK4 keeps its order: agreement to ~h^4
    np.testing.assert_allclose(one.risk, out, rtol=1e-7, atol=1e-10)


def test_breakpoints_are_solver_restarts():
    from symquad.numeric import integrate as integ
    m = sq.Model(p=2, p_star=1, lr=0.3, lr_schedule="step:1=0.5:2.5=0.25")
    calls = []
    real = integ._solve

    def spy(fun, t_max, y0, method, t_eval, rtol, atol, blow_up, t0=0.0):
        calls.append((t0, t_max))
        return real(fun, t_max, y0, method, t_eval, rtol, atol, blow_up, t0=t0)
    integ._solve = spy
    try:
        sq.integrate(m, *_start(2, 1), 4.0)
    finally:
        integ._solve = real
    assert calls == [(0.0, 1.0), (1.0, 2.5), (2.5, 4.0)]


# ---- simulators -------------------------------------------------------------------------

def _welch(a, b):
    """Largest |z| of the two-sample difference of the replica means, and its threshold."""
    se = np.sqrt(a.var(0, ddof=1) / a.shape[0] + b.var(0, ddof=1) / b.shape[0])
    keep = se > 0
    z = np.abs(a.mean(0) - b.mean(0))[keep] / se[keep]
    return float(np.max(z)), norm.isf(ALPHA / (2 * z.size))


def _states(run, idx):
    return np.concatenate([run.Q[:, idx].reshape(run.Q.shape[0], -1),
                           run.rho[:, idx].reshape(run.rho.shape[0], -1),
                           run.risk[:, idx]], axis=1)


def test_reduced_simulator_law_equals_the_full_one_with_a_schedule():
    m = sq.Model(p=2, p_star=1, lr=0.3, noise=0.2, weight_decay=0.1,
                 lr_schedule="step:0.5=0.4:1.5=1.2")
    Q, rho, T = _start(2, 1)
    kw = dict(N=200, t_max=2.5, t_eval=np.array([0.0, 0.5, 1.5, 2.5]), Q0=Q, rho0=rho, T=T)
    red = sq.simulate(m, replicas=300, method="reduced", seed=1, **kw)
    full = sq.simulate(m, replicas=150, method="full", seed=2, **kw)
    z, limit = _welch(_states(red, [1, 2, 3]), _states(full, [1, 2, 3]))
    assert z < limit
    # power at this size: the constant-lr reduced simulator differs from the full one
    plain = sq.simulate(m.replace(lr_schedule="constant"), replicas=300, method="reduced",
                        seed=3, **kw)
    assert _welch(_states(plain, [1, 2, 3]), _states(full, [1, 2, 3]))[0] > limit
    # spread (second moments) agree too
    r, f = red.risk[:, -1], full.risk[:, -1]
    assert abs(np.log(r.var() / f.var())) < 4 * math.sqrt(2 / 150 + 2 / 300)


def _sgd_vs_ode(method, N, replicas, seed, schedule="step:1=0.5:2.5=0.2"):
    m = sq.Model(p=2, p_star=1, lr=0.3, noise=0.05, lr_schedule=schedule)
    Q, rho, T = np.eye(2), np.array([[0.5], [0.3]]), np.eye(1)
    t = np.linspace(0, 5, 11)
    run = sq.simulate(m, N=N, t_max=5, replicas=replicas, method=method, seed=seed,
                      Q0=Q, rho0=rho, T=T, t_eval=t)
    se = run.risk.std(0, ddof=1) / math.sqrt(replicas)
    assert np.max(se[1:] / run.risk.mean(0)[1:]) < 0.05    # precision of the test
    out = []
    for model in (m, m.replace(lr_schedule="constant")):
        ode = sq.integrate(model, Q, rho, T, 5.0, t_eval=t)
        out.append(float(np.max(np.abs(run.risk.mean(0)[1:] - ode.risk[1:]) / se[1:])))
    return out, norm.isf(ALPHA / (2 * (t.size - 1)))


def test_ode_with_the_schedule_agrees_with_sgd_and_constant_lr_fails_cheap():
    (z_sched, z_const), limit = _sgd_vs_ode("reduced", 1000, 64, 5)
    # within error of the scheduled ODE; far outside that of the constant-lr ODE. The
    # O(1/N) bias of the mean is ~1/N of the drift scale: below the resolution here
    assert z_sched < limit
    assert z_const > 2 * limit


@pytest.mark.slow
def test_ode_with_the_schedule_agrees_with_full_sgd_at_N1000():
    (z_sched, z_const), limit = _sgd_vs_ode("full", 1000, 128, 6)
    assert z_sched < limit
    assert z_const > 2 * limit


@pytest.mark.slow
def test_sde_follows_the_scheduled_ode():
    (z_sched, z_const), limit = _sgd_vs_ode("sde", 1000, 64, 7)
    assert z_sched < limit and z_const > 2 * limit


# ---- refusals -----------------------------------------------------------------------------

def test_analyses_assuming_a_constant_eta_refuse_the_schedule_by_name():
    m = sq.Model(p=4, p_star=2, lr=0.1, lr_schedule="inverse:100")
    for call in (lambda: sq.plateau(m), lambda: sq.escape_time(m, N=1000)):
        with pytest.raises(ValueError, match="lr_schedule"):
            call()
    # the O(1/N) mean is derived for schedules: every term at eta(t), so t is required
    Q, rho, T = _start(2, 1)
    k = sq.kernels(m.replace(p=2, p_star=1))
    with pytest.raises(ValueError, match="t .the time. is required.*lr_schedule"):
        k.second_order(Q, rho, T)
    const = sq.kernels(m.replace(p=2, p_star=1, lr_schedule="constant", lr=0.1 / (1 + 30 / 100)))
    for got, ref in zip(k.second_order(Q, rho, T, t=30.0), const.second_order(Q, rho, T)):
        assert np.allclose(got, ref, rtol=1e-12, atol=1e-14)


# ---- validate / compare -----------------------------------------------------------------

def _scheduled_run(N, replicas, seed):
    m = sq.Model(p=2, p_star=1, lr=0.3, noise=0.05, lr_schedule="step:1=0.5:2.5=0.2")
    Q, rho, T = np.eye(2), np.array([[0.5], [0.3]]), np.eye(1)
    run = sq.simulate(m, N=N, t_max=5, replicas=replicas, seed=seed, Q0=Q, rho0=rho, T=T,
                      t_eval=np.linspace(0, 5, 26))
    return m, run, T


def test_compare_passes_with_the_schedule_and_fails_the_model_without_it_cheap():
    m, run, T = _scheduled_run(500, 32, 3)
    kw = dict(N=500, whole_run=False, resolution=False, finite_n=False)
    assert sq.compare(m, run.t, run.Q, run.rho, T, **kw).verdict == "PASS"
    wrong = sq.compare(m.replace(lr_schedule="constant"), run.t, run.Q, run.rho, T, **kw)
    assert wrong.verdict == "FAIL"
    assert any(r.startswith("FAIL: mean risk deviation") for r in wrong.reasons)
    with pytest.raises(ValueError, match="t must start at 0"):
        sq.compare(m, run.t[1:], run.Q[:, 1:], run.rho[:, 1:], T, **kw)


@pytest.mark.slow
def test_validate_passes_with_the_schedule_and_its_data_fail_the_constant_model():
    m = sq.Model(p=2, p_star=1, lr=0.3, noise=0.05, lr_schedule="step:1=0.5:2.5=0.2")
    rep = sq.validate(m, N=1000, t_max=5, replicas=64, fss=False, invariant=False)
    assert rep.passed, rep.reasons
    wrong = sq.compare(m.replace(lr_schedule="constant"), rep.t, rep.sgd_Q, rep.sgd_rho,
                       rep.T, N=1000)
    assert wrong.verdict == "FAIL"


def test_cli_flag_and_sweep_axis_read_and_refuse_schedules(capsys):
    from symquad.cli._model_args import field_value
    from symquad.studies.tasks import task_model
    assert field_value("lr_schedule", "step:1=0.5:2=0.2") == "step:1=0.5:2=0.2"
    with pytest.raises(ValueError, match="lr_schedule"):
        field_value("lr_schedule", "inverse:-3")
    m = task_model(p=2, p_star=1, lr=0.1, lr_schedule="inverse:10")
    assert m.schedule.factor(10) == 0.5
    from symquad.cli import main
    def run(*args):
        try:
            return main(list(args))
        except SystemExit as exc:
            return exc.code
    assert run("equations", "--p", "2", "--p-star", "1", "--lr-schedule", "inverse:0") == 2
    assert "lr_schedule" in capsys.readouterr().err
    assert run("equations", "--p", "2", "--p-star", "1", "--lr-schedule", "power:10:0.5") == 0
    assert r"\eta(t) = \eta\,\min" in capsys.readouterr().out


# ---- forward sensitivities and the resolution of validate ----------------------------------

def _risk_fd(model, name, Q, rho, T, t, h):
    """Central differences of the ODE's risk (``sq.integrate``, tight tolerances) in `name`."""
    from symquad.numeric.sensitivity import _replaced, _value
    theta = _value(model, name)
    risk = [sq.integrate(_replaced(model, name, theta + s * h), Q, rho, T, float(t[-1]),
                         t_eval=t, rtol=1e-12, atol=1e-14).risk for s in (1, -1)]
    return (risk[0] - risk[1]) / (2 * h)


_SENS_MODEL = dict(p=2, p_star=1, lr=0.3, noise=0.05, weight_decay=0.01)
_SENS_NAMES = ("lr", "noise", "weight_decay")


@functools.lru_cache(maxsize=1)
def _constant_eta_sensitivities():
    """The power route of the test below: the constant-η model's sensitivities at its
    start and times (the same for every family: computed once per process)."""
    from symquad.numeric.sensitivity import risk_sensitivity
    Q, rho, T = np.eye(2), np.array([[0.5], [0.3]]), np.eye(1)
    return risk_sensitivity(sq.Model(**_SENS_MODEL), Q, rho, T, np.linspace(0, 4, 9),
                            parameters=_SENS_NAMES, rtol=1e-11, atol=1e-13)


#: one pytest-xdist worker for the three: they share :func:`_constant_eta_sensitivities`
@pytest.mark.xdist_group("lr-schedule-constant-sensitivities")
@pytest.mark.parametrize("family", ["inverse", "step", "table"])
def test_forward_sensitivities_with_a_schedule_against_differences_of_integrate(family):
    r"""``dε(t)/dθ`` along the scheduled ODE (``J`` and ``∂f/∂θ`` at ``η(t)``, restarted at
    the schedule's breakpoints) against central differences of ``sq.integrate`` at
    ``θ ± h``; ``lr`` is the schedule's base ``η`` (``η(t) = η s(t)``).  Error of the
    differences ``O(h²)``: measured ≤ 1.4e-8 for lr, ≤ 4e-10 for the others (h = 1e-5),
    against derivatives of 0.05–0.9.  Power: the constant-η model's sensitivities miss
    them by 0.2–3.4."""
    from symquad.numeric.sensitivity import risk_sensitivity
    m = sq.Model(**_SENS_MODEL, lr_schedule=FAMILIES[family])
    Q, rho, T = np.eye(2), np.array([[0.5], [0.3]]), np.eye(1)
    t = np.linspace(0, 4, 9)
    names = _SENS_NAMES
    sens = risk_sensitivity(m, Q, rho, T, t, parameters=names, rtol=1e-11, atol=1e-13)
    plain = _constant_eta_sensitivities()
    assert plain.risk_derivative.keys() == sens.risk_derivative.keys()
    for name in names:
        fd = _risk_fd(m, name, Q, rho, T, t, 1e-5)
        scale = np.max(np.abs(fd))
        assert scale > 0.04, name
        assert np.max(np.abs(sens.risk_derivative[name] - fd)) <= 1e-6 * scale, name
        assert np.max(np.abs(plain.risk_derivative[name] - fd)) > 0.5 * scale, name


def test_validate_reports_the_resolution_of_a_scheduled_model():
    r"""``validate`` on a scheduled model states ``report.resolution``, and its numbers are
    ``critical / max_t (|dε/dθ| / se)`` with ``dε/dθ`` from central differences of the
    scheduled ``sq.integrate`` (second route) and ``se`` the replicas' standard errors of
    the report; the constant-η model's sensitivities would state other numbers."""
    from symquad.numeric.sensitivity import risk_sensitivity
    from symquad.studies.validation import informed_start
    m = sq.Model(p=2, p_star=1, lr=0.3, noise=0.05, lr_schedule="step:1=0.5:2.5=0.2")
    Q, rho = informed_start(m)
    T = np.eye(1)
    rep = sq.validate(m, N=1000, t_max=5, replicas=32, seed=3, Q0=Q, rho0=rho, T=T,
                      n_times=26, fss=False, invariant=False, whole_run=False,
                      finite_n=False)
    res = rep.numbers["resolution"]
    assert res["reason"] == "" and "RESOLUTION" in rep.summary()
    md = next(c for c in rep.numbers["verdict"]["checks"] if c["name"] == "mean_deviation")
    assert md["status"] == "pass"
    R = rep.sgd_risk.shape[0]
    se = (rep.sgd_risk - rep.ode_risk).std(0, ddof=1) / math.sqrt(R)
    window = rep.t > 0                         # no escape analysis: the whole run after t = 0
    plain = risk_sensitivity(m.replace(lr_schedule="constant"), Q, rho, T, rep.t,
                             parameters=("lr", "noise"))
    for name in ("lr", "noise"):
        fd = _risk_fd(m, name, Q, rho, T, rep.t, 1e-5)
        want = md["critical"] / np.max(np.abs(fd[window]) / se[window])
        assert rep.resolution[name] == pytest.approx(want, rel=1e-5), name
        wrong = md["critical"] / np.max(np.abs(plain.risk_derivative[name][window])
                                        / se[window])
        assert abs(wrong / want - 1) > 0.1, name

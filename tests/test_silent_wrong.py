"""Silent-wrong results: inputs that used to give a number instead of an error.

One group per defect class of the audit (issue 18, item 6): complex arrays,
extreme activation coefficients, times of the user's data, silent replacement
of built-in tasks, and a task's ``sys.exit``.
"""

from __future__ import annotations

import inspect
import warnings
from fractions import Fraction

import numpy as np
import pytest

import symquad as sq
from symquad.numeric.ode_batch import integrate_batch
from symquad.numeric.simulate import population_risk

M = sq.Model(p=3, p_star=2, lr=0.2)
Q0, RHO0, T = np.eye(3), 1e-2 * np.arange(1, 7).reshape(3, 2) / 6, np.eye(2)


def cplx(a):
    return np.asarray(a, dtype=complex)          # imaginary part zero: still refused


@pytest.fixture(scope="module")
def run():
    return sq.simulate(M, N=200, t_max=1.0, replicas=3, seed=0, t_eval=np.linspace(0, 1.0, 11))


# --------------------------------------------------------------------------- complex arrays
# (public function, parameter, call with that parameter complex); the README promises
# "complex arrays are refused, never silently truncated" for every public function
COMPLEX_CASES = [
    ("integrate", "Q0", lambda r: sq.integrate(M, cplx(Q0), RHO0, T, 1.0)),
    ("integrate", "rho0", lambda r: sq.integrate(M, Q0, cplx(RHO0), T, 1.0)),
    ("integrate", "T", lambda r: sq.integrate(M, Q0, RHO0, cplx(T), 1.0)),
    ("integrate", "t_eval", lambda r: sq.integrate(M, Q0, RHO0, T, 1.0, t_eval=cplx([0, 1.0]))),
    ("integrate_batch", "Q0", lambda r: integrate_batch(M, cplx(Q0)[None], RHO0[None], T, 1.0)),
    ("integrate_batch", "rho0", lambda r: integrate_batch(M, Q0[None], cplx(RHO0)[None], T, 1.)),
    ("integrate_batch", "T", lambda r: integrate_batch(M, Q0[None], RHO0[None], cplx(T), 1.0)),
    ("integrate_batch", "t_eval",
     lambda r: integrate_batch(M, Q0[None], RHO0[None], T, 1.0, t_eval=cplx([0, 1.0]))),
    ("simulate", "Q0", lambda r: sq.simulate(M, N=100, t_max=0.1, Q0=cplx(Q0), rho0=RHO0)),
    ("simulate", "rho0", lambda r: sq.simulate(M, N=100, t_max=0.1, Q0=Q0, rho0=cplx(RHO0))),
    ("simulate", "T", lambda r: sq.simulate(M, N=100, t_max=0.1, T=cplx(T))),
    ("simulate", "t_eval", lambda r: sq.simulate(M, N=100, t_max=0.1, t_eval=cplx([0, 0.1]))),
    ("compare", "t", lambda r: sq.compare(M, cplx(r.t), r.Q, r.rho)),
    ("compare", "Q", lambda r: sq.compare(M, r.t, cplx(r.Q), r.rho)),
    ("compare", "rho", lambda r: sq.compare(M, r.t, r.Q, cplx(r.rho))),
    ("compare", "T", lambda r: sq.compare(M, r.t, r.Q, r.rho, cplx(T))),
    ("validate", "T", lambda r: sq.validate(M, N=100, replicas=2, T=cplx(T))),
    ("validate", "Q0", lambda r: sq.validate(M, N=100, replicas=2, Q0=cplx(Q0), rho0=RHO0)),
    ("validate", "rho0", lambda r: sq.validate(M, N=100, replicas=2, Q0=Q0, rho0=cplx(RHO0))),
    ("invariant_S", "rho", lambda r: sq.invariant_S(cplx(RHO0))),
    ("closest_solution", "Q0", lambda r: sq.closest_solution(M, cplx(Q0), RHO0, T)),
    ("closest_solution", "rho0", lambda r: sq.closest_solution(M, Q0, cplx(RHO0), T)),
    ("closest_solution", "T", lambda r: sq.closest_solution(M, Q0, RHO0, cplx(T))),
    ("Kernels.rhs", "Q", lambda r: sq.kernels(M).rhs(cplx(Q0), RHO0, T)),
    ("Kernels.rhs", "rho", lambda r: sq.kernels(M.replace(activation="z**3")).rhs(Q0, cplx(RHO0),
                                                                               T)),
    ("Kernels.risk", "T", lambda r: sq.kernels(M).risk(Q0, RHO0, cplx(T))),
    ("escape_times", "t", lambda r: sq.escape_times(cplx([0, 1, 2]), [[1, .5, .1]], 0.3)),
    ("escape_times", "risk", lambda r: sq.escape_times([0, 1, 2], cplx([[1, .5, .1]]), 0.3)),
    ("escape_times", "threshold", lambda r: sq.escape_times([0, 1, 2], [[1, .5, .1]], 0.3 + 0j)),
    ("escape_threshold", "fraction", lambda r: sq.escape_threshold(M, 0.5 + 0j)),
    ("overlaps_from_unnormalised", "Q",
     lambda r: sq.overlaps_from_unnormalised(M, cplx(Q0), RHO0, T)),
    ("overlaps_to_unnormalised", "rho",
     lambda r: sq.overlaps_to_unnormalised(M, Q0, cplx(RHO0), T)),
    ("overlaps_to_unnormalised", "T", lambda r: sq.overlaps_to_unnormalised(M, Q0, RHO0, cplx(T))),
    ("tau_from_t", "t", lambda r: sq.tau_from_t(M, cplx([1.0, 2.0]))),
    ("t_from_tau", "tau", lambda r: sq.t_from_tau(M, cplx([1.0]))),
    ("rate_per_tau", "rate_per_t", lambda r: sq.rate_per_tau(M, cplx([1.0]))),
    ("zero_risk_point", "O", lambda r: sq.zero_risk_point(cplx(np.eye(3, 2)))),
    ("zero_risk_point", "T", lambda r: sq.zero_risk_point(np.eye(3, 2), cplx(T))),
    ("invariant_set_defect", "Q", lambda r: sq.invariant_set_defect(cplx(Q0), RHO0, T)),
    ("invariant_set_defect", "rho", lambda r: sq.invariant_set_defect(Q0, cplx(RHO0), T)),
    ("invariant_set_defect", "T", lambda r: sq.invariant_set_defect(Q0, RHO0, cplx(T))),
    ("overlaps_from_unnormalised", "rho",
     lambda r: sq.overlaps_from_unnormalised(M, Q0, cplx(RHO0), T)),
    ("overlaps_from_unnormalised", "T",
     lambda r: sq.overlaps_from_unnormalised(M, Q0, RHO0, cplx(T))),
    ("overlaps_to_unnormalised", "Q", lambda r: sq.overlaps_to_unnormalised(M, cplx(Q0), RHO0, T)),
    ("invariant_set_point", "T",
     lambda r: sq.invariant_set_point(3, 2, np.random.default_rng(0), T=cplx(T))),
    ("random_manifold_points", "T",
     lambda r: sq.random_manifold_points(3, 2, 2, np.random.default_rng(0), T=cplx(T))),
    ("weight_hessian", "W", lambda r: sq.weight_hessian(M, cplx(np.ones((3, 5))), np.eye(2, 5))),
    ("weight_hessian", "Wstar", lambda r: sq.weight_hessian(M, np.ones((3, 5)), cplx(np.eye(2, 5)))),
    ("critical_weights", "seed", lambda r: sq.critical_weights(M, "plateau", 12, seed=1 + 0j)),
    ("weight_objective", "W", lambda r: sq.weight_objective(M, cplx(np.ones((3, 5))), np.eye(2, 5))),
    ("weight_objective", "Wstar",
     lambda r: sq.weight_objective(M, np.ones((3, 5)), cplx(np.eye(2, 5)))),
    ("escape_time", "q0", lambda r: sq.escape_time(M, N=100, q0=1 + 0j, n_samples=4)),
    ("invariant_drift_study", "T",
     lambda r: sq.invariant_drift_study(M, [100, 400], 1.0, 2, 0, T=cplx(T))),
    ("population_risk", "Q", lambda r: population_risk(M.activation, cplx(Q0), RHO0, T)),
    ("fluctuations", "Q0", lambda r: sq.fluctuations(M, cplx(Q0), RHO0, T, 100, [0.0, 1.0])),
    ("fluctuations", "rho0", lambda r: sq.fluctuations(M, Q0, cplx(RHO0), T, 100, [0.0, 1.0])),
    ("fluctuations", "T", lambda r: sq.fluctuations(M, Q0, RHO0, cplx(T), 100, [0.0, 1.0])),
    ("fluctuations", "t_eval", lambda r: sq.fluctuations(M, Q0, RHO0, T, 100, cplx([0.0, 1.0]))),
    ("optimal_schedule", "Q0", lambda r: sq.optimal_schedule(M, 1.0, Q0=cplx(Q0), rho0=RHO0, T=T, lr_max=1.0)),
    ("optimal_schedule", "rho0", lambda r: sq.optimal_schedule(M, 1.0, Q0=Q0, rho0=cplx(RHO0), T=T, lr_max=1.0)),
    ("optimal_schedule", "T", lambda r: sq.optimal_schedule(M, 1.0, Q0=Q0, rho0=RHO0, T=cplx(T), lr_max=1.0)),
]


@pytest.mark.parametrize("function, parameter, call", COMPLEX_CASES,
                         ids=[f"{f}-{p}" for f, p, _ in COMPLEX_CASES])
def test_complex_input_is_refused_naming_the_parameter(function, parameter, call, run):
    with warnings.catch_warnings():
        warnings.simplefilter("error", np.exceptions.ComplexWarning)  # no silent truncation
        with pytest.raises(TypeError, match=rf"\b{parameter}\b"):
            call(run)


# array-valued parameter names of the public API; every public function with one of them
# must appear in COMPLEX_CASES (a new function cannot skip the check unnoticed)
ARRAY_PARAMETERS = {"Q0", "rho0", "T", "t", "Q", "rho", "t_eval", "tau", "rate_per_t", "O",
                    "W", "Wstar", "risk"}
NOT_ARRAY_FUNCTIONS = {"plot_invariant_drift", "save_figure", "sweep", "load_sweep",
                       "load_sweep_arrays", "register_task", "list_tasks", "escape_sweep_summary",
                       "sweep_errorbar_figure", "sweep_escape_figure", "sweep_heatmap_figure",
                       "escape_sweep_figures"}


def test_every_public_array_parameter_is_covered():
    covered = {(f, p) for f, p, _ in COMPLEX_CASES}
    missing = []
    for name in sq._LAZY:
        obj = getattr(sq, name)
        if not inspect.isfunction(obj) or name in NOT_ARRAY_FUNCTIONS:
            continue
        for param in inspect.signature(obj).parameters:
            if param in ARRAY_PARAMETERS and (name, param) not in covered:
                missing.append(f"{name}({param})")
    assert not missing, f"public array parameters without a complex-input case: {missing}"


# --------------------------------------------------------------------------- compare's times
def _bad_times(t, index, value):
    t = np.array(t, dtype=float)
    t[index] = value
    return t


@pytest.mark.parametrize("make_t, error, match", [
    (lambda t: _bad_times(t, 7, np.nan), ValueError, r"t must be finite: t\[7\] = nan"),
    (lambda t: _bad_times(t, 9, np.inf), ValueError, r"t\[9\] = inf"),
    (lambda t: _bad_times(t, 6, t[5]), ValueError, r"strictly increasing: t\[5\] .* t\[6\]"),
    (lambda t: _bad_times(t, 8, t[3]), ValueError, r"strictly increasing: t\[7\]"),
    (lambda t: _bad_times(t, 0, -1.0), ValueError, r"t\[0\] = -1.0"),
    (lambda t: t[:-1], ValueError, r"n = len\(t\) = 10"),
    (lambda t: np.stack([t, t]), ValueError, "1-d array"),
    (lambda t: t > 0.5, TypeError, "t must be an array of real numbers, got bool"),
    (lambda t: 1e300 + t * 1e-300, ValueError, "strictly increasing"),
])
def test_compare_checks_every_time_of_the_data(run, make_t, error, match):
    with pytest.raises(error, match=match):
        sq.compare(M, make_t(run.t), run.Q, run.rho)


@pytest.mark.parametrize("which", ["Q", "rho"])
def test_compare_finds_a_nan_hidden_at_a_later_time(run, which):
    arrays = {"Q": run.Q.copy(), "rho": run.rho.copy()}
    arrays[which][2, 8, 1, 0] = np.nan                # replica 2, the 9th time
    with pytest.raises(ValueError, match=rf"{which} must be finite; replica 2 .* "
                                         rf"t = {run.t[8]:.6g}"):
        sq.compare(M, run.t, arrays["Q"], arrays["rho"])


# --------------------------------------------------------------------------- extreme coefficients
EXTREME = [
    pytest.param((0, 0, 1e300), id="1e300 z^2"),
    pytest.param((0, 0, 1e-300), id="1e-300 z^2"),
    pytest.param((0, 0, 0, 1e300), id="1e300 z^3"),
    pytest.param((0, -3e-300, 0, 1e-300), id="1e-300 (z^3 - 3z)"),
    pytest.param((0, 0, 0, Fraction(10**400 + 1, 3)), id="huge rational"),
    pytest.param((0, 0, 0, Fraction(1, 10**400)), id="tiny rational"),
    pytest.param((0, 0, 0, 1e51), id="just above the range"),
    pytest.param((1e8, 0, 0, 1), id="constant 1e8 z^3"),
]
P2 = (np.eye(2), np.array([[0.1], [0.05]]), np.eye(1))       # no symmetric start
NUMERIC_ROUTES = {
    "kernels": lambda m: sq.kernels(m).rhs(*P2),
    "integrate": lambda m: sq.integrate(m, *P2, 1.0),
    "simulate": lambda m: sq.simulate(m, N=50, t_max=0.1, replicas=2),
    "validate": lambda m: sq.validate(m, N=50, replicas=2),
    "compare": lambda m: sq.compare(m, np.arange(3.0), np.stack([P2[0]] * 3),
                                    np.stack([P2[1]] * 3)),
    "plateau": lambda m: sq.plateau(m),
    "escape_time": lambda m: sq.escape_time(m, N=100, n_samples=4),
    "population_risk": lambda m: population_risk(m.activation, *P2),
}


@pytest.mark.parametrize("activation", EXTREME)
@pytest.mark.parametrize("route", sorted(NUMERIC_ROUTES))
def test_extreme_coefficients_are_refused_by_every_float_route(activation, route):
    m = sq.Model(p=2, p_star=1, lr=0.1, activation=activation)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)          # no overflow on the way
        with pytest.raises(ValueError, match=r"activation: the (largest non-constant "
                                             r"coefficient|constant term)"):
            NUMERIC_ROUTES[route](m)


@pytest.mark.parametrize("c", [Fraction(10) ** 50, Fraction(1, 10**50), Fraction(7, 3)])
@pytest.mark.parametrize("shape", [(0, 0, 1), (0, -1, 0, Fraction(1, 3)), (-1, 0, 0, 0, 1)])
def test_coefficients_at_the_ends_of_the_range_work(c, shape):
    # an exact symmetry as the second route: σ = c s with (lr, noise) has the overlap
    # dynamics of σ = s with (lr c², noise/c²), and c² times its risk
    a = sq.Model(p=3, p_star=2, lr=1e-3 / float(c) ** 2, noise=0.25 * float(c) ** 2,
                 activation=tuple(c * x for x in shape))
    b = sq.Model(p=3, p_star=2, lr=1e-3, noise=0.25, activation=shape)
    Q, rho, T = np.eye(3) * 0.9, 0.2 * np.arange(1, 7).reshape(3, 2) / 6, np.eye(2)
    ka, kb = sq.kernels(a), sq.kernels(b)
    for x, y in zip(ka.rhs(Q, rho, T), kb.rhs(Q, rho, T)):
        assert np.all(np.isfinite(x)) and np.allclose(x, y, rtol=1e-12, atol=0)
    assert ka.risk(Q, rho, T) == pytest.approx(float(c) ** 2 * kb.risk(Q, rho, T), rel=1e-12)
    ra = sq.simulate(a, N=40, t_max=0.2, replicas=2, seed=3)
    rb = sq.simulate(b, N=40, t_max=0.2, replicas=2, seed=3)
    assert np.allclose(ra.Q, rb.Q, rtol=1e-9) and np.allclose(ra.rho, rb.rho, rtol=1e-9)


def test_symbolic_routes_stay_exact_for_extreme_coefficients():
    from symquad.symbolic.derive import derive
    huge = Fraction(10**400 + 1, 3)
    eq = derive(sq.Model(p=2, p_star=1, lr=0.1, activation=(0, 0, huge)))
    ref = derive(sq.Model(p=2, p_star=1, lr=0.1, activation=(0, 0, 1)))
    import sympy as sp
    c = sp.Rational(huge.numerator, huge.denominator)
    assert sp.expand(eq.explicit()[0] - c**2 * ref.explicit()[0]) == 0
    assert "10000000000" in eq.latex()            # printed exactly, not as a float

"""The width-independent tensor route against independent routes.

* the entry route (Wick/Isserlis entry by entry, a separate derivation) at every
  (p, p*) <= (3, 3): equal to 1e-12 relative;
* Monte Carlo of the defining one-step increments at p = 12, p* = 3, a width
  the entry route cannot reach;
* the multigraph expansion itself against Isserlis moments;
* a multiprecision (mpmath) evaluation of the printed polynomials, term by
  term, at p = 64: the float64 kernels' rounding error;
* SGD itself (exact reduced simulator) at p = 16, p* = 4 for z³ − 3z.
"""

from functools import lru_cache

import numpy as np
import pytest
import sympy as sp

import symquad as sq
from conftest import random_overlaps
from symquad.kernel_files import load_module_text
from symquad.symbolic.tensor import (VARIANCE, derive_tensor_form, multigraphs,
                                     reference_entries, vertex_function)
from symquad.symbolic.wick import GaussianFields
from test_kernels_monte_carlo import mc_estimates

ACTIVATIONS = ("z**3", "z + z**2", "z**3 - 3*z", "z**4")
SIZES = [(p, k) for p in (1, 2, 3) for k in (1, 2, 3)]


@lru_cache(maxsize=None)
def entry_module(p, p_star, activation):
    """Entry-route kernels rendered in memory (no kernel cache touched)."""
    from symquad.codegen.render import render_entries_module
    model = sq.Model(p=p, p_star=p_star, lr=1.0, activation=activation)
    return load_module_text(render_entries_module(model), "entry_reference")



def assert_tensor_equals_entries(p, p_star, activation, noise, lr_scaling, points=3):
    model = sq.Model(p=p, p_star=p_star, lr=0.3, noise=noise, activation=activation,
                     lr_scaling=lr_scaling)
    tensor = sq.kernels(model)
    assert tensor.form == "tensor"
    entries = entry_module(p, p_star, activation)
    rng = np.random.default_rng(100 * p + 10 * p_star + len(activation))
    for _ in range(points):
        Q, rho, T = random_overlaps(p, p_star, rng)
        dQ, drho = tensor.rhs(Q, rho, T)
        a = np.array([float(c) for c in model.readout])
        b = np.array([float(c) for c in model.teacher_readout])
        params = tuple(model.kernel_params()[name] for name in entries.PARAMS)
        dQ_e, drho_e, _ = entries.rhs(Q, rho, T, a, b, params)
        scale = max(np.max(np.abs(dQ_e)), np.max(np.abs(drho_e)))
        assert scale > 1e-3
        assert np.max(np.abs(dQ - dQ_e)) <= 1e-12 * scale
        assert np.max(np.abs(drho - drho_e)) <= 1e-12 * scale
        risk_e = float(entries.risk(Q, rho, T, a, b))
        assert abs(tensor.risk(Q, rho, T) - risk_e) <= 1e-12 * abs(risk_e)


# a representative subset in the default run; the whole grid is `slow`
@pytest.mark.parametrize("p, p_star, activation, noise, lr_scaling", [
    (1, 1, "z**3", 0.0, "fixed"),
    (2, 1, "z + z**2", 0.5, "width"),
    (2, 2, "z**3 - 3*z", 0.5, "fixed"),
    (3, 2, "z**3", 0.0, "width"),
    (2, 1, "z**4", 0.3, "fixed"),
])
def test_tensor_equals_entry_route(p, p_star, activation, noise, lr_scaling):
    assert_tensor_equals_entries(p, p_star, activation, noise, lr_scaling)


@pytest.mark.slow
@pytest.mark.parametrize("lr_scaling", ["fixed", "width"])
@pytest.mark.parametrize("noise", [0.0, 0.5])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("p, p_star", SIZES)
def test_tensor_equals_entry_route_full_grid(p, p_star, activation, noise, lr_scaling):
    assert_tensor_equals_entries(p, p_star, activation, noise, lr_scaling)


def test_quadratic_tensor_equals_matrix_form():
    model = sq.Model(p=5, p_star=3, lr=0.2, noise=0.4, activation="3*z**2/2 - 1")
    rng = np.random.default_rng(7)
    Q, rho, T = random_overlaps(5, 3, rng)
    tensor, matrix = sq.kernels(model, form="tensor"), sq.kernels(model)
    assert matrix.form == "matrix"
    for a, b in zip(tensor.rhs(Q, rho, T), matrix.rhs(Q, rho, T)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.max(np.abs(b)))
    assert abs(tensor.risk(Q, rho, T) - matrix.risk(Q, rho, T)) < 1e-12


def test_uncommitted_activation_is_generated_per_activation(isolated_cache):
    """A new activation is derived once into the cache and serves every width."""
    act = "z**3/3 + z**2 - 1"
    small = sq.kernels(sq.Model(p=2, p_star=1, lr=0.2, noise=0.2, activation=act))
    files = list(isolated_cache.glob("tensor_*.py"))
    assert len(files) == 1 and small.source == str(files[0])
    wide = sq.kernels(sq.Model(p=7, p_star=3, lr=0.2, activation=act))
    assert wide.source == small.source and list(isolated_cache.glob("tensor_*.py")) == files
    assert_tensor_equals_entries(2, 1, act, 0.2, "fixed", points=2)


def test_vertex_functions_and_multigraph_expansion_match_isserlis():
    """E[∏ f_a(x_a)] by the multigraph formula == Isserlis on a symbolic covariance."""
    z = sp.Symbol("z")
    sigma = sp.Rational(1, 2) * z**4 - z**3 + 2 * z
    coeffs = tuple(sp.Poly(sigma, z).all_coeffs()[::-1])
    D = sp.Symbol("D", positive=True)
    x = sp.Symbol("x")
    for j in range(5):  # φ_j(D) = E[σ^{(j)}(x)], x ~ N(0, D)
        direct = GaussianFields((x,), sp.Matrix([[D]])).expectation(sp.diff(sigma, z, j).subs(z, x))
        assert sp.expand(vertex_function(coeffs, j, D) - direct) == 0
    # three fields, f = (σ', σ, σ): sum over multigraphs with degree caps (3, 4, 4)
    u = sp.symbols("u0:3")
    c = {(0, 1): sp.Symbol("c01"), (0, 2): sp.Symbol("c02"), (1, 2): sp.Symbol("c12")}
    d = sp.symbols("d0:3", positive=True)
    cov = sp.Matrix(3, 3, lambda i, j: d[i] if i == j else c[(min(i, j), max(i, j))])
    fs = [sp.diff(sigma, z), sigma, sigma]
    exact = GaussianFields(u, cov).expectation(sp.Mul(*[f.subs(z, ui) for f, ui in zip(fs, u)]))
    total = 0
    for edges in multigraphs((3, 4, 4)):
        deg = [sum(m for (a, b), m in edges.items() if v in (a, b)) for v in range(3)]
        term = sp.Mul(*[c[e]**m / sp.factorial(m) for e, m in edges.items()])
        for v, f in enumerate(fs):
            term *= GaussianFields((x,), sp.Matrix([[d[v]]])).expectation(
                sp.diff(f, z, deg[v]).subs(z, x))
        total += term
    assert sp.expand(total - exact) == 0


def test_coincident_indices_need_no_special_case():
    """I_4(k, k, a, a) on the singular covariance equals E[σ'(x)² σ(y)²] directly."""
    tf = derive_tensor_form(sq.Model(1, 1, 1.0, activation="z**3 - 3*z").activation)
    x, y, dk, da, c = sp.symbols("x y dk da c")
    sigma = x**3 - 3 * x
    direct = GaussianFields((x, y), sp.Matrix([[dk, c], [c, da]])).expectation(
        sp.diff(sigma, x).subs(x, x)**2 * sigma.subs(x, y)**2)
    cov = {(0, 1): dk, (0, 2): c, (0, 3): c, (1, 2): c, (1, 3): c, (2, 3): da}
    via_formula = tf.I4.expression(cov, [dk, dk, da, da], tf.phi)
    assert sp.expand(via_formula - direct) == 0
    assert VARIANCE in tf.phi[1].free_symbols


def test_tensor_kernels_match_monte_carlo_beyond_entry_route():
    """p = 12, p* = 3: the kernels against MC of N ΔQ, N Δρ and the risk."""
    model = sq.Model(p=12, p_star=3, lr=0.3, noise=0.4, activation="z**3 - 3*z")
    rng = np.random.default_rng(12)
    Q, rho, T = random_overlaps(12, 3, rng, scale=0.6)
    kern = sq.kernels(model)
    dQ, drho = kern.rhs(Q, rho, T)
    exact = np.concatenate([dQ.ravel(), drho.ravel(), [kern.risk(Q, rho, T)]])
    mean, se = mc_estimates(model, Q, rho, T, 400_000, rng)
    scale = np.max(np.abs(exact))
    assert np.max(se) < 0.05 * scale, f"MC too imprecise: {np.max(se):.3g} vs {scale:.3g}"
    z = np.abs(mean - exact) / se
    assert np.max(z) < 5.5, f"max |kernel − MC| = {np.max(z):.2f} standard errors"


def test_batched_tensor_kernels_equal_single_calls():
    model = sq.Model(p=4, p_star=2, lr=0.2, noise=0.1, activation="z**4")
    rng = np.random.default_rng(3)
    pts = [random_overlaps(4, 2, rng) for _ in range(3)]
    Q, rho, T = (np.stack(x) for x in zip(*pts))
    kern = sq.kernels(model)
    dQ, drho = kern.rhs(Q, rho, T)
    risk = kern.risk(Q, rho, T)
    assert dQ.shape == (3, 4, 4) and drho.shape == (3, 4, 2) and risk.shape == (3,)
    for b in range(3):
        a, c = kern.rhs(Q[b], rho[b], T[b])
        np.testing.assert_allclose(dQ[b], a, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(drho[b], c, rtol=1e-13, atol=1e-15)


def test_kernels_refuse_overlaps_of_another_width():
    kern = sq.kernels(sq.Model(p=3, p_star=2, lr=0.1, activation="z**3"))
    with pytest.raises(ValueError, match="shapes"):
        kern.rhs(np.eye(4), np.zeros((4, 2)), np.eye(2))


def _mp_relative_errors(p, p_star, activation, dq_entries, drho_entries, seed, scale=1.0):
    model = sq.Model(p=p, p_star=p_star, lr=0.3, noise=0.2, activation=activation)
    rng = np.random.default_rng(seed)
    Q, rho, T = random_overlaps(p, p_star, rng, scale=scale)
    ref = reference_entries(model, Q, rho, T, dq_entries, drho_entries, risk=True)
    kern = sq.kernels(model)
    dQ, drho = kern.rhs(Q, rho, T)
    got = {("risk",): kern.risk(Q, rho, T)}
    got.update({("dQ", k, l): dQ[k, l] for k, l in dq_entries})
    got.update({("drho", k, m): drho[k, m] for k, m in drho_entries})
    return {key: abs(got[key] - float(v)) / abs(float(v)) for key, v in ref.items()}


def test_float64_conditioning_against_mpmath_at_p64():
    """At p = 64 the float64 kernels agree with 40-digit arithmetic to ~1e-15.

    Default run: the O(n) and O(n²)-cheap entries (dρ, risk) at p = 64 and a dQ
    entry at p = 16; the dQ entries at p = 64 are in the slow test below.
    """
    errs = _mp_relative_errors(64, 8, "z**3 - 3*z", (), [(0, 0), (63, 7)], seed=64)
    errs.update(_mp_relative_errors(16, 4, "z**3 - 3*z", [(0, 0), (2, 9)], (), seed=16))
    assert max(errs.values()) < 1e-13, errs


@pytest.mark.slow
@pytest.mark.parametrize("activation", ["z**3 - 3*z", "z**4"])
@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_float64_conditioning_against_mpmath_at_p64_all_terms(activation, scale):
    errs = _mp_relative_errors(64, 8, activation, [(0, 0), (0, 1), (5, 60)], [(3, 2)],
                               seed=65, scale=scale)
    assert max(errs.values()) < 1e-13, errs


def _sgd_vs_ode(N, t_max, replicas, seed):
    p, k = 16, 4
    model = sq.Model(p=p, p_star=k, lr=0.2, activation="z**3 - 3*z")
    rng = np.random.default_rng(3)
    W = 0.3 * rng.standard_normal((p, k))
    Q0, rho0, T = 0.5 * np.eye(p) + W @ W.T, W.copy(), np.eye(k)
    times = np.linspace(0.0, t_max, 4)
    ode = sq.integrate(model, Q0, rho0, T, t_max=t_max, t_eval=times, rtol=1e-7, atol=1e-10)
    run = sq.simulate(model, N=N, t_max=t_max, replicas=replicas, seed=seed, Q0=Q0, rho0=rho0,
                      T=T, t_eval=times)
    risk_se = run.risk.std(axis=0, ddof=1) / np.sqrt(replicas)
    # the SGD average must resolve the ODE's own motion before it can test it
    assert np.max(risk_se) < 0.05 * (ode.risk[0] - ode.risk[-1])
    z_risk = np.abs(run.risk.mean(axis=0) - ode.risk)[1:] / risk_se[1:]
    assert np.max(z_risk) < 4.5, z_risk
    final = np.concatenate([run.Q[:, -1].reshape(replicas, -1), run.rho[:, -1].reshape(replicas, -1)], 1)
    se = final.std(axis=0, ddof=1) / np.sqrt(replicas)
    z = np.abs(final.mean(axis=0) - np.concatenate([ode.Q[-1].ravel(), ode.rho[-1].ravel()])) / se
    assert np.max(z) < 5.5, np.max(z)


def test_sgd_mean_tracks_tensor_ode_at_p16():
    """z³ − 3z at p = 16, p* = 4: mean of 16 exact SGD runs vs the tensor ODE."""
    _sgd_vs_ode(N=1000, t_max=6.0, replicas=16, seed=1)


@pytest.mark.slow
def test_sgd_mean_tracks_tensor_ode_at_p16_large():
    _sgd_vs_ode(N=4000, t_max=10.0, replicas=32, seed=2)


def test_equations_cli_prints_width_independent_tensor_form(capsys):
    from symquad.cli import main
    bodies = []
    for p in (5, 64):
        assert main(["equations", "--activation", "z**3 - 3*z", "--p", str(p), "--p-star", "4"]) == 0
        text = capsys.readouterr().out
        assert "tensor form" in text
        for fn in ("I_{2}", "J_{2}", "I_{3}", "I_{4}"):   # each function defined once
            assert sum(line.startswith(fn) for line in text.splitlines()) == 1, fn
        bodies.append("\n".join(l for l in text.splitlines() if "p =" not in l and "p=" not in l))
    assert bodies[0] == bodies[1] and len(bodies[1]) < 20_000


def test_entry_route_checks_its_size_first(monkeypatch, forbid):
    """Refuses (before any SymPy work) or warns with an estimate; the tensor route has no limit."""
    from symquad.symbolic import entries
    from symquad.symbolic.entries import check_entry_route_size, entry_route_estimate
    huge = sq.Model(p=20, p_star=4, lr=0.1, activation="z**3")
    with monkeypatch.context():
        # the entry route's SymPy work: the drift, the Gaussian fields, the expectations
        started = forbid(entries, "_derive_entries", "drift", "model_fields")
        with pytest.raises(ValueError, match=r"p=20, p_star=4.*about .* s"):
            sq.derive(huge, form="entries")
        with pytest.raises(ValueError, match="tensor"):
            sq.kernels(huge.replace(activation="z**3 + z"), form="entries")
        assert started == []
    # the estimate reproduces the measured 180 s of z³ at (8, 4) within a factor 2
    assert 90 < entry_route_estimate(sq.Model(p=8, p_star=4, lr=0.1, activation="z**3")) < 360
    with pytest.warns(RuntimeWarning, match="will take about"):
        check_entry_route_size(sq.Model(p=8, p_star=4, lr=0.1, activation="z**3"))
    assert sq.derive(huge).form == "tensor"


def test_risk_keeps_relative_precision_near_zero_risk():
    """Students = replicated teachers + 1e-4 noise: risk ~1e-9, still ~1e-11 accurate.

    In float64 the student/teacher cancellation left a 2e-8 relative error here
    (absolute 3e-17); the kernels' risk sums in extended precision.
    """
    p, k, N = 16, 4, 100
    rng = np.random.default_rng(11)
    Ws = np.linalg.qr(rng.standard_normal((N, k)))[0].T * np.sqrt(N)
    W = np.repeat(Ws, p // k, axis=0) + 1e-4 * rng.standard_normal((p, N))
    Q, rho, T = W @ W.T / N, W @ Ws.T / N, Ws @ Ws.T / N
    model = sq.Model(p=p, p_star=k, lr=0.3, activation="z**3 - 3*z")
    exact = float(reference_entries(model, Q, rho, T, risk=True)[("risk",)])
    assert 1e-11 < exact < 1e-7
    if np.finfo(np.longdouble).eps < 1e-18:       # an extended type exists here
        assert abs(sq.kernels(model).risk(Q, rho, T) - exact) < 1e-10 * exact

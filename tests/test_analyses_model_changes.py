"""The paper's analyses under a change of the model (issue 15, item 4).

Every routine derived for the classic model either re-derives its result for
a changed field — checked here by a second route (the closed forms against
the generated kernels, the ODE integrated to the fixed point, finite
differences of the kernels' risk, exact Taylor coefficients against the
kernels' dS/dt and an integrated trajectory) — or refuses with an error that
names the field.
"""

from fractions import Fraction

import numpy as np
import pytest
import sympy as sp

import symquad as sq
from symquad.applicability import RULES, check
from symquad.numeric import invariants as ninv
from symquad.numeric import landscape as L
from symquad.symbolic import fixed_points as F
from symquad.symbolic import hessian as H
from symquad.symbolic import invariants as sinv
from symquad.symbolic import manifold as smf

BASE = sq.Model(p=3, p_star=2, lr=0.1)
R = Fraction


def changed(**kw):
    return BASE.replace(**kw)


NON_UNIFORM_A = (R(1, 2), R(1, 3), R(1, 6))
NON_UNIFORM_B = (R(2, 3), R(1, 3))


# --------------------------------------------------------------------------- refusals
REFUSALS = [
    # (routine, call, model, field named)
    ("plateau", lambda m: L.plateau(m), changed(readout=NON_UNIFORM_A), "readout"),
    ("plateau", lambda m: L.plateau(m), changed(lr_readout=0.1), "lr_readout"),
    ("plateau_solution", F.plateau_solution, changed(teacher_readout=NON_UNIFORM_B),
     "teacher_readout"),
    ("plateau_solution", F.plateau_solution, changed(teacher_activation="z**2 + z"),
     "teacher_activation"),
    ("escape_time", lambda m: L.escape_time(m, 1000, n_samples=2),
     changed(teacher_readout=NON_UNIFORM_B), "teacher_readout"),
    ("escape_time", lambda m: L.escape_time(m, 1000, n_samples=2),
     changed(teacher_activation="z**2 + z"), "teacher_activation"),
    ("escape_time", lambda m: L.escape_time(m, 1000, n_samples=2), changed(lr_readout=0.1),
     "lr_readout"),
    ("rho_diffusion", lambda m: L.rho_diffusion(m, 0.5), changed(constraint="sphere"),
     "constraint"),
    ("rho_diffusion", lambda m: L.rho_diffusion(m, 0.5), changed(readout=NON_UNIFORM_A),
     "readout"),
    ("rho_diffusion_symbolic", lambda m: F.rho_diffusion_symbolic(m),
     changed(constraint="sphere"), "constraint"),
    ("hessian_spectrum", lambda m: H.hessian_spectrum(m, "plateau", 6),
     changed(readout=NON_UNIFORM_A), "readout"),
    ("hessian_spectrum", lambda m: H.hessian_spectrum(m, "origin", 6),
     changed(lr_readout=0.1), "lr_readout"),
    ("hessian_spectrum", lambda m: H.hessian_spectrum(m, "origin", 6),
     changed(constraint="sphere"), "constraint"),
    ("hessian_spectrum", lambda m: H.hessian_spectrum(m, "minimum", 6),
     changed(teacher_activation="z**2 + 1"), "kappa"),      # no zero-risk point
    ("weight_hessian", lambda m: L.weight_hessian(m, *L.critical_weights(BASE, "origin", 6)),
     changed(constraint="sphere"), "constraint"),
    ("critical_weights", lambda m: L.critical_weights(m, "plateau", 6),
     changed(teacher_readout=NON_UNIFORM_B), "teacher_readout"),
    ("manifold_dimension", lambda m: sq.manifold_dimension(model=m),
     changed(constraint="sphere"), "constraint"),
    ("manifold_dimension", lambda m: sq.manifold_dimension(model=m),
     changed(readout=(1, -1, 1)), "readout"),
    ("manifold_dimension", lambda m: sq.manifold_dimension(model=m),
     changed(teacher_activation="z**3"), "teacher_activation"),
    ("manifold_dimension", lambda m: sq.manifold_dimension(model=m),
     changed(teacher_readout=-0.5), "teacher_readout"),     # opposite signs: no zero risk
    ("zero_risk_point", lambda m: sq.zero_risk_point(np.eye(3, 2), model=m),
     changed(constraint="sphere"), "constraint"),
    ("closest_solution", lambda m: sq.closest_solution(m, np.eye(3), 0.1 * np.eye(3, 2)),
     changed(weight_decay=0.1), "weight_decay"),
    ("closest_solution", lambda m: sq.closest_solution(m, np.eye(3), 0.1 * np.eye(3, 2)),
     changed(lr_readout=0.1), "lr_readout"),
    ("closest_solution", lambda m: sq.closest_solution(m, np.eye(3), 0.1 * np.eye(3, 2)),
     changed(readout=NON_UNIFORM_A), "readout"),
    ("closest_solution", lambda m: sq.closest_solution(m, np.eye(3), 0.1 * np.eye(3, 2)),
     changed(constraint="sphere"), "constraint"),
    ("invariant_set_point",
     lambda m: sq.invariant_set_point(3, 2, np.random.default_rng(0), model=m),
     changed(teacher_readout=NON_UNIFORM_B), "teacher_readout"),
    ("prove_conservation", lambda m: sinv.prove_conservation(m), changed(lr_readout=0.1),
     "lr_readout"),
    ("prove_conservation", lambda m: sinv.prove_conservation(m),
     changed(readout=NON_UNIFORM_A), "readout"),
    ("noisy_floor", lambda m: L.noisy_floor(m, t_max=1.0), changed(weight_decay=0.1),
     "weight_decay"),
    ("noisy_floor", lambda m: L.noisy_floor(m, t_max=1.0), changed(lr_readout=0.1),
     "lr_readout"),
    ("minimum_overlaps", L.minimum_overlaps, changed(constraint="sphere"), "constraint"),
    ("minimum_risk", L.minimum_risk, changed(constraint="sphere", readout=0.5), "constraint"),
    ("solution_jacobian", F.solution_jacobian, changed(weight_decay=0.1), "weight_decay"),
    ("spectrum_formulas", lambda m: H.spectrum_formulas("origin", model=m),
     changed(readout=0.5), "readout"),
    ("count_formulas", lambda m: H.count_formulas("plateau", model=m),
     changed(weight_decay=0.1), "weight decay"),
    ("dimension_check", lambda m: smf.dimension_check(3, 2, model=m),
     changed(readout=NON_UNIFORM_A), "readout"),
    ("manifold_latex", lambda m: smf.manifold_latex(3, 2, model=m),
     changed(constraint="sphere"), "constraint"),
    ("escape_prediction", lambda m: L.escape_prediction(m, 1000, n_samples=2),
     changed(readout=NON_UNIFORM_A), "readout"),
    ("ode_escape_times", lambda m: L.ode_escape_times(m, np.eye(3)[None], np.zeros((1, 3, 2)),
                                                      1.0), changed(lr_readout=0.1),
     "lr_readout"),
    ("escape_threshold", L.escape_threshold, changed(readout=NON_UNIFORM_A), "readout"),
    ("gradient_flow_plateau_q", L.gradient_flow_plateau_q, changed(lr_readout=0.1),
     "lr_readout"),
    ("check_symmetric_ansatz", F.check_symmetric_ansatz, changed(readout=NON_UNIFORM_A),
     "readout"),
    ("isotropic_reduction", lambda m: F.isotropic_reduction(model=m),
     changed(teacher_readout=NON_UNIFORM_B), "teacher_readout"),
    ("solution_zero_modes", lambda m: F.solution_zero_modes(3, 2, model=m),
     changed(lr_readout=0.1), "lr_readout"),
    ("weight_distance", lambda m: ninv.weight_distance(np.eye(3), 0.1 * np.eye(3, 2),
                                                       np.eye(3, 2), model=m),
     changed(readout=NON_UNIFORM_A), "readout"),
    ("random_manifold_points",
     lambda m: sq.random_manifold_points(3, 2, 2, np.random.default_rng(0), model=m),
     changed(constraint="sphere"), "constraint"),
    ("is_zero_risk_point", lambda m: ninv.is_zero_risk_point(np.eye(3), np.eye(3, 2), model=m),
     changed(constraint="sphere"), "constraint"),
    ("manifold_rank_deficiency", lambda m: ninv.manifold_rank_deficiency(3, 2, model=m),
     changed(readout=(1, -1, 1)), "readout"),
    ("zero_risk_points_check", smf.zero_risk_points_check, changed(constraint="sphere"),
     "constraint"),
    ("underparameterised_minimum", smf.underparameterised_minimum,
     sq.Model(p=1, p_star=2, lr=0.1, constraint="sphere"), "constraint"),
    ("hessian_blocks", lambda m: H.hessian_blocks(m, "origin"), changed(lr_readout=0.1),
     "lr_readout"),
    ("effective_point", lambda m: H.effective_point(m, "plateau"),
     changed(readout=NON_UNIFORM_A), "readout"),
    ("formula_spectrum", lambda m: H.formula_spectrum(m, "origin", 6),
     changed(weight_decay=0.1), "weight_decay"),
    ("instantaneous_condition", sinv.instantaneous_condition, changed(constraint="sphere"),
     "constraint"),
    ("exact_dS_dt", lambda m: sinv.exact_dS_dt(m, sp.eye(3), sp.eye(3, 2), sp.eye(2) / 2,
                                               sp.eye(2)),
     changed(lr_readout=0.1), "lr_readout"),
]


@pytest.mark.parametrize("routine,call,model,name", REFUSALS,
                         ids=[f"{r}-{n}" for r, _, _, n in REFUSALS])
def test_refusal_names_the_field(routine, call, model, name):
    with pytest.raises(ValueError, match=name):
        call(model)


def test_every_rule_refuses_a_field_it_does_not_list():
    """A field without a rule is refused with the general reason (future fields)."""
    m = changed(weight_decay=0.1)
    for analysis in RULES:
        rules = dict(RULES[analysis])
        rules.pop("weight_decay")
        RULES[analysis], saved = rules, RULES[analysis]
        try:
            with pytest.raises(ValueError, match="weight_decay=0.1"):
                check(m, analysis)
        finally:
            RULES[analysis] = saved


def test_refusals_come_before_any_work(monkeypatch):
    """escape_time refuses fields and arguments before integrating anything."""
    monkeypatch.setattr(L, "plateau", lambda m: pytest.fail("plateau was called"))
    with pytest.raises(ValueError, match="lr_readout"):
        L.escape_time(changed(lr_readout=0.1), 1000)
    with pytest.raises(ValueError, match="q0 must be 1"):
        L.escape_time(changed(constraint="sphere"), 1000, q0=2.0, sgd_noise=False)


# --------------------------------------------------------------------------- plateau
PLATEAU_MODELS = [
    changed(weight_decay=0.1),
    changed(weight_decay=0.5),                   # g(q_gf) < 0: the root below q_gf
    changed(batch_size=4),
    changed(readout=R(1, 2)),
    changed(teacher_readout=R(1, 4)),
    changed(teacher_activation="2*z**2"),
    changed(teacher_activation="z**2 + 1"),
    changed(constraint="sphere"),
    changed(constraint="sphere", batch_size=3, readout=R(1, 2), weight_decay=0.2),
]


@pytest.mark.parametrize("m", PLATEAU_MODELS, ids=lambda m: m.describe())
def test_plateau_closed_form_equals_kernels(m):
    """Route 1: matrix form reduced at Q = qI (symbolic); route 2: kernels + finite differences."""
    fp = L.plateau(m)
    exact = F.plateau_solution(m)
    assert float(exact.q) == pytest.approx(fp.q, rel=1e-11)
    assert float(exact.rate) == pytest.approx(fp.rate, rel=1e-9)
    assert float(exact.risk) == pytest.approx(fp.risk, rel=1e-11)
    assert float(exact.rate_gradient_flow) == pytest.approx(fp.rate_gradient_flow, rel=1e-8)
    assert float(exact.q_gradient_flow) == pytest.approx(fp.q_gradient_flow, rel=1e-10)
    ev = np.sort(fp.jacobian_eigenvalues.real)
    assert np.min(np.abs(ev - float(exact.lambda_traceless))) < 1e-9
    if m.constraint == "none":
        assert np.min(np.abs(ev - float(exact.lambda_iso))) < 1e-9
    assert len(fp.rho_rates) == 1


def test_weight_decay_moves_the_plateau_and_a_strong_one_removes_it():
    """By hand for p = 3, p* = 2, σ = z²: ε(qI, 0, I) = ½(q − 1)² + q²/3 + ½, so the
    stationary point of ε + (λ/2)·3q is q = (3/5)(1 − 3λ/2)."""
    classic, decayed = L.plateau(BASE), L.plateau(changed(weight_decay=0.1))
    assert decayed.q < classic.q
    assert decayed.q_gradient_flow == pytest.approx(0.6 * (1 - 1.5 * 0.1), rel=1e-12)
    with pytest.raises(ValueError, match="decay"):
        L.plateau(changed(weight_decay=3.0))


@pytest.mark.parametrize("m", [changed(weight_decay=0.1, batch_size=4),
                               changed(readout=R(1, 2), teacher_activation="2*z**2")],
                         ids=lambda m: m.describe())
def test_ode_relaxes_to_the_changed_plateau(m):
    """Third route: integrate the ODE from Q = I, ρ = 0 until it stops."""
    fp = L.plateau(m)
    sol = sq.integrate(m, np.eye(3), np.zeros((3, 2)), np.eye(2), 400.0, rtol=1e-11,
                       atol=1e-13, warn_symmetric=False)
    assert np.max(np.abs(sol.Q[-1] - fp.Q)) < 1e-8


@pytest.mark.parametrize("m", [changed(constraint="sphere"), changed(weight_decay=0.1),
                               changed(teacher_activation="z**2 + z"),
                               changed(teacher_readout=NON_UNIFORM_B)],
                         ids=lambda m: m.describe())
def test_ode_near_the_changed_plateau_grows_at_its_rate(m):
    """Integrate the ODE from the plateau with a tiny ρ along the fastest direction."""
    fp = L.plateau(m)
    rho0 = np.zeros((m.p, m.p_star))
    rho0[0, 0] = 1e-8
    if not m.is_default("teacher_readout"):   # the largest b_m grows fastest
        assert len(fp.rho_rates) == 2
    t_max = np.log(1e4) / fp.rate
    sol = sq.integrate(m, fp.Q, rho0, fp.T, t_max, t_eval=np.linspace(0, t_max, 200),
                       rtol=1e-11, atol=1e-16, warn_symmetric=False)
    logn = np.log(np.linalg.norm(sol.rho.reshape(len(sol.t), -1), axis=1))
    assert np.polyfit(sol.t, logn, 1)[0] == pytest.approx(fp.rate, rel=1e-6)
    assert np.max(np.abs(sol.Q - fp.Q)) < 1e-6


def test_symmetric_ansatz_entry_route_for_changed_models():
    """The entry route (explicit, independent) keeps Q = qI, ρ = 0 and has the same S(q)."""
    for m in (changed(weight_decay=0.1, batch_size=2), changed(readout=R(1, 2)),
              changed(teacher_readout=NON_UNIFORM_B)):
        chk = F.check_symmetric_ansatz(m)
        assert chk["offdiag_zero"] and chk["diag_equal"] and chk["drho_zero"]
        if m.is_default("teacher_readout"):
            red = F.isotropic_reduction(model=m)
            vals = {F.P: m.p, F.P_STAR: m.p_star}
            for s in chk["S"].free_symbols | red["S"].free_symbols:
                if s.name in ("weight_decay", "batch_size"):
                    vals[s] = s
            assert sp.simplify(red["S"].subs(vals) - chk["S"]) == 0


def test_trained_readout_has_no_plateau_fixed_point():
    """The refusal's reason, checked: where da = 0 at ρ = 0, dQ_kk > 0."""
    from symquad.survival import _trained_plateau_drift
    for a0 in (R(1, 3), R(1, 5), R(1, 2)):
        q, dq = _trained_plateau_drift(changed(lr_readout=0.1, readout=a0))
        assert q > 0 and dq > 1e-4


@pytest.mark.parametrize("m", [changed(weight_decay=0.1), changed(readout=R(1, 2)),
                               changed(teacher_activation="2*z**2", batch_size=4)],
                         ids=lambda m: m.describe())
def test_axis_aligned_minimum_of_the_changed_risk(m):
    """The derived scale s² = c*β/(cα): the kernels' risk vanishes there, not at √(p/p*)."""
    Q, rho = L.minimum_overlaps(m)
    T = np.eye(2)
    assert abs(sq.kernels(m).risk(Q, rho, T)) < 1e-14
    if not (m.is_default("readout") and m.is_default("teacher_activation")):
        Qc, rc = L.minimum_overlaps(BASE)
        assert sq.kernels(m).risk(Qc, rc, T) > 1e-3
    assert L.minimum_risk(m) == pytest.approx(0.0, abs=1e-14)


def test_sphere_minimum_risk_is_zero_on_a_parseval_frame():
    """The reason given for minimum_risk on the sphere: an equal-norm Parseval frame."""
    m = changed(constraint="sphere")
    ang = 2 * np.pi * np.arange(3) / 3
    O = np.sqrt(2 / 3) * np.stack([np.cos(ang), np.sin(ang)], axis=1)   # rows of norm² 2/3
    assert np.allclose(O.T @ O, np.eye(2))
    rho = np.sqrt(3 / 2) * O
    Q = rho @ rho.T
    assert np.allclose(np.diag(Q), 1.0)
    assert abs(sq.kernels(m).risk(Q, rho, np.eye(2))) < 1e-14
    assert L.minimum_risk(m) == 0.0


def test_random_start_on_the_sphere_is_the_law_of_renormalised_rows():
    """Two-sample test against actual Gaussian rows renormalised to |w|² = N."""
    from scipy.stats import ks_2samp
    m, N, n = changed(constraint="sphere"), 12, 4000
    Q0, rho0 = L.random_start(m, N, n, seed=1)
    assert np.all(np.diagonal(Q0, axis1=1, axis2=2) == 1.0)
    rng = np.random.default_rng(2)
    W = rng.standard_normal((n, 3, N))
    W *= np.sqrt(N) / np.linalg.norm(W, axis=-1, keepdims=True)
    Q_mc, rho_mc = W @ np.swapaxes(W, 1, 2) / N, W[..., :2] / np.sqrt(N)   # W* = √N e_l
    for a, b in ((Q0[:, 0, 1], Q_mc[:, 0, 1]), (rho0[:, 1, 0], rho_mc[:, 1, 0])):
        assert ks_2samp(a, b).pvalue > 1e-3
    # and not the unnormalised law (its Q_kk fluctuate)
    Q_free, _ = L.random_start(BASE, N, n, seed=1)
    assert ks_2samp(Q_free[:, 0, 1] / np.sqrt(Q_free[:, 0, 0] * Q_free[:, 1, 1]),
                    Q_mc[:, 0, 1]).pvalue > 1e-3


def test_zero_risk_fixed_points_of_a_changed_model():
    """solution_jacobian at s² = c*β/(cα): a fixed point with the predicted zero modes, and
    with label noise the η² term (4c²α²η²Δ/b) Q (derived by hand in noisy_floor's docstring)."""
    m = sq.Model(p=2, p_star=1, lr=0.1, readout=R(1, 4), batch_size=2,
                 teacher_activation="2*z**2")
    _, ev, rhs = F.solution_jacobian(m)
    assert all(v == 0 for v in rhs)
    assert ev.get(0, 0) == F.solution_zero_modes(2, 1, model=m)
    assert all(v < 0 for v in ev if v != 0)
    _, _, noisy = F.solution_jacobian(m, noise=sp.Rational(1, 4))
    s2 = sp.Rational(2 * 1, 1) / sp.Rational(1, 4)            # c* β / (c α) = 2·1/(1/4)
    Q0 = s2 * sp.eye(2, 1) * sp.eye(1, 2)
    coef = 4 * sp.Rational(1, 16) * sp.Rational(1, 100) * sp.Rational(1, 4) / 2
    expect = [coef * Q0[i, j] for i in range(2) for j in range(i, 2)] + [0, 0]
    assert [sp.simplify(a - b) for a, b in zip(noisy, expect)] == [0] * len(expect)


# --------------------------------------------------------------------------- escape law
@pytest.mark.parametrize("m", [changed(weight_decay=0.1, batch_size=4),
                               changed(constraint="sphere")], ids=lambda m: m.describe())
def test_escape_law_paired_with_the_ode(m):
    """The law's samples equal the ODE escape times from the same ρ(0) directions."""
    N = 100_000
    Z = np.random.default_rng(4).standard_normal((24, m.p, m.p_star))
    pred = L.escape_prediction(m, N, sgd_noise=False, Z=Z)
    Q0 = np.broadcast_to(np.eye(m.p), (24, m.p, m.p))
    t_ode = L.ode_escape_times(m, Q0, Z / np.sqrt(N), 3 * pred.median)
    assert not np.isnan(t_ode).any()
    assert np.abs(pred.samples - t_ode).max() < 0.01 * np.median(t_ode)


@pytest.mark.parametrize("m", [changed(readout=R(1, 2), teacher_readout=R(1, 3),
                                       batch_size=4, noise=0.2),
                               changed(teacher_activation="2*z**2 + 1", weight_decay=0.1)],
                         ids=lambda m: m.describe())
def test_rho_diffusion_formula_equals_wick_on_the_network(m):
    q = 0.7
    exact = float(F.rho_diffusion_symbolic(m, sp.nsimplify(q)))
    assert L.rho_diffusion(m, q) == pytest.approx(exact, rel=1e-12)


def test_rho_diffusion_monte_carlo_of_one_minibatch_step():
    """Variance of one mini-batch step's ρ increment, sampled directly (b = 4, α, β, c*)."""
    m = changed(readout=R(1, 2), teacher_readout=R(1, 3), teacher_activation="2*z**2",
                batch_size=4, noise=0.3)
    q = 0.7
    D = L.rho_diffusion(m, q)
    rng = np.random.default_rng(5)
    n, b = 200_000, m.batch_size
    lam = np.sqrt(q) * rng.standard_normal((n, b, m.p))
    nu = rng.standard_normal((n, b, m.p_star))
    y = 2 * (nu ** 2).sum(-1) / 3 + np.sqrt(m.noise) * rng.standard_normal((n, b))
    err = 0.5 * (lam ** 2).sum(-1) - y
    # N Δρ_11 = −η · mean over the batch of a_1 err σ'(λ_1) ν_1; its variance is D
    step = -m.eta * (0.5 * err * 2 * lam[..., 0] * nu[..., 0]).mean(-1)
    sq_dev = step ** 2                                  # the mean is 0 at ρ = 0
    se = sq_dev.std(ddof=1) / np.sqrt(n)
    assert se < 0.03 * D
    assert abs(sq_dev.mean() - D) < 4 * se
    # and not the full-batch (b = 1) value
    assert abs(sq_dev.mean() - D * b) > 20 * se


# --------------------------------------------------------------------------- Hessian
HESSIAN_MODELS = [changed(weight_decay=0.1), changed(readout=R(1, 2)),
                  changed(teacher_readout=R(1, 4), teacher_activation="2*z**2"),
                  changed(batch_size=4, teacher_activation="3*z**2")]


@pytest.mark.parametrize("m", HESSIAN_MODELS, ids=lambda m: m.describe())
@pytest.mark.parametrize("point", H.POINTS)
def test_exact_hessian_equals_finite_differences_of_the_kernels(m, point):
    N = 6
    spec = H.hessian_spectrum(m, point, N)
    W, Ws = L.critical_weights(m, point, N, seed=3)
    ev = np.linalg.eigvalsh(L.weight_hessian(m, W, Ws))
    assert np.max(np.abs(ev - np.asarray(spec))) < 1e-10
    # the point is critical for the objective eps + (lambda/2N)|W|^2 (central differences)
    x0, h = W.ravel(), 1e-4
    grad = []
    for i in range(x0.size):
        e = np.zeros_like(x0)
        e[i] = h
        grad.append((L.weight_objective(m, (x0 + e).reshape(W.shape), Ws)
                     - L.weight_objective(m, (x0 - e).reshape(W.shape), Ws)) / (2 * h))
    assert np.max(np.abs(grad)) < 1e-8


def test_counts_survive_uniform_readouts_but_not_weight_decay():
    N = 6
    for m in HESSIAN_MODELS[1:]:
        for point in H.POINTS:
            spec = H.hessian_spectrum(m, point, N)
            classic = H.hessian_spectrum(BASE, point, N)
            assert spec.counts == classic.counts
            assert spec.count_formulas == classic.count_formulas
    wd = H.hessian_spectrum(changed(weight_decay=0.1), "minimum", N)
    assert wd.count_formulas == {}
    # the extra (quartic) zero modes are lifted by the decay; the tangent ones stay
    assert wd.zero == wd.tangent_zero_modes == sq.manifold_dimension(3, 2)
    assert "not derived" in wd.summary()


# --------------------------------------------------------------------------- manifold
def _in_span_hessian_zero_modes(m, pt):
    """Zero eigenvalues of the Hessian of the kernels' risk in (X[, a]), W = X W*."""
    k = sq.kernels(m)
    p, ks = m.p, m.p_star
    X0 = pt.rho.copy()                        # T = I: ρ = X
    a0 = np.array([float(c) for c in m.readout])
    x0 = np.concatenate([X0.ravel(), a0 if m.readout_trained else []])

    def risk(x):
        X = x[:p * ks].reshape(p, ks)
        a = x[p * ks:] if m.readout_trained else None
        return k.risk(X @ X.T, X, np.eye(ks), a)
    n, h = x0.size, 1e-3
    Hm = np.zeros((n, n))
    for i in range(n):
        for j in range(i, n):
            def d(hh):
                ei, ej = np.eye(n)[i] * hh, np.eye(n)[j] * hh
                return (risk(x0 + ei + ej) - risk(x0 + ei - ej) - risk(x0 - ei + ej)
                        + risk(x0 - ei - ej)) / (4 * hh * hh)
            Hm[i, j] = Hm[j, i] = (4 * d(h) - d(2 * h)) / 3
    ev = np.linalg.eigvalsh(Hm)
    return int(np.sum(np.abs(ev) < 1e-7 * np.abs(ev).max()))


@pytest.mark.parametrize("m", [changed(readout=R(1, 2)), changed(readout=NON_UNIFORM_A),
                               changed(teacher_readout=NON_UNIFORM_B,
                                       teacher_activation="2*z**2"),
                               changed(lr_readout=0.1), changed(weight_decay=0.1),
                               changed(readout=NON_UNIFORM_A, lr_readout=0.1)],
                         ids=lambda m: m.describe())
def test_manifold_dimension_by_the_zero_modes_of_the_risk(m):
    """Second route: the kernel risk vanishes on the derived points, and its Hessian in the
    teacher-span weights (and the readout, when trained) has exactly dim zero modes."""
    dim = sq.manifold_dimension(model=m)
    pts = sq.random_manifold_points(3, 2, 4, np.random.default_rng(7), model=m)
    risk = sq.kernels(m).risk(pts.Q, pts.rho, np.eye(2))
    assert np.max(np.abs(risk)) < 1e-14
    for i in range(4):
        assert ninv.is_zero_risk_point(pts.Q[i], pts.rho[i], model=m)
    off = sq.kernels(m).risk(1.1 * pts.Q[0], pts.rho[0], np.eye(2))
    assert off > 1e-3
    pt = sq.zero_risk_point(ninv.random_stiefel(3, 2, np.random.default_rng(1)), model=m)
    assert _in_span_hessian_zero_modes(m, pt) == dim
    d = ninv.manifold_rank_deficiency(3, 2, model=m, seed=5)
    assert d["constraint"] == d["weights"] == dim == d["formula"]
    assert dim == 3 + (3 if m.readout_trained else 0)


def test_symbolic_manifold_checks_for_uniform_readouts():
    for m in (changed(readout=R(1, 2), teacher_activation="2*z**2"), changed(lr_readout=0.1)):
        smf.risk_trace_form(m)
        vals = smf.zero_risk_points_check(m, n_points=1)["values"]
        assert vals[0] == 0 and vals[1] > 0
        d = smf.dimension_check(3, 2, model=m)
        assert d["kernel_dims"] == [d["formula"]] * 2 == [sq.manifold_dimension(model=m)] * 2
        assert r"\dim Z_T" in smf.manifold_latex(3, 2, model=m)


def test_constant_offset_has_no_zero_risk_point():
    m = changed(teacher_activation="z**2 + 1")
    smf.risk_trace_form(m)                 # the trace form with kappa = -1 holds
    with pytest.raises(ValueError, match="kappa"):
        sq.manifold_dimension(model=m)


# --------------------------------------------------------------------------- closest solution
@pytest.mark.parametrize("m", [changed(readout=R(1, 2), teacher_activation="2*z**2"),
                               changed(batch_size=4, teacher_readout=R(1, 4))],
                         ids=lambda m: m.describe())
def test_ode_reaches_the_changed_closest_solution(m):
    rng = np.random.default_rng(21)
    Q0, rho0, T = sq.invariant_set_point(3, 2, rng, q_perp=np.zeros(1), model=m)
    sol = sq.integrate(m, Q0, rho0, T, t_max=800, rtol=1e-10, atol=1e-13)
    c = sq.closest_solution(m, Q0, rho0, T)
    err = max(np.abs(sol.rho[-1] - c.rho).max(), np.abs(sol.Q[-1] - c.Q).max())
    assert err <= 1e-7
    classic = sq.closest_solution(BASE, Q0, rho0, T)
    assert np.abs(classic.rho - c.rho).max() > 1e-2        # not the classic answer
    d_c = ninv.weight_distance(Q0, rho0, c.S, T, model=m)
    others = sq.random_manifold_points(3, 2, 200, rng, T, model=m)
    assert np.all(ninv.weight_distance(Q0, rho0, others.S, T, model=m) >= d_c - 1e-12)


# --------------------------------------------------------------------------- conservation of S
@pytest.mark.parametrize("change", [dict(weight_decay=0.2), dict(batch_size=3),
                                    dict(readout=R(1, 3)), dict(teacher_activation="3*z**2"),
                                    dict(teacher_readout=R(1, 5))], ids=str)
def test_conservation_proved_per_change(change):
    m = sq.Model(p=2, p_star=2, lr=0.1, **change)
    verdict = sinv.conservation_verdict(m)
    assert verdict.conserved is True
    assert verdict.summary() == "conserved on I_T (proof)"


@pytest.mark.parametrize("p,k", [(2, 2), pytest.param(3, 2, marks=pytest.mark.slow)])
def test_conservation_proved_for_the_changes_that_keep_it(p, k):
    m = sq.Model(p=p, p_star=k, lr=0.1, weight_decay=0.1, batch_size=4, readout=R(1, 3),
                 teacher_readout=R(1, 4), teacher_activation="2*z**2", noise=0.1)
    verdict = sinv.conservation_verdict(m)
    assert verdict.conserved is True
    assert r"\paragraph{Theorem.}" in verdict.latex() and "weight" in verdict.latex()
    # the changed ODE, not the classic one: the growth rates differ
    classic = sinv.conservation_verdict(sq.Model(p=p, p_star=k, lr=0.1, noise=0.1)).proof
    assert verdict.proof.invariance["growth"] != classic.invariance["growth"]


COUNTER = [changed(readout=NON_UNIFORM_A), changed(teacher_readout=NON_UNIFORM_B),
           changed(constraint="sphere"), changed(lr_readout=0.1),
           changed(teacher_activation="z**2 + z")]


@pytest.mark.parametrize("m", COUNTER, ids=lambda m: m.describe())
def test_counterexample_matches_the_kernels(m):
    """The exact Taylor coefficient of S(t) against the kernels: dS/dt (order 1) or a
    Richardson second difference of S along the integrated ODE (order 2)."""
    verdict = sinv.conservation_verdict(m)
    assert verdict.conserved is False
    ce = verdict.counterexample
    st = ce["start"]
    Q0, rho0, T = (np.array(st[x], dtype=float) for x in ("Q", "rho", "T"))
    exact = np.array(ce["dS"].evalf(30), dtype=float)
    assert np.abs(exact).max() > 1e-6
    if ce["order"] == 1:
        assert np.allclose(ninv.dS_dt(m, Q0, rho0, T), exact, rtol=1e-9, atol=1e-13)
        return
    assert ce["order"] == 2
    assert np.abs(ninv.dS_dt(m, Q0, rho0, T)).max() < 1e-13

    def S_at(t):
        sol = sq.integrate(m, Q0, rho0, T, t, t_eval=[t], rtol=1e-13, atol=1e-15)
        return sq.invariant_S(sol.rho[-1])
    S0 = sq.invariant_S(rho0)
    h = 0.05
    f = [(S_at(2 * x) - 2 * S_at(x) + S0) / x ** 2 for x in (h, h / 2, h / 4)]
    # f(x) = S'' + a x + b x^2 + O(x^3): the combination removes a and b
    estimate = (8 * f[2] - 6 * f[1] + f[0]) / 3
    assert np.allclose(estimate, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())
    assert not np.allclose(f[0], exact, rtol=1e-4)     # the extrapolation is needed


def test_counterexample_latex_and_verdict_summary():
    v = sinv.conservation_verdict(changed(lr_readout=0.1))
    assert v.summary().startswith("not conserved: d2S/dt2")
    tex = v.latex()
    assert r"S^{(2)}(0)" in tex and r"\neq0" in tex and "a(0)" in tex


def test_cli_invariants_changed_model(capsys):
    from symquad.cli import main
    assert main(["invariants", "--p", "2", "--p-star", "2", "--readout", "2/3,1/3"]) == 0
    out = capsys.readouterr().out
    assert r"\paragraph{$S$ is not conserved.}" in out and r"\dim Z_T" not in out
    assert main(["invariants", "--p", "2", "--p-star", "1", "--weight-decay", "0.1",
                 "--only", "conservation"]) == 0
    assert r"\paragraph{Theorem.}" in capsys.readouterr().out


# --------------------------------------------------------------------------- survival table
def test_survival_rows_are_computed():
    from symquad.survival import survival_table
    table = survival_table(models=[("classic", sq.Model(p=2, p_star=1, lr=0.1)),
                                   ("trained", sq.Model(p=2, p_star=1, lr=0.1,
                                                        lr_readout=0.1))],
                           N_escape=10_000, n_samples=4)
    classic, trained = (row[2] for row in table.rows)
    assert all(cell.status == "yes" for cell in classic.values()), classic
    assert trained["plateau"].status == "no" and "dQ_kk" in trained["plateau"].text
    assert trained["escape"].status == "not derived"
    assert trained["manifold"].text.startswith("dim 3")     # 2*1 - 1 + 2 readout weights
    assert trained["hessian"].status == "not derived"
    text = str(table)
    assert "| classic |" in text and "[1]" in text


@pytest.mark.slow
def test_survival_command_output_is_in_the_user_guide_and_model_md(capsys):
    """docs/user-guide.md's and docs/model.md's tables are what `symquad survival` prints."""
    from pathlib import Path

    from symquad.cli import main
    assert main(["survival"]) == 0
    out = capsys.readouterr().out
    root = Path(__file__).resolve().parents[1]
    for name in ("docs/user-guide.md", "docs/model.md"):
        assert out.strip() in (root / name).read_text(encoding="utf-8"), name

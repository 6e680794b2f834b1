"""The O(1/N) correction of the mean (symquad.symbolic.second_order, fluctuations(...).risk_mean).

Each source of ``f₁`` (``E[N ΔX] = f + f₁/N + O(N⁻²)``) is checked on its own against a
Monte Carlo of the exact N-dimensional step (tests/second_order_mc.py, numpy only, with a
control variate whose mean is the drift); the drift's second derivatives against central
differences of the generated drift; the modified-equation term on a deterministic map; the
whole correction against the exact reduced simulator (N·(mean − ODE) of the replicas).
Statistical checks assert their precision first.
"""

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import symquad as sq
from symquad.numeric.fluctuations import mean_correction_rhs
from second_order_mc import mean_and_se, one_step_sources

Z = 4.0          # |MC − theory| / se allowed (per entry; a handful of entries per check)


def _state(model):
    Q = np.array([[1.0, 0.2], [0.2, 0.8]])
    if model.constraint == "sphere":
        Q = np.array([[1.0, 0.2], [0.2, 1.0]])
    return Q, np.array([[0.5], [0.3]]), np.eye(1)


def _theory(model, a=None):
    Q, rho, T = _state(model)
    k = sq.kernels(model)
    f1, _ = k.second_order(Q, rho, T, a)
    return f1


def _mc(model, N, n, seed=0, a=None):
    Q, rho, T = _state(model)
    return one_step_sources(model, Q, rho, T, N, n, np.random.default_rng(seed), a=a)


def _agree(mc, se, theory, precision):
    """Precision first (se below `precision` × the largest |theory|), then |mc − th| < Z se."""
    scale = np.max(np.abs(theory))
    assert scale > 0
    assert np.max(se) < precision * scale, f"MC too imprecise: se {np.max(se):.3g} vs {scale:.3g}"
    z = np.abs(mc - theory) / np.maximum(se, 1e-12 * scale)
    assert np.max(z) < Z, f"MC {mc} vs theory {theory} (se {se})"


BASE = dict(p=2, p_star=1, lr=0.5, noise=0.2)


# Without the sphere every source is exact at any N (Stein's identities in R^N and the
# polynomial map), so the one-step checks run at a small N; the sphere's expansion has an
# O(1/N) remainder and runs at N = 400.


def test_norm_source_alone():
    """|x|²/N and its correlation with the fields: E[F r] = E[F] + E[Σ Ω_kl ∂_k∂_l F]/N."""
    m = sq.Model(**BASE)
    th = _theory(m)
    parts = _mc(m, N=20, n=100_000)
    mc, se = mean_and_se(parts["norm"])
    _agree(mc, se, th, 0.06)
    # and nothing else contributes at batch 1 without weight decay
    mc_rest, se_rest = mean_and_se(parts["decay"])
    assert np.all(np.abs(mc_rest) < 1e-6 + Z * se_rest)
    assert np.all(th[3:] == 0)          # ρ has no 1/N term without a constraint


def test_batch_cross_source_alone():
    """x^μ·x^ν/N (μ ≠ ν): E[F^μ G^ν r_×] = Σ E[∂_k F] Ω_kl E[∂_l G]/N."""
    b = 3
    m = sq.Model(**BASE, batch_size=b)
    th_cross = _theory(m) - _theory(sq.Model(**BASE)) / b      # the norm term is (η²/b)E[𝓛 gg]
    parts = _mc(m, N=20, n=200_000)
    mc, se = mean_and_se(parts["cross"])
    _agree(mc, se, th_cross, 0.06)
    mc_n, se_n = mean_and_se(parts["norm"])
    _agree(mc_n, se_n, _theory(sq.Model(**BASE)) / b, 0.1)


def test_weight_decay_source_alone():
    """(1 − ηλ/N)² and its cross term with the gradient."""
    m = sq.Model(**BASE, weight_decay=2.0)
    th = _theory(m) - _theory(sq.Model(**BASE))
    parts = _mc(m, N=20, n=20_000)
    mc, se = mean_and_se(parts["decay"])
    _agree(mc[:3], se[:3], th[:3], 0.05)
    assert np.all(np.abs(th[3:]) == 0)


def test_sphere_source():
    """The exact renormalisation √N w/|w| to second order (batch 2, weight decay too)."""
    m = sq.Model(2, 1, 0.3, noise=0.2, constraint="sphere", batch_size=2, weight_decay=0.5)
    th = _theory(m)
    assert th[0] == 0 and th[2] == 0                   # the norm is exact: no 1/N term
    # measured: N(E[NΔX] − f) of Q_12, ρ_11, ρ_21 = (−0.21, −0.278, −0.198) ± (0.02, 0.009,
    # 0.008) at N = 100 against f₁ = (−0.267, −0.286, −0.206): the O(1/N) remainder shows
    # at N = 100 in Q_12, hence N = 200 here
    parts = _mc(m, N=200, n=80_000)
    mc, se = mean_and_se(parts["total"])
    assert np.max(np.abs(mc[[0, 2]])) < 1e-9
    _agree(mc[[1, 3, 4]], se[[1, 3, 4]], th[[1, 3, 4]], 0.3)


def test_trained_readout_has_no_source():
    """a' = a − (η_a/N) Mean h is linear in 1/N: f₁ of a is 0 (and a enters g, h as state)."""
    m = sq.Model(**BASE, lr_readout=0.7)
    a = np.array([0.6, 0.3])
    th = _theory(m, a)
    assert np.all(th[5:] == 0)
    parts = _mc(m, N=20, n=60_000, a=a)
    mc, se = mean_and_se(parts["total"])
    assert np.max(np.abs(mc[5:])) < 1e-8
    _agree(mc[:5], se[:5], th[:5], 0.06)


@pytest.mark.parametrize("kw", [dict(), dict(constraint="sphere", batch_size=2),
                                dict(lr_readout=0.3, weight_decay=0.1)])
def test_drift_hessian_against_differences(kw):
    """∂²f/∂X∂X (exact, entry route) against central second differences of the drift."""
    m = sq.Model(2, 1, 0.4, noise=0.1, **kw)
    k = sq.kernels(m)
    lay = k.layout
    Q, rho, T = _state(m)
    a = np.array([0.6, 0.3]) if m.readout_trained else None
    x = lay.pack(Q, rho, a)
    _, H = k.second_order(Q, rho, T, a)

    def f(y):
        return lay.pack(*k.rhs(*lay.unpack(y)[:2], T, *([lay.unpack(y)[2]] if a is not None
                                                         else [])))
    h = 1e-3
    E = np.eye(lay.dim)
    for J in range(lay.dim):
        for K in range(lay.dim):
            fd = (f(x + h * E[J] + h * E[K]) - f(x + h * E[J] - h * E[K])
                  - f(x - h * E[J] + h * E[K]) + f(x - h * E[J] - h * E[K])) / (4 * h * h)
            assert np.allclose(H[:, J, K], fd, rtol=1e-4, atol=1e-5), (J, K)


def test_modified_equation_on_a_deterministic_map():
    """x' = x + h f(x), h = 1/N, is the ODE plus c/N with dc/dt = J c − ½ J f (c(0) = 0)."""
    def f(x):
        return np.array([-x[0] ** 2 + 0.5 * x[1], -x[1] * x[0]])

    def J(x):
        return np.array([[-2 * x[0], 0.5], [-x[1], -x[0]]])
    x0, t1 = np.array([1.0, 0.8]), 2.0

    def rhs(_, y):
        x, c = y[:2], y[2:]
        zero = np.zeros((2, 2, 2))
        return np.concatenate([f(x), mean_correction_rhs(J(x), f(x), np.zeros(2), zero,
                                                         np.zeros((2, 2)), c)])
    sol = solve_ivp(rhs, (0, t1), np.concatenate([x0, np.zeros(2)]), rtol=1e-11, atol=1e-12)
    x_ode, c = sol.y[:2, -1], sol.y[2:, -1]
    residual = []
    for N in (100, 400, 1600):
        x = x0.copy()
        for _ in range(int(t1 * N)):
            x = x + f(x) / N
        residual.append(np.max(np.abs(N * (x - x_ode) - c)))
    assert np.max(np.abs(c)) > 0.05
    # the residual of N·(map − ODE) − c is O(1/N): it falls by ~4 per factor 4 in N
    assert residual[1] < residual[0] / 3 and residual[2] < residual[1] / 3
    assert residual[2] < 0.01 * np.max(np.abs(c))


def test_random_start_has_mean_x0():
    """c(0) = N(E[X(0)] − x(0)) = 0 for the random start: its mean is x(0) exactly."""
    m = sq.Model(2, 1, 0.1)
    run = sq.simulate(m, N=20, t_max=0.05, replicas=20000, seed=3, t_eval=[0.0])
    X = sq.numeric.layout.state_layout(m).pack(run.Q[:, 0], run.rho[:, 0])
    mean, se = X.mean(0), X.std(0) / np.sqrt(len(X))
    x0 = np.array([1.0, 0.0, 1.0, 0.0, 0.0])
    assert np.max(se) < 0.01
    assert np.max(np.abs(mean - x0) / se) < Z
    fl = sq.fluctuations(m, None, None, np.eye(1), 20, [0.0, 0.5], start="random")
    assert np.all(fl.mean_correction[0] == 0)


def test_api_and_refusals():
    m = sq.Model(2, 1, 0.3, noise=0.1, lr_readout=0.2)
    fl = sq.fluctuations(m, np.eye(2), np.array([[0.5], [0.2]]), np.eye(1), 500, [0, 1, 2])
    assert fl.risk_mean.shape == (3,) and fl.mean_correction.shape == (3, fl.layout.dim)
    assert np.allclose(fl.risk_mean, fl.risk + fl.risk_mean_correction / 500)
    assert np.allclose(fl.Q_mean, fl.Q + fl.layout.unpack(fl.mean_correction)[0] / 500)
    assert fl.readout_mean.shape == (3, 2) and fl.expansion_valid.all()
    assert np.allclose(fl.at(1000).risk_mean, fl.risk + fl.risk_mean_correction / 1000)
    assert len(repr(fl)) < 400
    # the start alone (an empty interval for the solver): Σ(0) = 0 and c(0) = 0
    start = sq.fluctuations(m, np.eye(2), np.array([[0.5], [0.2]]), np.eye(1), 500, [0.0])
    assert start.risk_mean[0] == start.risk[0] and start.risk_std[0] == 0
    off = sq.fluctuations(m, np.eye(2), np.array([[0.5], [0.2]]), np.eye(1), 500, [0, 1],
                          second_order=False)
    with pytest.raises(ValueError, match="second_order"):
        off.risk_mean
    # erf: the O(1/N) mean comes from the drift kernels (computed by default); the symbolic
    # entry route refuses it by name
    erf = sq.Model(2, 1, 0.3, activation="erf")
    with pytest.raises(ValueError, match="polynomial activations.*erf"):
        sq.fluctuations(erf, np.eye(2), np.zeros((2, 1)), np.eye(1), 500, [0, 1],
                        second_order=True, form="entries")
    lna = sq.fluctuations(erf, np.eye(2), 0.1 * np.ones((2, 1)), np.eye(1), 500, [0, 1])
    assert np.all(np.isfinite(lna.risk_mean)) and lna.second_order_note == ""
    # the cost law is checked before any work
    with pytest.raises(ValueError, match="per right-hand side"):
        sq.fluctuations(sq.Model(48, 2, 0.1, activation="erf"), np.eye(48),
                        np.zeros((48, 2)), np.eye(2), 500, [0, 1], second_order=True)
    with pytest.raises(ValueError, match="expansion_tol"):
        sq.fluctuations(m, np.eye(2), np.zeros((2, 1)), np.eye(1), 500, [0, 1],
                        expansion_tol=2.0)


def test_expansion_flagged_on_a_plateau_escape():
    """A random start on the plateau: Σ grows like e^{2κt}, the flag turns False (values finite)."""
    m = sq.Model(2, 1, 0.2)
    fl = sq.fluctuations(m, None, None, np.eye(1), 100, np.linspace(0, 20, 11), start="random")
    valid = fl.expansion_valid
    assert valid[0] and not valid[-1]
    assert np.all(np.isfinite(fl.risk_mean_correction))
    # once flagged, later times stay flagged
    assert np.all(np.diff(valid.astype(int)) <= 0)


def test_sources_for_a_cubic_student():
    """Generality: σ = z³ − 3z, σ* = z², batch 2 and weight decay, each source on its own.

    The norm term's samples are heavy-tailed here (g² ~ z¹⁰), so the state is scaled
    down (fields of variance ≤ 0.3) and that source gets more samples.
    """
    kw = dict(p=2, p_star=1, lr=0.3, noise=0.2, activation="z**3 - 3*z",
              teacher_activation="z**2")
    Q = 0.3 * np.array([[1.0, 0.2], [0.2, 0.8]])
    rho, T = 0.3 * np.array([[0.5], [0.3]]), np.eye(1)

    def f1(**extra):
        return sq.kernels(sq.Model(**kw, **extra)).second_order(Q, rho, T)[0]
    m = sq.Model(**kw, batch_size=2, weight_decay=0.5)
    parts = one_step_sources(m, Q, rho, T, 20, 150_000, np.random.default_rng(5))
    theory = {"norm": f1() / 2, "cross": f1(batch_size=2) - f1() / 2,
              "decay": f1(weight_decay=0.5) - f1()}
    assert np.allclose(f1(batch_size=2, weight_decay=0.5),
                       theory["norm"] + theory["cross"] + theory["decay"])
    for name, precision in (("norm", 0.06), ("cross", 0.3), ("decay", 0.06)):
        mc, se = mean_and_se(parts[name])
        _agree(mc[:3], se[:3], theory[name][:3], precision)


def _scheduled_map_residuals(sched, Ns, with_shift=True):
    """``max |N(x_map − x_ODE) − c|`` of the map ``x' = x + f(x, η(k/N))/N`` (step k at
    ``t = k/N``) against the ODE with ``dc/dt = Jc − ½(Jf + ∂f/∂t)`` and, at a jump of η,
    ``c += δ_N (f(x, η₋) − f(x, η₊))`` (``δ_N``: fluctuations.step_phase)."""
    from symquad.numeric.fluctuations import step_phase
    from symquad.schedule import parse_schedule
    s = parse_schedule(sched)
    eta0, t1 = 0.8, 2.0

    def f(x, eta):                      # quadratic in eta, like the drift
        return eta * np.array([-x[0] ** 2 + 0.5 * x[1], -x[1] * x[0]]) + \
            eta ** 2 * np.array([0.3 * x[1], 0.1 * x[0] ** 2])

    def J(x, eta):
        return eta * np.array([[-2 * x[0], 0.5], [-x[1], -x[0]]]) + \
            eta ** 2 * np.array([[0.0, 0.3], [0.2 * x[0], 0.0]])

    def f_eta(x, eta):
        return 0.5 * (f(x, eta + 1) - f(x, eta - 1))
    x0 = np.array([1.0, 0.8])
    out = []
    for N in Ns:
        def rhs(t, y):
            x, c = y[:2], y[2:]
            eta = eta0 * s.factor(t)
            zero = np.zeros((2, 2, 2))
            dc = mean_correction_rhs(J(x, eta), f(x, eta), np.zeros(2), zero, np.zeros((2, 2)),
                                     c) - 0.5 * f_eta(x, eta) * eta0 * s.rate(t)
            return np.concatenate([f(x, eta), dc])
        y, t0 = np.concatenate([x0, np.zeros(2)]), 0.0
        for b in list(s.breakpoints(0.0, t1)) + [t1]:
            below = b - 1e-13
            sol = solve_ivp(lambda t, y: rhs(min(t, below), y), (t0, b), y, rtol=1e-12,
                            atol=1e-13)
            y = sol.y[:, -1].copy()
            for tj, before, after in s.jumps(b - 1e-9, b + 1e-9):
                if with_shift:
                    y[2:] += step_phase(tj, N) * (f(y[:2], eta0 * before)
                                                  - f(y[:2], eta0 * after))
            t0 = b
        x = x0.copy()
        for k in range(int(round(t1 * N))):
            x = x + f(x, eta0 * s.factor(k / N)) / N
        out.append(np.max(np.abs(N * (x - y[:2]) - y[2:])))
    return out, np.max(np.abs(y[2:]))


@pytest.mark.parametrize("sched", ["inverse:0.7", "table:0=1:1=0.3", "step:0.8337=0.4"])
def test_modified_equation_with_a_schedule(sched):
    """Step k uses η(k/N): the map is the ODE plus c/N with −½(Jf + ∂f/∂t), and a step of η
    shifts c by δ_N (f₋ − f₊); the residual falls like 1/N (δ_N = 0.63, 0.48, 0.08 here)."""
    residual, scale = _scheduled_map_residuals(sched, (100, 400, 1600))
    assert scale > 0.05
    assert residual[1] < residual[0] / 3 and residual[2] < residual[1] / 3, residual
    assert residual[2] < 0.01 * scale
    if sched.startswith("step"):
        # power: without the shift the residual does not fall
        wrong, _ = _scheduled_map_residuals(sched, (100, 400, 1600), with_shift=False)
        assert wrong[2] > 10 * residual[2] and wrong[0] > 3 * residual[0]
    if sched.startswith("inverse"):
        from symquad.schedule import parse_schedule
        s, h = parse_schedule(sched), 1e-6
        assert abs(s.rate(0.5) - (s.factor(0.5 + h) - s.factor(0.5 - h)) / (2 * h)) < 1e-8

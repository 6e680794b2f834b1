"""Tests of the SGD simulators (symquad.numeric.simulate): inputs, seeds, initial
conditions, population risk, divergence, singular Gram matrices, and the one-step
drift against the ODE kernels (a second route to both)."""

import math

import numpy as np
import pytest

import symquad as sq
from symquad.numeric.errors import DivergenceError
from symquad.numeric.simulate import population_risk, simulate

M = sq.Model(p=3, p_star=2, lr=0.2)


# ---------------------------------------------------------------------------
# input validation
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(N=0), "N must be an integer >= 1"),
    (dict(N=10.5), "N must be an integer >= 1"),
    (dict(replicas=0), "replicas must be an integer >= 1"),
    (dict(t_max=-1.0), r"t_max must be a finite number > 0"),
    (dict(t_max=float("nan")), r"t_max must be a finite number > 0"),
    (dict(method="exact"), "method must be one of"),
    (dict(seed=-3), "seed must be an integer >= 0"),
    (dict(Q0=np.eye(3)), "Q0 and rho0 must be given together"),
    (dict(Q0=np.eye(2), rho0=np.zeros((3, 2))), r"Q0 must have shape \(p, p\)"),
    (dict(Q0=np.eye(3), rho0=np.zeros((2, 3))), r"rho0 must have shape \(p, p_star\)"),
    (dict(Q0=-np.eye(3), rho0=np.zeros((3, 2))), "positive semi-definite"),
    (dict(Q0=np.eye(3), rho0=2 * np.eye(3, 2)), "positive semi-definite"),
    (dict(T=np.diag([1.0, -1.0])), "T must be positive semi-definite"),
    (dict(T=np.eye(3)), r"T must have shape \(p_star, p_star\)"),
    (dict(t_eval=[0.0, 5.0], t_max=1.0), r"t_eval must lie in \[0, t_max\]"),
    (dict(t_eval=[0.5, 0.2]), "t_eval must be strictly increasing"),
])
@pytest.mark.parametrize("method", ["reduced", "full"])
def test_bad_input_names_parameter(kwargs, match, method):
    args = dict(N=20, t_max=1.0, replicas=2, seed=0, method=method)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):  # N=10.5: TypeError
        simulate(M, **args)


def test_model_type_checked():
    with pytest.raises(TypeError, match="model must be a symquad.Model"):
        simulate("model", N=10)


# ---------------------------------------------------------------------------
# reproducibility and output layout
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["reduced", "full"])
def test_same_seed_same_numbers(method):
    m = M.replace(noise=0.1)
    a = simulate(m, N=30, t_max=2.0, replicas=5, seed=7, method=method)
    b = simulate(m, N=30, t_max=2.0, replicas=5, seed=7, method=method)
    c = simulate(m, N=30, t_max=2.0, replicas=5, seed=8, method=method)
    np.testing.assert_array_equal(a.Q, b.Q)
    np.testing.assert_array_equal(a.rho, b.rho)
    np.testing.assert_array_equal(a.risk, b.risk)
    assert not np.allclose(a.Q[:, -1], c.Q[:, -1])
    n = 61  # 60 steps: every step recorded (default: up to 101 records)
    assert a.t.shape == (n,) and a.Q.shape == (5, n, 3, 3)
    assert a.rho.shape == (5, n, 3, 2) and a.risk.shape == (5, n)
    assert list(a.status) == ["ok"] * 5 and np.all(np.isnan(a.t_diverged))


def test_t_eval_rounded_to_steps():
    run = simulate(M, N=10, t_max=1.0, replicas=1, seed=0, t_eval=[0.0, 0.33, 1.0])
    np.testing.assert_allclose(run.t, [0.0, 0.3, 1.0])


# ---------------------------------------------------------------------------
# initial conditions
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["reduced", "full"])
def test_given_overlaps_are_realised_exactly(method):
    Q0 = np.array([[1.0, 0.2, 0.0], [0.2, 0.8, 0.1], [0.0, 0.1, 0.5]])
    rho0 = np.array([[0.3, 0.1], [0.0, 0.4], [0.2, -0.1]])
    T = np.array([[1.0, 0.3], [0.3, 0.7]])
    run = simulate(M, N=25, t_max=1.0, replicas=3, seed=1, method=method, Q0=Q0, rho0=rho0,
                   T=T, t_eval=[0.0, 1.0])
    np.testing.assert_allclose(run.Q[:, 0], np.broadcast_to(Q0, (3, 3, 3)), atol=1e-12)
    np.testing.assert_allclose(run.rho[:, 0], np.broadcast_to(rho0, (3, 3, 2)), atol=1e-12)
    np.testing.assert_array_equal(run.T, T)


def test_full_teacher_is_orthonormal_times_sqrtN():
    from symquad.numeric import simulate as sim
    ss = np.random.SeedSequence(0).spawn(4)
    rngs = [np.random.default_rng(s) for s in ss]
    X0, T = sim._initial_coordinates(M, 40, 2, None, None, None, rngs[1])
    st = sim._FullStepper(M, 40, 2, X0, rngs[0], rngs[1], rngs[2], rngs[3], random_student=True)
    np.testing.assert_allclose(st.Ws @ st.Ws.T / 40, np.eye(2), atol=1e-12)


@pytest.mark.parametrize("method", ["reduced", "full"])
def test_random_init_law(method):
    """Q(0) = WWᵀ/N with w ~ N(0, I): E Q_kk = 1, Var Q_kk = 2/N; ρ_kl ~ N(0, 1/N)."""
    N, R = 40, 3000 if method == "reduced" else 1500
    run = simulate(M, N=N, t_max=0.1, replicas=R, seed=3, method=method, t_eval=[0.0])
    q = run.Q[:, 0, 0, 0]
    se = q.std() / math.sqrt(R)
    assert se < 0.01
    assert abs(q.mean() - 1.0) < 4 * se
    assert abs(q.var() / (2 / N) - 1) < 4 * math.sqrt(2 / R) * 3  # chi2 var of var is larger
    r = run.rho[:, 0].ravel() * math.sqrt(N)
    se_r = r.std() / math.sqrt(r.size)
    assert abs(r.mean()) < 4 * se_r
    assert abs((r ** 2).mean() - 1) < 4 * (r ** 2).std() / math.sqrt(r.size)
    np.testing.assert_allclose(run.T, np.eye(2))


# ---------------------------------------------------------------------------
# population risk: Isserlis formula vs Monte Carlo
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("activation", [(0, 0, 1), (0.5, 1, -0.5, 1.0 / 3)])
def test_population_risk_matches_monte_carlo(activation):
    rng = np.random.default_rng(11)
    p, ps = 3, 2
    A = rng.standard_normal((p + ps, p + ps)) / 2
    C = A @ A.T
    Q, rho, T = C[:p, :p], C[:p, p:], C[p:, p:]
    n = 400_000
    z = rng.multivariate_normal(np.zeros(p + ps), C, size=n)
    poly = np.polynomial.polynomial.polyval
    err = poly(z[:, :p], activation).mean(1) - poly(z[:, p:], activation).mean(1)
    samples = 0.5 * err ** 2
    se = samples.std() / math.sqrt(n)
    mc = samples.mean()
    assert se < 0.02 * mc
    assert abs(population_risk(activation, Q, rho, T) - mc) < 4 * se


def test_population_risk_batched_and_zero_at_teacher():
    T = np.array([[1.0, 0.2], [0.2, 0.5]])
    # student = teacher (p = p*): zero risk
    assert abs(population_risk((0, 0, 1), T, T, T)) < 1e-14
    Q = np.stack([np.eye(2), 2 * np.eye(2)])
    rho = np.zeros((2, 2, 2))
    out = population_risk((0, 0, 1), Q, rho, T)
    assert out.shape == (2,)
    np.testing.assert_allclose(out[1], population_risk((0, 0, 1), Q[1], rho[1], T))


@pytest.mark.parametrize("m", [sq.Model(p=3, p_star=2, lr=0.1, activation="z**3 - 3*z"),
                               sq.Model(p=2, p_star=1, lr=0.1, lr_readout=0.1),
                               sq.Model(p=2, p_star=2, lr=0.1, activation="erf",
                                        teacher_activation="relu")],
                         ids=["cubic", "trained readout", "erf-relu"])
def test_population_risk_in_pieces_equals_whole_and_one_by_one(m, monkeypatch):
    """Pieces of rows (a shared T and a per-state readout broadcast into each) give the
    numbers of one evaluation of the whole batch, bit for bit, and of each state alone."""
    from symquad.numeric import simulation_run
    rng = np.random.default_rng(5)
    p, k = m.p, m.p_star
    W = rng.standard_normal((7, 3, p + k, 12)) / np.sqrt(12)
    C = W @ np.swapaxes(W, -1, -2)
    Q, rho, T = C[..., :p, :p], C[..., :p, p:], np.eye(k)
    a = rng.standard_normal((7, 3, p)) if m.readout_trained else None
    monkeypatch.setattr(simulation_run, "RISK_PIECE_STATES", 10**9)
    whole = population_risk(m, Q, rho, T, a)
    for states in (7, 2):                          # pieces of 2 rows (7 = 2+2+2+1), of 1 row
        monkeypatch.setattr(simulation_run, "RISK_PIECE_STATES", states)
        np.testing.assert_array_equal(population_risk(m, Q, rho, T, a), whole)
    one = [[population_risk(m, Q[i, j], rho[i, j], T, None if a is None else a[i, j])
            for j in range(3)] for i in range(7)]
    np.testing.assert_allclose(whole, one, rtol=1e-13, atol=0)
    assert np.ptp(whole) > 1e-3 * np.abs(whole).max()   # the states differ


def test_recorded_risk_is_the_population_risk_of_the_weights():
    """Monte Carlo over fresh inputs at the final weights of a full run."""
    m = sq.Model(p=2, p_star=2, lr=0.3)
    run = simulate(m, N=200, t_max=3.0, replicas=1, seed=5, method="full", t_eval=[3.0])
    Q, rho = run.Q[0, -1], run.rho[0, -1]
    C = np.block([[Q, rho], [rho.T, run.T]])
    rng = np.random.default_rng(2)
    z = rng.multivariate_normal(np.zeros(4), C, size=400_000)
    samples = 0.5 * ((z[:, :2] ** 2).mean(1) - (z[:, 2:] ** 2).mean(1)) ** 2
    se = samples.std() / math.sqrt(samples.size)
    assert se < 0.02 * samples.mean()
    assert abs(run.risk[0, -1] - samples.mean()) < 4 * se


# ---------------------------------------------------------------------------
# divergence
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["reduced", "full"])
def test_divergence_raises_with_time_and_last_finite_state(method):
    m = sq.Model(p=2, p_star=1, lr=20.0)
    with pytest.raises(DivergenceError) as info:
        simulate(m, N=50, t_max=10.0, replicas=4, seed=0, method=method)
    err = info.value
    assert 0 < err.t <= 10.0
    assert np.all(np.isfinite(err.last_finite["Q"]))
    assert err.last_finite["t"] <= err.t
    assert "diverged" in str(err)
    run = err.partial
    assert run.n_diverged >= 1


def test_divergence_stop_marks_replicas_and_never_hides_nan():
    m = sq.Model(p=2, p_star=1, lr=20.0)
    run = simulate(m, N=50, t_max=10.0, replicas=4, seed=0, on_divergence="stop")
    assert run.n_diverged == 4
    for r in range(4):
        after = run.t > run.t_diverged[r]
        assert np.all(np.isnan(run.risk[r, after]))
        before = run.t < run.last_finite["t"][r]
        assert np.all(np.isfinite(run.risk[r, before]))
    assert "DIVERGED" in run.summary()


# ---------------------------------------------------------------------------
# singular Gram matrices
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["reduced", "full"])
def test_zero_weights_are_a_fixed_point_of_quadratic_sgd(method):
    run = simulate(M, N=30, t_max=2.0, replicas=3, seed=0, method=method,
                   Q0=np.zeros((3, 3)), rho0=np.zeros((3, 2)))
    assert np.all(run.Q == 0) and np.all(run.rho == 0)
    np.testing.assert_allclose(run.risk, population_risk(M.activation, np.zeros((3, 3)),
                                                         np.zeros((3, 2)), np.eye(2)))


@pytest.mark.parametrize("method", ["reduced", "full"])
def test_overparameterised_solution_is_kept_without_noise(method):
    """p = 2, p* = 1, w_1 = w_2 = w*: rank-one Gram matrix, zero risk, zero gradient."""
    m = sq.Model(p=2, p_star=1, lr=0.3)
    run = simulate(m, N=30, t_max=2.0, replicas=3, seed=0, method=method,
                   Q0=np.ones((2, 2)), rho0=np.ones((2, 1)), T=np.ones((1, 1)))
    # the full simulator builds the weights in a random orthonormal frame, so the
    # Gram matrix (and the risk) carry round-off of a few ulps
    assert np.max(np.abs(run.risk)) < 1e-12
    np.testing.assert_allclose(run.Q[:, -1], np.ones((3, 2, 2)), atol=1e-12)


def test_reduced_cost_does_not_grow_with_N(monkeypatch):
    """Same number of steps at N = 1e3 and N = 1e6: the same work, counted, not timed.

    The compiled step loops over the arrays it is handed (the state ``B, E, F_T`` and
    the step's random numbers), so equal shapes at both N mean equal work per step;
    N enters only as a number (the chi-square's degrees of freedom).
    """
    from symquad.numeric import simulate as S
    work = {}
    real_draw, real_advance = S._ReducedStepper.draw, S._ReducedStepper.advance

    def draw(self, n):
        out = real_draw(self, n)
        work[self.N]["draws"].append(tuple(np.shape(a) for a in out))
        return out

    def advance(self, n):
        work[self.N]["steps"] += n
        work[self.N]["state"] = (self.B.shape, self.E.shape, self.F_T.shape)
        return real_advance(self, n)
    monkeypatch.setattr(S._ReducedStepper, "draw", draw)
    monkeypatch.setattr(S._ReducedStepper, "advance", advance)
    for N in (10**3, 10**6):
        work[N] = {"draws": [], "steps": 0}
        simulate(M, N=N, t_max=2000 / N, replicas=8, seed=0, t_eval=[0.0])
    small, large = work[10**3], work[10**6]
    assert small["steps"] == large["steps"] == 2000
    assert small["draws"] and small["draws"] == large["draws"]
    assert small["state"] == large["state"] == ((8, 3, 2), (8, 3, 3), (2, 2))


# ---------------------------------------------------------------------------
# one-step drift = ODE right-hand side (second route to the generated kernels)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("method, N, R", [("reduced", 10**6, 20000), ("full", 400, 4000)])
def test_one_step_drift_matches_ode_rhs(method, N, R):
    """E[N (Q(1/N) − Q(0))] = dQ/dt + O(1/N), likewise for ρ; the O(η²) term included."""
    m = sq.Model(p=3, p_star=2, lr=0.8, noise=0.3)
    Q0 = np.array([[1.0, 0.2, 0.1], [0.2, 0.9, -0.1], [0.1, -0.1, 0.6]])
    rho0 = np.array([[0.5, 0.1], [0.2, -0.3], [0.1, 0.2]])
    T = np.array([[1.0, 0.2], [0.2, 0.8]])
    run = simulate(m, N=N, t_max=1.0 / N, replicas=R, seed=4, method=method, Q0=Q0,
                   rho0=rho0, T=T)
    dQ, drho = sq.kernels(m).rhs(Q0, rho0, T)
    for name, inc, theory in (("Q", N * (run.Q[:, -1] - Q0), dQ),
                              ("rho", N * (run.rho[:, -1] - rho0), drho)):
        mean = inc.mean(0)
        se = inc.std(0) / math.sqrt(R)
        assert np.all(se < 0.05), f"{name}: standard error too large: {se.max():.3g}"
        z = np.abs(mean - theory) / se
        assert np.all(z < 4.5), f"{name}: drift off by {z.max():.2f} standard errors"
    # the test can see the O(η²) term: dropping it moves dQ by many standard errors
    k = sq.kernels(m.replace(lr=1e-9))
    dQ_first = k.rhs(Q0, rho0, T)[0] * (m.eta / 1e-9)
    inc = N * (run.Q[:, -1] - Q0)
    se = inc.std(0) / math.sqrt(R)
    assert np.max(np.abs(inc.mean(0) - dQ_first) / se) > 6


def test_population_risk_agrees_with_generated_kernels():
    """Isserlis route vs the SymPy-generated risk kernel, batched random overlaps."""
    rng = np.random.default_rng(9)
    for m in (sq.Model(p=4, p_star=2, lr=0.1), sq.Model(p=2, p_star=1, lr=0.1,
                                                       activation=(0, 1, 1))):
        p, ps = m.p, m.p_star
        A = rng.standard_normal((5, p + ps, p + ps))
        C = A @ np.swapaxes(A, 1, 2) / (p + ps)
        Q, rho, T = C[:, :p, :p], C[:, :p, p:], C[0, p:, p:]
        rho_T = rho  # T shared: use the first T for all
        ours = population_risk(m.activation, Q, rho_T, T)
        theirs = sq.kernels(m).risk(Q, rho_T, T)
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_reduced_roundoff_does_not_accumulate():
    """After many re-compressions the teacher block of C = X Xᵀ is still T and C is PSD."""
    from symquad.numeric import simulate as sim
    m = sq.Model(p=3, p_star=2, lr=0.2, noise=0.1)
    T = np.array([[1.0, 0.3], [0.3, 0.5]])
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(1).spawn(5)]
    X0, T = sim._initial_coordinates(m, 1000, 4, None, None, T, rngs[1])
    st = sim._ReducedStepper(m, 1000, 4, X0, rngs[2], rngs[3], rngs[4])
    st.advance(8000)                         # 8000 rotations back to p + p* columns
    C = np.einsum("rac,rbc->rab", st.X, st.X)
    np.testing.assert_allclose(C[:, 3:, 3:], np.broadcast_to(T, (4, 2, 2)), atol=1e-12)
    assert np.all(np.linalg.eigvalsh(C) > -1e-12)


def test_benchmark_script_runs(capsys):
    """Smoke test of benchmarks/bench_simulators.py (tiny sizes)."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_simulators.py"
    spec = importlib.util.spec_from_file_location("bench_simulators", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--N", "100", "--replicas", "1", "4", "--min-time", "0.01", "--rounds", "1"])
    assert len(rows) == 2 and all(r[3] > 0 and r[2] > 0 for r in rows)
    out = capsys.readouterr().out
    assert "cost/floor" in out and "red/full" in out

r"""erf(z/√2) and ReLU in the simulators: the law of N-dimensional SGD (issue 17, phase 2).

* **One N-dimensional step against the kernels** (the pattern of
  tests/test_model_fields_one_step.py, whose exact finite-N expansion of the step
  this file reuses): weights with a prescribed Gram matrix at N = 4000, many
  independent steps with fresh inputs, the mean increments ``N ΔQ``, ``N Δρ``,
  ``N Δa`` against ``sq.kernels(model).rhs`` for erf, ReLU and mixed pairs with
  every field of the specification, within a Bonferroni bound of standard errors
  (asserted small first, and the finite-N bias measured below a fraction of them);
  power: the kernels of a wrong variant are rejected.  The gradients are written
  here from the definitions (σ = erf(z/√2), σ' = √(2/π) e^{−z²/2}; ReLU, 1{z > 0}).
* **One compiled step = the literal step**: the reduced simulator's step with its
  drawn numbers rebuilt as N-dimensional inputs, and the full simulator's step,
  against the literal update of the definitions, to round-off.
* **Reduced vs full**: two-sample Kolmogorov–Smirnov tests of the two simulators'
  laws at three times (the statistics of tests/test_model_fields_simulators.py),
  with power against a wrong model.
* The recorded risk (typed closed forms, ``population_risk``) equals the kernels' risk
  (the generated closed forms): two routes.
"""

from fractions import Fraction
import math

import numpy as np
import pytest
from scipy import special as sps
from scipy.stats import ks_2samp

import symquad as sq
from conftest import random_overlaps
from symquad.numeric.simulate import population_risk, simulate
from test_model_fields_one_step import Sums, increments, limit_increments, z_threshold
from test_model_fields_simulators import family_size, statistics
from literal_sgd import assert_full_step_is_literal, assert_reduced_step_is_literal, on_the_sphere

# ---------------------------------------------------------------------------------------
# activations from their definitions
# ---------------------------------------------------------------------------------------
SQ2PI = math.sqrt(2 / math.pi)


def act(activation):
    """(σ, σ') as numpy functions, written from the definitions."""
    if activation == "erf":
        return (lambda z: sps.erf(z / math.sqrt(2)), lambda z: SQ2PI * np.exp(-z * z / 2))
    if activation == "relu":
        return (lambda z: np.maximum(z, 0.0), lambda z: (z > 0).astype(float))
    P = np.polynomial.polynomial
    c = np.array([float(v) for v in activation])
    return (lambda z: P.polyval(z, c), lambda z: P.polyval(z, P.polyder(c)))


def sample_gradients(model, lam, nu, xi, a):
    """Per-sample ``g_k = ∂ℓ/∂λ_k`` and ``h_k = ∂ℓ/∂a_k`` (δ = ŷ − y with label noise)."""
    (s, ds), (t, _) = act(model.activation), act(model.teacher_activation)
    b = np.array([float(v) for v in model.teacher_readout])
    sig = s(lam)
    delta = sig @ a - (t(nu) @ b + np.sqrt(model.noise) * xi)
    return delta[..., None] * a * ds(lam), delta[..., None] * sig


# ---------------------------------------------------------------------------------------
# one N-dimensional step against the kernels
# ---------------------------------------------------------------------------------------
P, P_STAR = 6, 2
ALPHA = 1e-3
PRECISION = 0.05
BIAS_FRACTION = 0.25
READOUT = tuple(Fraction((-1) ** (k // 4) * (k % 3 + 2), 3 * P) for k in range(P))
TEACHER_READOUT = (Fraction(2, 3), Fraction(1, 2))
BASE = dict(p=P, p_star=P_STAR, lr=1.0, noise=0.25)
FIELDS = dict(readout=READOUT, teacher_readout=TEACHER_READOUT, lr_readout=0.5,
              weight_decay=0.1, batch_size=4)
VARIANTS = {
    "erf": dict(activation="erf"),
    "relu": dict(activation="relu"),
    "erf-relu": dict(activation="erf", teacher_activation="relu"),
    "relu-erf": dict(activation="relu", teacher_activation="erf"),
    # (lr 0.5: the O(1/N) bias of the unbounded z² student stays below BIAS_FRACTION)
    "z2-erf": dict(activation="z**2", teacher_activation="erf", lr=0.5),
    "erf-z3": dict(activation="erf", teacher_activation="z**3 - 3*z"),
    "erf fields": dict(activation="erf", **FIELDS),
    "relu-erf fields": dict(activation="relu", teacher_activation="erf", **FIELDS),
    "erf sphere": dict(activation="erf", constraint="sphere", lr_readout=0.5),
    "relu sphere": dict(activation="relu", constraint="sphere"),
}
WRONG = [("erf", dict(lr=0.9)), ("relu", dict(teacher_activation="erf")),
         ("erf fields", dict(batch_size=1)), ("relu-erf fields", dict(weight_decay=0.0)),
         ("erf sphere", dict(constraint="none"))]
BATCH = 4
UPPER = np.triu_indices(P)


def model_of(name, **changes):
    return sq.Model(**{**BASE, **VARIANTS[name], **changes})


def flatten(dQ, drho, da):
    parts = [dQ[..., UPPER[0], UPPER[1]], drho.reshape(drho.shape[:-2] + (-1,))]
    return np.concatenate(parts + ([] if da is None else [da]), axis=-1)


def current_readout(model):
    a0 = np.array([float(v) for v in model.readout])
    return 1.3 * a0 + 0.01 if model.readout_trained else a0


class Point:
    def __init__(self, Q, rho, T, frame):
        self.Q, self.rho, self.T = Q, rho, T
        N = frame.shape[0]
        self.V = np.sqrt(N) * np.linalg.cholesky(np.block([[Q, rho], [rho.T, T]])) @ frame.T


def one_step_monte_carlo(N, samples, seed, chunk_values=2_000_000):
    rng = np.random.default_rng(seed)
    Q, rho, T = random_overlaps(P, P_STAR, rng)
    frame = np.linalg.qr(rng.standard_normal((N, P + P_STAR)))[0]
    d = np.sqrt(np.diag(Q))
    general = Point(Q, rho, T, frame)
    sphere = Point(Q / np.outer(d, d), rho / d[:, None], T, frame)
    models = {name: model_of(name) for name in VARIANTS}
    sums = {name: (Sums(), Sums()) for name in models}
    steps = samples // BATCH
    chunk = max(1, chunk_values // (BATCH * N))
    for start in range(0, steps, chunk):
        m = min(chunk, steps - start)
        x = rng.standard_normal((m, BATCH, N))
        xi = rng.standard_normal((m, BATCH))
        R = np.matmul(x, np.swapaxes(x, 1, 2)) / N
        fields = {id(pt): x @ pt.V.T / np.sqrt(N) for pt in (general, sphere)}
        for name, model in models.items():
            pt = sphere if model.constraint == "sphere" else general
            z = fields[id(pt)]
            if model.batch_size == BATCH:
                zb, Rb, xib = z, R, xi
            else:
                zb, Rb = z.reshape(-1, 1, z.shape[-1]), np.einsum("nbb->nb", R).reshape(-1, 1, 1)
                xib = xi.reshape(-1, 1)
            lam, nu = zb[..., :P], zb[..., P:]
            g, h = sample_gradients(model, lam, nu, xib, current_readout(model))
            exact = flatten(*increments(model, pt.Q, pt.rho, lam, nu, Rb, g, h, N))
            limit = flatten(*limit_increments(model, pt.Q, pt.rho, lam, nu, g, h))
            sums[name][0].add(exact)
            sums[name][1].add(exact - limit)
    out = {}
    for name, (main, bias) in sums.items():
        mean, se = main.mean_se()
        b_mean, b_se = bias.mean_se()
        out[name] = dict(mean=mean, se=se, bias=b_mean, bias_se=b_se, steps=main.n)
    return out, general, sphere


def compare(result, model, point, a):
    rhs = sq.kernels(model).rhs(point.Q, point.rho, point.T,
                                a if model.readout_trained else None)
    exact = flatten(*rhs) if model.readout_trained else flatten(*rhs, None)
    mean, se = result["mean"], result["se"]
    live = se > 1e-9 * np.max(se)
    z = np.abs(mean - exact)[live] / se[live]
    return np.max(z), z_threshold(live.sum()), live, exact


#: Samples of the one-step Monte Carlo (N = 4000).  Measured at 80 000 (seed 1717): the
#: largest se/scale 0.028 (erf-z3, the precision gate is 0.05), the largest bias fraction
#: 0.082 (gate 0.25), the weakest wrong variant (erf, lr 10 % off) at z = 14.0 against a
#: threshold of 4.17.  At half the samples (measured, same seed): 0.041, 0.085 and
#: z = 10.4 (every other wrong variant z >= 18.5): every gate met and the power tests still
#: rejecting, for half the CPU (2.5 s instead of 5.0 s, loaded 2-core machine).
STEP_SAMPLES = 40_000


@pytest.fixture(scope="module")
def step_mc():
    return one_step_monte_carlo(4000, STEP_SAMPLES, seed=1717)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_one_step_of_sgd_matches_the_kernels(name, step_mc):
    results, general, sphere = step_mc
    model = model_of(name)
    point = sphere if model.constraint == "sphere" else general
    result = results[name]
    zmax, threshold, live, exact = compare(result, model, point, current_readout(model))
    scale = np.max(np.abs(exact))
    assert np.max(result["se"]) < PRECISION * scale, name
    bias = (np.abs(result["bias"]) + 3 * result["bias_se"])[live] / result["se"][live]
    assert np.max(bias) < BIAS_FRACTION, (name, float(np.max(bias)))
    assert zmax < threshold, (name, float(zmax), float(threshold))


@pytest.mark.parametrize("name, wrong", WRONG, ids=[w[0] + " " + str(w[1]) for w in WRONG])
def test_power_wrong_kernels_are_rejected(name, wrong, step_mc):
    results, general, sphere = step_mc
    right = model_of(name)
    point = sphere if right.constraint == "sphere" else general
    zmax, threshold, _, _ = compare(results[name], model_of(name, **wrong), point,
                                    current_readout(right))
    assert zmax > threshold, (name, wrong, float(zmax))


# ---------------------------------------------------------------------------------------
# one compiled step == the literal step of the definitions
# ---------------------------------------------------------------------------------------
SIM_BASE = dict(p=3, p_star=2, lr=0.4, noise=0.2)
SIM_FIELDS = dict(readout=(Fraction(1, 2), Fraction(-1, 6), Fraction(1, 3)),
                  teacher_readout=(Fraction(3, 4), Fraction(-1, 4)), lr_readout=0.2,
                  weight_decay=0.5)


STEP_CASES = [dict(activation="erf"), dict(activation="relu"),
              dict(activation="relu", teacher_activation="erf", batch_size=3, **SIM_FIELDS),
              dict(activation="erf", teacher_activation="z**2", constraint="sphere",
                   batch_size=2, **SIM_FIELDS)]


@pytest.mark.parametrize("kwargs", STEP_CASES, ids=[str(i) for i in range(len(STEP_CASES))])
def test_one_reduced_step_is_the_literal_step(kwargs):
    model = sq.Model(**SIM_BASE, **kwargs)
    Q0, rho0, T = random_overlaps(3, 2, np.random.default_rng(4))
    assert_reduced_step_is_literal(model, *on_the_sphere(model, Q0, rho0), T,
                                   gradients=sample_gradients)


@pytest.mark.parametrize("kwargs", STEP_CASES, ids=[str(i) for i in range(len(STEP_CASES))])
def test_one_full_step_is_the_literal_step(kwargs):
    model = sq.Model(**SIM_BASE, **kwargs)
    Q0, rho0, T = random_overlaps(3, 2, np.random.default_rng(6))
    assert_full_step_is_literal(model, *on_the_sphere(model, Q0, rho0), T,
                                gradients=sample_gradients)


# ---------------------------------------------------------------------------------------
# reduced vs full: the same law
# ---------------------------------------------------------------------------------------
KS_ALPHA = 0.01
KS_CASES = {
    "erf": (dict(activation="erf"), dict(activation="erf", lr=0.2)),
    "relu": (dict(activation="relu"), dict(activation="relu", teacher_activation="erf")),
    "erf fields": (dict(activation="erf", batch_size=4, **SIM_FIELDS),
                   dict(activation="erf", batch_size=4, **{**SIM_FIELDS, "weight_decay": 0.25})),
    "relu-erf sphere": (dict(activation="relu", teacher_activation="erf",
                             constraint="sphere", lr_readout=0.3),
                        dict(activation="relu", teacher_activation="erf", lr_readout=0.3)),
}
KS_TESTS = sum(family_size(sq.Model(**SIM_BASE, **c)) for c, _ in KS_CASES.values())


def pvalues(a, b, times):
    sa, sb = statistics(a, times), statistics(b, times)
    return {k: ks_2samp(sa[k], sb[k]).pvalue for k in sa}


#: Replicas of each simulator.  Measured (these seeds) at 1000: the smallest p-value of a
#: true family 0.013 (relu-erf sphere; 0.048, 0.2, 0.2 for the others) against the Bonferroni
#: threshold 1.45e-4, the weakest wrong model at p = 4.4e-9 (relu-erf sphere; the others
#: <= 6e-33); at 2000: 0.015 and 6.8e-23, for twice the CPU (3.0 s instead of 1.6 s).
KS_REPLICAS = 1000


@pytest.mark.parametrize("name", list(KS_CASES))
def test_reduced_simulator_has_the_law_of_full_sgd(name):
    change, wrong = KS_CASES[name]
    model = sq.Model(**SIM_BASE, **change)
    N, t_max, replicas, seed = 40, 3.0, KS_REPLICAS, 10 * list(KS_CASES).index(name)
    common = dict(N=N, t_max=t_max, replicas=replicas, t_eval=np.linspace(0, t_max, 4))
    full = simulate(model, method="full", seed=seed, **common)
    red = simulate(model, method="reduced", seed=seed + 1, **common)
    times = [t_max / 3, 2 * t_max / 3, t_max]
    p = pvalues(full, red, times)
    assert len(p) == family_size(model)
    threshold = KS_ALPHA / KS_TESTS
    worst = min(p, key=p.get)
    assert p[worst] > threshold, (name, worst, p[worst])
    other = simulate(sq.Model(**{**SIM_BASE, **wrong}), method="reduced", seed=seed + 2,
                     **common)
    assert min(pvalues(full, other, times).values()) < threshold, f"{name}: no power"


# ---------------------------------------------------------------------------------------
# the recorded risk, the seed
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("student,teacher", [("erf", "erf"), ("relu", "relu"), ("relu", "erf"),
                                             ("erf", "relu"), ("z**3 - 3*z", "relu"),
                                             ("erf", "z**2 + z")])
def test_population_risk_equals_the_kernels_risk(student, teacher):
    """Two routes: the typed closed forms of population_risk and the generated kernels."""
    rng = np.random.default_rng(2)
    m = sq.Model(p=4, p_star=3, lr=0.1, activation=student, teacher_activation=teacher,
                 readout=(0.5, -0.25, 0.25, 1), teacher_readout=(1, 0.5, -0.5))
    Qs, rhos = [], []
    for _ in range(3):
        Q, rho, T = random_overlaps(4, 3, rng)
        Qs.append(Q)
        rhos.append(rho)
    Q, rho = np.stack(Qs), np.stack(rhos)
    ref = population_risk(m, Q, rho, T)
    got = sq.kernels(m).risk(Q, rho, T)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=0)


@pytest.mark.parametrize("method", ["reduced", "full"])
def test_same_seed_same_numbers(method):
    m = sq.Model(p=3, p_star=2, lr=0.3, activation="relu", teacher_activation="erf",
                 batch_size=2)
    runs = [simulate(m, N=60, t_max=1.0, replicas=3, seed=4, method=method) for _ in range(2)]
    assert np.array_equal(runs[0].Q, runs[1].Q) and np.array_equal(runs[0].rho, runs[1].rho)

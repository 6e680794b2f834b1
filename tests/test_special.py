"""erf(z/√2), ReLU and mixed activations: closed forms and the ReLU quadrature (issue 17).

Every closed form of symquad.symbolic.special (through the generated kernels of
symquad/_generated/special_*.py) is checked by a second route:

* one-dimensional quadrature (scipy) of a conditional expectation that uses
  only the elementary mean-shift formulas E[g(m + √v Z)];
* the erf formulas of Saad & Solla (1995), typed here from the paper
  (Λ-determinant form), to 1e-12 relative on full index grids;
* Monte Carlo of the defining expectations, with the standard error asserted
  first;
* for the ReLU four-point quadrature: a 30-digit adaptive (mpmath) evaluation of
  the same integral (its accuracy), an independent route through the other
  pair's plane with Owen's T (scipy) and a numerical radial integral, and the
  closed forms of the coincident-index cases (derived by Stein's lemma).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp
from scipy import integrate, special as sps

from symquad.symbolic import special as S
from symquad.numeric import special as NS

ERF = NS.special_kernels("erf", "erf")
RELU = NS.special_kernels("relu", "relu")
ERF_RELU = NS.special_kernels("erf", "relu")
RELU_ERF = NS.special_kernels("relu", "erf")

SQ2PI = math.sqrt(2 * math.pi)

#: Stated accuracy of the ReLU four-point quadrature: absolute, in units of √(C_aa C_bb).
STATED_ACCURACY = 1e-10


# ---- elementary mean-shift formulas (the independent building blocks) ---------------

def _Phi(z):
    return 0.5 * sps.erfc(-z / math.sqrt(2))


def _phi(z):
    return math.exp(-z * z / 2) / SQ2PI


def shifted_mean(act, m, v):
    """E[act(m + √v Z)], Z ~ N(0,1), for act in relu, erf, step (=relu'), gauss (=erf'), poly."""
    s = math.sqrt(max(v, 0.0))
    if act == "relu":
        return max(m, 0.0) if s == 0 else m * _Phi(m / s) + s * _phi(m / s)
    if act == "step":
        return float(m > 0) if s == 0 else _Phi(m / s)
    if act == "erf":
        return math.erf(m / math.sqrt(2 * (1 + v)))
    if act == "gauss":   # d/dz erf(z/√2) = √(2/π) e^{−z²/2}
        return math.sqrt(2 / math.pi) / math.sqrt(1 + v) * math.exp(-m * m / (2 * (1 + v)))
    coeffs = act         # polynomial: E[(m + sZ)^i] by binomial moments
    out = 0.0
    for i, c in enumerate(coeffs):
        out += float(c) * sum(math.comb(i, j) * m**(i - j) * s**j * _gauss_moment(j)
                              for j in range(i + 1))
    return out


def _gauss_moment(j):
    return 0.0 if j % 2 else float(sp.factorial2(j - 1))


def derivative_act(act):
    return {"relu": "step", "erf": "gauss"}.get(act) if isinstance(act, str) else \
        tuple(i * act[i] for i in range(1, len(act)))


def pointwise(act, x):
    if act == "relu":
        return max(x, 0.0)
    if act == "step":
        return float(x > 0)
    if act == "erf":
        return math.erf(x / math.sqrt(2))
    if act == "gauss":
        return math.sqrt(2 / math.pi) * math.exp(-x * x / 2)
    return sum(float(c) * x**i for i, c in enumerate(act))


def quad_two(f, g, A, c, B):
    """E[f(x) g(y)] by conditioning on x (scipy quad, breakpoint at the kink 0)."""
    sA = math.sqrt(A)

    def integrand(t):           # x = sA t, t ~ N(0, 1)
        x = sA * t
        return _phi(t) * pointwise(f, x) * shifted_mean(g, c / A * x, B - c * c / A)
    left = integrate.quad(integrand, -np.inf, 0, epsabs=1e-14, epsrel=1e-13, limit=200)[0]
    right = integrate.quad(integrand, 0, np.inf, epsabs=1e-14, epsrel=1e-13, limit=200)[0]
    return left + right


def quad_three(f, g, C):
    """E[f'(u_0) u_1 g(u_2)] by conditioning on u_0 and Stein on the conditional pair."""
    fp, gp = derivative_act(f), derivative_act(g)
    A = C[0, 0]
    sA = math.sqrt(A)
    Vjj_a = C[2, 2] - C[0, 2] ** 2 / A
    Vja = C[1, 2] - C[0, 1] * C[0, 2] / A

    def integrand(t):
        x = sA * t
        mj, ma = C[0, 1] / A * x, C[0, 2] / A * x
        inner = mj * shifted_mean(g, ma, Vjj_a) + Vja * shifted_mean(gp, ma, Vjj_a)
        return _phi(t) * pointwise(fp, x) * inner
    return sum(integrate.quad(integrand, lo, hi, epsabs=1e-14, epsrel=1e-13, limit=200)[0]
               for lo, hi in ((-np.inf, 0), (0, np.inf)))


def random_cov(n, rng, df=None, scale=1.0):
    df = df or n + 2
    G = rng.standard_normal((n, df))
    return scale * G @ G.T / df


def entries4(C):
    """The ten entries of a (..., 4, 4) covariance in the I4 argument order."""
    return (C[..., 0, 0], C[..., 0, 1], C[..., 1, 1], C[..., 0, 2], C[..., 0, 3],
            C[..., 1, 2], C[..., 1, 3], C[..., 2, 2], C[..., 2, 3], C[..., 3, 3])


def mc_sample(C, n, seed):
    rng = np.random.default_rng(seed)
    L = np.linalg.cholesky(C + 1e-13 * np.trace(C) * np.eye(len(C)))
    return rng.standard_normal((n, len(C))) @ L.T


def mc_mean(values):
    return values.mean(), values.std(ddof=1) / math.sqrt(values.size)


NP_ACT = {
    "relu": lambda u: np.maximum(u, 0.0),
    "erf": lambda u: sps.erf(u / math.sqrt(2)),
    "step": lambda u: (u > 0).astype(float),
    "gauss": lambda u: math.sqrt(2 / math.pi) * np.exp(-u * u / 2),
}


def np_act(act):
    if isinstance(act, str):
        return NP_ACT[act]
    return lambda u: sum(float(c) * u**i for i, c in enumerate(act))


# ---- symbolic building blocks --------------------------------------------------------

def test_vertex_functions_match_quadrature_and_known_forms():
    D = sp.Symbol("D", positive=True)
    for r in range(4):   # erf: φ_{2r+1} = √(2/π)(−1)^r (2r−1)!! (1+D)^{−r−1/2}; even orders 0
        known = sp.sqrt(2 / sp.pi) * (-1)**r * sp.factorial2(2 * r - 1) * (1 + D)**(-r - sp.Rational(1, 2))
        assert sp.simplify(S.vertex_function("erf", 2 * r + 1, D) - known) == 0
        assert S.vertex_function("erf", 2 * r, D) == 0
    assert S.vertex_function("relu", 1, D) == sp.Rational(1, 2)
    assert S.vertex_function("relu", 3, D) == 0
    # second route: E[σ^{(m)}(x)] = D^{-m/2} E[σ(x) He_m(x/√D)] by quadrature
    for act, fn in (("erf", lambda x: math.erf(x / math.sqrt(2))), ("relu", lambda x: max(x, 0))):
        for m in range(6):
            for Dv in (0.3, 1.7):
                he = sps.eval_hermitenorm(m, 1.0)
                val = sum(integrate.quad(lambda t: _phi(t) * fn(math.sqrt(Dv) * t)
                                         * sps.eval_hermitenorm(m, t), lo, hi, epsabs=1e-14)[0]
                          for lo, hi in ((-np.inf, 0), (0, np.inf))) / Dv**(m / 2)
                expr = float(S.vertex_function(act, m, D).subs(D, Dv))
                assert abs(expr - val) < 1e-11, (act, m, Dv, he)


def test_orthants_and_fold_lemma():
    rng = np.random.default_rng(3)
    P2, (xx, xy, yy) = S.orthant_2()
    P3, s = S.orthant_3()
    for _ in range(3):
        C = random_cov(3, rng)
        u = mc_sample(C, 400_000, seed=int(rng.integers(1 << 30)))
        pos = u > 0
        m2, se2 = mc_mean((pos[:, 0] & pos[:, 1]).astype(float))
        m3, se3 = mc_mean(pos.all(axis=1).astype(float))
        assert se2 < 1e-3 and se3 < 1e-3
        v2 = float(P2.subs({xx: C[0, 0], xy: C[0, 1], yy: C[1, 1]}))
        names = "xyz"
        v3 = float(P3.subs({s[(names[i], names[j])]: C[i, j] for i in range(3) for j in range(3)}))
        assert abs(v2 - m2) < 4.5 * se2 and abs(v3 - m3) < 4.5 * se3
    # fold: E[e^{-u_0²/2} u_1²] = det(1 + C_00)^{-1/2} C'_11 (Gaussian integral by quadrature)
    C = random_cov(2, rng)
    pref, Cp = S.gaussian_fold(sp.Matrix(C.tolist()), [0])
    direct = quad_two("gauss", (0, 0, 1), C[0, 0], C[0, 1], C[1, 1]) / math.sqrt(2 / math.pi)
    assert abs(float(pref * Cp[0, 0]) - direct) < 1e-12


# ---- two- and three-point functions against 1-D quadrature ---------------------------

PAIRS = [("erf", "erf"), ("erf", "relu"), ("relu", "erf"), ("relu", "relu")]
POLY = (0, 1, 0, 1)            # z + z³
POLY2 = (1, 0, -1, 0, 1)       # 1 − z² + z⁴


def _eval(expr, values):
    return float(expr.xreplace({sp.Symbol(k, **({"positive": True} if k[2] == k[3] else
                                                   {"real": True})): v
                                for k, v in values.items()}))


@pytest.mark.parametrize("f,g", PAIRS + [("erf", POLY), (POLY, "erf"), ("relu", POLY2),
                                         (POLY2, "relu")])
def test_two_point_matches_quadrature(f, g):
    rng = np.random.default_rng(11)
    expr = S.two_point(f, g)
    for _ in range(3):
        C = random_cov(2, rng, scale=1.5)
        val = _eval(expr, {"C_aa": C[0, 0], "C_ab": C[0, 1], "C_bb": C[1, 1]})
        ref = quad_two(f, g, C[0, 0], C[0, 1], C[1, 1])
        assert abs(val - ref) < 1e-10 * max(1.0, abs(ref))


@pytest.mark.parametrize("f", ["erf", "relu"])
def test_noise_two_point_matches_quadrature(f):
    rng = np.random.default_rng(5)
    expr = S.noise_two_point(f)
    fp = derivative_act(f)
    for _ in range(3):
        C = random_cov(2, rng)
        val = _eval(expr, {"C_kk": C[0, 0], "C_kl": C[0, 1], "C_ll": C[1, 1]})
        assert abs(val - quad_two(fp, fp, C[0, 0], C[0, 1], C[1, 1])) < 1e-11


@pytest.mark.parametrize("f,g", PAIRS + [("erf", POLY), (POLY, "relu"), ("relu", POLY)])
def test_three_point_matches_quadrature(f, g):
    rng = np.random.default_rng(7)
    expr = S.three_point(f, g)
    for _ in range(3):
        C = random_cov(3, rng)      # fields (k, j, a)
        vals = {"C_kk": C[0, 0], "C_kj": C[0, 1], "C_ka": C[0, 2], "C_ja": C[1, 2],
                "C_aa": C[2, 2]}
        val = _eval(expr, vals)
        ref = quad_three(f, g, C)
        assert abs(val - ref) < 1e-10 * max(1.0, abs(ref))


def test_two_point_derivatives_match_quadrature():
    rng = np.random.default_rng(2)
    C = random_cov(2, rng)
    vals = {"C_aa": C[0, 0], "C_ab": C[0, 1], "C_bb": C[1, 1]}
    # E[f^{(m)} g^{(n)}] for the orders that are ordinary functions (steps, Gaussians)
    for (f, g, m, n, fm, gn) in (("erf", "erf", 1, 1, "gauss", "gauss"),
                                 ("erf", "erf", 1, 0, "gauss", "erf"),
                                 ("relu", "relu", 1, 0, "step", "relu"),
                                 ("relu", "erf", 1, 1, "step", "gauss"),
                                 ("relu", "erf", 0, 1, "relu", "gauss"),
                                 ("relu", "relu", 1, 1, "step", "step")):
        val = _eval(S.two_point_derivative(f, g, m, n), vals)
        assert abs(val - quad_two(fm, gn, C[0, 0], C[0, 1], C[1, 1])) < 1e-11, (f, g, m, n)
    # E[δ(x) δ(y)] = density at the origin
    d = _eval(S.two_point_derivative("relu", "relu", 2, 2), vals)
    assert abs(d - 1 / (2 * math.pi * math.sqrt(np.linalg.det(C)))) < 1e-12


# ---- erf: against Saad & Solla's formulas (typed from the paper) ---------------------

def saad_solla_I2(C, a, b):
    return 2 / np.pi * np.arcsin(C[a, b] / np.sqrt((1 + C[a, a]) * (1 + C[b, b])))


def saad_solla_J2(C, k, l):
    return 2 / np.pi / np.sqrt(1 + C[k, k] + C[l, l] + C[k, k] * C[l, l] - C[k, l] ** 2)


def saad_solla_I3(C, k, j, a):
    L3 = (1 + C[k, k]) * (1 + C[a, a]) - C[k, a] ** 2
    return 2 / np.pi / np.sqrt(L3) * (C[j, a] * (1 + C[k, k]) - C[k, j] * C[k, a]) / (1 + C[k, k])


def saad_solla_I4(C, k, l, a, b):
    c11, c22, c33, c44 = C[k, k], C[l, l], C[a, a], C[b, b]
    c12, c13, c14, c23, c24, c34 = C[k, l], C[k, a], C[k, b], C[l, a], C[l, b], C[a, b]
    L4 = (1 + c11) * (1 + c22) - c12 ** 2
    L0 = L4 * c34 - c23 * c24 * (1 + c11) - c13 * c14 * (1 + c22) + c12 * c13 * c24 \
        + c12 * c14 * c23
    L1 = L4 * (1 + c33) - c23 ** 2 * (1 + c11) - c13 ** 2 * (1 + c22) + 2 * c12 * c13 * c23
    L2 = L4 * (1 + c44) - c24 ** 2 * (1 + c11) - c14 ** 2 * (1 + c22) + 2 * c12 * c14 * c24
    return 4 / np.pi ** 2 / np.sqrt(L4) * np.arcsin(L0 / np.sqrt(L1 * L2))


def _grids(p, n):
    k = np.arange(p)[:, None, None, None]
    l = np.arange(p)[None, :, None, None]
    a = np.arange(n)[None, None, :, None]
    b = np.arange(n)[None, None, None, :]
    return k, l, a, b


@pytest.mark.parametrize("p,pk", [(1, 1), (2, 1), (2, 3), (3, 3), (12, 4)])
def test_erf_kernels_equal_saad_solla_on_full_index_grids(p, pk):
    """All index combinations, coincident ones included, to 1e-12 relative."""
    n = p + pk
    C = random_cov(n, np.random.default_rng(p * 10 + pk))
    k, l, a, b = _grids(p, n)
    a2, b2 = np.arange(n)[:, None], np.arange(n)[None, :]
    rel = lambda x, y: np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-300))  # noqa: E731
    for fn in (ERF.I2_ss, ERF.I2_st, ERF.I2_tt):
        assert rel(fn(C[a2, a2], C[a2, b2], C[b2, b2]), saad_solla_I2(C, a2, b2)) < 1e-12
    kk, ll = np.arange(p)[:, None], np.arange(p)[None, :]
    assert rel(ERF.J2(C[kk, kk], C[kk, ll], C[ll, ll]), saad_solla_J2(C, kk, ll)) < 1e-12
    k3, j3, a3 = np.arange(p)[:, None, None], np.arange(n)[None, :, None], np.arange(n)[None, None, :]
    for fn in (ERF.I3_s, ERF.I3_t):
        got = fn(C[k3, k3], C[k3, j3], C[k3, a3], C[j3, a3], C[a3, a3])
        ref = saad_solla_I3(C, k3, j3, a3)
        assert np.max(np.abs(got - ref)) <= 1e-12 * np.max(np.abs(ref))   # exact zeros occur
    ref = saad_solla_I4(C, k, l, a, b)
    for fn in (ERF.I4_ss, ERF.I4_st, ERF.I4_tt):
        got = fn(C[k, k], C[k, l], C[l, l], C[k, a], C[k, b], C[l, a], C[l, b], C[a, a],
                 C[a, b], C[b, b])
        assert got.shape == ref.shape and rel(got, ref) < 1e-12


def test_erf_four_point_matches_monte_carlo_with_coincident_indices():
    rng = np.random.default_rng(21)
    C = random_cov(4, rng)
    u = mc_sample(C, 1_000_000, seed=4)
    g, e = NP_ACT["gauss"], NP_ACT["erf"]
    for idx in ((0, 1, 2, 3), (0, 0, 2, 3), (0, 1, 0, 3), (0, 1, 2, 2), (0, 0, 0, 0)):
        k, l, a, b = idx
        m, se = mc_mean(g(u[:, k]) * g(u[:, l]) * e(u[:, a]) * e(u[:, b]))
        assert se < 2e-3
        val = ERF.I4_ss(C[k, k], C[k, l], C[l, l], C[k, a], C[k, b], C[l, a], C[l, b], C[a, a],
                        C[a, b], C[b, b])
        assert abs(val - m) < 4.5 * se, idx


# ---- mixed pairs with an erf student: fold + I2 (nested quadrature and Monte Carlo) -----

def nested_erf_student_four_point(C, g, h, n_outer=48):
    """E[erf'(u_k) erf'(u_l) g(u_a) h(u_b)]: Gauss–Hermite over (u_k, u_l), 1-D quad inside."""
    x, w = np.polynomial.hermite_e.hermegauss(n_outer)
    w = w / math.sqrt(2 * math.pi)
    L = np.linalg.cholesky(C[:2, :2])
    Cinv = np.linalg.inv(C[:2, :2])
    B = C[2:, :2] @ Cinv                       # regression of (u_a, u_b) on (u_k, u_l)
    V = C[2:, 2:] - B @ C[:2, 2:]
    total = 0.0
    for i in range(n_outer):
        for j in range(n_outer):
            z = np.array([x[i], x[j]])
            ukl = L @ z
            m = B @ ukl
            weight = w[i] * w[j] * pointwise("gauss", ukl[0]) * pointwise("gauss", ukl[1])
            if weight < 1e-18:
                continue
            total += weight * _cond_pair(g, h, m, V)
    return total


def _cond_pair(g, h, m, V):
    """E[g(A) h(B)] for (A, B) ~ N(m, V): condition on A, fixed Gauss–Legendre with the kink split."""
    sa = math.sqrt(V[0, 0])
    nodes, weights = np.polynomial.legendre.leggauss(60)
    out = 0.0
    for lo, hi in ((-12.0, -m[0] / sa), (-m[0] / sa, 12.0)):
        lo, hi = max(lo, -12.0), min(hi, 12.0)
        if hi <= lo:
            continue
        t = 0.5 * (hi - lo) * nodes + 0.5 * (hi + lo)
        wt = 0.5 * (hi - lo) * weights
        for ti, wi in zip(t, wt):
            aval = m[0] + sa * ti
            out += wi * _phi(ti) * pointwise(g, aval) * shifted_mean(
                h, m[1] + V[0, 1] / V[0, 0] * sa * ti, V[1, 1] - V[0, 1] ** 2 / V[0, 0])
    return out


@pytest.mark.parametrize("g,h,fn", [("erf", "relu", ERF_RELU.I4_st),
                                    ("relu", "relu", ERF_RELU.I4_tt)])
def test_erf_student_mixed_four_point_matches_nested_quadrature(g, h, fn):
    rng = np.random.default_rng(31)
    C = random_cov(4, rng)
    ref = nested_erf_student_four_point(C, g, h)
    assert abs(fn(*entries4(C)) - ref) < 1e-9


def test_erf_student_polynomial_teacher_four_point_matches_monte_carlo():
    rng = np.random.default_rng(8)
    C = random_cov(4, rng, scale=0.8)
    expr = S.four_point("erf", "erf", POLY)
    names = ("C_kk", "C_kl", "C_ll", "C_ka", "C_kb", "C_la", "C_lb", "C_aa", "C_ab", "C_bb")
    val = _eval(expr, dict(zip(names, entries4(C))))
    u = mc_sample(C, 1_000_000, seed=9)
    m, se = mc_mean(NP_ACT["gauss"](u[:, 0]) * NP_ACT["gauss"](u[:, 1]) * NP_ACT["erf"](u[:, 2])
                    * np_act(POLY)(u[:, 3]))
    assert se < 5e-3 and abs(val - m) < 4.5 * se
    # and the nested quadrature (deterministic, tighter)
    assert abs(val - nested_erf_student_four_point(C, "erf", POLY)) < 1e-9


# ---- polynomial students with erf/relu teachers, relu students with polynomial teachers -

def _mc_four(C, fprime, g, h, n=1_000_000, seed=0):
    u = mc_sample(C, n, seed)
    return mc_mean(np_act(fprime)(u[:, 0]) * np_act(fprime)(u[:, 1]) * np_act(g)(u[:, 2])
                   * np_act(h)(u[:, 3]))


@pytest.mark.parametrize("f,g,h", [((0, 0, 1, 1), "erf", "erf"), ((0, 0, 1, 1), "relu", "relu"),
                                   ("relu", (0, 1, 1), POLY)])
def test_polynomial_core_four_points_match_monte_carlo(f, g, h):
    rng = np.random.default_rng(13)
    C = random_cov(4, rng, scale=0.7)
    expr = S.four_point(f, g, h)
    names = ("C_kk", "C_kl", "C_ll", "C_ka", "C_kb", "C_la", "C_lb", "C_aa", "C_ab", "C_bb")
    val = _eval(expr, dict(zip(names, entries4(C))))
    m, se = _mc_four(C, derivative_act(f), g, h, seed=17)
    assert se < 0.02 * max(1.0, abs(m)) and abs(val - m) < 4.5 * se


def test_polynomial_student_relu_teacher_merged_diagonal():
    rng = np.random.default_rng(23)
    C = random_cov(3, rng, scale=0.7)       # (k, l, a) with a = b
    f = (0, 0, 1, 1)
    expr = S.four_point_merged_teacher(f, "relu")
    val = _eval(expr, {"C_kk": C[0, 0], "C_kl": C[0, 1], "C_ll": C[1, 1], "C_ka": C[0, 2],
                       "C_la": C[1, 2], "C_aa": C[2, 2]})
    u = mc_sample(C, 1_000_000, seed=5)
    fp = np_act(derivative_act(f))
    m, se = mc_mean(fp(u[:, 0]) * fp(u[:, 1]) * np.maximum(u[:, 2], 0) ** 2)
    assert se < 0.02 * abs(m) and abs(val - m) < 4.5 * se


def test_relu_student_polynomial_teacher_merged_diagonal():
    rng = np.random.default_rng(29)
    C = random_cov(3, rng, scale=0.7)       # (k, a, b) with k = l
    expr = S.four_point_merged_student("relu", (0, 1, 1), POLY)
    val = _eval(expr, {"C_kk": C[0, 0], "C_ka": C[0, 1], "C_kb": C[0, 2], "C_aa": C[1, 1],
                       "C_ab": C[1, 2], "C_bb": C[2, 2]})
    u = mc_sample(C, 1_000_000, seed=6)
    m, se = mc_mean((u[:, 0] > 0) * np_act((0, 1, 1))(u[:, 1]) * np_act(POLY)(u[:, 2]))
    assert se < 0.02 * abs(m) and abs(val - m) < 4.5 * se


def test_closure_table_agrees_with_four_point():
    for (fn, f, g, h), status in S.closure_table().items():
        if fn != "I4":
            continue
        acts = [{"erf": "erf", "relu": "relu", "poly": POLY}[x] for x in (f, g, h)]
        if status.startswith("closed"):
            assert isinstance(S.four_point(*acts), sp.Expr)
        else:
            with pytest.raises(S.NotClosedError):
                S.four_point(*acts)


# ---- ReLU: closed I2, J2, I3 -----------------------------------------------------------

def cho_saul_I2(A, c, B):
    """½ k_1 of Cho & Saul (2009): √(AB)/(2π) [sin θ + (π − θ) cos θ], cos θ = c/√(AB)."""
    th = np.arccos(np.clip(c / np.sqrt(A * B), -1, 1))
    return np.sqrt(A * B) / (2 * np.pi) * (np.sin(th) + (np.pi - th) * np.cos(th))


def test_relu_closed_forms_equal_literature_and_coincident_limits():
    rng = np.random.default_rng(1)
    C = random_cov(5, rng)
    a, b = np.arange(5)[:, None], np.arange(5)[None, :]
    got = RELU.I2_ss(C[a, a], C[a, b], C[b, b])
    assert np.max(np.abs(got - cho_saul_I2(C[a, a], C[a, b], C[b, b]))) < 1e-13
    assert np.allclose(np.diag(got), np.diag(C) / 2, rtol=1e-14, atol=0)    # E[relu(u)²] = C/2
    J = RELU.J2(C[a, a], C[a, b], C[b, b])
    assert np.allclose(np.diag(J), 0.5, rtol=1e-14)                         # P(u > 0) = 1/2
    # I3 at coincident indices: E[1{u_k>0} u_j relu(u_k)] = C_kj/2 (Stein)
    k, j = np.arange(5)[:, None], np.arange(5)[None, :]
    I3 = RELU.I3_s(C[k, k], C[k, j], C[k, k], C[j, k], C[k, k])
    assert np.max(np.abs(I3 - C / 2)) < 1e-14


@pytest.mark.parametrize("p,pk", [(2, 2), (8, 2)])
def test_relu_kernels_match_monte_carlo_at_p(p, pk):
    """I2, J2, I3 and I4 on random index tuples (coincident ones included) of p + p* fields."""
    n = p + pk
    rng = np.random.default_rng(100 + p)
    C = random_cov(n, rng)
    u = mc_sample(C, 400_000, seed=p)
    r, s = np.maximum(u, 0.0), (u > 0).astype(float)
    tuples = [tuple(rng.integers(0, [p, p, n, n])) for _ in range(24)]
    tuples += [(0, 0, 0, 0), (0, 1, 0, 1), (1, 1, 0, n - 1), (0, 1, n - 1, n - 1)]
    zcrit = 4.5
    for k, l, a, b in tuples:
        m, se = mc_mean(s[:, k] * s[:, l] * r[:, a] * r[:, b])
        assert se < 5e-3 * max(1.0, C[a, a] * C[b, b]) ** 0.5
        val = RELU.I4_ss(C[k, k], C[k, l], C[l, l], C[k, a], C[k, b], C[l, a], C[l, b],
                         C[a, a], C[a, b], C[b, b])
        assert abs(val - m) < zcrit * se, (k, l, a, b)
        m3, se3 = mc_mean(s[:, k] * u[:, a] * r[:, b])
        val3 = RELU.I3_s(C[k, k], C[k, a], C[k, b], C[a, b], C[b, b])
        assert abs(val3 - m3) < zcrit * se3
        m2, se2 = mc_mean(r[:, a] * r[:, b])
        assert abs(RELU.I2_ss(C[a, a], C[a, b], C[b, b]) - m2) < zcrit * se2
        mj, sej = mc_mean(s[:, k] * s[:, l])
        assert abs(RELU.J2(C[k, k], C[k, l], C[l, l]) - mj) < zcrit * max(sej, 1e-12)


# ---- ReLU I4 quadrature: accuracy ------------------------------------------------------

def _owen_bvn(h, k, r):
    """Φ₂(h, k; r) = P(X < h, Y < k), Owen (1956) through Owen's T (scipy)."""
    h, k = np.asarray(h, float), np.asarray(k, float)
    sq = math.sqrt(1 - r * r)
    with np.errstate(divide="ignore", invalid="ignore"):
        ah = np.where(h != 0, (k - r * h) / (h * sq), np.inf)
        ak = np.where(k != 0, (h - r * k) / (k * sq), np.inf)
    beta = np.where((h * k > 0) | ((h * k == 0) & (h + k >= 0)), 0.0, 0.5)
    return 0.5 * _Phi_np(h) + 0.5 * _Phi_np(k) - sps.owens_t(h, ah) - sps.owens_t(k, ak) - beta


def _Phi_np(z):
    return 0.5 * sps.erfc(-z / math.sqrt(2))


def relu_four_point_other_plane(C, n_theta=80, n_r=80):
    """E[1{u_k>0}1{u_l>0} relu(u_a) relu(u_b)] in polar coordinates of the (a, b) plane.

    Independent of the kernel: whitens (u_a, u_b), integrates r³ e^{−r²/2}
    Φ₂(conditional thresholds) numerically in r and θ (Gauss–Legendre), with
    Φ₂ from Owen's T.
    """
    M = np.linalg.cholesky(C[2:, 2:])
    B = C[:2, 2:] @ np.linalg.inv(C[2:, 2:])      # regression of (k, l) on (a, b)
    V = C[:2, :2] - B @ C[2:, :2]
    sk, sl = math.sqrt(V[0, 0]), math.sqrt(V[1, 1])
    rho = V[0, 1] / (sk * sl)
    # u_a = M00 y1 > 0 and u_b = M10 y1 + M11 y2 > 0: θ ∈ (atan2(M11, M10) − π/2, π/2)
    lo, hi = math.atan2(M[1, 1], M[1, 0]) - math.pi / 2, math.pi / 2
    xt, wt = np.polynomial.legendre.leggauss(n_theta)
    thetas = 0.5 * (hi - lo) * xt + 0.5 * (hi + lo)
    wth = 0.5 * (hi - lo) * wt
    xr, wr = np.polynomial.legendre.leggauss(n_r)
    R = 14.0
    rs = 0.5 * R * (xr + 1)
    wrs = 0.5 * R * wr
    total = 0.0
    for t, wtt in zip(thetas, wth):
        ev = np.array([math.cos(t), math.sin(t)])
        uab = M @ ev                              # (u_a, u_b)/r
        mkl = B @ uab                             # conditional means of (u_k, u_l) / r
        phi2 = _owen_bvn(rs * mkl[0] / sk, rs * mkl[1] / sl, rho)
        radial = np.sum(wrs * rs ** 3 * np.exp(-rs ** 2 / 2) * phi2)
        total += wtt * uab[0] * uab[1] * radial
    return total / (2 * math.pi)


def test_relu_quadrature_matches_independent_route_on_generic_covariances():
    rng = np.random.default_rng(41)
    for _ in range(3):
        C = random_cov(4, rng, df=6)
        ref = relu_four_point_other_plane(C)
        got = NS.relu_four_point(*entries4(C))
        assert abs(got - ref) < 1e-10 * math.sqrt(C[2, 2] * C[3, 3])


def _coincident_closed(pattern, C4):
    """The closed coincident forms of the generated module, fed from a (k, l, a, b) covariance."""
    e = dict(zip(("C_kk", "C_kl", "C_ll", "C_ka", "C_kb", "C_la", "C_lb", "C_aa", "C_ab", "C_bb"),
                 entries4(C4)))
    fn = {"k=l": RELU.I4_relu_kl, "a=k": RELU.I4_relu_ak, "a=b": RELU.I4_relu_ab}[pattern]
    import inspect
    return fn(*[e[name] for name in inspect.signature(fn).parameters])


def _embed(C3, pattern):
    """4×4 covariance of (k, l, a, b) realising the coincidence from three distinct fields."""
    idx = {"k=l": (0, 0, 1, 2), "a=k": (1, 0, 1, 2), "a=b": (0, 1, 2, 2)}[pattern]
    # (k=l): fields (k, a, b); (a=k): fields (l, k, b) so that k = field 1; (a=b): (k, l, a)
    i = np.array(idx)
    return C3[np.ix_(i, i)]


@pytest.mark.parametrize("pattern", ["k=l", "a=k", "a=b"])
def test_relu_quadrature_equals_closed_coincident_forms(pattern):
    """Exact coincidences: the quadrature against the Stein-derived closed forms."""
    rng = np.random.default_rng({"k=l": 1, "a=k": 2, "a=b": 3}[pattern])
    for _ in range(4):
        C3 = random_cov(3, rng)
        C4 = _embed(C3, pattern)
        closed = _coincident_closed(pattern, C4)
        got = NS.relu_four_point(*entries4(C4))
        assert abs(got - closed) < STATED_ACCURACY * math.sqrt(C4[2, 2] * C4[3, 3]), pattern
    # and Monte Carlo of the merged expectation
    u = mc_sample(C4, 400_000, seed=3)
    m, se = mc_mean((u[:, 0] > 0) * (u[:, 1] > 0) * np.maximum(u[:, 2], 0) * np.maximum(u[:, 3], 0))
    assert se < 5e-3 and abs(closed - m) < 4.5 * se


# 30-digit reference: the same polar integral, adaptive tanh-sinh (mpmath) with the
# arc split at every kink of the singular limit and refined geometrically towards them.

def _mp_inner_rr(al, be, Saa, Sbb, Sab, sdet):
    CAA, CBB, CAB = al * al + Saa, be * be + Sbb, al * be + Sab
    rA, rB = mp.sqrt(CAA), mp.sqrt(CBB)
    gX = CAB + al * be
    gA = (CAA * be + al * CAB) / rA if rA > 0 else mp.mpf(0)
    gB = (CBB * al + be * CAB) / rB if rB > 0 else mp.mpf(0)
    t0, tXA, tXB = rA * rB, al * rB, be * rA
    dens = (t0 + tXA + tXB + CAB, t0 - tXA - tXB + CAB, t0 - tXA + tXB - CAB, t0 + tXA - tXB - CAB)
    cX, cA, cB = (gA + gB) / 2, (gX + gB) / 2, (gX + gA) / 2
    j = min(range(4), key=lambda i: sdet ** 2 + dens[i] ** 2)
    lam = (0, -cX, -cA, -cB)[j]
    Om = [2 * mp.atan2(sdet, d) for d in dens]
    val = lam * (sum(Om) - 2 * mp.pi) + cX * Om[1] + cA * Om[2] + cB * Om[3]
    return (sdet + val) / (2 * mp.pi) / mp.sqrt(2 * mp.pi)


def mp_relu_four_point(C, dps=30):
    with mp.workdps(dps):
        c = [[mp.mpf(float(x)) for x in row] for row in C]
        L11 = mp.sqrt(c[0][0])
        det2 = max(c[0][0] * c[1][1] - c[0][1] ** 2, 0)
        root = mp.sqrt(c[0][0] * det2)
        ca = (c[0][2] / L11, (c[1][2] * c[0][0] - c[0][1] * c[0][2]) / root if root > 0 else 0)
        cb = (c[0][3] / L11, (c[1][3] * c[0][0] - c[0][1] * c[0][3]) / root if root > 0 else 0)
        Saa = max(c[2][2] - ca[0] ** 2 - ca[1] ** 2, 0)
        Sbb = max(c[3][3] - cb[0] ** 2 - cb[1] ** 2, 0)
        lim = mp.sqrt(Saa * Sbb)
        Sab = min(max(c[2][3] - ca[0] * cb[0] - ca[1] * cb[1], -lim), lim)
        sdet = mp.sqrt(max(Saa * Sbb - Sab ** 2, 0))
        lo, hi = mp.atan2(mp.sqrt(det2 / c[0][0]), c[0][1] / L11) - mp.pi / 2, mp.pi / 2

        def f(ph):
            al = ca[0] * mp.cos(ph) + ca[1] * mp.sin(ph)
            be = cb[0] * mp.cos(ph) + cb[1] * mp.sin(ph)
            return _mp_inner_rr(al, be, Saa, Sbb, Sab, sdet)
        pts = [lo, hi]
        kinks = [mp.atan2(v[1], v[0]) + mp.pi / 2 for v in (ca, cb)]
        N11 = Sbb * ca[0] ** 2 - 2 * Sab * ca[0] * cb[0] + Saa * cb[0] ** 2
        N22 = Sbb * ca[1] ** 2 - 2 * Sab * ca[1] * cb[1] + Saa * cb[1] ** 2
        N12 = Sbb * ca[0] * ca[1] - Sab * (ca[0] * cb[1] + ca[1] * cb[0]) + Saa * cb[0] * cb[1]
        kinks.append(mp.atan2(N12, (N11 - N22) / 2) / 2 + mp.pi / 2)
        for r in kinks:
            for j in range(-3, 4):
                z = r + j * mp.pi
                if lo < z < hi:
                    pts.append(z)
        pts = sorted(pts)
        fine = []
        for a, b in zip(pts[:-1], pts[1:]):
            fine += [a] + [a + (b - a) * mp.mpf(10) ** -q / 2 for q in range(1, 12)] \
                + [b - (b - a) * mp.mpf(10) ** -q / 2 for q in range(1, 12)]
        fine = sorted(set(fine + [pts[-1]]))
        return float(mp.quad(f, fine) / mp.sqrt(2 * mp.pi))


def _near_singular(kind, eps, rng):
    A = rng.standard_normal((4, 4))
    if kind == "rank2":
        B = rng.standard_normal((4, 2))
        return B @ B.T / 2 + eps * np.diag(rng.uniform(0.5, 1.5, 4))
    if kind == "rank3":
        B = rng.standard_normal((4, 3))
        return B @ B.T / 3 + eps * np.diag(rng.uniform(0.5, 1.5, 4))
    pairs = {"a~k": [(2, 0)], "k~l": [(1, 0)], "a~b": [(3, 2)], "a~k,b~l": [(2, 0), (3, 1)],
             "a~k~b": [(2, 0), (3, 0)], "k~l,a=k,b~k": [(1, 0), (3, 0)],
             "k=l,a~k": [(2, 0)]}[kind]
    for i, j in pairs:
        A[i] = A[j] + math.sqrt(eps) * rng.standard_normal(4)
    exact = {"k~l,a=k,b~k": [(2, 0)], "k=l,a~k": [(1, 0)]}.get(kind, [])
    for i, j in exact:              # exact coincidences: the same row
        A[i] = A[j]
    return A @ A.T / 4


@pytest.mark.parametrize("kind,eps", [("rank2", 1e-10), ("a~k,b~l", 1e-12), ("a~k~b", 1e-9),
                                      ("rank3", 1e-6), ("k~l,a=k,b~k", 1e-8)])
def test_relu_quadrature_meets_stated_accuracy_near_singular(kind, eps):
    # ("k~l,a=k,b~k": a field within 1e-4 of u_k at the end of an arc ≈ π; with 20 nodes per
    # sinh-mapped half, as before December 2026, the error there was 2.5e-10)
    rng = np.random.default_rng(int(-math.log10(eps)) + len(kind))
    for _ in range(2):
        C = _near_singular(kind, eps, rng)
        ref = mp_relu_four_point(C)
        got = NS.relu_four_point(*entries4(C))
        assert abs(got - ref) <= STATED_ACCURACY * math.sqrt(C[2, 2] * C[3, 3])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["rank2", "rank3", "a~k", "k~l", "a~b", "a~k,b~l", "a~k~b",
                                  "k~l,a=k,b~k", "k=l,a~k"])
def test_relu_quadrature_meets_stated_accuracy_ensembles(kind):
    """The accuracy study: 6 covariances per (family, distance to the singular set)."""
    rng = np.random.default_rng(len(kind))
    for eps in (1e-2, 1e-4, 1e-6, 1e-8, 1e-10, 1e-13):
        for _ in range(6):
            C = _near_singular(kind, eps, rng)
            ref = mp_relu_four_point(C)
            got = NS.relu_four_point(*entries4(C))
            assert abs(got - ref) <= STATED_ACCURACY * math.sqrt(C[2, 2] * C[3, 3]), (kind, eps)


def test_relu_quadrature_exactly_singular_covariances_match_monte_carlo():
    """Rank-2 and rank-3 covariances of four distinct fields (no closed form to compare)."""
    rng = np.random.default_rng(77)
    for r in (2, 3):
        B = rng.standard_normal((4, r))
        C = B @ B.T
        u = mc_sample(C, 400_000, seed=r)
        m, se = mc_mean((u[:, 0] > 0) * (u[:, 1] > 0) * np.maximum(u[:, 2], 0)
                        * np.maximum(u[:, 3], 0))
        got = NS.relu_four_point(*entries4(C))
        assert se < 5e-3 * max(1.0, math.sqrt(C[2, 2] * C[3, 3]))
        assert abs(got - m) < 4.5 * se + 1e-12
        assert abs(got - mp_relu_four_point(C)) < STATED_ACCURACY * math.sqrt(C[2, 2] * C[3, 3])


# ---- the sums' route (relu_four_point_sums): index coincidences, vectorised loops --------

def test_polynomial_atan2_coefficients_and_accuracy():
    """atan2_upper: its coefficients are the Chebyshev interpolant they claim to be, and it
    is within 2 ulp of libm (and of a 30-digit atan2) over 15 decades and at signed zeros."""
    with mp.workdps(50):
        tmax = mp.tan(mp.pi / 8) ** 2
        d = len(NS._ATAN_P) - 1
        ts = [tmax / 2 * (1 + mp.cos(mp.pi * (2 * i + 1) / (2 * (d + 1)))) for i in range(d + 1)]
        R = [(mp.atan(mp.sqrt(t)) - mp.sqrt(t)) / (t * mp.sqrt(t)) for t in ts]
        coeffs = mp.lu_solve(mp.matrix([[t ** j for j in range(d + 1)] for t in ts]), mp.matrix(R))
    assert [float(c) for c in coeffs] == list(NS._ATAN_P)
    rng = np.random.default_rng(3)
    y = np.abs(rng.standard_normal(20_000)) * 10.0 ** rng.uniform(-8, 7, 20_000)
    x = rng.standard_normal(20_000) * 10.0 ** rng.uniform(-8, 7, 20_000)
    got = np.array([NS.atan2_upper(a, b) for a, b in zip(y, x)])
    ref = np.arctan2(y, x)
    assert np.max(np.abs(got - ref) / np.spacing(np.abs(ref))) <= 2
    with mp.workdps(30):
        for a, b in zip(y[:200], x[:200]):
            exact = float(mp.atan2(mp.mpf(float(a)), mp.mpf(float(b))))
            assert abs(NS.atan2_upper(a, b) - exact) <= 2 * np.spacing(abs(exact))
    for a in (0.0, 1e-300, 1.0):
        for b in (0.0, -0.0, 1e-300, -1e-300, 2.0, -2.0):
            assert NS.atan2_upper(a, b) == math.atan2(a, b), (a, b)
    # the vectorised relu–relu integrand equals the scalar one to rounding
    al, be = rng.standard_normal(500), rng.standard_normal(500)
    Saa, Sbb = rng.uniform(0, 1, 500), rng.uniform(0, 1, 500)
    Sab = rng.uniform(-1, 1, 500) * np.sqrt(Saa * Sbb)
    Sab[:50] = np.sqrt(Saa * Sbb)[:50]                      # singular S
    sdet = np.sqrt(np.maximum(Saa * Sbb - Sab ** 2, 0.0))
    for args in zip(al, be, Saa, Sbb, Sab, sdet):
        assert abs(NS._inner_relu_relu_simd(*args) - NS.inner_relu_relu(*args)) < 1e-15


def _radial(fn):
    """∫_0^∞ φ(x) fn(x) dx by scipy quad (the kinks of the integrands are at x = 0)."""
    return integrate.quad(lambda x: _phi(x) * fn(x), 0, np.inf, epsabs=1e-14, epsrel=1e-13,
                          limit=200)[0]


@pytest.mark.parametrize("al,be,V", [(0.7, 0.4, 0.5), (0.3, -0.9, 0.2), (1.2, -0.5, 0.0),
                                     (0.5, 0.8, 0.0), (0.0, 0.3, 1.0), (0.9, -2.0, 1e-9),
                                     (0.4, 1e-3, 3.0)])
def test_closed_integrands_match_radial_quadrature(al, be, V):
    """The three closed integrands of the sums (Stein on X) against a quadrature over X of
    the elementary mean-shift formulas: E[relu(X) relu(αX) σ(βX + s)], E[relu(X) relu(A)²]."""
    relu_b = _radial(lambda x: x * al * x * shifted_mean("relu", be * x, V))
    assert abs(NS.inner_coincident_relu(al, be, V) - relu_b) < 1e-12
    erf_b = _radial(lambda x: x * al * x * shifted_mean("erf", be * x, V))
    assert abs(NS.inner_coincident_erf(al, be, V) - erf_b) < 1e-12

    def relu_sq(m):             # E[relu(m + s)²], s ~ N(0, V)
        if V == 0:
            return max(m, 0.0) ** 2
        z = m / math.sqrt(V)
        return (m * m + V) * _Phi(z) + m * math.sqrt(V) * _phi(z)
    # a = b with the field a at (α, V): E[relu(X) relu(αX + s)²]
    sq_ref = _radial(lambda x: x * relu_sq(be * x))
    assert abs(NS.inner_square_relu(be, V) - sq_ref) < 1e-12
    # and the general integrand at the same (singular) conditional covariances
    assert abs(NS.inner_relu_relu(al, be, 0.0, V, 0.0, 0.0) - relu_b) < 1e-12
    assert abs(NS.inner_relu_relu(be, be, V, V, V, 0.0) - sq_ref) < 1e-12


def _grid_cases(p, pk, rng):
    """(name, C) states of p + p* fields: Wishart, random start, converged students, a
    nearly antipodal student pair (the arc nearly π), exact duplicates."""
    n = p + pk
    out = [("wishart", random_cov(n, rng))]
    W = rng.standard_normal((n, 4000))
    out.append(("start", W @ W.T / 4000))
    T = rng.standard_normal((pk, 50))
    S = T[np.arange(p) % pk] + 1e-4 * rng.standard_normal((p, 50))
    W = np.vstack([S, T])
    out.append(("converged", W @ W.T / 50))
    W = rng.standard_normal((n, n + 2))
    W[1] = -W[0] + 0.05 * rng.standard_normal(n + 2)
    out.append(("antipodal", W @ W.T / (n + 2)))
    W = rng.standard_normal((n, n + 2))
    W[p] = W[0]                                     # a teacher equal to a student
    out.append(("duplicate", W @ W.T / (n + 2)))
    return out


def _grid_entry_closed(C, k, l, a, b):
    """The closed coincident form for an index pattern, or None."""
    if a > b:
        a, b = b, a
    e = lambda i, j: C[i, j]                                 # noqa: E731
    if k == l and len({k, a, b}) == 3:
        return RELU.I4_relu_kl(e(k, k), e(k, a), e(k, b), e(a, a), e(a, b), e(b, b))
    if k != l and a == b and a not in (k, l):
        return RELU.I4_relu_ab(e(k, k), e(k, l), e(l, l), e(k, a), e(l, a), e(a, a))
    if k != l and len({a, b} & {k, l}) == 1 and a != b:
        x, y = (a, b) if a in (k, l) else (b, a)
        o = l if x == k else k                               # the other student
        return RELU.I4_relu_ak(e(x, x), e(x, o), e(o, o), e(x, y), e(o, y), e(y, y))
    return None


def test_relu_sums_route_equals_closed_coincident_forms_and_elementwise_route():
    """Every I4 of the sums (relu_four_point_grid) at (4, 2): coincident entries against the
    Stein-derived closed forms (where the three fields are non-singular), the others
    against the elementwise route, to the stated accuracy; power: an integrand off by 1e-9
    is caught at the first coincident entry."""
    rng = np.random.default_rng(29)
    p, pk = 4, 2
    pk_, pl_ = np.triu_indices(p)
    checked = 0
    for name, C in _grid_cases(p, pk, rng):
        grid = NS.relu_four_point_grid(C[None], p, ("relu",))[0]
        n = p + pk
        for q, (k, l) in enumerate(zip(pk_, pl_)):
            for a in range(n):
                for b in range(a, n):
                    scale = math.sqrt(C[a, a] * C[b, b])
                    got = grid[q, a, b]
                    closed = None
                    if name in ("wishart", "start"):
                        closed = _grid_entry_closed(C, k, l, a, b)
                    if closed is not None:
                        assert abs(got - closed) <= STATED_ACCURACY * scale, (name, k, l, a, b)
                        assert abs(got + 1e-9 * scale - closed) > STATED_ACCURACY * scale
                        checked += 1
                    if len({k, l, a, b}) == 4 or (k == l and len({k, a, b}) == 3
                                                  and closed is None):
                        i = np.array([k, l, a, b])
                        ref = NS.relu_four_point(*entries4(C[np.ix_(i, i)]))
                        assert abs(got - ref) <= STATED_ACCURACY * scale, (name, k, l, a, b)
    assert checked > 150


#: Near-singular (4, 2)-type states and the coincident entries the closed forms cannot
#: check there: (name, pattern of the 4x4 covariance, entries (k, l, a, b)).
_HARD_COINCIDENT = [("k~b", (0, 1, 0, 2)), ("k~b", (0, 0, 0, 2)), ("k~l", (0, 1, 0, 2)),
                    ("k~l", (0, 1, 2, 2)), ("antipodal", (0, 1, 0, 1)),
                    ("antipodal", (0, 1, 1, 2))]


def _hard_state(name, rng, eps):
    W = rng.standard_normal((3, 6))
    if name == "k~b":
        W[2] = W[0] + math.sqrt(eps) * rng.standard_normal(6)
    elif name == "k~l":
        W[1] = W[0] + math.sqrt(eps) * rng.standard_normal(6)
    else:
        W[1] = -W[0] + 0.01 * rng.standard_normal(6)
    return W @ W.T / 6


@pytest.mark.parametrize("name,idx", _HARD_COINCIDENT)
def test_relu_sums_route_coincident_entries_near_singular_match_mpmath(name, idx):
    """Coincident entries where a third field is within 1e-8 of the pair (sinh-mapped
    closed integrand) or the pair is nearly antipodal (the arc ≈ π: the rule for the
    entire factor α): against the 30-digit reference."""
    rng = np.random.default_rng(len(name) + sum(idx))
    C3 = _hard_state(name, rng, 1e-8)
    k, l, a, b = idx
    p = 2                                              # fields 0, 1 students, 2 a teacher
    grid = NS.relu_four_point_grid(C3[None], p, ("relu",))[0]
    q = {(0, 0): 0, (0, 1): 1, (1, 1): 2}[(k, l)]
    i = np.array(idx)
    ref = mp_relu_four_point(C3[np.ix_(i, i)])
    assert abs(grid[q, a, b] - ref) <= STATED_ACCURACY * math.sqrt(C3[a, a] * C3[b, b])


def test_relu_sums_erf_coincident_entries_match_two_dimensional_quadrature():
    """ReLU student, erf teacher: the coincident entries (a student of the pair with an erf
    field) against a scipy 2-D quadrature of the definition in the pair's polar plane
    (erf's conditional mean closed, no Stein)."""
    rng = np.random.default_rng(23)
    C = random_cov(3, rng)                             # fields 0, 1 students, 2 an erf teacher
    grid = NS.relu_four_point_grid(C[None], 2, ("erf",))[0]
    for k, l, x in ((0, 1, 0), (0, 1, 1), (0, 0, 0), (1, 1, 1)):
        if k == l:                 # u_k = s x_1, u_b = c_b x_1 + N(0, V)
            s = math.sqrt(C[k, k])
            cb = C[k, 2] / s
            V = C[2, 2] - cb * cb

            def inner(r, ph):
                return (r * math.exp(-r * r / 2) / (2 * math.pi) * s * r * math.cos(ph)
                        * math.erf(cb * r * math.cos(ph) / math.sqrt(2 * (1 + V))))
            lo, hi = -math.pi / 2, math.pi / 2
        else:                      # (u_k, u_l) = L x, u_b = c·x + N(0, V)
            pair = [k, l]
            L = np.linalg.cholesky(C[np.ix_(pair, pair)])
            c = np.linalg.solve(L, C[pair, 2])
            V = C[2, 2] - c @ c
            row = L[pair.index(x)]
            lo, hi = math.atan2(L[1, 1], L[1, 0]) - math.pi / 2, math.pi / 2

            def inner(r, ph):
                e = np.array([math.cos(ph), math.sin(ph)])
                return (r * math.exp(-r * r / 2) / (2 * math.pi) * r * (row @ e)
                        * math.erf(r * (c @ e) / math.sqrt(2 * (1 + V))))
        ref = integrate.dblquad(inner, lo, hi, 0, 12, epsabs=1e-13, epsrel=1e-12)[0]
        q = {(0, 0): 0, (0, 1): 1, (1, 1): 2}[(k, l)]
        assert abs(grid[q, x, 2] - ref) < 1e-10, (k, l, x, grid[q, x, 2], ref)


def test_relu_sums_do_not_depend_on_threads_or_driver(monkeypatch):
    """Same numbers with one or two threads, the serial or the parallel driver, and equal to
    the weighted sum of the grid's values."""
    import numba
    rng = np.random.default_rng(31)
    p, pk = 5, 2
    C = np.stack([random_cov(p + pk, rng) for _ in range(6)])
    w = rng.standard_normal((6, p + pk))
    w[0, 3] = 0.0                                       # a zero weight skips its terms
    monkeypatch.setattr(NS, "PARALLEL_MIN_EVALUATIONS", 0)
    threads = numba.get_num_threads()
    outs = []
    try:
        for t in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(t)
            outs.append(NS.relu_four_point_sums(C, w, p, ("relu",)))
    finally:
        numba.set_num_threads(threads)
    monkeypatch.setattr(NS, "PARALLEL_MIN_EVALUATIONS", 10 ** 18)
    outs.append(NS.relu_four_point_sums(C, w, p, ("relu",)))
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])
    grid = NS.relu_four_point_grid(C, p, ("relu",))
    n = p + pk
    tri = np.triu(np.ones((n, n)))
    mult = tri * (2.0 - np.eye(n))
    ref = np.einsum("zqab,za,zb,ab->zq", grid, w, w, mult)
    pk_, pl_ = np.triu_indices(p)
    assert np.allclose(outs[0][:, pk_, pl_], ref, rtol=1e-13, atol=1e-15)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["start", "converged", "antipodal", "duplicate", "wishart"])
def test_relu_sums_route_meets_stated_accuracy_on_every_entry(name):
    """Every I4 of the sums at (2, 2) states against the 30-digit reference (30 entries)."""
    rng = np.random.default_rng(37)
    C = dict(_grid_cases(2, 2, rng))[name]
    grid = NS.relu_four_point_grid(C[None], 2, ("relu",))[0]
    for q, (k, l) in enumerate(zip(*np.triu_indices(2))):
        for a in range(4):
            for b in range(a, 4):
                i = np.array([k, l, a, b])
                ref = mp_relu_four_point(C[np.ix_(i, i)])
                assert abs(grid[q, a, b] - ref) <= STATED_ACCURACY * math.sqrt(C[a, a] * C[b, b]), \
                    (name, k, l, a, b)


# ---- ReLU student with erf teachers ----------------------------------------------------

@pytest.mark.parametrize("sa,sb", [("erf", "erf"), ("relu", "erf"), ("erf", "relu")])
def test_relu_student_erf_teacher_quadrature_matches_monte_carlo(sa, sb):
    rng = np.random.default_rng(5)
    for idx in ((0, 1, 2, 3), (0, 0, 2, 3), (0, 1, 2, 2), (0, 1, 0, 3)):
        C = random_cov(4, rng)
        k, l, a, b = idx
        if sa == "erf" and a < 2 or sb == "erf" and b < 2:
            continue       # an erf field is a teacher field, never a student one
        i = np.array(idx)
        C4 = C[np.ix_(i, i)]
        u = mc_sample(C4, 1_000_000, seed=11)
        m, se = mc_mean((u[:, 0] > 0) * (u[:, 1] > 0) * np_act(sa)(u[:, 2]) * np_act(sb)(u[:, 3]))
        assert se < 3e-3
        got = NS.relu_four_point(*entries4(C4), sigma_a=sa, sigma_b=sb)
        assert abs(got - m) < 4.5 * se, (idx, sa, sb)


def test_relu_student_erf_quadrature_against_nested_quadrature():
    """Deterministic second route for the erf inners: condition on (u_a, u_b)."""
    rng = np.random.default_rng(19)
    C = random_cov(4, rng)
    for sa, sb in (("erf", "erf"), ("relu", "erf")):
        got = NS.relu_four_point(*entries4(C), sigma_a=sa, sigma_b=sb)
        # E[1{u_k>0}1{u_l>0} | u_a, u_b] = Φ₂(...): 2-D Gauss–Hermite in the (a, b) plane
        x, w = np.polynomial.hermite_e.hermegauss(120)
        w = w / math.sqrt(2 * math.pi)
        M = np.linalg.cholesky(C[2:, 2:])
        Bm = C[:2, 2:] @ np.linalg.inv(C[2:, 2:])
        V = C[:2, :2] - Bm @ C[2:, :2]
        sk, sl = math.sqrt(V[0, 0]), math.sqrt(V[1, 1])
        Y1, Y2 = np.meshgrid(x, x, indexing="ij")
        Wt = np.outer(w, w)
        uab = np.einsum("ij,jab->iab", M, np.stack([Y1, Y2]))
        mkl = np.einsum("ij,jab->iab", Bm, uab)
        phi2 = _owen_bvn(mkl[0] / sk, mkl[1] / sl, V[0, 1] / (sk * sl))
        ref = np.sum(Wt * phi2 * np_act(sa)(uab[0]) * np_act(sb)(uab[1]))
        tol = 1e-8 if sa == sb == "erf" else 2e-5    # the relu kink limits Gauss–Hermite
        assert abs(got - ref) < tol, (sa, sb, got, ref)


# ---- kernels: shapes, broadcasting, bad input ------------------------------------------

def test_kernels_broadcast_and_reject_bad_input():
    C = random_cov(4, np.random.default_rng(0))
    e = list(entries4(C))
    e[0] = np.full((3, 1), C[0, 0])
    e[7] = np.full((1, 5), C[2, 2])
    out = NS.relu_four_point(*e)
    assert out.shape == (3, 5) and np.allclose(out, out[0, 0], rtol=1e-15)
    assert ERF.I4_ss(*e).shape == (3, 5)
    assert RELU.J2(1.0, 0.2, 1.0).shape == ()
    with pytest.raises(ValueError, match="sigma_a"):
        NS.relu_four_point(*entries4(C), sigma_a="tanh")
    bad = list(entries4(C))
    bad[2] = 0.0
    with pytest.raises(ValueError, match="C_kk and C_ll"):
        NS.relu_four_point(*bad)
    bad[2] = np.nan
    with pytest.raises(ValueError, match="finite"):
        NS.relu_four_point(*bad)
    with pytest.raises(ValueError, match="activation"):
        S.activation_key("tanh")


def test_generated_modules_are_what_the_renderer_writes():
    from symquad.codegen.special_render import SPECIAL_BUILTINS, render_special_module
    from symquad.kernel_files import GENERATED_DIR
    for f, t in SPECIAL_BUILTINS:
        text = (GENERATED_DIR / (NS.special_module_name(f, t) + ".py")).read_text(encoding="utf-8")
        assert text == render_special_module(f, t)
    assert RELU.quadrature == ("I4_ss", "I4_st", "I4_tt") and ERF.quadrature == ()
    assert RELU_ERF.quadrature == ("I4_ss", "I4_st", "I4_tt")


def test_polynomial_pairs_are_rendered_into_the_cache(isolated_cache):
    kern = NS.special_kernels("relu", (0, 1, 0, 1))
    assert isolated_cache.exists() and len(list(isolated_cache.glob("special_*.py"))) == 1
    C = random_cov(4, np.random.default_rng(2))
    assert np.isfinite(kern.I4_ss(*entries4(C))) and np.isfinite(kern.I4_tt(*entries4(C)))
    with pytest.raises(NotImplementedError, match="not implemented"):
        kern.I4_st(*entries4(C))
    again = NS.special_kernels("relu", (0, 1, 0, 1))        # from the cache
    assert again.I2_tt(1.0, 0.3, 2.0) == kern.I2_tt(1.0, 0.3, 2.0)

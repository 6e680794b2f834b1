"""The law of the replica mean of a Gaussian quadratic form, and the mean-deviation test
that uses it (symquad.numeric.quadratic_law, studies.validation._with_predicted_law).

Second routes: Monte Carlo of ``bᵀζ + ½(ζᵀAζ − tr AΣ)`` for the cumulants and the tail
probabilities of the mean of R replicas; the normal law where ``A = 0``.  The test's level
on a skewed law: a synthetic χ²-like sample with known mean (skewness 2.3, the largest
measured at the z³ − 3z floor), where Student's t rejects a correct mean several times
above its level and the combined test does not; its power against a shifted mean.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm, t as student

from symquad.numeric.quadratic_law import quadratic_law

R = 32


def _sample(b, A, S, n, rng, v=0.0):
    """``n × R`` draws of ``Y = bᵀζ + ½(ζᵀAζ − tr AS) + e`` (the definition)."""
    z = rng.multivariate_normal(np.zeros(len(b)), S, size=(n, R))
    y = z @ b + 0.5 * (np.einsum("...i,ij,...j->...", z, A, z) - np.trace(A @ S))
    return y + (rng.normal(0.0, math.sqrt(v), size=y.shape) if v else 0.0)


def _law_case():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4, 4))
    S = X @ X.T / 4
    A = np.array([[3.0, 0.5, 0, 0], [0.5, 1.0, 0, 0], [0, 0, 0.5, 0.2], [0, 0, 0.2, -0.3]])
    return np.array([0.3, 0.0, -0.1, 0.1]), A, S, 0.01


def test_cumulants_match_monte_carlo():
    b, A, S, v = _law_case()
    law = quadratic_law(b, A, S, v=v)
    y = _sample(b, A, S, 6000, np.random.default_rng(1), v).ravel()    # 192000 draws
    k2 = y.var()
    k3 = np.mean((y - y.mean()) ** 3)
    # precision first: the Monte Carlo standard errors of the mean, variance, third moment
    n = y.size
    se_mean, se_k2 = math.sqrt(k2 / n), math.sqrt((np.mean((y - y.mean()) ** 4) - k2 ** 2) / n)
    se_k3 = math.sqrt(np.var((y - y.mean()) ** 3) / n)
    assert se_k2 < 0.02 * k2 and se_k3 < 0.05 * abs(law.cumulant(3))
    assert abs(y.mean()) < 4 * se_mean
    assert abs(k2 - law.cumulant(2)) < 4 * se_k2
    assert abs(k3 - law.cumulant(3)) < 4 * se_k3
    # closed forms in Σ, b, A (a second route to the eigen-decomposition's)
    AS = A @ S
    assert law.cumulant(2) == pytest.approx(b @ S @ b + 0.5 * np.trace(AS @ AS) + v, rel=1e-10)
    assert law.cumulant(3) == pytest.approx(3 * b @ S @ A @ S @ b + np.trace(AS @ AS @ AS),
                                            rel=1e-10)


def test_tails_of_the_replica_mean_match_monte_carlo():
    b, A, S, v = _law_case()
    law = quadratic_law(b, A, S, v=v)
    m = _sample(b, A, S, 40000, np.random.default_rng(2), v).mean(1)
    sd = law.std / math.sqrt(R)
    assert abs(m.std() / sd - 1) < 0.015
    for k in (-3.0, -2.0, 2.0, 3.0):
        upper = k > 0
        mc = np.mean(m >= k * sd) if upper else np.mean(m <= k * sd)
        se = math.sqrt(max(mc, 1e-5) * (1 - mc) / m.size)
        pred = law.mean_tail(k * sd, R, upper=upper)
        # at 3 s.d. the law is visibly skewed: the normal tail would be off by 3x
        assert abs(mc - pred) < 4 * se + 0.02 * pred, (k, mc, pred, se)
    assert law.mean_tail(3 * sd, R) > 2.5 * norm.sf(3.0)       # power of the check
    assert law.mean_p_value(0.0, R) == pytest.approx(1.0)


def test_without_curvature_the_law_is_normal():
    b, _, S, v = _law_case()
    law = quadratic_law(b, np.zeros((4, 4)), S, v=v)
    sd = math.sqrt((b @ S @ b + v) / R)
    for k in (-4.0, -1.5, 2.5, 5.0):
        assert law.mean_tail(k * sd, R, upper=k > 0) == pytest.approx(norm.sf(abs(k)), rel=1e-6)


def test_bad_input_is_refused_by_name():
    b, A, S, _ = _law_case()
    with pytest.raises(ValueError, match="v must be a finite variance"):
        quadratic_law(b, A, S, v=-1.0)
    with pytest.raises(ValueError, match="must be finite"):
        quadratic_law(b * np.nan, A, S)
    with pytest.raises(ValueError, match="R must be >= 1"):
        quadratic_law(b, A, S).mean_tail(0.1, 0)


# the level of the mean-deviation test on a skewed law --------------------------------------
LAM = np.array([1.0, 0.5])          # Y = ½ Σ λ_i (u_i² − 1): skewness 2.28, mean 0


def _critical_means(law, alpha):
    """The replica means where the law's two-sided test at level alpha rejects."""
    hi = brentq(lambda y: law.mean_tail(y, R, True) - alpha / 2, 1e-9, 20 * law.std)
    lo = brentq(lambda y: law.mean_tail(y, R, False) - alpha / 2, -20 * law.std, -1e-9)
    return lo, hi


def _rejections(Y, law, alpha):
    m = Y.mean(1)
    t = m / (Y.std(1, ddof=1) / math.sqrt(R))
    student_rejects = np.abs(t) > student.isf(alpha / 2, R - 1)
    lo, hi = _critical_means(law, alpha)
    law_rejects = (m > hi) | (m < lo)
    return student_rejects, law_rejects, student_rejects & law_rejects


def test_level_on_a_skewed_law_student_fails_it_the_combined_test_holds():
    """At α = 0.001 (the verdict tests at α/(2·times) ≈ 2.5e-5 per time; a smaller α is
    where the skew matters more): Student's t falsely rejects a correct mean 11x above its
    level (measured 0.0112), nearly all on the low side (a sample missing the right tail);
    the predicted law alone holds it (0.00115), the combined test too (0.0007)."""
    alpha, n = 1e-3, 20000
    law = quadratic_law(np.zeros(2), np.diag(LAM), np.eye(2))
    assert law.cumulant(3) / law.cumulant(2) ** 1.5 > 2.0                # skewed indeed
    u = np.random.default_rng(3).normal(size=(n, R, 2))
    Y = 0.5 * ((u ** 2 - 1) * LAM).sum(-1)
    old, by_law, new = _rejections(Y, law, alpha)
    se = math.sqrt(alpha * (1 - alpha) / n)                             # 2.2e-4
    assert se < alpha / 4                                               # precision first
    assert old.mean() > alpha + 10 * se, old.mean()                     # the defect is seen
    assert abs(by_law.mean() - alpha) < 4 * se, by_law.mean()           # the law's level
    assert new.mean() <= alpha + 3 * se, new.mean()                     # the combined test


def test_power_against_a_shifted_mean():
    """A mean shifted by ±6 predicted s.e. is rejected in nearly every sample."""
    alpha, n = 1e-3, 4000
    law = quadratic_law(np.zeros(2), np.diag(LAM), np.eye(2))
    sd = law.std / math.sqrt(R)
    u = np.random.default_rng(4).normal(size=(n, R, 2))
    Y = 0.5 * ((u ** 2 - 1) * LAM).sum(-1)
    for shift in (6 * sd, -6 * sd):
        assert _rejections(Y + shift, law, alpha)[2].mean() > 0.9, shift
    assert _rejections(Y, law, alpha)[2].mean() < 0.01


def test_the_verdict_uses_both_tests_where_the_law_applies():
    """studies.validation._with_predicted_law on samples of the skewed law: a sample
    whose Student t rejects falsely (low mean, low s.e.) passes the combined test; a
    shifted one fails it; the z it returns is the Student-t-equivalent of the larger
    p-value, and the s.e. the larger of the two."""
    from symquad.studies.validation import _with_predicted_law
    N = 400
    law = quadratic_law(np.zeros(2), np.diag(LAM), np.eye(2))
    # a fake Fluctuations: risk gradient 0, Hessian diag(λ), Σ = I (ε − ε_ODE = Y/N)
    fl = SimpleNamespace(risk_gradient=np.zeros((2, 2)), covariance=np.stack([np.eye(2)] * 2),
                         risk_hessian_at=lambda idx: np.stack([np.diag(LAM)] * len(idx)))
    rng = np.random.default_rng(5)
    u = rng.normal(size=(20000, R, 2))
    Y = 0.5 * ((u ** 2 - 1) * LAM).sum(-1)
    t_stat = Y.mean(1) / (Y.std(1, ddof=1) / math.sqrt(R))
    crit = student.isf(1e-3 / 2, R - 1)
    # a false rejection of Student's t: a low mean with a low s.e. (the least extreme mean
    # among them; docs/benchmarks.md: the z^3 - 3z floor's false FAILs, t = -5 to -6)
    false = np.nonzero(t_stat < -crit)[0]
    low = Y[false[np.argmax(Y[false].mean(1))]]
    sd = law.std / math.sqrt(R)
    for sample, should_reject in ((low, False), (Y[0] + 8 * sd, True)):
        d = sample / N                                      # ε − ε_ODE − c/N per replica
        mean_dev = np.full(2, d.mean())
        se = np.full(2, d.std(ddof=1) / math.sqrt(R))
        z = np.abs(mean_dev) / se
        z2, se2, use = _with_predicted_law(z, se, fl, np.array([True, False]), 2, N, R,
                                           mean_dev, np.zeros(2))
        assert use.tolist() == [True, False]
        assert z2[1] == z[1] and se2[1] == se[1]            # Student's t alone elsewhere
        p = max(2 * student.sf(z[0], R - 1), law.mean_p_value(N * mean_dev[0], R))
        assert z2[0] == pytest.approx(student.isf(p / 2, R - 1), rel=1e-9)
        assert se2[0] == pytest.approx(max(se[0], sd / N), rel=1e-12)
        assert (z2[0] > crit) == should_reject, (z[0], z2[0])
    assert np.abs(low.mean() / (low.std(ddof=1) / math.sqrt(R))) > crit   # Student did

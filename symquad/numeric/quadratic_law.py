r"""The law of the mean of replicas of a Gaussian quadratic form (a generalised χ²).

To second order in the linear-noise expansion (docs/derivation.md §8.3, §8.3a) one
replica's finite-N risk deviation is

.. math::  Y = N(ε − ε_{ODE}) − c_ε ≈ bᵀζ + ½(ζᵀAζ − \operatorname{tr} AΣ),
           \qquad ζ \sim N(0, Σ),\; b = \sqrt N ∇ε,\; A = ∇²ε ,

a *generalised χ²* variable: with ``Σ = LLᵀ`` and ``LᵀAL = V diag(λ) Vᵀ``,
``β = VᵀLᵀb`` and ``u ~ N(0, I)``,

.. math::  Y = \sum_i β_i u_i + ½ λ_i (u_i^2 − 1) (+ e,\; e \sim N(0, v)) ,

whose cumulant generating function is closed form (each term a non-central χ²₁):

.. math::  K(s) = \sum_i \Big[−½\log(1 − sλ_i) − ½ sλ_i + \frac{s^2 β_i^2}{2(1 − sλ_i)}\Big]
           + ½ v s^2 ,

``K'(s) = Σ_i [½λ_i²s/d_i + sβ_i²(2 − sλ_i)/(2d_i²)] + vs`` and
``K''(s) = Σ_i [λ_i²/(2d_i²) + β_i²/d_i³] + v`` with ``d_i = 1 − sλ_i``; so
``κ₂ = bᵀΣb + ½ tr (AΣ)² + v`` and ``κ₃ = 3 bᵀΣAΣb + tr (AΣ)³`` (Mathai & Provost 1992,
*Quadratic forms in random variables*, ch. 3).  The mean ``Ȳ`` of ``R`` independent
replicas has ``K_R(s) = R K(s/R)``.  Its tail probabilities come from the
Lugannani–Rice saddlepoint formula (Lugannani & Rice 1980; Butler 2007, *Saddlepoint
approximations with applications*, §1.2):

.. math::  P(Ȳ ≥ y) ≈ 1 − Φ(w) + φ(w)(1/u − 1/w), \quad K'(τ) = y,\;
           w = \operatorname{sgn}(τ)\sqrt{2R(τy − K(τ))},\; u = τ\sqrt{R K''(τ)} ,

relative error ``O(R^{-3/2})`` uniformly in the tail (the skewness ``κ₃/κ₂^{3/2}/√R``
of the mean is taken exactly, not by a normal or Student approximation).  Checked
against simulation (tests/test_quadratic_law.py).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["QuadraticLaw", "quadratic_law"]

#: Relative size below which an eigenvalue of Σ or of LᵀAL is treated as zero.
_TINY = 1e-12
#: ``|w|`` below which the saddlepoint formula is replaced by its normal limit (it is
#: ``0/0`` at the mean; the tails the tests use are far from it).
_NEAR_MEAN = 1e-4


class QuadraticLaw:
    """``Y = Σ_i β_i u_i + ½λ_i(u_i² − 1) + e`` (module docstring): mean 0.

    Attributes
    ----------
    lam, beta : ndarray (m,)
    v : float
        Variance of the independent Gaussian part ``e``.
    """

    def __init__(self, lam, beta, v=0.0):
        self.lam = np.asarray(lam, float)
        self.beta = np.asarray(beta, float)
        self.v = float(v)
        scale = float(np.max(np.abs(self.lam), initial=0.0))
        self._hi = 1.0 / float(self.lam.max()) if self.lam.size and self.lam.max() > \
            _TINY * scale else math.inf
        self._lo = 1.0 / float(self.lam.min()) if self.lam.size and self.lam.min() < \
            -_TINY * scale else -math.inf

    # cumulants ---------------------------------------------------------------------
    def cumulant(self, r: int) -> float:
        """``κ_r`` of one ``Y`` for r = 2, 3, 4 (``κ_r = 2^{r−1}(r−1)!/2^r Σλ^r + r!/2
        Σβ²λ^{r−2}``, the non-central χ²₁ cumulants)."""
        lam, b2 = self.lam, self.beta ** 2
        if r == 2:
            return float(0.5 * np.sum(lam ** 2) + np.sum(b2) + self.v)
        if r == 3:
            return float(np.sum(lam ** 3) + 3.0 * np.sum(b2 * lam))
        if r == 4:
            return float(3.0 * np.sum(lam ** 4) + 12.0 * np.sum(b2 * lam ** 2))
        raise ValueError(f"r must be 2, 3 or 4, got {r!r}")

    @property
    def std(self) -> float:
        """Standard deviation of one ``Y``."""
        return math.sqrt(max(self.cumulant(2), 0.0))

    def _K(self, s):
        d = 1.0 - s * self.lam
        return float(np.sum(-0.5 * np.log(d) - 0.5 * s * self.lam
                            + 0.5 * s * s * self.beta ** 2 / d) + 0.5 * self.v * s * s)

    def _K1(self, s):
        d = 1.0 - s * self.lam
        return float(np.sum(0.5 * self.lam ** 2 * s / d
                            + s * self.beta ** 2 * (2.0 - s * self.lam) / (2.0 * d * d))
                     + self.v * s)

    def _K2(self, s):
        d = 1.0 - s * self.lam
        return float(np.sum(0.5 * self.lam ** 2 / d ** 2 + self.beta ** 2 / d ** 3) + self.v)

    # the mean of R replicas ----------------------------------------------------------
    def _saddle(self, y):
        """``τ`` with ``K'(τ) = y`` (K' increases on the domain); None beyond the support."""
        from scipy.optimize import brentq      # lazy: scipy
        if y == 0.0:
            return 0.0
        edge = self._hi if y > 0 else self._lo
        if math.isfinite(edge):
            far = edge * (1.0 - 1e-13)
        else:                               # grow the bracket until K' passes y
            far = math.copysign(1.0, y) / max(self.cumulant(2), 1e-300)
            for _ in range(200):
                if (self._K1(far) - y) * math.copysign(1.0, y) > 0:
                    break
                far *= 2.0
        if (self._K1(far) - y) * math.copysign(1.0, y) <= 0:
            return None                     # y is beyond the support of Y
        lo, hi = (0.0, far) if y > 0 else (far, 0.0)
        return brentq(lambda s: self._K1(s) - y, lo, hi, xtol=1e-300, rtol=1e-14,
                      maxiter=500)

    def mean_tail(self, y: float, R: int, upper: bool = True) -> float:
        """``P(Ȳ ≥ y)`` (``upper``) or ``P(Ȳ ≤ y)`` for the mean of ``R`` replicas."""
        from scipy.stats import norm           # lazy: scipy
        if R < 1:
            raise ValueError(f"R must be >= 1, got {R!r}")
        k2 = self.cumulant(2)
        if not k2 > 0:
            return float((y <= 0) if upper else (y >= 0))
        tau = self._saddle(float(y))
        if tau is None:                     # beyond the support: impossible
            return 0.0 if (y > 0) == upper else 1.0
        arg = max(2.0 * R * (tau * y - self._K(tau)), 0.0)
        w = math.copysign(math.sqrt(arg), tau)
        if abs(w) < _NEAR_MEAN:
            upper_p = float(norm.sf(y / math.sqrt(k2 / R)))
        else:
            u = tau * math.sqrt(R * self._K2(tau))
            upper_p = float(norm.sf(w) + norm.pdf(w) * (1.0 / u - 1.0 / w))
        upper_p = min(max(upper_p, 0.0), 1.0)
        return upper_p if upper else 1.0 - upper_p

    def mean_p_value(self, y: float, R: int) -> float:
        """Two-sided ``p = 2 min(P(Ȳ ≥ y), P(Ȳ ≤ y))`` of an observed replica mean ``y``."""
        return float(min(1.0, 2.0 * self.mean_tail(y, R, upper=y >= 0)))


def quadratic_law(b, A, S, v=0.0) -> QuadraticLaw:
    """The law of ``Y = bᵀζ + ½(ζᵀAζ − tr AS) + e``, ``ζ ~ N(0, S)``, ``e ~ N(0, v)``.

    Parameters
    ----------
    b : ndarray (n,)
    A : ndarray (n, n)
        Symmetric (symmetrised here).
    S : ndarray (n, n)
        Covariance (symmetric positive semi-definite; negative eigenvalues from rounding
        are set to zero).
    v : float
        Variance of an independent Gaussian part (>= 0).

    Returns
    -------
    QuadraticLaw
        With ``Σ = LLᵀ``, ``L = U diag(√s)``: ``λ`` the eigenvalues of ``LᵀAL`` and
        ``β = VᵀLᵀb`` (module docstring).
    """
    b = np.asarray(b, float)
    A = np.asarray(A, float)
    S = np.asarray(S, float)
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(A)) and np.all(np.isfinite(S))):
        raise ValueError("b, A and S must be finite")
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError(f"v must be a finite variance >= 0, got {v!r}")
    s, U = np.linalg.eigh(0.5 * (S + S.T))
    s = np.where(s > _TINY * max(float(s.max(initial=0.0)), 0.0), s, 0.0)
    L = U * np.sqrt(s)
    lam, V = np.linalg.eigh(L.T @ (0.5 * (A + A.T)) @ L)
    beta = V.T @ (L.T @ b)
    return QuadraticLaw(lam, beta, v)

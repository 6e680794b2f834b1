r"""Hessian of the population risk in weight space, reduced exactly to a finite problem.

Reduction
---------
Let ``U ⊂ R^N`` be the span of the student and teacher rows (dimension ``r``)
and ``E`` (N×r) an orthonormal basis of it.  Write ``W = √N X Eᵀ`` and
``W* = √N Y Eᵀ`` with ``X`` (p×r), ``Y`` (p*×r) effective coordinates; then
``Q = XXᵀ``, ``ρ = XYᵀ``, ``T = YYᵀ`` and ``ε(W) = ε(Q, ρ, T)``.  For a weight
perturbation ``V = V_∥ + V_⊥`` (rows in ``U`` and in ``U^⊥``):

* ``V_∥ = Z Eᵀ`` gives ``∂²ε/∂W² [V_∥, V_∥] = (1/N) ∂²ε/∂X² [Z, Z]``: a
  ``p r × p r`` block, the Hessian of the reduced risk ``ε(XXᵀ, XYᵀ, YYᵀ)``;
* ``V_⊥`` with rows ``c_k u`` (``u ∈ U^⊥`` a unit vector) is, by rotation
  invariance, the same as adding one more column to ``X`` that is zero at the
  point; its Hessian is a ``p×p`` block ``H_⊥``, repeated for each of the
  ``N − r`` orthogonal directions;
* the two do not couple (checked exactly here: the mixed block is zero).

So the ``p·N`` eigenvalues of ``∂²ε/∂W²`` are ``eig(H_∥)/N`` and
``eig(H_⊥)/N`` with multiplicity ``N − r``.  For σ(z)=z² the quadratic form is

.. math::
    N\,∂²ε[V,V] = \big(\tfrac{2}{p}\operatorname{tr}XZᵀ\big)^2
      + \tfrac{2}{p^2}\operatorname{tr}(ZᵀX + XᵀZ)^2
      + \tfrac{2}{p}\operatorname{tr}[(aI + 2m) ZᵀZ],

with ``m = XᵀX/p − YᵀY/p*``, ``a = tr m``, hence ``N H_⊥ = (2a/p) I + (4/p²) Q``.
The blocks here are computed from the risk that :func:`symquad.derive`
derives (chain rule through ``Q = XXᵀ``, ``ρ = XYᵀ``), not from this formula;
the closed forms in :func:`spectrum_formulas` come from it and are checked
against the exact blocks in the tests.

Critical points (T = I)
-----------------------
* ``"origin"``: ``W = 0`` (``r = p*``);
* ``"plateau"``: the critical point of the *risk* with ``ρ = 0``: rows of ``W``
  orthogonal to the teacher, ``Q = q I`` with ``q`` stationary for
  ``ε(qI, 0, I)`` (``q = p/(p+2)``; ``r = p + p*``, needs ``N >= p + p*``).  This
  is the plateau of gradient flow (η → 0); the ODE's plateau with the η² term
  (:mod:`symquad.symbolic.fixed_points`) has a larger ``q`` and is *not* a
  critical point of the risk;
* ``"minimum"``: for ``p >= p*`` a zero-risk point ``X = √(p/p*) S``,
  ``SᵀS = I``; for ``p < p*`` the best rank-``p`` fit ``X = √c R``, ``RRᵀ = I``
  with ``c`` stationary for the risk (``r = p*``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import sympy as sp
from sympy.polys.matrices import DomainMatrix

from ..applicability import check, zero_risk_reason
from ..spec import Model, check_model
from ..stages import require_known_structure
from ..spec import require
from .derive import derive

__all__ = [
    "POINTS", "HessianBlocks", "HessianSpectrum", "effective_point", "hessian_blocks",
    "hessian_spectrum",
    "spectrum_formulas", "count_formulas", "P_SYM", "P_STAR_SYM", "N_SYM",
]

POINTS = ("origin", "plateau", "minimum")

#: Symbols of the closed forms.
P_SYM = sp.Symbol("p", positive=True, integer=True)
P_STAR_SYM = sp.Symbol("p_star", positive=True, integer=True)
N_SYM = sp.Symbol("N", positive=True, integer=True)


#: Largest p and p* of the exact Hessian reduction.  Its cost is the explicit
#: risk in the p(p+1)/2 + p p* entry symbols, exact Hessians and eigenvalues;
#: measured on a shared 2-core machine (all three points): p=4, p*=2: 3 s;
#: p=6, p*=2: 15 s; it roughly doubles with each unit of p.
MAX_HESSIAN_WIDTH = 10


def _check(m, point):
    check_model(m, "m")
    if not isinstance(point, str) or point not in POINTS:
        raise ValueError(f"point must be one of {POINTS}, got {point!r}")
    check(m, "hessian_spectrum", "hessian")
    if not m.is_quadratic:
        raise ValueError(
            "the weight-space Hessian reduction is derived for σ(z) = c z² (+ c0); "
            f"the model has activation {m.activation_str!r}")
    if point == "minimum" and m.p >= m.p_star and zero_risk_reason(m):
        raise ValueError(f"hessian_spectrum at the minimum: {zero_risk_reason(m)} "
                         f"(model {m!r})")
    if max(m.p, m.p_star) > MAX_HESSIAN_WIDTH:
        raise ValueError(
            f"the exact Hessian reduction needs p and p_star in [1, {MAX_HESSIAN_WIDTH}] "
            f"(cost roughly doubles with each unit of p: p=6, p*=2 takes ~15 s, p=10 several "
            f"minutes); got p={m.p}, p_star={m.p_star}")


def _risk_key(m: Model) -> tuple:
    """What the risk depends on: widths, activations and readouts (others refused)."""
    require_known_structure(m, "the cached risk of the Hessian analyses",
                            ("p", "p_star", "activation", "teacher_activation", "constraint",
                             "lr_readout"))
    return (m.p, m.p_star, m.activation, m.teacher_activation, m.readout, m.teacher_readout)


@lru_cache(maxsize=None)
def _derived_risk(p, p_star, activation, teacher_activation, readout, teacher_readout):
    eq = derive(Model(p=p, p_star=p_star, lr=1, activation=activation,
                      teacher_activation=teacher_activation, readout=readout,
                      teacher_readout=teacher_readout))
    risk = eq.explicit()[0]
    Q, rho, T = eq.entry_symbols
    return risk, Q, rho, T


def _risk_function(m: Model):
    r"""The objective ``L = ε + (λ/2) tr Q`` (explicit, entry symbols) and its symbols.

    ``ε`` is the risk that :func:`symquad.derive` derives for the model's
    activations and readouts; ``(λ/2) tr Q = (λ/2N)‖W‖²`` is the weight decay,
    whose gradient flow is the O(η) part of the dynamics (docs/model.md §8.5).
    """
    risk, Q, rho, T = _derived_risk(*_risk_key(m))
    if m.weight_decay:
        risk = risk + sp.nsimplify(m.weight_decay) / 2 * sum(Q[i, i] for i in range(m.p))
    return risk, Q, rho, T


def _stationary_scale(expr, var):
    """The positive root of ``d expr/d var`` (expr is quadratic in var)."""
    roots = [r for r in sp.solve(sp.diff(expr, var), var) if r.is_positive]
    if len(roots) != 1:
        raise RuntimeError(f"expected one positive stationary point, got {roots}")
    return sp.nsimplify(roots[0])


def _substitute(risk, syms, values):
    Q, rho, T = syms
    sub = {}
    for S, V in ((Q, values[0]), (rho, values[1]), (T, values[2])):
        for i in range(S.rows):
            for j in range(S.cols):
                sub[S[i, j]] = V[i, j]
    return sp.expand(risk.xreplace(sub))


def effective_point(m: Model, point: str):
    r"""Exact effective coordinates ``(X, Y, r)`` of a critical point (T = I).

    ``X`` is p×r and ``Y = [I_{p*}, 0]`` is p*×r; the scale of the plateau and of
    the minimum is the stationary point of the derived objective
    (:func:`_risk_function`) along the corresponding ray: ``s² = c*β/(cα)``
    (``p/p*``) for a zero-risk minimum.  The rays are the fixed sets of the
    rotations that keep them, so a stationary point along a ray is a critical
    point (symmetric criticality).
    """
    _check(m, point)
    p, k = m.p, m.p_star
    risk, *syms = _risk_function(m)
    s = sp.Symbol("s", positive=True)
    if point == "origin":
        r = k
        X = sp.zeros(p, r)
    elif point == "plateau":
        r = k + p
        q = _stationary_scale(_substitute(risk, syms, (s * sp.eye(p), sp.zeros(p, k),
                                                       sp.eye(k))), s)
        X = sp.zeros(p, k).row_join(sp.sqrt(q) * sp.eye(p))
    else:
        r = k
        R = sp.eye(p, k)
        c = _stationary_scale(_substitute(risk, syms, (s * R * R.T, sp.sqrt(s) * R,
                                                       sp.eye(k))), s)
        X = sp.sqrt(c) * R
    Y = sp.eye(k, r)
    return sp.ImmutableMatrix(X), sp.ImmutableMatrix(Y), r


def _exact_eigenvalues(M: sp.Matrix) -> dict:
    """``{eigenvalue: multiplicity}`` of a symmetric matrix with exact entries.

    Characteristic polynomial over the entries' domain (``DomainMatrix``), then
    its exact roots; raises if some root cannot be expressed in radicals.
    """
    if M.rows == 0:
        return {}
    dM = DomainMatrix.from_Matrix(M)
    lam = sp.Symbol("lambda")
    poly = sp.Poly(dM.charpoly(), lam, domain=dM.domain)
    roots = sp.roots(poly)
    if sum(roots.values()) != M.rows:
        raise RuntimeError("characteristic polynomial has roots SymPy cannot express")
    return {sp.nsimplify(sp.simplify(v)) if v.is_number else v: n for v, n in roots.items()}


@dataclass(frozen=True)
class HessianBlocks:
    r"""Exact reduced Hessian of the risk at a critical point (scaled by N).

    Attributes
    ----------
    model : Model
    point : str
    X, Y : ImmutableMatrix
        Effective coordinates of the point (p×r, p*×r).
    r : int
        Dimension of the span of student and teacher rows.
    parallel : ImmutableMatrix (p·r × p·r)
        ``N ∂²ε`` on perturbations inside the span (rows ordered as ``Z.ravel()``).
    perp : ImmutableMatrix (p × p)
        ``N ∂²ε`` on one direction orthogonal to the span (multiplicity ``N − r``).
    parallel_eigenvalues, perp_eigenvalues : dict
        Exact ``{eigenvalue: multiplicity}``.
    tangent_parallel, tangent_perp : int
        Dimension of the tangent space of the critical point's orbit under the
        symmetries of the risk (``W → UW``, ``U ∈ O(p)``; rotations of ``R^N``
        that map the teacher span to itself, which leave ``W*ᵀW* = N P_T``
        unchanged for ``T = I``) inside the span, and per orthogonal direction.
    """

    model: Model
    point: str
    X: sp.ImmutableMatrix = field(repr=False)
    Y: sp.ImmutableMatrix = field(repr=False)
    r: int
    parallel: sp.ImmutableMatrix = field(repr=False)
    perp: sp.ImmutableMatrix = field(repr=False)
    parallel_eigenvalues: dict
    perp_eigenvalues: dict
    tangent_parallel: int
    tangent_perp: int

    def _check_N(self, N):
        if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < self.r:
            raise ValueError(f"N must be an integer >= r = {self.r} for point "
                             f"{self.point!r} (p={self.model.p}, p_star={self.model.p_star}), "
                             f"got {N!r}")
        return int(N)

    def spectrum(self, N: int) -> dict:
        """Exact ``{eigenvalue: multiplicity}`` of ``∂²ε/∂W²`` (p·N eigenvalues)."""
        N = self._check_N(N)
        out: dict = {}
        for v, n in self.parallel_eigenvalues.items():
            out[v / N] = out.get(v / N, 0) + n
        for v, n in self.perp_eigenvalues.items():
            if N > self.r:
                out[v / N] = out.get(v / N, 0) + n * (N - self.r)
        return out

    def counts(self, N: int) -> tuple:
        """``(negative, zero, positive)`` eigenvalue counts of ``∂²ε/∂W²``."""
        neg = zero = pos = 0
        for v, n in self.spectrum(N).items():
            if v == 0:
                zero += n
            elif v < 0:
                neg += n
            else:
                pos += n
        return neg, zero, pos

    def zero_modes(self, N: int) -> dict:
        """Zero modes split into ``tangent`` (to the critical manifold) and ``extra``."""
        N = self._check_N(N)
        z_par = self.parallel_eigenvalues.get(sp.S.Zero, 0)
        z_perp = self.perp_eigenvalues.get(sp.S.Zero, 0)
        tangent = self.tangent_parallel + self.tangent_perp * (N - self.r)
        return {"tangent": tangent, "extra": z_par + z_perp * (N - self.r) - tangent}


def _hessian_reduced(m: Model, X0, Y):
    """``N ∂²ε/∂X²`` at ``X0`` with one extra zero column, by the chain rule.

    ``ε(Q, ρ, T)`` from :func:`symquad.derive`; ``Q = XXᵀ``, ``ρ = XYᵀ``.
    Returns the full ``p(r+1) × p(r+1)`` matrix (rows ordered as ``X.ravel()``).
    """
    p, k = m.p, m.p_star
    r = X0.cols
    risk, Qs, rhos, Ts = _risk_function(m)
    xs = sp.Matrix(p, r + 1, lambda i, j: sp.Symbol(f"x_{i}_{j}", real=True))
    Yx = Y.row_join(sp.zeros(k, 1))
    Qx, rhox = xs * xs.T, xs * Yx.T
    # overlap variables: unique Q entries (i <= j) and all rho entries
    qvars = [Qs[i, j] for i in range(p) for j in range(i, p)]
    qexpr = [Qx[i, j] for i in range(p) for j in range(i, p)]
    rvars = [rhos[i, j] for i in range(p) for j in range(k)]
    rexpr = [rhox[i, j] for i in range(p) for j in range(k)]
    ovars, oexpr = qvars + rvars, qexpr + rexpr
    x_flat = list(xs)
    point = {xs[i, j]: (X0[i, j] if j < r else 0) for i in range(p) for j in range(r + 1)}
    Tval = Yx * Yx.T
    at = {Ts[i, j]: Tval[i, j] for i in range(k) for j in range(k)}
    oval = {v: sp.expand(e.xreplace(point)) for v, e in zip(ovars, oexpr)}
    at.update(oval)
    grad_o = sp.Matrix([sp.diff(risk, v).xreplace(at) for v in ovars])
    hess_o = sp.Matrix(len(ovars), len(ovars),
                       lambda a, b: sp.diff(risk, ovars[a], ovars[b]).xreplace(at))
    jac = sp.Matrix(len(ovars), len(x_flat),
                    lambda a, b: sp.diff(oexpr[a], x_flat[b]).xreplace(point))
    H = jac.T * hess_o * jac
    for a, e in enumerate(oexpr):
        if grad_o[a] != 0:
            H += grad_o[a] * sp.hessian(e, x_flat)
    return H.applyfunc(sp.nsimplify)


def _tangent_dims(m: Model, X0, r):
    """Ranks of the orbit tangent vectors inside the span and along one ⊥ direction."""
    p, k = m.p, m.p_star
    Xe = X0.row_join(sp.zeros(p, 1))
    vecs = []
    for i in range(p):            # W -> U W, U in O(p) (σ = z² sees only WᵀW)
        for j in range(i + 1, p):
            B = sp.zeros(p, p)
            B[i, j], B[j, i] = 1, -1
            vecs.append(list(B * Xe))
    # rotations of R^N that map the teacher span to itself (they leave W*ᵀW* = N P_T
    # unchanged for T = I): blocks inside the teacher span and inside its complement
    for i in range(r + 1):
        for j in range(i + 1, r + 1):
            if (i < k) != (j < k):
                continue
            A = sp.zeros(r + 1, r + 1)
            A[i, j], A[j, i] = 1, -1
            vecs.append(list(Xe * A))
    if not vecs:
        return 0, 0
    M = sp.Matrix(vecs)
    par_cols = [a * (r + 1) + b for a in range(p) for b in range(r)]
    perp_cols = [a * (r + 1) + r for a in range(p)]
    return M[:, par_cols].rank(), M[:, perp_cols].rank()


@lru_cache(maxsize=None)
def hessian_blocks(m: Model, point: str) -> HessianBlocks:
    """Exact reduced Hessian blocks, eigenvalues and tangent dimensions at a critical point.

    Parameters
    ----------
    m : Model
        Quadratic activations; ``lr``/``noise`` and the batch size do not enter
        (the risk is clean); the weight decay adds ``(λ/2) tr Q``.
    point : {"origin", "plateau", "minimum"}
    """
    _check(m, point)
    X0, Y, r = effective_point(m, point)
    p = m.p
    H = _hessian_reduced(m, X0, Y)
    par = [a * (r + 1) + b for a in range(p) for b in range(r)]
    perp = [a * (r + 1) + r for a in range(p)]
    mixed = H.extract(par, perp)
    if not mixed.is_zero_matrix:
        raise AssertionError("the span and its orthogonal complement couple in the Hessian "
                             f"at {point!r}: the reduction does not hold")
    Hpar, Hperp = H.extract(par, par), H.extract(perp, perp)
    tp, tq = _tangent_dims(m, X0, r)
    return HessianBlocks(m, point, X0, Y, r, sp.ImmutableMatrix(Hpar), sp.ImmutableMatrix(Hperp),
                         _exact_eigenvalues(Hpar), _exact_eigenvalues(Hperp), tp, tq)


#: Largest number of eigenvalues (p·N) hessian_spectrum lists one by one.
MAX_SPECTRUM_SIZE = 10 ** 7


@dataclass(frozen=True, repr=False)
class HessianSpectrum:
    r"""Spectrum of the weight-space Hessian ``∂²ε/∂W²`` of the risk at a critical point.

    Attributes
    ----------
    model : Model
    point : {"origin", "plateau", "minimum"}
    N : int
        Input dimension; there are ``p·N`` eigenvalues.
    eigenvalues : ndarray (p·N,)
        All eigenvalues, ascending, with multiplicity (floats of exact values).
    exact : dict
        ``{eigenvalue: multiplicity}`` with exact SymPy eigenvalues.
    negative, zero, positive : int
        Eigenvalue counts (from the exact values, so no tolerance is involved).
    tangent_zero_modes : int
        Zero modes tangent to the critical manifold (the orbit of the point
        under ``W → UW``, ``U ∈ O(p)``, and under rotations of ``R^N`` that fix
        the teacher span).
    extra_zero_modes : int
        The remaining zero modes (flat directions that are not symmetries,
        e.g. unused student directions at a minimum with ``p > p*``, along
        which the risk grows quartically).
    count_formulas : dict
        ``{"negative", "zero", "positive"}``: the counts as formulas in
        ``p, p_star, N`` (strings), from the closed-form spectra (module docstring);
        empty where the closed forms do not apply (weight decay).
    r : int
        Dimension of the span of student and teacher rows at the point.

    ``numpy.asarray(spectrum)``, ``len(spectrum)`` and ``spectrum[i]`` act on the
    eigenvalues, so code written for the plain array keeps working.
    """

    model: Model
    point: str
    N: int
    eigenvalues: np.ndarray
    exact: dict
    negative: int
    zero: int
    positive: int
    tangent_zero_modes: int
    extra_zero_modes: int
    count_formulas: dict
    r: int

    @property
    def counts(self) -> tuple:
        """``(negative, zero, positive)``."""
        return self.negative, self.zero, self.positive

    @property
    def zero_modes(self) -> dict:
        """``{"tangent": ..., "extra": ...}``."""
        return {"tangent": self.tangent_zero_modes, "extra": self.extra_zero_modes}

    @property
    def shape(self) -> tuple:
        return self.eigenvalues.shape

    def __array__(self, dtype=None, copy=None):
        return self.eigenvalues if dtype is None else self.eigenvalues.astype(dtype)

    def __len__(self) -> int:
        return len(self.eigenvalues)

    def __getitem__(self, index):
        return self.eigenvalues[index]

    def __repr__(self) -> str:
        m = self.model
        return (f"HessianSpectrum({self.point}, p={m.p}, p_star={m.p_star}, N={self.N}: "
                f"{len(self.eigenvalues)} eigenvalues, (neg, zero, pos) = {self.counts}, "
                f"zero modes {self.tangent_zero_modes} tangent + {self.extra_zero_modes} extra)")

    def summary(self) -> str:
        """Counts with their formulas, the distinct eigenvalues (times N) and the zero modes."""
        f = self.count_formulas
        distinct = ", ".join(
            f"{sp.nsimplify(v * self.N)}" + (f" (x{n})" if n > 1 else "")
            for v, n in sorted(self.exact.items(), key=lambda kv: float(kv[0])))
        formulas = (f"negative = {f['negative']}, zero = {f['zero']}, "
                    f"positive = {f['positive']}" if f else
                    "not derived for this model (weight decay, or no zero-risk minimum)")
        return (f"{self.point}: (negative, zero, positive) = {self.counts} of p·N = "
                f"{len(self.eigenvalues)}\n"
                f"  formulas: {formulas}\n"
                f"  N*eigenvalues: {distinct}\n"
                f"  zero modes: {self.tangent_zero_modes} tangent to the critical manifold, "
                f"{self.extra_zero_modes} extra")

    def __str__(self) -> str:
        return self.summary()


def hessian_spectrum(m: Model, point: str = "plateau", N: int = 12) -> HessianSpectrum:
    r"""Spectrum of the weight-space Hessian of the risk at a critical point (T = I).

    The ``p·N × p·N`` Hessian reduces exactly to a ``p r`` block on the span of
    the student and teacher rows and a ``p×p`` block repeated ``N − r`` times
    (module docstring); both come from the risk that :func:`symquad.derive`
    derives, and their eigenvalues are exact.

    Parameters
    ----------
    m : Model
        Quadratic activation (``lr`` and ``noise`` do not enter: the risk is clean).
    point : {"origin", "plateau", "minimum"}
        ``W = 0``; the plateau critical point of the risk (``ρ = 0``,
        ``Q = p/(p+2) I``); a global minimum (zero risk for ``p >= p*``).
    N : int
        Input dimension, ``>= p*`` (``>= p + p*`` for the plateau).

    Returns
    -------
    HessianSpectrum
        Eigenvalues (``p·N``, ascending, with multiplicity), the counts of
        negative/zero/positive ones with their formulas in ``(p, p*, N)``, and
        the zero modes split into tangent and extra.
    """
    _check(m, point)
    if isinstance(N, bool) or not isinstance(N, (int, np.integer)):
        raise TypeError(f"N must be an integer >= p + p_star, got {N!r}")
    if m.p * N > MAX_SPECTRUM_SIZE:
        raise ValueError(f"N={N} asks for p*N = {m.p * N} eigenvalues; allowed N <= "
                         f"{MAX_SPECTRUM_SIZE // m.p} (listing more eigenvalues is beyond memory)")
    blocks = hessian_blocks(m, point)
    N = blocks._check_N(N)
    spec = blocks.spectrum(N)
    values = np.sort(np.concatenate([np.full(n, float(v)) for v, n in spec.items()]))
    neg, zero, pos = blocks.counts(N)
    zm = blocks.zero_modes(N)
    regime = None if point != "minimum" else ("over" if m.p >= m.p_star else "under")
    formulas = ({key: str(value) for key, value in count_formulas(point, regime).items()}
                if _counts_apply(m) is None else {})
    return HessianSpectrum(model=m, point=point, N=N, eigenvalues=values, exact=spec,
                           negative=neg, zero=zero, positive=pos,
                           tangent_zero_modes=zm["tangent"], extra_zero_modes=zm["extra"],
                           count_formulas=formulas, r=blocks.r)


# --------------------------------------------------------------------------- closed forms
def _counts_apply(m: Model) -> str | None:
    r"""Why the closed-form counts do not hold for `m` (None when they do).

    With ``cα > 0`` and ``c*β > 0`` (uniform readouts, ``κ = 0``) the rescaling
    ``W → √(cαp) W`` maps the risk onto the classic one with teacher overlap
    ``c*βp* T``, a positive multiple of the classic risk at rescaled weights:
    critical points correspond and the Hessians differ by positive factors, so
    the counts are the classic ones (the values are not).  Weight decay adds
    ``λ/N`` to every eigenvalue and moves the critical points.
    """
    if m.weight_decay:
        return "weight decay moves the spectrum"
    return zero_risk_reason(m)


def spectrum_formulas(point: str, regime: str | None = None, model: Model | None = None) -> list:
    r"""Closed-form spectrum ``[(N·eigenvalue, multiplicity, meaning), ...]`` in ``p, p*, N``.

    From the quadratic form in the module docstring, on the invariant subspaces
    of each point (``Z = [Z_T, Z_W]`` teacher/student-span columns; ``A`` the
    part of a perturbation along the student's own directions):

    * origin: ``−2(p*+2)/(p p*)`` on the ``p p*`` teacher directions and ``−2/p``
      on the ``p(N−p*)`` others;
    * plateau (gradient flow): ``−4/(p p*)`` on the ``p p*`` teacher directions
      (the escape directions; gradient-flow growth rate ``4η/(p p*)``), ``0`` on
      the ``p(N−p*) − p(p+1)/2`` tangent directions of the plateau manifold
      (antisymmetric ``Z_W`` and rotations into fresh directions), ``8/(p(p+2))``
      on symmetric traceless ``Z_W`` and ``4/p`` on ``Z_W ∝ I``;
    * minimum, ``p >= p*`` (regime ``"over"``): ``4(p*+2)/(p p*)`` (×1),
      ``8/(p p*)`` (symmetric traceless, ``p*(p*+1)/2 − 1``), ``4/(p p*)`` on
      ``p*(N−p*)`` directions out of the span, ``0`` on the
      ``p p* − p*(p*+1)/2`` tangent directions of the zero-risk manifold and on
      ``(p−p*)(N−p*)`` extra directions (unused student directions moved out of
      the span; the risk grows quartically there);
    * minimum, ``p < p*`` (regime ``"under"``): ``4(p*+2)/(p p*)`` (×1),
      ``8(p*+2)/(p p*(p+2))`` (``p(p+1)/2 − 1``), ``4/(p p*)`` (``p(N−p*)``),
      ``0`` on ``p p* − p(p+1)/2`` tangent directions.

    These are the classic model's values; with `model`, its changes are checked
    (only the batch size, which does not enter the risk, keeps them).
    """
    if model is not None:
        require(model, "spectrum_formulas", supports=("batch_size",),
                why="the closed-form eigenvalues are the classic model's")
    p, k, N = P_SYM, P_STAR_SYM, N_SYM
    if point not in POINTS:
        raise ValueError(f"point must be one of {POINTS}, got {point!r}")
    if point == "origin":
        return [(-2 * (k + 2) / (p * k), p * k, "teacher directions"),
                (-2 / p, p * (N - k), "all other directions")]
    if point == "plateau":
        return [(-4 / (p * k), p * k, "escape: student units toward the teacher"),
                (sp.S.Zero, p * (N - k) - p * (p + 1) / 2, "tangent to the plateau manifold"),
                (8 / (p * (p + 2)), p * (p + 1) / 2 - 1, "symmetric traceless change of Q"),
                (4 / p, sp.S.One, "isotropic change of Q")]
    if regime not in ("over", "under"):
        raise ValueError("regime must be 'over' (p >= p*) or 'under' (p < p*) for the minimum")
    if regime == "over":
        return [(4 * (k + 2) / (p * k), sp.S.One, "isotropic"),
                (8 / (p * k), k * (k + 1) / 2 - 1, "symmetric traceless in the teacher span"),
                (4 / (p * k), k * (N - k), "student directions used, moved out of the span"),
                (sp.S.Zero, p * k - k * (k + 1) / 2, "tangent to the zero-risk manifold"),
                (sp.S.Zero, (p - k) * (N - k), "extra: unused student directions (quartic)")]
    return [(4 * (k + 2) / (p * k), sp.S.One, "isotropic"),
            (8 * (k + 2) / (p * k * (p + 2)), p * (p + 1) / 2 - 1, "symmetric traceless"),
            (4 / (p * k), p * (N - k), "moved out of the span"),
            (sp.S.Zero, p * k - p * (p + 1) / 2, "tangent to the manifold of minima")]


def count_formulas(point: str, regime: str | None = None, model: Model | None = None) -> dict:
    """``{"negative", "zero", "positive"}`` counts as expressions in ``p, p*, N``.

    With `model`: ValueError when the counts do not hold for it (weight decay,
    non-uniform or sign-incompatible readouts, a constant offset; see
    :func:`_counts_apply`).
    """
    if model is not None:
        check(model, "count_formulas", "hessian")
        reason = _counts_apply(model)
        if reason:
            raise ValueError(f"count_formulas does not hold for {model!r}: {reason}")
    out = {"negative": sp.S.Zero, "zero": sp.S.Zero, "positive": sp.S.Zero}
    for value, mult, _ in spectrum_formulas(point, regime):
        sign = "zero" if value == 0 else ("negative" if value.is_negative else "positive")
        out[sign] += mult
    return {key: sp.simplify(v) for key, v in out.items()}


def formula_spectrum(m: Model, point: str, N: int) -> dict:
    """``{eigenvalue of ∂²ε/∂W²: multiplicity}`` from :func:`spectrum_formulas` (exact)."""
    regime = None if point != "minimum" else ("over" if m.p >= m.p_star else "under")
    sub = {P_SYM: m.p, P_STAR_SYM: m.p_star, N_SYM: N}
    out: dict = {}
    for value, mult, _ in spectrum_formulas(point, regime, model=m):
        v = sp.nsimplify(value.subs(sub)) / N
        n = int(mult.subs(sub))
        if n:
            out[v] = out.get(v, 0) + n
    return out

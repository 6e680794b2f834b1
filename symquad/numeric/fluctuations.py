r"""Linear-noise approximation: the O(N^{-1/2}) fluctuations of the order parameters around the ODE.

At finite ``N`` the state ``X`` (:class:`~symquad.numeric.layout.StateLayout`)
moves by ``dX = f(X) dt + √(D(X)/N) dB`` at leading order
(:meth:`~symquad.numeric.kernels.Kernels.diffusion`).  Writing
``X = x(t) + N^{-1/2} ζ`` with ``x`` the ODE solution and expanding to first
order in ``N^{-1/2}`` (van Kampen's system-size expansion) gives a linear SDE
``dζ = J(x) ζ dt + D(x)^{1/2} dB`` whose covariance ``Σ = Cov ζ`` obeys

.. math::  \dot Σ = J Σ + Σ J^T + D, \qquad J = ∂f/∂X \text{ (Kernels.jacobian)} .

It is integrated in two passes: the ODE alone (dense, per smooth piece of a learning-rate
schedule), then ``Σ`` — and ``c`` below — along ``x(t)``, with ``D`` evaluated at the ODE
solver's accepted steps and interpolated by cubic splines in ``t`` (``D`` is a smooth
function of ``x(t)``; one ``D`` per ODE step instead of one per right-hand side).

Then ``Cov[X(t)] ≈ Σ(t)/N`` and the risk spreads by
``Var ε ≈ ∇εᵀ Σ ∇ε / N + ½ tr(HΣHΣ)/N²`` (``∇ε``, ``H`` exact,
:meth:`Kernels.risk_gradient`, :meth:`Kernels.risk_hessian`; the second term is the
spread near a minimum, where ``∇ε → 0``).

**Validity.**  The expansion needs ``ζ/√N`` to stay small compared with the scale
on which ``f`` and ``D`` change: it holds at all times along trajectories that
stay away from unstable fixed points (a start near a minimum, the descent from
an informed start), with errors ``O(N^{-1/2})`` relative.  It breaks down on
the plateau's escape: there ``J`` has a positive eigenvalue ``κ``, ``Σ`` grows like
``e^{2κt}`` and the linearisation fails once ``Σ/N`` reaches the size of the
overlaps — the escape *time* then has an O(1) random part (see
:func:`symquad.escape_time`) that no Gaussian approximation of the state
captures.  On a flat manifold of minima (``p > p*``) ``J`` has zero modes and ``Σ``
grows linearly along them: the overlaps wander while the risk stays put.

**The O(1/N) mean** (``second_order``; docs/derivation.md §8.3a).  The ODE is the
``N → ∞`` limit of the mean; to the next order ``E[X(t)] = x(t) + c(t)/N`` with

.. math::  \dot c = J c + \tfrac12\, ∂^2 f : Σ + f_1 − \tfrac12 (J f + ∂f/∂t), \qquad c(0) = 0,

``f₁`` the ``1/N`` term of one step's mean increment
(:meth:`~symquad.numeric.kernels.Kernels.second_order`), ``½ ∂²f : Σ`` the drift's
curvature against the LNA covariance (both from the drift kernels,
:mod:`symquad.numeric.drift_derivatives`, for every activation pair), ``−½ (J f + ∂f/∂t)``
the discreteness of time (steps of ``1/N``; ``∂f/∂t`` under a learning-rate schedule, whose
jumps shift ``c``: :func:`step_shift`), and ``E[ε] = ε(x) + (∇ε·c + ½ ∇²ε : Σ)/N``.  :attr:`Fluctuations.expansion_valid`
flags where the expansion has failed (same validity as above).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from ..second_order_cost import SECOND_ORDER_AUTO_SECONDS, second_order_estimate
from ..spectrum import block_sizes, has_spectrum
from ..stages import declare
from .checks import (as_overlaps, as_real_array, check_choice, check_int, check_positive,
                     check_times)
# the schedule's terms of the O(1/N) mean (shared with the SDE's O(1/N) drift)
from .drift_derivatives import (directions_per_rhs, schedule_time_derivative, step_phase,
                                step_shift)
from .errors import DivergenceError, describe_state
from .kernels import (SECOND_ORDER_FIELDS, SECOND_ORDER_STAGE, default_form,
                      drift_state_seconds, kernels, require_diffusion)
from .layout import StateLayout, state_layout
from .sde import MAX_SDE_DIM

__all__ = ["fluctuations", "Fluctuations", "random_start_covariance", "block_random_start",
           "STARTS", "mean_correction_rhs", "mean_correction_rate", "expansion_valid",
           "SECOND_ORDER_FIELDS", "mean_correction_seconds", "check_mean_correction_cost",
           "MEAN_CORRECTION_AUTO_SECONDS", "MEAN_CORRECTION_REFUSE_SECONDS"]

#: ``fluctuations(second_order=None)`` computes the O(1/N) mean (matrix and tensor forms)
#: when its extra work per right-hand side (:func:`mean_correction_seconds`) is estimated
#: at most this (an integration takes a few hundred right-hand sides) ...
MEAN_CORRECTION_AUTO_SECONDS = 1.0
#: ... and refuses it above this, even when asked for.
MEAN_CORRECTION_REFUSE_SECONDS = 60.0


def mean_correction_seconds(model, form=None) -> float:
    r"""Estimated extra seconds per right-hand side of the O(1/N) mean (cost law).

    The stencils of :mod:`symquad.numeric.drift_derivatives` evaluate the drift at
    ``dim (n_t − 1) + n_s`` states per right-hand side
    (:func:`~symquad.numeric.drift_derivatives.directions_per_rhs`: ``n_t`` stencil
    nodes along each of the ``dim`` eigen-directions of ``Σ``, ``n_s`` for the
    ``|x|²/N`` term), each at :func:`~symquad.numeric.kernels.drift_state_seconds`
    (matrix ``~n³``, tensor ``~p² n²``, erf/ReLU the special kernels' law); the
    ``O(dim²)`` pseudo-inverse and products are below it.  ``D`` is the LNA's own cost.
    ``form='entries'``: the symbolic derivation's one-time estimate
    (:func:`~symquad.second_order_cost.second_order_estimate`) instead.
    """
    if form == "entries":
        return second_order_estimate(model)
    dim = state_layout(model).dim
    return directions_per_rhs(model, dim) * drift_state_seconds(model, form)


def check_mean_correction_cost(model, form=None) -> float:
    """Refuse (ValueError) the O(1/N) mean above :data:`MEAN_CORRECTION_REFUSE_SECONDS`."""
    if form == "entries":
        # lazy: sympy
        from ..symbolic.second_order import check_second_order_size
        check_second_order_size(model)
        return second_order_estimate(model)
    est = mean_correction_seconds(model, form)
    if est > MEAN_CORRECTION_REFUSE_SECONDS:
        raise ValueError(
            f"the O(1/N) correction of the mean at p={model.p}, p_star={model.p_star} "
            f"({model.activation_str!r}, teacher {model.teacher_activation_str!r}) is "
            f"estimated at {est:.3g} s per right-hand side (limit "
            f"{MEAN_CORRECTION_REFUSE_SECONDS:g} s: {directions_per_rhs(model, state_layout(model).dim)} "
            f"drift evaluations each); use a smaller width or second_order=False")
    return est

#: ``"fixed"``: the given start, ``Σ(0) = 0``; ``"random"``: the mean of the random start
#: ``w_k ~ N(0, q0 I_N)`` with ``Σ(0)`` its exact leading-order covariance.
STARTS = ("fixed", "random")


@dataclass
class Fluctuations:
    """The linear-noise prediction along one ODE trajectory.

    Attributes
    ----------
    model : Model
    N : int
    t : ndarray (n,)
    Q, rho : ndarray (n, p, p), (n, p, p*)
        The ODE solution ``x(t)``.
    readout : ndarray (n, p) or None
        A trained readout's ODE solution.
    risk : ndarray (n,)
        The risk along ``x(t)``.
    covariance : ndarray (n, dim, dim)
        ``Σ(t) = N Cov[X(t)]`` (independent of ``N``) in the state order of `layout`.
    layout : StateLayout
    risk_gradient : ndarray (n, dim)
        ``∂ε/∂X`` along ``x(t)``.
    risk_hessian : ndarray (n, dim, dim)
        ``∂²ε/∂X∂X`` along ``x(t)``.
    mean_correction : ndarray (n, dim) or None
        ``c(t)`` with ``E[X(t)] = x(t) + c(t)/N + O(N⁻²)`` in the state order
        (:func:`mean_correction_rhs`; None when computed with ``second_order=False``).
    risk_mean_correction : ndarray (n,) or None
        ``c_ε(t) = ∇ε·c + ½ ∇²ε : Σ``, so that ``E[ε] = ε(x) + c_ε/N + O(N⁻²)``.
    expansion_tol : float
        The tolerance of :attr:`expansion_valid`.
    T : ndarray (p*, p*)
        The teacher overlaps (scale of ``ρ`` in :attr:`expansion_valid`).
    second_order_note : str
        Why the correction was not computed (empty when it was).
    """

    model: object
    N: int
    t: np.ndarray
    Q: np.ndarray = field(repr=False)
    rho: np.ndarray = field(repr=False)
    readout: np.ndarray | None = field(repr=False)
    risk: np.ndarray = field(repr=False)
    covariance: np.ndarray = field(repr=False)
    layout: StateLayout = field(repr=False)
    risk_gradient: np.ndarray = field(repr=False)
    #: ``∂²ε/∂X∂X`` (n, dim, dim), or a function of time indices computing it on demand
    #: (:attr:`risk_hessian`; the O(1/N) mean needs only ``½ ∇²ε : Σ``)
    _hessian: object = field(repr=False)
    mean_correction: np.ndarray | None = field(default=None, repr=False)
    risk_mean_correction: np.ndarray | None = field(default=None, repr=False)
    expansion_tol: float = field(default=0.2, repr=False)
    T: np.ndarray | None = field(default=None, repr=False)
    second_order_note: str = field(default="", repr=False)

    @property
    def risk_hessian(self) -> np.ndarray:
        """``∂²ε/∂X∂X`` along ``x(t)``; (n, dim, dim), computed on first use."""
        if callable(self._hessian):
            self._hessian = self._hessian(np.arange(len(self.t)))
        return self._hessian

    def risk_hessian_at(self, index) -> np.ndarray:
        """``∂²ε/∂X∂X`` at the recorded times `index` only; (len(index), dim, dim)."""
        index = np.asarray(index, dtype=int)
        if callable(self._hessian):
            return self._hessian(index)
        return self._hessian[index]

    def _need_second_order(self, what):
        if self.mean_correction is None:
            raise ValueError(f"{what} needs the O(1/N) correction of the mean, which was not "
                             f"computed ({self.second_order_note or 'second_order=False'}); "
                             "call fluctuations(..., second_order=True)")

    @property
    def risk_mean(self) -> np.ndarray:
        """``E[ε(t)] ≈ ε(x(t)) + c_ε(t)/N`` at this ``N``; (n,). See :attr:`expansion_valid`."""
        self._need_second_order("risk_mean")
        return self.risk + self.risk_mean_correction / self.N

    @property
    def state_mean(self) -> np.ndarray:
        """``E[X(t)] ≈ x(t) + c(t)/N`` in the state order; (n, dim)."""
        self._need_second_order("state_mean")
        return self.layout.pack(self.Q, self.rho, self.readout) + self.mean_correction / self.N

    @property
    def Q_mean(self) -> np.ndarray:
        """Corrected mean of ``Q`` at this ``N``; (n, p, p)."""
        return self.layout.unpack(self.state_mean)[0]

    @property
    def rho_mean(self) -> np.ndarray:
        """Corrected mean of ``ρ`` at this ``N``; (n, p, p*)."""
        return self.layout.unpack(self.state_mean)[1]

    @property
    def readout_mean(self):
        """Corrected mean of a trained readout; (n, p), or None for a fixed readout."""
        return self.layout.unpack(self.state_mean)[2]

    @property
    def expansion_valid(self) -> np.ndarray:
        r"""Where the expansion in ``1/N`` holds at this ``N``; (n,) bool.

        Rule (:func:`expansion_valid`): at every time up to ``t``, every state entry's
        spread ``√(Σ_II/N)`` and its mean shift ``|c_I|/N`` are at most
        :attr:`expansion_tol` times the entry's natural scale ``s_I`` (``√(Q_ii Q_jj)``
        for ``Q_ij``, ``√(Q_ii T_mm)`` for ``ρ_im``, the largest ``|a_j|`` so far for
        ``a_i``).  Where it
        is False the corrected means are still returned (finite) but are not a
        prediction: the linearisation has failed (typically a noise-seeded escape from
        a plateau, where ``Σ`` grows like ``e^{2κt}``) and the whole-run law against
        the SDE is the comparison to make.
        """
        self._need_second_order("expansion_valid")
        return expansion_valid(self.layout, self.Q, self.rho, self.readout, self.T,
                               self.covariance, self.mean_correction, self.N,
                               self.expansion_tol)

    @property
    def state_covariance(self) -> np.ndarray:
        """``Cov[X(t)] = Σ(t)/N`` at this ``N``; (n, dim, dim)."""
        return self.covariance / self.N

    @property
    def risk_std(self) -> np.ndarray:
        r"""Predicted spread of the risk across replicas; (n,).

        With ``X = x + ζ/√N``, ``ζ ~ N(0, Σ)``: ``ε(X) = ε + gᵀζ/√N + ½ ζᵀHζ/N + …`` and

        .. math::  \mathrm{Var}\,ε = g^T Σ g / N + \tfrac12 \operatorname{tr}(HΣHΣ)/N^2 ,

        the second term (Gaussian ``ζ``; the cross term vanishes by symmetry) being
        what remains near a minimum of the risk, where ``g → 0``.
        """
        g, H, S = self.risk_gradient, self.risk_hessian, self.covariance
        first = np.einsum("ti,tij,tj->t", g, S, g) / self.N
        HS = H @ S
        second = 0.5 * np.einsum("tij,tji->t", HS, HS) / self.N**2
        return np.sqrt(np.maximum(first + second, 0.0))

    @property
    def state_std(self) -> np.ndarray:
        """Spread of every state entry, ``√(Σ_II/N)``; (n, dim)."""
        return np.sqrt(np.maximum(np.diagonal(self.covariance, axis1=1, axis2=2), 0) / self.N)

    @property
    def Q_std(self) -> np.ndarray:
        """Spread of each ``Q_ij`` across replicas; (n, p, p)."""
        return self.layout.unpack(self.state_std)[0]

    @property
    def rho_std(self) -> np.ndarray:
        """Spread of each ``ρ_im`` across replicas; (n, p, p*)."""
        return self.layout.unpack(self.state_std)[1]

    @property
    def readout_std(self):
        """Spread of a trained readout ``a_i``; (n, p), or None."""
        return self.layout.unpack(self.state_std)[2]

    def at(self, N: int) -> "Fluctuations":
        """The same prediction at another ``N`` (``Σ`` does not depend on it)."""
        N = check_int(N, "N", 1)
        if self.mean_correction is not None:
            # a step of the learning rate shifts c by δ_N (f₋ − f₊): δ_N depends on N's phase
            jumps = self.model.schedule.jumps(0.0, float(self.t[-1]))
            if any(step_phase(tj, N) != step_phase(tj, self.N) for tj, _, _ in jumps):
                raise ValueError(f"the O(1/N) mean of lr_schedule={self.model.lr_schedule!r} "
                                 f"depends on where its jumps fall on the grid of steps 1/N "
                                 f"(step_shift): call fluctuations(..., N={N}) again")
        out = Fluctuations(self.model, N, self.t, self.Q, self.rho, self.readout, self.risk,
                           self.covariance, self.layout, self.risk_gradient, self._hessian,
                           self.mean_correction, self.risk_mean_correction, self.expansion_tol,
                           self.T, self.second_order_note)
        return out

    def __repr__(self) -> str:
        extra = ""
        if self.mean_correction is not None:
            valid = self.expansion_valid
            extra = (f", N*(mean risk - ODE) at the end {self.risk_mean_correction[-1]:.3g}"
                     + ("" if valid.all() else f" (expansion invalid at {int((~valid).sum())} "
                        "times)"))
        return (f"Fluctuations(N={self.N}, {len(self.t)} times in [{self.t[0]:.3g}, "
                f"{self.t[-1]:.3g}], risk std at the end {self.risk_std[-1]:.3g}{extra}; "
                f"{self.model!r})")


def expansion_valid(layout, Q, rho, a, T, covariance, correction, N, tol=0.2) -> np.ndarray:
    r"""The validity flags of the ``1/N`` expansion (see :attr:`Fluctuations.expansion_valid`).

    ``ok(t) = max_I √(Σ_II/N)/s_I ≤ tol  and  max_I |c_I|/N / s_I ≤ tol``, and the
    flag at ``t`` is ``ok`` at every recorded time ``≤ t`` (once the linearisation
    has failed, later times inherit the O(1) spread it let in).  Why this measures
    the expansion: its terms are successive powers of ``ζ/√N`` measured on the
    scale ``s`` on which the polynomial drift changes (``f`` is a polynomial in the
    overlaps, homogeneous in ``s`` for quadratic activations); the first neglected
    term of the mean is ``O(|ζ/√N|⁴/s⁴)`` relative to ``O(|ζ/√N|²/s²)``, i.e. a
    relative error ``≲ tol²`` on the correction where the flag holds.
    """
    n = len(Q)
    qd = np.sqrt(np.maximum(np.diagonal(Q, axis1=1, axis2=2), 1e-300))        # (n, p)
    td = np.sqrt(np.maximum(np.diagonal(T), 1e-300))
    scale = np.empty((n, layout.dim))
    for I, (block, i, j) in enumerate(layout.entries):
        if block == "Q":
            scale[:, I] = qd[:, i] * qd[:, j]
        elif block == "rho":
            scale[:, I] = qd[:, i] * td[j]
        else:
            # the readout's scale so far (a trained readout may decay to 0 at a floor)
            scale[:, I] = np.maximum(np.maximum.accumulate(np.max(np.abs(a), axis=1)), 1e-300)
    spread = np.sqrt(np.maximum(np.diagonal(covariance, axis1=1, axis2=2), 0) / N) / scale
    shift = np.abs(correction) / N / scale
    ok = (np.max(spread, axis=1) <= tol) & (np.max(shift, axis=1) <= tol)
    ok &= np.all(np.isfinite(correction), axis=1)
    return np.logical_and.accumulate(ok)


def mean_correction_rate(J, f, f1, curvature, c) -> np.ndarray:
    r"""``dc/dt = J c + ½ ∂²f : Σ + f₁ − ½ J f`` with the curvature ``½ ∂²f : Σ`` given.

    With ``X_k`` after ``k`` steps, ``X_{k+1} = X_k + Φ/N``, ``E[Φ | X] = f(X) + f₁(X)/N``
    and ``Cov X_k = Σ/N``: the mean ``m_k = E[X_k]`` obeys
    ``m_{k+1} = m_k + h (f(m_k) + h F₂(m_k)) + O(h³)``, ``h = 1/N``,
    ``F₂ = ½ ∂²f : Σ + f₁`` (``E[f(X)] = f(m) + ½ ∂²f : Cov X + O(N⁻²)``).  The
    map ``m' = m + h F(m)`` is the flow of ``dm/dt = F − (h/2) F'F + O(h²)``
    (modified equation); with ``m = x + h c`` the order ``h`` gives the equation.
    """
    return J @ c + curvature + f1 - 0.5 * (J @ f)


def mean_correction_rhs(J, f, f1, drift_hessian, S, c) -> np.ndarray:
    r"""``dc/dt = J c + ½ ∂²f : Σ + f₁ − ½ J f`` (docs/derivation.md, "The O(1/N) mean"),
    from the full drift Hessian (:func:`mean_correction_rate` takes the contraction)."""
    return mean_correction_rate(J, f, f1, 0.5 * np.einsum("ijk,jk->i", drift_hessian, S), c)


@dataclass
class _Start:
    """The solution at ``t_eval = [0]`` alone (the start), shaped like solve_ivp's."""

    t: np.ndarray
    y: np.ndarray
    status: int = 0
    success: bool = True
    message: str = "the start only"


def _ode_pieces(k, T, x0, t_end, breaks, method, rtol, atol, max_norm):
    """The ODE from `x0`, one dense solution per smooth piece of the schedule.

    Returns ``[{"a", "b", "sol", "nodes"}]``: ``sol(t)`` the state, ``nodes`` the solver's
    accepted step times.  A blow-up (or a non-finite state) is a DivergenceError.
    """
    # lazy: scipy
    from scipy.integrate import solve_ivp
    # lazy: scipy
    from .integrate import left_of
    lay = k.layout
    trained = k.model.readout_trained

    def f(t, x):
        Q, rho, a = lay.unpack(x)
        return lay.pack(*k.rhs(Q, rho, T, a if trained else None, t=t))

    def blown(_, x):
        return max_norm - np.max(np.abs(x)) if np.all(np.isfinite(x)) else -1.0
    blown.terminal = True
    knots = [0.0] + [float(b) for b in breaks] + [t_end]
    out, x = [], np.asarray(x0, dtype=float)
    for a_, b_ in zip(knots[:-1], knots[1:]):
        if b_ <= a_:                       # t_end = 0: a single state
            out.append({"a": a_, "b": b_, "sol": (lambda t, x=x: x.copy()),
                        "nodes": np.array([a_])})
            continue
        fun = left_of(f, b_) if breaks else f
        sol = solve_ivp(fun, (a_, b_), x, method=method, rtol=rtol, atol=atol,
                        dense_output=True, events=blown)
        if sol.status != 0 or not np.all(np.isfinite(sol.y[:, -1])):
            t_fail = float(sol.t[-1])
            Qd, rd, _ = lay.unpack(sol.y[:, -1])
            raise DivergenceError(
                f"the linear-noise integration stopped at t = {t_fail:.4g} (the ODE: "
                f"{sol.message}); last state {describe_state({'Q': Qd, 'rho': rd})}", t_fail,
                {"t": t_fail, "Q": Qd, "rho": rd})
        out.append({"a": a_, "b": b_, "sol": sol.sol, "nodes": np.asarray(sol.t)})
        x = sol.y[:, -1]
    return out


#: States per batched diffusion call of the spline's nodes (the cubature holds 2^17
#: points per state).
_D_CHUNK = 8


def _diffusion_spline(k, T, piece, both):
    """Cubic interpolants in ``t`` of ``D`` (and ``D^u``) at a piece's ODE steps.

    With a schedule each node takes ``η`` at its own time (the piece's end its left
    limit).  Returns ``(D(t), D^u(t) or None)``.
    """
    # lazy: scipy
    from scipy.interpolate import make_interp_spline
    lay = k.layout
    nodes = piece["nodes"]
    X = np.stack([piece["sol"](t) for t in nodes])
    Q, rho, a = lay.unpack(X)
    a = a if k.model.readout_trained else None
    below = piece["b"] - 1e-13 * max(1.0, abs(piece["b"]))
    times = np.minimum(nodes, below) if len(nodes) > 1 else nodes
    if k.model.schedule.is_constant:
        parts = [k._diffusion_pair(Q[i:i + _D_CHUNK], rho[i:i + _D_CHUNK], T,
                                   None if a is None else a[i:i + _D_CHUNK], both=both)
                 for i in range(0, len(nodes), _D_CHUNK)]
        D = np.concatenate([p[0] if both else p for p in parts])
        Du = np.concatenate([p[1] for p in parts]) if both else None
    else:
        parts = [k._diffusion_pair(Q[i], rho[i], T, None if a is None else a[i],
                                   t=float(times[i]), both=both) for i in range(len(nodes))]
        D = np.stack([p[0] if both else p for p in parts])
        Du = np.stack([p[1] for p in parts]) if both else None

    def spline(values):
        if len(nodes) == 1:
            return lambda t, v=values[0]: v
        return make_interp_spline(nodes, values, k=min(3, len(nodes) - 1), axis=0)
    return spline(D), (spline(Du) if both else None)


def random_start_covariance(model, T, q0: float = 1.0) -> np.ndarray:
    r"""``N Cov[X(0)]`` of the random start ``w_k ~ N(0, q0 I_N)`` at leading order.

    With ``ρ(0) = W W*ᵀ/N`` and ``Q(0) = W Wᵀ/N``: ``N Cov[ρ_im, ρ_jn] = q0 δ_ij T_mn``,
    ``N Cov[Q_ij, Q_kl] = q0² (δ_ik δ_jl + δ_il δ_jk)``, ``Q`` and ``ρ`` uncorrelated
    (odd moments); on the sphere (rows of norm ``√N``, ``q0 = 1``) the diagonal of
    ``Q`` is exact and ``N Var Q_ij = 1`` for ``i < j``; a trained readout starts at
    its fixed value.
    """
    lay = state_layout(model)
    if lay.spectrum_blocks:
        return _block_start_covariance(model, lay, T, q0)
    S = np.zeros((lay.dim, lay.dim))
    sphere = model.constraint == "sphere"
    q = 1.0 if sphere else q0
    for I, (block, i, j) in enumerate(lay.entries):
        if block == "Q":
            S[I, I] = 0.0 if (i == j and sphere) else (2 * q**2 if i == j else q**2)
        elif block == "rho":
            for J, (b2, i2, j2) in enumerate(lay.entries):
                if b2 == "rho" and i2 == i:
                    S[I, J] = q * T[j, j2]
    return S


def _block_start_covariance(model, lay, T, q0):
    r"""``N Cov[X(0)]`` of the random start with an input spectrum (per-block overlaps).

    ``Q^c = W P_c Wᵀ/N`` sums ``f_c N`` independent coordinates of ``w_k ~ N(0, q0 I)``:
    ``E[Q^c] = q0 f_c I``, ``N Cov[Q^c_ij, Q^d_kl] = δ_cd q0² f_c (δ_ik δ_jl + δ_il δ_jk)``;
    ``N Cov[ρ^c_im, ρ^d_jn] = δ_cd δ_ij q0 T^c_mn``; ``Q`` and ``ρ`` uncorrelated.  On the
    sphere (``q0 = 1``, rows renormalised to the Euclidean norm ``√N``) ``Q^c_ii`` is the
    fraction of a row's squared norm in block ``c``, a Dirichlet (Beta) share:
    ``N Cov[Q^c_ii, Q^d_ii] = 2 (δ_cd f_c − f_c f_d)``; the off-diagonal and ``ρ`` entries
    keep their laws at this order.  `T`: the per-block teacher overlaps (B, p*, p*).
    """
    T = np.asarray(T, dtype=float)
    f = [float(x) for x, _ in model.spectrum]
    sphere = model.constraint == "sphere"
    q = 1.0 if sphere else q0
    S = np.zeros((lay.dim, lay.dim))
    for I, entry in enumerate(lay.entries):
        if entry[0] == "Q":
            _, c, i, j = entry
            for J, other in enumerate(lay.entries):
                if other[0] != "Q":
                    continue
                _, d, k, l = other
                if sphere and i == j:
                    if k == l == i:
                        S[I, J] = 2 * ((c == d) * f[c] - f[c] * f[d])
                elif c == d and (i, j) == (k, l):
                    S[I, J] = q**2 * f[c] * (2 if i == j else 1)
        elif entry[0] == "rho":
            _, c, i, m = entry
            for J, other in enumerate(lay.entries):
                if other[0] == "rho" and other[1] == c and other[2] == i:
                    S[I, J] = q * T[c, m, other[3]]
    return S


def block_random_start(model, T, N: int, n: int, seed=0, q0: float = 1.0):
    r"""Draws of the exact law of the per-block start ``w_k ~ N(0, q0 I_N)`` (input spectrum).

    In block ``c`` (``f_c N`` coordinates, ``symquad.spectrum.block_sizes``) the teacher
    rows are ``√N L_c u`` with ``L_c L_cᵀ = T^c`` and ``u`` orthonormal in the block, so
    ``ρ^c = √(q0/N) G_c L_cᵀ`` with ``G_c`` (p × p*) standard normal and ``Q^c = q0 (G_c G_cᵀ
    + S_c)/N``, ``S_c ~ Wishart(f_c N − p*, I_p)`` independent (the rest of the block), the
    blocks independent.  On the sphere every row is renormalised to the Euclidean norm:
    ``Q^c ← D^{-1/2} Q^c D^{-1/2}``, ``ρ^c ← D^{-1/2} ρ^c`` with ``D = diag Σ_c Q^c``.
    Returns ``(Q0 (n, B, p, p), rho0 (n, B, p, p*))``.
    """
    from scipy.stats import wishart                  # lazy: scipy.stats (as landscape)
    declare(model, "the state layout")
    T = np.asarray(T, dtype=float)
    p, k, B = model.p, model.p_star, model.n_blocks
    if T.shape != (B, k, k):
        raise ValueError(f"T must have shape {(B, k, k)} (one teacher overlap per block), "
                         f"got {T.shape}")
    sizes = block_sizes(model.spectrum, check_int(N, "N", 1))
    n = check_int(n, "n", 1)
    q0 = check_positive("q0", q0)
    if min(sizes) < k:
        raise ValueError(f"N = {N} gives a block of {min(sizes)} coordinates, fewer than "
                         f"p_star = {k}: every block must hold the teacher's part")
    rng = np.random.default_rng(seed)
    Q0 = np.empty((n, B, p, p))
    rho0 = np.empty((n, B, p, k))
    for c in range(B):
        L = _psd_factor(T[c])
        G = rng.standard_normal((n, p, k))
        rest = sizes[c] - k
        if rest >= p:
            S = wishart(df=rest, scale=np.eye(p)).rvs(size=n, random_state=rng).reshape(n, p, p)
        else:
            G2 = rng.standard_normal((n, p, rest))
            S = G2 @ np.swapaxes(G2, -1, -2)
        Q0[:, c] = q0 * (G @ np.swapaxes(G, -1, -2) + S) / N
        rho0[:, c] = np.sqrt(q0 / N) * G @ L.T
    if model.constraint == "sphere":
        scale = 1.0 / np.sqrt(np.diagonal(Q0.sum(1), axis1=-2, axis2=-1))
        Q0 = scale[:, None, :, None] * Q0 * scale[:, None, None, :]
        rho0 = scale[:, None, :, None] * rho0
    return Q0, rho0


def _psd_factor(T):
    """A factor ``L`` with ``L Lᵀ = T`` of a positive semi-definite ``T`` (eigenvalues)."""
    w, V = np.linalg.eigh(T)
    return V * np.sqrt(np.maximum(w, 0.0))


def fluctuations(model, Q0, rho0, T, N, t_eval, start: str = "fixed", q0: float = 1.0,
                 a0=None, form: str | None = None, rtol: float = 1e-7, atol: float = 1e-10,
                 method: str = "RK45", max_norm: float = 1e8, second_order: bool | None = None,
                 expansion_tol: float = 0.2) -> Fluctuations:
    r"""Linear-noise covariance of the order parameters along the ODE (see the module docstring).

    Integrates ``dx/dt = f(x)`` and ``dΣ/dt = JΣ + ΣJᵀ + D`` together.

    Parameters
    ----------
    model : Model
    Q0, rho0 : array_like (p, p), (p, p*), or None
        The start (``start="fixed"``); None with ``start="random"``.  With an input
        spectrum of ``B`` blocks, per block: ``(B, p, p)``, ``(B, p, p*)``
        (docs/derivation.md §8.8: the block ``D`` and Jacobian).
    T : array_like (p*, p*), or (B, p*, p*) with an input spectrum
    N : int >= 1
        Input dimension: ``Cov[X] = Σ/N``.
    t_eval : array_like
        Increasing times ``>= 0`` at which to record; the integration starts at 0.
    start : {"fixed", "random"}
        ``"fixed"``: ``Σ(0) = 0`` (a given start); ``"random"``: ``x(0)`` is the mean of
        the random start ``w_k ~ N(0, q0 I_N)`` (``Q = q0 I`` or ``I`` on the sphere,
        ``ρ = 0``) and ``Σ(0)`` its covariance (:func:`random_start_covariance`) —
        valid until ``ρ`` grows off the plateau (see the module docstring).
    a0 : array_like (p,), optional
        Start of a trained readout (default the model's).
    form : {"matrix", "tensor", "entries"}, optional
        Kernels of the drift and of ``D`` (default: :func:`~symquad.numeric.kernels.kernels`'s).
        ``J``, ``∇ε``, ``∇²ε``, ``f₁`` and the curvature come from the same form: the
        stencils of :mod:`symquad.numeric.drift_derivatives` on the moment kernels
        (matrix, tensor: every activation pair, any width), or the symbolic entry route
        (``"entries"``: polynomial activations, small widths; the reference).
    rtol, atol, method
        :func:`scipy.integrate.solve_ivp` settings.
    max_norm : float
        A state or covariance entry beyond this is a divergence.
    second_order : bool or None
        Also integrate the O(1/N) correction of the mean, ``dc/dt = J c + ½ ∂²f : Σ
        + f₁ − ½ J f`` (:func:`mean_correction_rhs`; ``c(0) = N(E[X(0)] − x(0)) = 0``
        for both starts: the random start's mean is ``x(0)`` exactly), giving
        :attr:`Fluctuations.risk_mean`, ``risk_mean_correction``, ``mean_correction``,
        ``Q_mean``, ``rho_mean``, ``readout_mean`` and ``expansion_valid``.  Derived for
        every model field (:data:`SECOND_ORDER_FIELDS`) and every activation pair with a
        diffusion matrix (polynomials, erf, ReLU, mixed pairs).
        None (default): computed when its extra cost per right-hand side
        (:func:`mean_correction_seconds`) is estimated at most
        :data:`MEAN_CORRECTION_AUTO_SECONDS` (``form="entries"``: its one-time symbolic
        derivation at most :data:`~symquad.second_order_cost.SECOND_ORDER_AUTO_SECONDS`),
        otherwise skipped (the attributes are None and say why); True computes it
        whatever the cost up to :data:`MEAN_CORRECTION_REFUSE_SECONDS` per right-hand
        side (refused above, before any work).
    expansion_tol : float in (0, 1]
        Tolerance of :attr:`Fluctuations.expansion_valid`.

    Returns
    -------
    Fluctuations

    Raises
    ------
    DivergenceError
        If the ODE or ``Σ`` blows up (with the last finite time and state).
    """
    from scipy.integrate import solve_ivp
    declare(model, "fluctuations")
    require_diffusion(model, "the linear-noise approximation (its D and J)")
    N = check_int(N, "N", 1)
    check_choice("start", start, STARTS)
    q0 = check_positive("q0", q0)
    rtol, atol = check_positive("rtol", rtol), check_positive("atol", atol)
    max_norm = check_positive("max_norm", max_norm)
    expansion_tol = check_positive("expansion_tol", expansion_tol)
    if expansion_tol > 1:
        raise ValueError(f"expansion_tol must be in (0, 1], got {expansion_tol}")
    note = ""
    if form is not None and form not in ("matrix", "tensor", "entries"):
        raise ValueError(f"form must be one of ('matrix', 'tensor', 'entries'), got {form!r}")
    if has_spectrum(model) and not second_order:
        # the O(1/N) mean (f₁, ∂²f of the block drift) is not derived for blocks: its stage
        # refuses the spectrum by name when asked for (second_order=True, below)
        note = ("not derived for an input spectrum (the stage 'the O(1/N) correction of the "
                "mean' does not implement spectrum)" if second_order is None
                else "second_order=False")
        second_order = False
    elif second_order is None:
        route = "entries" if form == "entries" else (form or default_form(model))
        estimate = mean_correction_seconds(model, route)
        limit = SECOND_ORDER_AUTO_SECONDS if route == "entries" else MEAN_CORRECTION_AUTO_SECONDS
        second_order = estimate <= limit
        if not second_order:
            note = (f"skipped by default: estimated at {estimate:.3g} s > {limit:g} s "
                    + ("to derive (the entry route)" if route == "entries" else
                       "per right-hand side") + f" for p={model.p}, p_star={model.p_star}")
    elif not second_order:
        note = "second_order=False"
    if second_order:
        declare(model, SECOND_ORDER_STAGE)
        if form == "entries" and not model.is_polynomial:
            raise ValueError("form='entries' (the symbolic O(1/N) mean) is derived for "
                             f"polynomial activations, got activation={model.activation_str!r}"
                             f", teacher_activation={model.teacher_activation_str!r}")
        check_mean_correction_cost(model, "entries" if form == "entries"
                                   else (form or default_form(model)))
    t_eval = as_real_array(t_eval, "t_eval")
    if t_eval.ndim != 1 or t_eval.size == 0 or np.any(t_eval < 0) or np.any(np.diff(t_eval) <= 0):
        raise ValueError("t_eval must be a non-empty 1-d array of increasing times >= 0")
    p, ps = model.p, model.p_star
    T = as_real_array(T, "T")
    if start == "random":
        if Q0 is not None or rho0 is not None:
            raise ValueError("start='random' uses the mean of the random start: pass "
                             "Q0=None, rho0=None")
        Q0 = (1.0 if model.constraint == "sphere" else q0) * np.eye(p)
        rho0 = np.zeros((p, ps))
        if has_spectrum(model):
            # per block E[Q^c] = q0 f_c I (on the sphere f_c I), E[ρ^c] = 0 (docs/model.md §1a)
            f = np.array([float(fb) for fb, _ in model.spectrum])
            Q0 = f[:, None, None] * Q0
            rho0 = np.zeros((model.n_blocks, p, ps))
    Q0, rho0, T = as_overlaps(model, Q0, rho0, T)
    if model.constraint == "sphere":
        # lazy: scipy
        from .integrate import check_sphere
        check_sphere(model, Q0)
    lay = state_layout(model)
    # sizes before any work: the state, its covariance (dim x dim) at every output time
    if lay.dim > MAX_SDE_DIM:
        raise ValueError(f"fluctuations at p={p}, p_star={ps} has a state of {lay.dim} "
                         f"entries (limit {MAX_SDE_DIM}: a dim x dim covariance and dim^3 "
                         f"products per solver step)")
    t_eval = check_times(t_eval, "t_eval", 8 * (2 * lay.dim ** 2 + 2 * lay.dim),
                         f"fluctuations at {len(t_eval)} times (state of {lay.dim} entries)")
    k = kernels(model, form)
    if model.readout_trained:
        a0 = (np.array([float(c) for c in model.readout]) if a0 is None
              else as_real_array(a0, "a0"))
        if a0.shape != (p,):
            raise ValueError(f"a0 must have shape ({p},), got {a0.shape}")
    elif a0 is not None:
        raise ValueError("a0 is the start of a trained readout (lr_readout > 0)")
    x0 = lay.pack(Q0, rho0, a0)
    S0 = random_start_covariance(model, T, q0) if start == "random" else np.zeros((lay.dim,) * 2)
    dim = lay.dim
    schedule = model.schedule
    t_end = float(t_eval[-1])
    breaks = schedule.breakpoints(0.0, t_end)
    sphere = second_order and model.constraint == "sphere" and k.form != "entries"
    with np.errstate(over="ignore", invalid="ignore"):
        # pass 1: the ODE alone, dense, piece by piece (the schedule's breakpoints)
        pieces = _ode_pieces(k, T, x0, t_end, breaks, method, rtol, atol, max_norm)
        # D (and, for the sphere's f1, the unconstrained D) at the ODE solver's steps,
        # interpolated in t: D is a smooth function of x(t), whose variation those steps
        # resolve; the LNA then needs no D per right-hand side (and a D with jumps at the
        # level of its cubature's accuracy, ReLU's, does not stall the step control)
        splines = [_diffusion_spline(k, T, piece, sphere) for piece in pieces]

    def at(t):
        i = min(bisect_right(breaks, t), len(pieces) - 1)
        x = pieces[i]["sol"](t)
        D = splines[i][0](t)
        Du = splines[i][1](t) if sphere else None
        return x, (0.5 * (D + D.T), None if Du is None else 0.5 * (Du + Du.T))

    def rhs(t, y):
        S = y[:dim * dim].reshape(dim, dim)
        x, diffusion = at(t)
        Q, rho, a = lay.unpack(x)
        f, J, D, f1, curv = k._lna_terms(Q, rho, T, a, S, t=t, second_order=second_order,
                                         diffusion=diffusion)
        JS = J @ S
        out = [(JS + JS.T + D).ravel()]
        if second_order:
            dc = mean_correction_rate(J, f, f1, curv, y[dim * dim:])
            if not schedule.is_constant:
                # the map's explicit time dependence: −½ ∂f/∂t (schedule_time_derivative)
                dc = dc - 0.5 * schedule_time_derivative(k, Q, rho, T, a, t)
            out.append(dc)
        return np.concatenate(out)

    def jump(b, y):
        """A step of the learning rate at ``b``: ``c += δ_N (f(η₋) − f(η₊))`` (step_shift)."""
        if not second_order:
            return y
        y = y.copy()
        Q, rho, a = lay.unpack(at(b)[0])
        y[dim * dim:] += step_shift(k, Q, rho, T, a, b, N)
        return y

    def blown(_, y):
        return max_norm - np.max(np.abs(y)) if np.all(np.isfinite(y)) else -1.0
    blown.terminal = True
    # pass 2: Σ and c, linear along x(t)
    # c(0) = N (E[X(0)] − x(0)): zero for a given start, and for the random start too
    # (E[W Wᵀ/N] = q0 I, E[W W*ᵀ/N] = 0 exactly; on the sphere E[Q_ij] = δ_ij)
    y0 = np.concatenate([S0.ravel()] + ([np.zeros(dim)] if second_order else []))
    with np.errstate(over="ignore", invalid="ignore"):
        if t_end == 0.0:
            # one time, the start (solve_ivp takes no empty interval)
            sol = _Start(t=np.array([0.0]), y=y0[:, None])
        elif breaks:
            # restarted at the schedule's kinks (no solver step across one)
            # lazy: scipy
            from .integrate import solve_pieces
            sol = solve_pieces(rhs, t_end, y0, method, t_eval, rtol, atol, blown, breaks,
                               jump=jump)
            sol.success = sol.status == 0
        else:
            sol = solve_ivp(rhs, (0.0, t_end), y0, t_eval=t_eval, method=method, rtol=rtol,
                            atol=atol, events=blown)
    if sol.status == 1 or not sol.success or sol.y.shape[1] < len(t_eval):
        t_fail = float(sol.t[-1]) if sol.t.size else 0.0
        Qd, rd, _ = lay.unpack(at(t_fail)[0])
        raise DivergenceError(
            f"the linear-noise integration stopped at t = {t_fail:.4g} ({sol.message}); "
            f"state there {describe_state({'Q': Qd, 'rho': rd})}", t_fail,
            {"t": t_fail, "Q": Qd, "rho": rd})
    X = np.stack([at(float(ti))[0] for ti in sol.t])
    S = sol.y[:dim * dim].T.reshape(-1, dim, dim)
    S = 0.5 * (S + np.swapaxes(S, 1, 2))
    Q, rho, a = lay.unpack(X)
    risk = np.asarray(k.risk(Q, rho, T, a), dtype=float).reshape(-1)
    grad = k.risk_gradient(Q, rho, T, a)

    def hess(index):
        # per time: the risk's stencils hold O(dim + pairs) states each
        return np.stack([k.risk_hessian(Q[i], rho[i], T, None if a is None else a[i])
                         for i in index]).reshape(len(index), dim, dim)
    c = c_risk = None
    if second_order:
        c = sol.y[dim * dim:].T
        # E[ε(X)] = ε(x) + (∇ε·c + ½ ∇²ε : Σ)/N + O(N⁻²), the contraction without ∇²ε
        c_risk = np.einsum("ti,ti->t", grad, c) + np.array(
            [k._risk_curvature(Q[i], rho[i], T, None if a is None else a[i], S[i])
             for i in range(len(sol.t))])
    return Fluctuations(model, N, sol.t, Q, rho, a, risk, S, lay, grad, hess, c, c_risk,
                        expansion_tol, T, note)

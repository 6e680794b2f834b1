r"""The learning-rate schedule that minimises the risk at a final time: adjoint of the derived ODE.

The order parameters ``X`` (the state of :mod:`symquad.numeric.layout`) follow the derived
ODE ``dX/dt = f(X, η(t))``; the schedule is piecewise constant, ``η(t) = η_j`` on the
``j``-th of ``n`` equal pieces of ``[0, t_f]``, ``0 <= η_j <= η_max``.  The objective is
the population risk ``J(η) = ε(X(t_f))``.  Its gradient comes from the adjoint
(Pontryagin) system, integrated backwards from ``t_f``:

.. math::

    λ(t_f) = ∇ε(X(t_f)),\qquad \frac{dλ}{dt} = -J_f(X, η)^T λ,\qquad
    \frac{∂J}{∂η_j} = \int_{t_j}^{t_{j+1}} λ(t)·\frac{∂f}{∂η}(X(t), η_j)\,dt,

with ``J_f = ∂f/∂X`` the exact Jacobian of the drift (:meth:`symquad.Kernels.jacobian`,
the entry route differentiated symbolically) and ``∇ε`` the exact risk gradient.  The
drift is a polynomial of degree 2 in the step size — ``f = f₀ + η f₁ + η² f₂``: the
gradient term is linear in ``η`` (weight decay's ``ηλ`` too), the ``η²`` term is the
squared step, ``f₀`` the readout's own rate ``η_a`` — so ``∂f/∂η = f₁ + 2η f₂ =
(f(η + 1) − f(η − 1))/2`` exactly, two evaluations of the drift at exact step sizes (an
identity of quadratics, not a finite-difference approximation; the degree is checked on
the symbolic drift by ``tests/test_optimal_schedule.py``).  The minimisation is L-BFGS-B over the
``η_j`` with the bounds, from the model's constant ``lr``.

Every forward solve is one piece at a time (the schedule's jumps are solver restarts);
the backward solve uses the forward solution's dense output.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..stages import declare
from .checks import as_overlaps, check_int, check_positive
from ..spec import check_model
from .._generated.assembly import PARAMS
from .integrate import initial_readout
from .kernels import _jacobian_function, kernels
from .layout import state_layout

__all__ = ["optimal_schedule", "OptimalSchedule"]

#: Most pieces of a schedule (each is a forward and a backward solve per gradient).
MAX_PIECES = 2000


@dataclass
class OptimalSchedule:
    """Result of :func:`optimal_schedule`.

    Attributes
    ----------
    model : Model
        The model (its ``lr`` was the start of the optimisation).
    t : ndarray (n + 1,)
        Edges of the pieces, ``0 = t_0 < … < t_n = t_final``.
    lr : ndarray (n,)
        The learning rate on each piece (in the units of ``Model.lr``; the step size is
        ``lr · p`` with ``lr_scaling="width"``).
    t_curve, risk : ndarray
        The risk ``ε(t)`` under the optimal schedule (``t_curve`` has 11 points per piece).
    risk_final : float
        ``ε(t_final)``.
    risk_start : float
        ``ε(t_final)`` under the model's constant ``lr`` (the optimisation's start).
    n_gradients : int
        Adjoint gradients computed (each is one forward and one backward solve).
    seconds : float
    message : str
        The optimiser's message.
    """

    model: object
    t: np.ndarray
    lr: np.ndarray
    t_curve: np.ndarray
    risk: np.ndarray
    risk_final: float
    risk_start: float
    n_gradients: int
    seconds: float
    message: str
    rtol: float = field(default=1e-10, repr=False)

    @property
    def t_final(self) -> float:
        return float(self.t[-1])

    def lr_at(self, t):
        """The learning rate of the schedule at the times `t` (right-continuous steps)."""
        i = np.clip(np.searchsorted(self.t, np.asarray(t, float), side="right") - 1, 0,
                    self.lr.size - 1)
        return self.lr[i]

    def schedule_model(self):
        """The model with this schedule as its ``lr_schedule`` (a ``step`` schedule).

        Refused when a piece has ``lr = 0`` (a schedule's factors are positive).
        """
        if not np.all(self.lr > 0):
            raise ValueError("a piece of the optimal schedule has lr = 0; a Model's "
                             "lr_schedule needs positive factors")
        lr0 = float(self.lr[0])
        points = tuple((float(t), float(v / lr0)) for t, v in zip(self.t[1:-1], self.lr[1:]))
        sched = ("step", points) if points else "constant"
        return self.model.replace(lr=lr0, lr_schedule=sched)

    def __repr__(self):
        return (f"OptimalSchedule({self.lr.size} pieces to t_final={self.t_final:g}: "
                f"risk_final={self.risk_final:.6g} (constant lr={self.model.lr:g}: "
                f"{self.risk_start:.6g}), lr in [{self.lr.min():.4g}, {self.lr.max():.4g}], "
                f"{self.n_gradients} gradients, {self.seconds:.3g} s)")


class _Problem:
    """Forward and adjoint solves of ``dX/dt = f(X, η)`` for piecewise-constant ``η``."""

    def __init__(self, model, x0, T, edges, rtol, atol):
        # the explicit entry polynomials are the fastest drift at small widths
        self.kern = kernels(model, "entries" if model.p + model.p_star <= 4 else None)
        self.jac = _jacobian_function(model)
        self.lay = state_layout(model)
        self.T, self.x0, self.edges = T, x0, edges
        self.rtol, self.atol = rtol, atol
        self.base = list(self.kern.params_at(None))
        self.i_eta = PARAMS.index("eta")
        self.nfev = 0

    def _params(self, eta):
        params = list(self.base)
        params[self.i_eta] = float(eta)
        return tuple(params)

    def f(self, x, eta):
        Q, rho, a = self.lay.unpack(x)
        k = self.kern
        args = k._arrays(Q, rho, self.T, a)
        self.nfev += 1
        return self.lay.pack(*_blocks(k, k._rhs(*args, self._params(eta))))

    def f_eta(self, x, eta):
        """``∂f/∂η = f₁ + 2η f₂`` at `x`: ``(f(η + 1) − f(η − 1))/2``, exact for a drift of
        degree 2 in ``η`` (the symmetric difference of a quadratic is its derivative)."""
        return 0.5 * (self.f(x, eta + 1.0) - self.f(x, eta - 1.0))

    def J(self, x, eta):
        Q, rho, a = self.lay.unpack(x)
        args = self.kern._arrays(Q, rho, self.T, a)
        return self.jac(*args, self._params(eta))[0]

    def risk(self, x):
        Q, rho, a = self.lay.unpack(x)
        return float(self.kern.risk(Q, rho, self.T, a if self.kern.model.readout_trained
                                    else None))

    def risk_gradient(self, x):
        Q, rho, a = self.lay.unpack(x)
        return self.kern.risk_gradient(Q, rho, self.T, a if self.kern.model.readout_trained
                                       else None)

    def forward(self, etas, dense=True):
        from scipy.integrate import solve_ivp
        x, sols = self.x0, []
        for j, eta in enumerate(etas):
            sol = solve_ivp(lambda t, y, e=eta: self.f(y, e), (self.edges[j], self.edges[j + 1]),
                            x, method="DOP853", rtol=self.rtol, atol=self.atol,
                            dense_output=dense)
            if sol.status != 0 or not np.all(np.isfinite(sol.y[:, -1])):
                return None, sols
            sols.append(sol)
            x = sol.y[:, -1]
        return x, sols

    def piece(self, x, j, eta):
        """The state at the end of piece `j` from `x` at its start, with step size `eta`."""
        from scipy.integrate import solve_ivp
        sol = solve_ivp(lambda t, y: self.f(y, eta), (self.edges[j], self.edges[j + 1]), x,
                        method="DOP853", rtol=self.rtol, atol=self.atol)
        return sol.y[:, -1] if sol.status == 0 and np.all(np.isfinite(sol.y[:, -1])) else None

    def greedy(self, eta_max):
        """Each piece's ``η`` minimises the risk at that piece's end (a bounded 1-d search).

        The myopic schedule: for the linear model it is the piecewise form of the exact
        optimum (minimising ``dε/dt`` pointwise), and in general a start from which the
        gradient method sees every piece (from a constant large ``η`` the risk at
        ``t_final`` hardly depends on the first pieces: their effect decays like
        ``exp(−∫ rate dt)``).
        """
        from scipy.optimize import minimize_scalar
        x, etas = self.x0, []
        for j in range(len(self.edges) - 1):
            def end_risk(eta, x=x, j=j):
                y = self.piece(x, j, eta)
                return math.inf if y is None else self.risk(y)
            best = minimize_scalar(end_risk, bounds=(0.0, eta_max), method="bounded",
                                   options={"xatol": 1e-4 * eta_max})
            etas.append(float(best.x))
            x = self.piece(x, j, best.x)
            if x is None:
                return None
        return np.array(etas)

    def value_and_gradient(self, etas):
        from scipy.integrate import solve_ivp
        x_end, sols = self.forward(etas)
        if x_end is None:
            return math.inf, None
        lam = self.risk_gradient(x_end)
        n = lam.size
        grad = np.zeros(len(etas))
        for j in range(len(etas) - 1, -1, -1):
            eta, xs = etas[j], sols[j].sol

            def back(t, y, eta=eta, xs=xs):
                x = xs(t)
                lam_t = y[:n]
                return np.concatenate([-self.J(x, eta).T @ lam_t,
                                       [-lam_t @ self.f_eta(x, eta)]])
            # the gradient needs fewer digits than the risk: 100x the forward tolerance
            sol = solve_ivp(back, (self.edges[j + 1], self.edges[j]),
                            np.concatenate([lam, [0.0]]), method="DOP853",
                            rtol=min(1e-6, 100 * self.rtol), atol=self.atol)
            lam, grad[j] = sol.y[:n, -1], sol.y[n, -1]
        return self.risk(x_end), grad


def _blocks(kern, out):
    dQ, drho, da = out
    return (dQ, drho, da) if kern.model.readout_trained else (dQ, drho)


def optimal_schedule(model, t_final, Q0=None, rho0=None, T=None, *, lr_max=None,
                     n_pieces=20, a0=None, rtol=1e-9, atol=1e-12, maxiter=100,
                     lr_init=None, greedy=True) -> OptimalSchedule:
    r"""The piecewise-constant learning rate that minimises the risk ``ε(t_final)``.

    Gradient method (L-BFGS-B, :func:`scipy.optimize.minimize`) on the ``n_pieces``
    values, each in ``[0, lr_max]``, with exact gradients from the adjoint of the derived
    ODE (module docstring: the exact Jacobian, ``∂f/∂η`` from the drift's polynomial
    structure in ``η``).

    Parameters
    ----------
    model : Model
        Its constant ``lr`` starts the optimisation (``lr_schedule`` must be
        ``"constant"``: the schedule is what is optimised).  Polynomial activations (the
        exact Jacobian is the entry route's).
    t_final : float
        The time ``t = steps/N`` at which the risk is minimised, ``> 0``.
    Q0 : array (p, p), optional
        Initial student overlaps (default ``I``).
    rho0 : array (p, p*)
        Initial student–teacher overlaps (required: ``ρ = 0`` is a fixed point).
    T : array (p*, p*), optional
        Teacher overlaps (default ``I``).
    lr_max : float
        Upper bound of the learning rate (``> 0``; required: beyond the stable rate the
        ODE diverges).
    n_pieces : int
        Equal pieces of ``[0, t_final]``, ``1 .. 2000``.
    a0 : array (p,), optional
        Initial readout when it is trained.
    rtol, atol : float
        Tolerances of the forward and backward solves (DOP853).
    maxiter : int
        Iterations of L-BFGS-B.
    lr_init : float or array (n_pieces,), optional
        Start of the optimisation (default ``min(model.lr, lr_max)`` on every piece).
    greedy : bool
        Start instead from the myopic schedule (each piece minimising the risk at its own
        end, a bounded 1-d search per piece) when its final risk is lower (default True).

    Returns
    -------
    OptimalSchedule
        ``.t``, ``.lr``, ``.t_curve``, ``.risk``, ``.risk_final`` and
        :meth:`OptimalSchedule.schedule_model`;
        :func:`symquad.plotting.optimal_schedule_figure` draws it.
    """
    from scipy.optimize import minimize

    check_model(model)
    declare(model, "optimal_schedule")
    if not model.schedule.is_constant:
        raise ValueError(f"optimal_schedule optimises the schedule: give the model with "
                         f"lr_schedule='constant', got lr_schedule={model.lr_schedule!r}")
    if not model.is_polynomial:
        raise ValueError("optimal_schedule needs polynomial activations (its exact Jacobian "
                         f"is the entry route's), got activation={model.activation_str!r}")
    t_final = check_positive("t_final", t_final)
    n_pieces = check_int(n_pieces, "n_pieces", 1)
    if n_pieces > MAX_PIECES:
        raise ValueError(f"n_pieces must be in [1, {MAX_PIECES}], got {n_pieces}")
    if lr_max is None:
        raise ValueError("lr_max (the upper bound of the learning rate, > 0) is required: "
                         "beyond the stable rate the ODE diverges")
    lr_max = check_positive("lr_max", lr_max)
    rtol, atol = check_positive("rtol", rtol), check_positive("atol", atol)
    maxiter = check_int(maxiter, "maxiter", 1)
    if rho0 is None:
        raise ValueError("rho0 (the initial student-teacher overlaps, shape (p, p_star)) is "
                         "required: rho = 0 is a fixed point of the ODE")
    p, ps = model.p, model.p_star
    Q0 = np.eye(p) if Q0 is None else Q0
    T = np.eye(ps) if T is None else T
    Q0, rho0, T = as_overlaps(model, Q0, rho0, T)
    a_start = initial_readout(model, a0)
    if lr_init is None:
        lr_init = min(model.lr, lr_max)
    x_init = np.broadcast_to(np.asarray(lr_init, dtype=float), (n_pieces,)).copy()
    if not (np.all(np.isfinite(x_init)) and np.all(x_init >= 0) and np.all(x_init <= lr_max)):
        raise ValueError(f"lr_init must be in [0, lr_max={lr_max:g}] on every piece")
    x0 = state_layout(model).pack(Q0, rho0, a_start)
    edges = np.linspace(0.0, t_final, n_pieces + 1)
    scale = model.eta / model.lr                     # eta = lr * scale (lr_scaling)
    prob = _Problem(model, x0, T, edges, rtol, atol)
    count = {"n": 0}
    tick = time.perf_counter()

    def objective(lrs):
        count["n"] += 1
        value, grad = prob.value_and_gradient(lrs * scale)
        if grad is None:                    # a diverging schedule: far from the optimum
            return 1e300, -np.ones_like(lrs)
        return value, grad * scale

    start_value = objective(x_init)[0]
    if greedy:
        # start from the better of the given start and the myopic schedule
        g = prob.greedy(lr_max * scale)
        if g is not None and objective(g / scale)[0] < start_value:
            x_init = np.clip(g / scale, 0.0, lr_max)
    res = minimize(objective, x_init, jac=True, method="L-BFGS-B",
                   bounds=[(0.0, lr_max)] * n_pieces,
                   options={"maxiter": maxiter, "ftol": 1e-15, "gtol": 1e-12})
    lrs = np.clip(res.x, 0.0, lr_max)
    x_end, sols = prob.forward(lrs * scale)
    t_curve = np.concatenate([np.linspace(edges[j], edges[j + 1], 11)[(0 if j == 0 else 1):]
                              for j in range(n_pieces)])
    states = np.concatenate([sols[j].sol(np.linspace(edges[j], edges[j + 1], 11)
                                         [(0 if j == 0 else 1):]).T for j in range(n_pieces)])
    risk = np.array([prob.risk(x) for x in states])
    return OptimalSchedule(model, edges, lrs, t_curve, risk, prob.risk(x_end), start_value,
                           count["n"], time.perf_counter() - tick, str(res.message), rtol)

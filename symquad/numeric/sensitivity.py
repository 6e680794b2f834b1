r"""Forward sensitivities of the ODE and of its risk to the model's parameters.

For a parameter ``θ`` of the model (learning rate, label noise, weight decay, batch
size, a readout learning rate, a coefficient of a polynomial activation) the
sensitivity ``s_θ(t) = ∂x(t)/∂θ`` of the ODE solution ``x(t)`` obeys the forward
sensitivity equation

.. math::  \dot s_θ = J(x)\, s_θ + ∂f/∂θ (x), \qquad s_θ(0) = 0,

with ``J = ∂f/∂X`` the Jacobian (:meth:`~symquad.numeric.kernels.Kernels.jacobian`: exact
stencils of the drift kernels for polynomials, Richardson for erf/ReLU),
integrated together with ``x``.  The risk then moves by

.. math::  \frac{dε(t)}{dθ} = ∇ε(x)·s_θ + ∂ε/∂θ (x) .

With a learning-rate schedule ``η(t) = η s(t)`` (docs/model.md §4.1) ``J``, ``f`` and
``∂f/∂θ`` are evaluated at ``η(t)`` (:meth:`~symquad.numeric.kernels.Kernels.params_at`),
the integration is restarted at the schedule's kinks and jumps as
:func:`symquad.numeric.integrate.integrate` does (``x`` and ``s_θ`` are continuous there,
their slopes jump), and ``"lr"`` is the base ``η``: ``∂f/∂η = s(t) ∂f/∂η(t)``, which
the stencil below gives directly (its kernels carry the schedule).

``∂f/∂θ`` and ``∂ε/∂θ`` are exact for the derived drift: ``f`` is a polynomial of
degree at most 4 in each of these parameters (``η A + η² B/b``; linear in ``Δ``, in the
weight decay and in ``1/b``; degree ≤ 4 in an activation coefficient, which enters the
second moment of the error signal ``δ_k δ_l`` four times), so the derivative of the
degree-4 Lagrange interpolant through five evaluations ``θ + k h`` (``k = 0 … 4``, one
sided so that a parameter at its lower bound, e.g. no weight decay, stays in range) is
the derivative itself, up to rounding ``~ 10⁻¹² |f|``.  For the batch size the drift is
``A + B/b`` and two evaluations (``b`` and ``b + 1``) give ``∂f/∂b = −B/b²`` exactly.

Used by :mod:`symquad.studies.resolution` (what a validation run can detect).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ..stages import declare
from .checks import as_overlaps, as_real_array
from .errors import DivergenceError
from .kernels import kernels
from .layout import state_layout

__all__ = ["Sensitivity", "risk_sensitivity", "sensitivity_parameters", "parameter_scale"]

#: One-sided five-point weights of ``g'(0)`` from ``g(0), g(h), …, g(4h)`` (times ``1/h``):
#: exact for polynomials of degree <= 4.
_FORWARD_WEIGHTS = np.array([-25.0 / 12.0, 4.0, -3.0, 4.0 / 3.0, -0.25])
#: Relative step of the stencil (rounding error ~ 1e-16 * 11.4 / 1e-3 ~ 1e-12 relative).
_REL_STEP = 1e-3


def sensitivity_parameters(model) -> tuple:
    """Names of the parameters :func:`risk_sensitivity` handles for `model`.

    ``"lr"``, ``"noise"``, ``"weight_decay"``, ``"batch_size"``, ``"lr_readout"`` (a
    trained readout) and ``"activation[k]"`` for each non-zero coefficient of ``z^k`` in
    a polynomial student activation.
    """
    names = ["lr", "noise", "weight_decay", "batch_size"]
    if model.readout_trained:
        names.append("lr_readout")
    if model.activation_kind == "polynomial":      # whatever the teacher's
        names += [f"activation[{k}]" for k, c in enumerate(model.activation) if c != 0]
    return tuple(names)


def _replaced(model, name, value):
    """`model` with parameter `name` set to `value` (an activation coefficient by index)."""
    if name.startswith("activation["):
        k = int(name[len("activation["):-1])
        coeffs = list(model.activation)
        coeffs[k] = Fraction(value)
        return model.replace(activation=tuple(coeffs), teacher_activation=model.teacher_activation)
    return model.replace(**{name: value})


def _value(model, name) -> float:
    if name.startswith("activation["):
        return float(model.activation[int(name[len("activation["):-1])])
    return float(getattr(model, name))


def parameter_scale(model, name) -> float:
    r"""The scale ``Θ`` of parameter `name`: the size of a change that is large for it.

    ``max(|θ|, 1)`` for an activation coefficient, ``max(|θ|, |η|, 10⁻²)`` for the rates,
    the label noise and the weight decay (a parameter at zero, e.g. no weight decay, is
    measured against the learning rate), ``b`` for the batch size.  The stencil's step
    is ``_REL_STEP · Θ``; :mod:`symquad.studies.resolution` measures ``Θ · dε/dθ``
    against the risk to tell a parameter the risk does not depend on.
    """
    theta = _value(model, name)
    if name == "batch_size":
        return abs(theta)
    return max(abs(theta), 1.0 if name.startswith("activation[") else
               max(abs(model.lr), 1e-2))


def _stencil(model, name, form):
    """``[(weight, Kernels)]`` whose weighted sum of drifts (risks) is ``∂f/∂θ`` (``∂ε/∂θ``)."""
    theta = _value(model, name)
    if name == "batch_size":
        b = int(model.batch_size)
        # f = A + B/b: (f(b) - f(b+1)) / (1/b - 1/(b+1)) = B, and df/db = -B/b^2
        scale = -1.0 / (b * b) / (1.0 / b - 1.0 / (b + 1))
        return [(scale, kernels(model, form)),
                (-scale, kernels(model.replace(batch_size=b + 1), form))]
    h = _REL_STEP * parameter_scale(model, name)
    return [(w / h, kernels(_replaced(model, name, theta + k * h), form))
            for k, w in enumerate(_FORWARD_WEIGHTS)]


@dataclass
class Sensitivity:
    """Forward sensitivities along one ODE trajectory.

    Attributes
    ----------
    t : ndarray (n,)
    risk : ndarray (n,)
        ``ε(x(t))``.
    risk_derivative : dict
        Parameter name → ``dε(t)/dθ``, shape (n,).
    state_derivative : dict
        Parameter name → ``∂x(t)/∂θ``, shape (n, dim), in the state order of the layout.
    """

    t: np.ndarray
    risk: np.ndarray = field(repr=False)
    risk_derivative: dict = field(repr=False)
    state_derivative: dict = field(repr=False)

    def __repr__(self) -> str:
        return (f"Sensitivity({len(self.t)} times in [{self.t[0]:.3g}, {self.t[-1]:.3g}]; "
                f"parameters {', '.join(self.risk_derivative)})")


def risk_sensitivity(model, Q0, rho0, T, t_eval, parameters=None, a0=None, form=None,
                     rtol=1e-8, atol=1e-11, max_norm=1e8) -> Sensitivity:
    r"""``dε(t)/dθ`` along the ODE from ``(Q0, ρ0)`` for each parameter (module docstring).

    Parameters
    ----------
    model : Model
        Any activation pair the kernels support (the Jacobian comes from the drift
        kernels' stencils, :mod:`symquad.numeric.drift_derivatives`).
    Q0, rho0, T : array_like
        Start and teacher overlaps.
    t_eval : array_like
        Increasing times ``>= 0``; the integration starts at 0.
    parameters : sequence of str, optional
        Default :func:`sensitivity_parameters`.
    a0 : array_like (p,), optional
        Start of a trained readout (default the model's).
    form : str, optional
        Kernel form of the drift and the risk (the Jacobian is the entry route's).
    rtol, atol : float
        :func:`scipy.integrate.solve_ivp` tolerances.

    Returns
    -------
    Sensitivity

    Raises
    ------
    ValueError
        An unknown parameter name, an activation pair without kernels (checked before
        the integration).
    DivergenceError
        The ODE or a sensitivity blows up.
    """
    from scipy.integrate import solve_ivp

    from .integrate import solve_pieces        # lazy: scipy (as solve_ivp above)

    declare(model, "the forward sensitivities")
    allowed = sensitivity_parameters(model)
    parameters = allowed if parameters is None else tuple(parameters)
    unknown = [n for n in parameters if n not in allowed]
    if unknown:
        raise ValueError(f"parameters: {unknown} not among {list(allowed)}")
    t_eval = as_real_array(t_eval, "t_eval")
    if t_eval.ndim != 1 or t_eval.size == 0 or np.any(t_eval < 0) or np.any(np.diff(t_eval) <= 0):
        raise ValueError("t_eval must be a non-empty 1-d array of increasing times >= 0")
    Q0, rho0, T = as_overlaps(model, Q0, rho0, T)
    lay = state_layout(model)
    if model.readout_trained:
        a0 = (np.array([float(c) for c in model.readout]) if a0 is None
              else as_real_array(a0, "a0"))
    k = kernels(model, form)
    # the Jacobian's size check and generation happen here, before the integration
    k.jacobian(Q0, rho0, T, a0, t=0.0)
    stencils = {name: _stencil(model, name, form) for name in parameters}
    dim, m = lay.dim, len(parameters)

    def drift_derivative(stencil, Q, rho, a, t):
        return sum(w * lay.pack(*kk.rhs(Q, rho, T, a, t=t)) for w, kk in stencil)

    def rhs(t, y):
        # every term at η(t) (Kernels.params_at); a constant-η model ignores t
        x, S = y[:dim], y[dim:].reshape(m, dim)
        Q, rho, a = lay.unpack(x)
        J = k.jacobian(Q, rho, T, a, t=t)
        dS = S @ J.T + np.stack([drift_derivative(stencils[n], Q, rho, a, t)
                                 for n in parameters])
        return np.concatenate([lay.pack(*k.rhs(Q, rho, T, a, t=t)), dS.ravel()])

    def blown(_, y):
        return max_norm - np.max(np.abs(y)) if np.all(np.isfinite(y)) else -1.0
    blown.terminal = True
    y0 = np.concatenate([lay.pack(Q0, rho0, a0), np.zeros(m * dim)])
    t_end = float(t_eval[-1])
    breaks = model.schedule.breakpoints(0.0, t_end)
    with np.errstate(over="ignore", invalid="ignore"):
        if breaks:
            # restarted at the schedule's kinks and jumps, as integrate does (x and s are
            # continuous there; only their slopes jump)
            sol = solve_pieces(rhs, t_end, y0, "RK45", t_eval, rtol, atol, blown, breaks)
            sol.success = sol.status == 0
        else:
            sol = solve_ivp(rhs, (0.0, t_end), y0, t_eval=t_eval, method="RK45",
                            rtol=rtol, atol=atol, events=blown)
    if sol.status == 1 or not sol.success or sol.y.shape[1] < len(t_eval):
        t_fail = float(sol.t[-1]) if sol.t.size else 0.0
        raise DivergenceError(f"the sensitivity integration stopped at t = {t_fail:.4g} "
                              f"({sol.message})", t_fail, {"t": t_fail})
    X = sol.y[:dim].T
    S = sol.y[dim:].T.reshape(len(sol.t), m, dim)
    Q, rho, a = lay.unpack(X)
    risk = np.asarray(k.risk(Q, rho, T, a), float).reshape(-1)
    grad = k.risk_gradient(Q, rho, T, a)
    out, states = {}, {}
    for i, name in enumerate(parameters):
        explicit = sum(w * np.asarray(kk.risk(Q, rho, T, a), float).reshape(-1)
                       for w, kk in stencils[name])
        out[name] = np.einsum("ti,ti->t", grad, S[:, i]) + explicit
        states[name] = S[:, i]
    return Sensitivity(sol.t, risk, out, states)

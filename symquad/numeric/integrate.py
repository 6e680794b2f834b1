"""Integration of the order-parameter ODEs with :func:`scipy.integrate.solve_ivp`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.integrate import solve_ivp

from ..spec import Model, check_model
from .checks import as_overlaps, check_positive
from .errors import DivergenceError, describe_state
from .kernels import kernels
from .persist import load_npz, model_from_dict, model_to_dict, save_npz

__all__ = ["ODESolution", "integrate"]

ON_DIVERGENCE = ("raise", "stop")


@dataclass(frozen=True)
class ODESolution:
    """Solution of the ODEs on a time grid.

    Attributes
    ----------
    t : ndarray (n,)
    Q : ndarray (n, p, p)
    rho : ndarray (n, p, p*)
    risk : ndarray (n,)
    T : ndarray (p*, p*)
    status : {"ok", "diverged", "failed"}
    t_diverged : float or None
        Time at which the state left the finite region (``status == "diverged"``).
    message : str
    """

    model: Model
    t: np.ndarray
    Q: np.ndarray
    rho: np.ndarray
    risk: np.ndarray
    T: np.ndarray
    status: str = "ok"
    t_diverged: float | None = None
    message: str = ""
    nfev: int = field(default=0, repr=False)

    def __repr__(self):
        return (f"ODESolution({len(self.t)} times in [{self.t[0]:.3g}, {self.t[-1]:.3g}], "
                f"status={self.status!r}, final risk {self.risk[-1]:.4g}; {self.model!r})")

    def save(self, path) -> Path:
        """Write the solution to ``path`` (``.npz`` with a JSON ``meta.json`` member), atomically.

        The arrays ``t, Q, rho, risk, T`` are stored exactly; the model, the
        status, ``t_diverged``, the solver message and ``nfev`` go into the
        JSON metadata.  :meth:`load` reads it back.
        """
        meta = {"model": model_to_dict(self.model), "status": self.status,
                "t_diverged": self.t_diverged, "message": self.message,
                "nfev": int(self.nfev)}
        arrays = {"t": self.t, "Q": self.Q, "rho": self.rho, "risk": self.risk, "T": self.T}
        return save_npz(path, "ODESolution", meta, arrays)

    @classmethod
    def load(cls, path) -> "ODESolution":
        """Read a solution written by :meth:`save` (same arrays, same model)."""
        meta, arr = load_npz(path, "ODESolution")
        t_div = meta["t_diverged"]
        return cls(model_from_dict(meta["model"]), arr["t"], arr["Q"], arr["rho"], arr["risk"],
                   arr["T"], meta["status"], None if t_div is None else float(t_div),
                   meta["message"], int(meta["nfev"]))


def _pack(Q, rho):
    return np.concatenate([Q.ravel(), rho.ravel()])


def _unpack(y, p, k):
    Q = y[: p * p].reshape(p, p)
    return 0.5 * (Q + Q.T), y[p * p:].reshape(p, k)


def integrate(model: Model, Q0, rho0, T, t_max, t_eval=None, *, method: str = "RK45",
              rtol: float = 1e-8, atol: float = 1e-11, max_norm: float | None = None,
              on_divergence: str = "raise", form: str | None = None) -> ODESolution:
    """Integrate ``dQ/dt, dρ/dt`` from ``(Q0, ρ0)`` with fixed teacher overlap ``T``.

    Parameters
    ----------
    model : Model
    Q0 : array (p, p), rho0 : array (p, p*), T : array (p*, p*)
        Initial overlaps; ``[[Q0, ρ0], [ρ0ᵀ, T]]`` must be symmetric PSD.
    t_max : float
        Final time (``t = steps/N``), > 0.
    t_eval : array, optional
        Output times in ``[0, t_max]``; default 501 equally spaced points.
    method, rtol, atol
        Passed to :func:`scipy.integrate.solve_ivp`.
    max_norm : float, optional
        The run counts as diverged once ``max|Q|`` exceeds this (default
        ``1e6 · max(1, max|Q0|, max|T|)``) or the state stops being finite.
    on_divergence : {"raise", "stop"}
        ``"raise"``: raise :class:`DivergenceError` (time of divergence, last
        finite state, the partial solution attached); ``"stop"``: return the
        partial solution with ``status="diverged"``.
    form : {"matrix", "entries"}, optional
        Which generated kernel to use (see :func:`symquad.kernels`).

    Returns
    -------
    ODESolution
    """
    check_model(model)
    Q0, rho0, T = as_overlaps(model, Q0, rho0, T)
    t_max = check_positive("t_max", t_max)
    if on_divergence not in ON_DIVERGENCE:
        raise ValueError(f"on_divergence must be one of {ON_DIVERGENCE}, got {on_divergence!r}")
    if t_eval is None:
        t_eval = np.linspace(0.0, t_max, 501)
    t_eval = np.asarray(t_eval, dtype=float)
    if t_eval.ndim != 1 or t_eval.size == 0 or np.any(np.diff(t_eval) <= 0) \
            or t_eval[0] < 0 or t_eval[-1] > t_max:
        raise ValueError("t_eval must be a non-empty increasing 1-d array within [0, t_max]")
    if max_norm is None:
        max_norm = 1e6 * max(1.0, float(np.max(np.abs(Q0))), float(np.max(np.abs(T))))
    max_norm = check_positive("max_norm", max_norm)

    kern = kernels(model, form)
    p, k = model.p, model.p_star
    last = {"t": 0.0, "Q": Q0.copy(), "rho": rho0.copy()}

    def fun(t, y):
        Q, rho = _unpack(y, p, k)
        if np.all(np.isfinite(y)):
            last.update(t=t, Q=Q, rho=rho)
        with np.errstate(over="ignore", invalid="ignore"):
            dQ, drho = kern.rhs(Q, rho, T)
        out = _pack(dQ, drho)
        if not np.all(np.isfinite(out)):
            # An infinite slope would make the step-size control shrink forever.
            out = np.full_like(out, np.inf)
        return out

    def blow_up(t, y):
        y_abs = np.abs(y)
        return max_norm - (np.max(y_abs) if np.all(np.isfinite(y)) else np.inf)

    blow_up.terminal = True
    blow_up.direction = -1

    sol = solve_ivp(fun, (0.0, t_max), _pack(Q0, rho0), method=method, t_eval=t_eval,
                    rtol=rtol, atol=atol, events=blow_up)
    Qs = np.empty((sol.t.size, p, p))
    rhos = np.empty((sol.t.size, p, k))
    for n in range(sol.t.size):
        Qs[n], rhos[n] = _unpack(sol.y[:, n], p, k)
    risk = np.asarray(kern.risk(Qs, rhos, T), dtype=float).reshape(sol.t.size)

    diverged = bool(sol.status == 1 and sol.t_events[0].size) or (
        sol.status == -1) or not np.all(np.isfinite(sol.y))
    if not diverged:
        return ODESolution(model, sol.t, Qs, rhos, risk, T, "ok", None, sol.message, sol.nfev)
    if sol.t_events[0].size:
        # the state where it crossed max_norm: the last one that is still finite
        t_div = float(sol.t_events[0][0])
        Q_div, rho_div = _unpack(sol.y_events[0][0], p, k)
        last.update(t=t_div, Q=Q_div, rho=rho_div)
    else:
        t_div = float(last["t"])
    finite = np.all(np.isfinite(sol.y), axis=0)
    keep = slice(0, int(np.argmin(finite)) if not finite.all() else sol.t.size)
    partial = ODESolution(model, sol.t[keep], Qs[keep], rhos[keep], risk[keep], T,
                          "diverged", t_div, sol.message, sol.nfev)
    msg = (f"ODE diverged at t = {t_div:.6g} (state exceeded max_norm={max_norm:.3g} or "
           f"stopped being finite; solver: {sol.message}); last finite state at "
           f"t = {last['t']:.6g}: {describe_state({'Q': last['Q'], 'rho': last['rho']})}. "
           f"A smaller lr usually helps (model: {model!r}).")
    if on_divergence == "raise":
        raise DivergenceError(msg, t_div, dict(last), partial)
    return ODESolution(model, partial.t, partial.Q, partial.rho, partial.risk, T,
                       "diverged", t_div, msg, sol.nfev)

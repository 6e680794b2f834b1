"""Integration of the order-parameter ODEs with :func:`scipy.integrate.solve_ivp`."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.integrate import solve_ivp

from ..spec import Model
from ..spectrum import block_axis, has_spectrum
from ..stages import declare
from .checks import as_overlaps, as_real_array, check_choice, check_positive, check_real, \
    check_record_bytes
from .errors import DivergenceError, describe_state
from .kernels import kernels, single_thread_blas
from .persist import load_npz, model_from_dict, model_to_dict, save_npz
from ..progress import progress as _progress

__all__ = ["ODESolution", "integrate", "symmetric_start", "METHODS", "initial_readout",
           "check_sphere"]

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
        With an input spectrum: ``Q`` (n, B, p, p), ``rho`` (n, B, p, p*), ``T``
        (B, p*, p*), the overlaps of every block (docs/model.md §1a).
    status : {"ok", "diverged", "failed"}
    t_diverged : float or None
        Time at which the state left the finite region (``status == "diverged"``).
    message : str
    readout : ndarray (n, p) or None
        The student readout ``a(t)`` when it is trained (``lr_readout > 0``),
        else None (it is fixed at ``model.readout``).
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
    readout: np.ndarray | None = field(default=None, repr=False)

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
        if self.readout is not None:
            arrays["readout"] = self.readout
        return save_npz(path, "ODESolution", meta, arrays)

    @classmethod
    def load(cls, path) -> "ODESolution":
        """Read a solution written by :meth:`save` (same arrays, same model)."""
        meta, arr = load_npz(path, "ODESolution",
                             ("t_diverged", "model", "status", "message", "nfev"),
                             ("t", "Q", "rho", "risk", "T"))
        t_div = meta["t_diverged"]
        return cls(model_from_dict(meta["model"]), arr["t"], arr["Q"], arr["rho"], arr["risk"],
                   arr["T"], meta["status"], None if t_div is None else float(t_div),
                   meta["message"], int(meta["nfev"]), arr.get("readout"))


def _pack(Q, rho, a=None):
    parts = [Q.ravel(), rho.ravel()]
    if a is not None:
        parts.append(np.ravel(a))
    return np.concatenate(parts)


def _unpack(y, p, k, trained=False, lead=()):
    """``(Q, ρ, a)`` from the solver state (full ``Q``, symmetrised; ``a`` only if trained).

    `lead` is the block axis ``(B,)`` of a model with an input spectrum (``Q`` then
    ``(B, p, p)``), ``()`` otherwise.
    """
    size = int(np.prod(lead, dtype=int))
    nq, nr = size * p * p, size * p * k
    Q = y[:nq].reshape(lead + (p, p))
    rho = y[nq:nq + nr].reshape(lead + (p, k))
    a = y[nq + nr:] if trained else None
    return 0.5 * (Q + np.swapaxes(Q, -1, -2)), rho, a


def initial_readout(model: Model, a0=None):
    """The start ``a(0)`` of a trained readout (default ``model.readout``), checked; None if fixed."""
    if not model.readout_trained:
        if a0 is not None:
            raise ValueError("a0 (initial student readout) is accepted only for a trained "
                             "readout (lr_readout > 0); a fixed readout is model.readout")
        return None
    if a0 is None:
        return np.array([float(c) for c in model.readout])
    a0 = as_real_array(a0, "a0")
    if a0.shape[-1:] != (model.p,) or not np.all(np.isfinite(a0)):
        raise ValueError(f"a0 must be a finite array ending in shape (p,) = ({model.p},), "
                         f"got shape {a0.shape}")
    return a0


def check_sphere(model: Model, Q0, name="Q0", tol=1e-8) -> None:
    """With ``constraint="sphere"`` every ``Q0_kk`` must be 1 (the rows lie on the sphere)."""
    if model.constraint != "sphere":
        return
    Q0 = np.asarray(Q0, dtype=float)
    if has_spectrum(model):            # the Euclidean norms: Σ_c Q^c_kk = |w_k|²/N
        Q0 = Q0.sum(-3)
        name = f"the sum over the blocks of {name}"
    diag = np.diagonal(Q0, axis1=-2, axis2=-1)
    if np.max(np.abs(diag - 1.0)) > tol:
        raise ValueError(f"{name}: with constraint='sphere' every diagonal entry of {name} "
                         f"must be 1 (|w_k|^2 = N), got {np.ravel(diag)[:8]}")


#: ``method`` values: "auto" or a :func:`scipy.integrate.solve_ivp` method name.
METHODS = ("auto", "RK45", "RK23", "DOP853", "Radau", "BDF", "LSODA")

#: With ``method="auto"``, RK45 takes at most this many accepted steps before
#: the integration continues with LSODA.  A few hundred steps reach the
#: plateau, the escape and the approach to the minimum (Model(3, 2, 0.2) from
#: a generic start: 171 steps to t = 200, 464 to t = 2000); beyond that RK45's
#: step is bounded by the stability of the fast decaying modes near the
#: minimum, not by accuracy, so its cost grows linearly with t_max (3.8e3
#: steps to t = 2e4, extrapolating to ~2e5 steps, about 1e6 kernel calls, to
#: t = 1e6), while LSODA reaches t = 1e6 in about 300 steps.
AUTO_RK45_STEPS = 1000

#: Largest t_max accepted.  By then every trajectory that converges has reached
#: its limit to round-off (Model(3, 2, 0.2), generic start: risk 3e-12 at
#: t = 1e6, 1e-16 at t = 1e9, in about 3 s with method="auto"), while far
#: larger horizons (1e30) made the solvers' first steps and event location
#: fail or never finish.
MAX_T = 1e9


def _symmetric_pair(A, B, axis_len):
    """A pair ``(i, j)`` with ``A`` and ``B`` fixed by swapping units i and j, else None.

    ``A`` is the ``n×n`` overlap among the units (Q or T), ``B`` the ``n×m``
    overlap with the other side (ρ or ρᵀ).  Swapping i and j fixes both when
    ``B_i = B_j``, ``A_ii = A_jj`` and ``A_ik = A_jk`` for ``k ∉ {i, j}``
    (exact equality: this is about exact invariant subspaces).
    """
    # A may be a stack (c, n, n) (an input spectrum's blocks, B then (n, c·m)): a swap must
    # fix every block
    A = A[None] if A.ndim == 2 else A
    n = A.shape[-1]
    if n < 2:
        return None
    keys = np.concatenate([B] + [np.diag(a)[:, None] for a in A], axis=1)
    order = np.lexsort(keys.T[::-1])
    for a in range(n - 1):
        i = order[a]
        for b in range(a + 1, n):
            j = order[b]
            if not np.array_equal(keys[i], keys[j]):
                break
            others = np.ones(n, bool)
            others[[i, j]] = False
            if np.array_equal(A[:, i, others], A[:, j, others]):
                return int(min(i, j)), int(max(i, j))
    return None


def symmetric_start(Q0, rho0, T):
    """Describe an exact permutation symmetry of the start, or return None.

    The ODE is equivariant under permutations of the student units
    (``Q → PQPᵀ, ρ → Pρ``) and of the teacher units (``ρ → ρPᵀ, T → PTPᵀ``).  A
    start fixed by such a permutation stays fixed by it for all time: the exact
    solution never leaves that subspace.  If the subspace contains a saddle
    (e.g. all rows of ρ equal, or ``ρ = 0``) the exact solution stays on it, and
    whether a numerical solution escapes depends on round-off and on
    ``rtol``/``atol``.  Teacher-symmetric starts (two equal columns of ρ with the
    matching symmetry of T) can never reach zero risk, where ``ρ ∝ O T`` has
    full column rank.
    """
    if Q0.ndim == 3:                   # per input block: every block must be symmetric
        rows = np.concatenate(list(rho0), axis=1)
        cols = np.concatenate([r.T for r in rho0], axis=1)
    else:
        rows, cols = rho0, rho0.T
    pair = _symmetric_pair(Q0, rows, Q0.shape[-1])
    if pair is not None:
        return (f"student units {pair[0]} and {pair[1]} are interchangeable "
                f"(equal rows of rho0, equal overlaps in Q0)")
    pair = _symmetric_pair(T, cols, T.shape[-1])
    if pair is not None:
        return (f"teacher units {pair[0]} and {pair[1]} are interchangeable "
                f"(equal columns of rho0, equal overlaps in T)")
    return None


def integrate(model: Model, Q0, rho0, T, t_max, t_eval=None, *, method: str = "auto",
              rtol: float = 1e-8, atol: float = 1e-11, max_norm: float | None = None,
              on_divergence: str = "raise", form: str | None = None,
              warn_symmetric: bool = True, a0=None, progress=False,
              threads: int | None = None) -> ODESolution:
    """Integrate ``dQ/dt, dρ/dt`` from ``(Q0, ρ0)`` with fixed teacher overlap ``T``.

    Parameters
    ----------
    model : Model
    Q0 : array (p, p), rho0 : array (p, p*), T : array (p*, p*)
        Initial overlaps; ``[[Q0, ρ0], [ρ0ᵀ, T]]`` must be symmetric PSD, real
        and finite.  With an input spectrum (``model.spectrum``) one per block:
        ``(B, p, p)``, ``(B, p, p*)``, ``(B, p*, p*)``, each block's joint matrix
        PSD (docs/model.md §1a); the solution's ``Q``, ``rho`` then carry the
        block axis after the time axis.
    t_max : float
        Final time (``t = steps/N``), in ``(0, MAX_T]`` (``MAX_T = 1e9``).
    t_eval : array, optional
        Output times in ``[0, t_max]``; default 501 equally spaced points.
    method : {"auto", "RK45", "RK23", "DOP853", "Radau", "BDF", "LSODA"}
        ``"auto"`` (default): explicit RK45 for the first ``AUTO_RK45_STEPS``
        accepted steps (identical to ``method="RK45"`` on runs that need fewer,
        which covers the plateau, the escape and the approach to the minimum),
        then LSODA from the state reached, which switches to a stiff (BDF)
        method on the slow tail near the minimum.  Pure RK45 there costs time
        proportional to ``t_max`` (``t_max = 1e6`` takes minutes); ``"auto"``
        keeps it near a second.  Other names go to
        :func:`scipy.integrate.solve_ivp` unchanged.
    rtol, atol : float
        Tolerances for the solver, > 0.  The defaults buy accuracy, not
        speed: for ``Model(4, 2, 0.1)`` from a random ``ρ(0) ~ 0.03`` to
        ``t = 200`` (plateau, escape, convergence) the risk is off by at most
        2e-9 with the defaults (66 ms), 3e-7 with ``rtol=1e-6, atol=1e-9``
        (29 ms) and 3.5e-5 with ``rtol=1e-4, atol=1e-7`` (15 ms), relative
        to a ``1e-12`` reference (measured on a 2-core x86-64 machine).
        Loosen them for sweeps that need a few digits.
    max_norm : float, optional
        The run counts as diverged once the largest entry of ``|Q|`` or ``|ρ|``
        exceeds this (default ``1e6 · max(1, max|Q0|, max|T|)``) or the state
        stops being finite.  Must exceed the start's largest entry.
    on_divergence : {"raise", "stop"}
        ``"raise"``: raise :class:`DivergenceError` (time of divergence, last
        finite state, the partial solution attached); ``"stop"``: return the
        partial solution with ``status="diverged"``.
    form : {"matrix", "tensor", "entries"}, optional
        Which generated kernel to use (default: the best route for the
        activation, see :func:`symquad.kernels`).
    warn_symmetric : bool
        Warn (``RuntimeWarning``) when the start is exactly symmetric under a
        permutation of student or teacher units (see :func:`symmetric_start`):
        the exact solution then stays in an invariant subspace, and leaving it
        (escaping a saddle inside it) is a round-off effect that depends on the
        tolerances.  Perturb the start generically to avoid it.
    a0 : array (p,), optional
        Initial student readout when it is trained (default ``model.readout``,
        which is ``a(0)`` by definition); refused for a fixed readout.
    progress : bool
        Progress of the solver's time on stderr (:mod:`symquad.progress`): a
        tqdm bar on a terminal, plain lines (every 10 % or 10 s, with the time
        left) otherwise; worth it at large ``p``, where one right-hand side
        costs seconds.
    threads : int, optional
        BLAS threads of the right-hand side's products from ``p + p* >= 48``
        (:func:`symquad.numeric.kernels.blas_threads`): default the environment
        variable ``SYMQUAD_THREADS``, else 1 (deterministic, no oversubscription).

    Returns
    -------
    ODESolution
        With ``readout`` (n, p) when the readout is trained.  With
        ``constraint="sphere"`` the diagonal of ``Q0`` must be 1.
    """
    declare(model, "integrate")
    Q0, rho0, T = as_overlaps(model, Q0, rho0, T)
    check_sphere(model, Q0)
    a_start = initial_readout(model, a0)
    trained = a_start is not None
    t_max = check_real("t_max", t_max, low=0.0, high=MAX_T, low_open=True)
    check_choice("method", method, METHODS)
    if method in ("RK45", "RK23", "DOP853") and t_max > 1e5:
        warnings.warn(f"integrate: method={method!r} is explicit; near the minimum its cost "
                      f"grows linearly with t_max (t_max={t_max:.3g} may take a long time). "
                      f"method='auto' switches to LSODA there.", RuntimeWarning, stacklevel=2)
    rtol = check_real("rtol", rtol, low=0.0, high=1.0, low_open=True, high_open=True)
    atol = check_positive("atol", atol)
    check_choice("on_divergence", on_divergence, ON_DIVERGENCE)
    if t_eval is None:
        t_eval = np.linspace(0.0, t_max, 501)
    t_eval = as_real_array(t_eval, "t_eval")
    if t_eval.ndim != 1 or t_eval.size == 0 or np.any(np.diff(t_eval) <= 0) \
            or t_eval[0] < 0 or t_eval[-1] > t_max:
        raise ValueError("t_eval must be a non-empty increasing 1-d array within [0, t_max]")
    # the solution holds y (state) and Q, rho, risk at every t_eval: checked before solving
    lead = block_axis(model)
    check_record_bytes(8 * t_eval.size * (model.n_blocks * (3 * model.p ** 2
                                                            + 2 * model.p * model.p_star) + 1),
                       f"integrate: {t_eval.size} output times at p={model.p}",
                       "use fewer times in t_eval")
    start_norm = max(float(np.max(np.abs(Q0))), float(np.max(np.abs(rho0), initial=0.0)))
    if max_norm is None:
        max_norm = 1e6 * max(1.0, float(np.max(np.abs(Q0))), float(np.max(np.abs(T))))
    else:
        max_norm = check_positive("max_norm", max_norm)
        if max_norm <= start_norm:
            raise ValueError(
                f"max_norm must exceed the largest entry of |Q0| and |rho0| "
                f"(allowed range: ({start_norm:.6g}, inf)), got {max_norm!r}: the run would "
                f"count as diverged at t = 0")
    if warn_symmetric and (not trained or len(set(a_start.tolist())) == 1):
        symmetry = symmetric_start(Q0, rho0, T)
        if symmetry is not None:
            warnings.warn(
                f"integrate: exactly symmetric start ({symmetry}). The exact solution stays "
                f"in the subspace fixed by this symmetry; if it reaches a saddle there, any "
                f"escape is driven by round-off and depends on rtol/atol. Perturb the start "
                f"(e.g. a generic rho0) or pass warn_symmetric=False if this is intended.",
                RuntimeWarning, stacklevel=2)

    kern = kernels(model, form, threads=threads)
    p, k = model.p, model.p_star
    last = {"t": 0.0, "Q": Q0.copy(), "rho": rho0.copy()}
    bar = _progress(progress, t_max, f"ODE (p={p}, p*={k}, {kern.form} kernels)", "time",
                    integer=False)

    blew = {"nonfinite": False}

    def fun(t, y):
        bar.set(t)
        Q, rho, a = _unpack(y, p, k, trained, lead)
        if np.all(np.isfinite(y)):
            last.update(t=t, Q=Q, rho=rho)
        else:
            blew["nonfinite"] = True
        with np.errstate(over="ignore", invalid="ignore"):
            out = _pack(*kern.rhs(Q, rho, T, a, t=t))
        if not np.all(np.isfinite(out)):
            # An infinite slope would make the step-size control shrink forever.
            out = np.full_like(out, np.inf)
            blew["nonfinite"] = True
        return out

    def blow_up(t, y):
        y_abs = np.abs(y)
        value = max_norm - (np.max(y_abs) if np.all(np.isfinite(y)) else np.inf)
        if not value > 0:
            blew["nonfinite"] = True        # past max_norm: what a solver error then means
        return value

    blow_up.terminal = True
    blow_up.direction = -1

    y0 = _pack(Q0, rho0, a_start)
    if method in EXPLICIT_METHODS:
        _check_explicit_steps(method, fun(0.0, y0), y0, t_max)
    try:
        sol = solve_pieces(fun, t_max, y0, method, t_eval, rtol, atol, blow_up,
                           model.schedule.breakpoints(0.0, t_max))
    except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
        if not blew["nonfinite"]:
            raise
        # the slope overflowed (a blow-up in the first steps) and the solver itself gave
        # up on it (scipy: "f(a) and f(b) must have different signs", "array must not
        # contain infs"): a divergence, reported as one below
        sol = _Joined(t=np.zeros(1), y=y0[:, None].copy(), status=-1, nfev=0,
                      message=f"the solver gave up on the blow-up ({exc})",
                      t_events=[np.empty(0)], y_events=[np.empty((0, y0.size))])
    finally:
        bar.close()
    # scipy leaves its outputs as Python lists when a solver fails at its first step
    sol.t = np.asarray(sol.t, dtype=float).reshape(-1)
    sol.y = np.asarray(sol.y, dtype=float).reshape(y0.size, -1)
    if sol.t.size == 0:
        sol.t, sol.y, sol.status = np.zeros(1), y0[:, None].copy(), -1
    sol.t_events = [np.asarray(e, dtype=float) for e in sol.t_events]
    sol.y_events = [np.asarray(e, dtype=float).reshape(-1, y0.size) for e in sol.y_events]
    Qs = np.empty((sol.t.size,) + lead + (p, p))
    rhos = np.empty((sol.t.size,) + lead + (p, k))
    readout = np.empty((sol.t.size, p)) if trained else None
    for n in range(sol.t.size):
        Qs[n], rhos[n], a_n = _unpack(sol.y[:, n], p, k, trained, lead)
        if trained:
            readout[n] = a_n
    risk = np.asarray(kern.risk(Qs, rhos, T, readout), dtype=float).reshape(sol.t.size)

    diverged = bool(sol.status == 1 and sol.t_events[0].size) or (
        sol.status == -1) or not np.all(np.isfinite(sol.y))
    if not diverged:
        return ODESolution(model, sol.t, Qs, rhos, risk, T, "ok", None, sol.message, sol.nfev,
                           readout)
    if sol.t_events[0].size:
        # the state where it crossed max_norm: the last one that is still finite
        t_div = float(sol.t_events[0][0])
        Q_div, rho_div, _ = _unpack(sol.y_events[0][0], p, k, trained, lead)
        last.update(t=t_div, Q=Q_div, rho=rho_div)
    else:
        t_div = float(last["t"])
    finite = np.all(np.isfinite(sol.y), axis=0)
    keep = slice(0, int(np.argmin(finite)) if not finite.all() else sol.t.size)
    partial = ODESolution(model, sol.t[keep], Qs[keep], rhos[keep], risk[keep], T,
                          "diverged", t_div, sol.message, sol.nfev,
                          None if readout is None else readout[keep])
    msg = (f"ODE diverged at t = {t_div:.6g} (state exceeded max_norm={max_norm:.3g} or "
           f"stopped being finite; solver: {sol.message}); last finite state at "
           f"t = {last['t']:.6g}: {describe_state({'Q': last['Q'], 'rho': last['rho']})}. "
           f"A smaller lr usually helps (model: {model!r}).")
    if on_divergence == "raise":
        raise DivergenceError(msg, t_div, dict(last), partial)
    return ODESolution(model, partial.t, partial.Q, partial.rho, partial.risk, T,
                       "diverged", t_div, msg, sol.nfev, partial.readout)


#: Explicit solvers: their step is bounded by the fastest rate of the system.
EXPLICIT_METHODS = ("RK45", "RK23", "DOP853")
#: Most steps an explicit solver may need (from the start's fastest rate) before
#: integrate refuses to start it: at ~1e5 steps/s this is over a quarter of an hour.
MAX_EXPLICIT_STEPS = 10**8


def _check_explicit_steps(method, f0, y0, t_max) -> None:
    """Refuse, before solving, an explicit method on a system too stiff for it.

    An explicit Runge-Kutta step is stable only for ``h·κ ≲ 3`` where ``κ`` is
    the fastest decay rate, so the run needs at least ``κ t_max / 3`` steps.
    ``κ`` is estimated at the start as ``max_i (−f_i sign y_i)⁺ / (|y_i| + 10^-3 max|y|)``
    over the entries driven towards zero (for a weight decay ``f = −ηλ y`` it
    is ``ηλ``; a fast growth is a blow-up, reported as a divergence instead).  ``weight_decay = 1e12``
    with ``method="RK45"`` needed ~10^12 steps and never finished; ``"auto"``
    switches to the stiff LSODA and takes a second.
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        floor = 1e-3 * max(float(np.max(np.abs(y0))), 1e-300)
        # decay only (f against y): a fast growth is a blow-up, which integrate reports
        rate = float(np.max(np.maximum(-f0 * np.sign(y0), 0.0) / (np.abs(y0) + floor)))
    if not np.isfinite(rate):
        return                         # an infinite slope: integrate reports the divergence
    steps = rate * t_max / 3.0
    if steps > MAX_EXPLICIT_STEPS:
        raise ValueError(
            f"integrate: method={method!r} is explicit and this system is stiff (fastest rate "
            f"about {rate:.3g} at the start): it would need at least {steps:.3g} steps to "
            f"t_max={t_max:.4g} (limit {MAX_EXPLICIT_STEPS:.0e}); use method='auto' or "
            f"'LSODA' (stiff solvers), or a shorter t_max")


def left_of(fun, b):
    """`fun` with its time argument kept just below `b` (the left limit at a jump of η).

    A solver's last stage of a piece evaluates the right-hand side at the piece's end
    ``t = b``, where a step schedule already has its next (right-continuous) value; the
    piece ``[a, b)`` must see its own value up to ``b``.  The shift, ``1e-13·max(1, b)``,
    moves a continuous schedule's factor by a relative ``~1e-13`` only.
    """
    below = b - 1e-13 * max(1.0, abs(b))

    def f(t, y):
        return fun(t if t < below else below, y)
    return f


def solve_pieces(fun, t_max, y0, method, t_eval, rtol, atol, blow_up, breaks=(), jump=None):
    """:func:`_solve` from 0 to `t_max`, restarted at each time of `breaks`.

    A learning-rate schedule's kinks and jumps (:meth:`symquad.schedule.Schedule.breakpoints`)
    are where the right-hand side is not smooth; a Runge-Kutta step across one loses the
    method's order and its error estimate, so each smooth piece is solved on its own and
    the next starts from the state the previous one reached (``jump(b, y)`` when given:
    the state after a discontinuity of the solution at ``b``, e.g. the O(1/N) mean's shift
    at a step of the learning rate).  Without `breaks` this is :func:`_solve`.  The
    output times are those of `t_eval`.
    """
    if not breaks:
        return _solve(fun, t_max, y0, method, t_eval, rtol, atol, blow_up)
    knots = [0.0] + [float(b) for b in breaks] + [float(t_max)]
    ts, ys, nfev, messages, sol = [], [], 0, [], None
    y_start = y0
    for i, (a, b) in enumerate(zip(knots[:-1], knots[1:])):
        inside = t_eval[(t_eval > a) & (t_eval <= b) | ((t_eval == a) & (i == 0))]
        seg_eval = np.union1d(inside, [b])          # the end state starts the next piece
        sol = _solve(left_of(fun, b), b, y_start, method, seg_eval, rtol, atol, blow_up,
                     t0=a)
        nfev += sol.nfev
        messages.append(sol.message)
        t_seg, y_seg = np.asarray(sol.t, dtype=float), np.asarray(sol.y, dtype=float)
        reached = sol.status == 0 and t_seg.size and t_seg[-1] == b
        keep = np.isin(t_seg, inside)
        ts.append(t_seg[keep])
        ys.append(y_seg.reshape(y0.size, -1)[:, keep])
        if not reached:
            break
        y_start = y_seg[:, -1] if jump is None else jump(b, y_seg[:, -1])
    return _Joined(t=np.concatenate(ts), y=np.concatenate(ys, axis=1), status=sol.status,
                   nfev=nfev, message=f"{len(messages)} pieces between the schedule's "
                                      f"breakpoints; last: {messages[-1]}",
                   t_events=sol.t_events, y_events=sol.y_events)


def _solve(fun, t_max, y0, method, t_eval, rtol, atol, blow_up, t0=0.0):
    """:func:`_solve_any` with the solver's own array work on one BLAS thread (its stage
    sums and dense output are matrix–vector products whose rounding would otherwise depend
    on the BLAS thread count: numeric/ode_batch._solve)."""
    with single_thread_blas():
        return _solve_any(fun, t_max, y0, method, t_eval, rtol, atol, blow_up, t0)


def _solve_any(fun, t_max, y0, method, t_eval, rtol, atol, blow_up, t0=0.0):
    """:func:`solve_ivp` with ``method="auto"`` resolved (RK45, then LSODA on a long tail).

    Returns an object with the fields of solve_ivp's result that
    :func:`integrate` uses (``t, y, status, message, nfev, t_events, y_events``).
    """
    if method != "auto":
        return solve_ivp(fun, (t0, t_max), y0, method=method, t_eval=t_eval,
                         rtol=rtol, atol=atol, events=blow_up)
    # The budget event is evaluated once per accepted step: it stays positive
    # until the budget is spent, then crosses zero exactly at that step's end,
    # so the RK45 part is step for step the same as a plain RK45 run.
    budget = {"calls": 0, "t_switch": None}

    def rk45_budget(t, y):
        if budget["t_switch"] is None:
            budget["calls"] += 1
            if budget["calls"] <= AUTO_RK45_STEPS + 1:
                return 1.0
            budget["t_switch"] = t
        return budget["t_switch"] - t

    rk45_budget.terminal = True
    rk45_budget.direction = -1
    first = solve_ivp(fun, (t0, t_max), y0, method="RK45", t_eval=t_eval,
                      rtol=rtol, atol=atol, events=(blow_up, rk45_budget))
    if not (first.status == 1 and first.t_events[1].size and not first.t_events[0].size):
        first.t_events = first.t_events[:1]
        first.y_events = first.y_events[:1]
        return first
    t_switch = float(first.t_events[1][0])
    y_switch = first.y_events[1][0]
    rest_eval = t_eval[t_eval > t_switch]
    if t_switch >= t_max or rest_eval.size == 0 and t_switch >= t_eval[-1]:
        first.t_events, first.y_events = first.t_events[:1], first.y_events[:1]
        first.status, first.message = 0, "The solver successfully reached the end."
        return first
    rest = solve_ivp(fun, (t_switch, t_max), y_switch, method="LSODA", t_eval=rest_eval,
                     rtol=rtol, atol=atol, events=blow_up)
    return _Joined(
        t=np.concatenate([first.t, rest.t]), y=np.concatenate([first.y, rest.y], axis=1),
        status=rest.status, nfev=first.nfev + rest.nfev,
        message=f"RK45 for {AUTO_RK45_STEPS} steps to t = {t_switch:.6g}, then LSODA: "
                f"{rest.message}",
        t_events=rest.t_events, y_events=rest.y_events)


@dataclass
class _Joined:
    t: np.ndarray
    y: np.ndarray
    status: int
    nfev: int
    message: str
    t_events: list
    y_events: list

"""Many starts of the same model integrated in one vectorised ODE solve.

:func:`integrate_batch` stacks the states ``(Q_b, ρ_b)`` of ``B`` starts into
one vector and integrates it with one of scipy's explicit solvers (the
classes behind :func:`scipy.integrate.solve_ivp`, stepped by hand): the
generated kernel is evaluated once per solver stage for the whole batch (its
arguments carry a leading batch axis), instead of ``B`` separate solves with
``B`` times the Python overhead.  The step size is shared, so it is set by the
most demanding start; the error control is the solver's usual mixed norm over
all components.

Divergence is tracked per start.  A start counts as diverged once the solver
evaluates it with ``max|Q_b| >= max_norm`` or a non-finite entry; from then on
its derivative is zero (it is frozen), its time of divergence is that
evaluation time (within one solver step of the crossing), and its recorded
entries from that time on are NaN.  The solver is restarted from the last
accepted state after a step in which a start diverged, so the frozen start's
earlier (huge) slopes leave the error control; the other starts are
integrated as if it were not there, one diverging start never stops the batch,
and a finite-time blow-up cannot make the step size shrink forever.

:func:`batch_first_crossings` runs the same solve but keeps, instead of the
trajectories, each start's first crossing of a risk level: the records are
searched block by block as the solver passes them (``_steps`` hands them to a
sink), so its memory is ``O(B·width)`` where :func:`integrate_batch` holds
``n_eval·B·width`` numbers several times over (494 MiB at the escape law's
``p = 5`` chunk, streamed through memory to find one time per start).

This module is part of the numeric runtime and never imports SymPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import integrate as _ivp

from ..spec import check_model
from ..spectrum import block_axis
from ..stages import declare
from .checks import as_real_array, check_positive, check_real
from .errors import describe_state
from .integrate import check_sphere, initial_readout
from .kernels import kernels, single_thread_blas
from .status import DIVERGED, OK, MemberStatus
from .integrate import left_of
from ..progress import progress as _progress

__all__ = ["BatchODESolution", "BatchCrossings", "integrate_batch", "batch_first_crossings",
           "first_crossings", "estimate_solve"]


@dataclass(frozen=True)
class BatchODESolution(MemberStatus):
    """Trajectories of ``B`` starts of one model on a shared time grid.

    Attributes
    ----------
    model : Model
    t : ndarray, shape (n,)
    Q : ndarray, shape (B, n, p, p)
    rho : ndarray, shape (B, n, p, p*)
    risk : ndarray, shape (B, n)
        NaN from a start's divergence on.
    T : ndarray, shape (p*, p*)
        With an input spectrum of ``K`` blocks ``Q`` (B, n, K, p, p), ``rho``
        (B, n, K, p, p*) and ``T`` (K, p*, p*) (docs/model.md §1a).
    status : ndarray of str, shape (B,)
        ``"ok"`` or ``"diverged"``.
    t_diverged : ndarray, shape (B,)
        Time at which the start was first evaluated beyond ``max_norm`` (or
        non-finite); NaN if it did not diverge.
    last_finite : dict
        ``{"t": (B,), "Q": (B, p, p), "rho": (B, p, p*)}``: the last recorded
        state before divergence (the final state of starts that did not diverge).
    message : str
        The solver's message.
    nfev : int
        Right-hand-side evaluations (each one evaluates the whole batch).
    readout : ndarray, shape (B, n, p), or None
        The student readout ``a(t)`` when it is trained, else None.
    """

    model: object
    t: np.ndarray
    Q: np.ndarray
    rho: np.ndarray
    risk: np.ndarray
    T: np.ndarray
    status: np.ndarray
    t_diverged: np.ndarray
    last_finite: dict = field(repr=False)
    message: str = ""
    nfev: int = 0
    readout: np.ndarray | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        """Number of starts ``B``."""
        return self.Q.shape[0]

    def __repr__(self):
        return (f"BatchODESolution(model={self.model!r}, starts={self.size}, n={len(self.t)}, "
                f"t=[{self.t[0]:.3g}, {self.t[-1]:.3g}], diverged={self.n_diverged})")

    def summary(self) -> str:
        text = repr(self)
        if self.n_diverged:
            first = int(np.nanargmin(self.t_diverged))
            state = {"Q": self.last_finite["Q"][first], "rho": self.last_finite["rho"][first]}
            text += (f"\n  DIVERGED: {self.n_diverged}/{self.size} starts, first (start {first})"
                     f" at t = {self.t_diverged[first]:.4g}; last finite state at "
                     f"t = {self.last_finite['t'][first]:.4g}: {describe_state(state)}")
        return text


def _batch_overlaps(model, Q0, rho0, T, tol=1e-9):
    """Validate a batch of starts; return ``Q0 (B,p,p)``, ``rho0 (B,p,p*)``, ``T (p*,p*)``.

    With an input spectrum of ``K`` blocks every overlap carries the block axis:
    ``Q0 (B,K,p,p)``, ``rho0 (B,K,p,p*)``, ``T (K,p*,p*)`` (docs/model.md §1a).
    """
    p, k = model.p, model.p_star
    lead = block_axis(model)
    d = len(lead)
    Q0 = as_real_array(Q0, "Q0", finite=False)
    rho0 = as_real_array(rho0, "rho0", finite=False)
    T = as_real_array(T, "T", finite=False)
    blocks = " (K the input blocks)" if lead else ""
    if Q0.ndim not in (2 + d, 3 + d) or Q0.shape[Q0.ndim - 2 - d:] != lead + (p, p):
        raise ValueError(f"Q0 must have shape (B, {'K, ' if d else ''}p, p) or "
                         f"({'K, ' if d else ''}p, p) with p={p}{blocks}, got {Q0.shape}")
    if rho0.ndim not in (2 + d, 3 + d) or rho0.shape[rho0.ndim - 2 - d:] != lead + (p, k):
        raise ValueError(f"rho0 must have shape (B, {'K, ' if d else ''}p, p_star) or "
                         f"({'K, ' if d else ''}p, p_star) with p={p}, p_star={k}{blocks}, "
                         f"got {rho0.shape}")
    if T.shape != lead + (k, k):
        raise ValueError(f"T must have shape {lead + (k, k)} (p_star = {k}){blocks}, got "
                         f"{T.shape}")
    try:
        B = np.broadcast_shapes(Q0.shape[:Q0.ndim - 2 - d], rho0.shape[:rho0.ndim - 2 - d])
    except ValueError:
        raise ValueError(f"Q0 and rho0 must hold the same number of starts, got "
                         f"{Q0.shape[0]} and {rho0.shape[0]}") from None
    B = B[0] if B else 1
    Q0 = np.broadcast_to(Q0, (B,) + lead + (p, p)).copy()
    rho0 = np.broadcast_to(rho0, (B,) + lead + (p, k)).copy()
    for name, arr in (("Q0", Q0), ("rho0", rho0), ("T", T)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite")
    for name, arr in (("Q0", Q0), ("T", T)):
        scale = max(1.0, float(np.max(np.abs(arr))))
        if np.max(np.abs(arr - np.swapaxes(arr, -1, -2))) > tol * scale:
            raise ValueError(f"{name} must be symmetric")
    C = np.concatenate([np.concatenate([Q0, rho0], -1),
                        np.concatenate([np.swapaxes(rho0, -1, -2),
                                        np.broadcast_to(T, (B,) + lead + (k, k))], -1)], -2)
    C = C.reshape((B, -1) + C.shape[-2:])               # each block's joint matrix
    low = np.linalg.eigvalsh(0.5 * (C + np.swapaxes(C, -1, -2)))[..., 0].min(axis=1)
    scale = np.maximum(1.0, np.max(np.abs(C), axis=(1, 2, 3)))
    bad = np.nonzero(low < -tol * scale * (p + k))[0]
    if bad.size:
        raise ValueError(
            f"start {int(bad[0])} (of {B}) is not a Gram matrix of weights / N: the joint "
            f"covariance [[Q0, rho0], [rho0^T, T]] must be positive semi-definite; smallest "
            f"eigenvalue {float(low[bad[0]]):.3g}")
    return Q0, rho0, T


def integrate_batch(model, Q0, rho0, T, t_max, t_eval=None, *, method: str = "RK45",
                    rtol: float = 1e-8, atol: float = 1e-11, max_norm: float | None = None,
                    form: str | None = None, a0=None, progress=False) -> BatchODESolution:
    """Integrate ``dQ/dt, dρ/dt`` from ``B`` starts at once (one vectorised solve).

    Parameters
    ----------
    model : Model
    Q0 : array (B, p, p), rho0 : array (B, p, p*)
        Initial overlaps of the starts (a single ``(p, p)`` / ``(p, p*)`` is
        broadcast); each ``[[Q0_b, ρ0_b], [ρ0_bᵀ, T]]`` must be symmetric PSD.
    T : array (p*, p*)
        Teacher overlaps, shared by the starts.
    t_max : float
        Final time (``t = steps/N``), > 0.
    t_eval : array, optional
        Output times in ``[0, t_max]``; default 501 equally spaced points.
    method : {"RK45", "RK23", "DOP853"}
        Explicit Runge–Kutta solver of :mod:`scipy.integrate`.
    rtol, atol
        Tolerances (same defaults as :func:`symquad.integrate`).
    max_norm : float, optional
        A start counts as diverged once ``max|Q_b|`` reaches this (default, per
        start, ``1e6 · max(1, max|Q0_b|, max|T|)`` as in :func:`symquad.integrate`)
        or it stops being finite.  If the solver's step size collapses before
        (a blow-up too fast to resolve), the start with the largest relative
        slope is marked diverged at that time.
    form : {"matrix", "tensor", "entries"}, optional
        Which generated kernel to use (see :func:`symquad.kernels`).
    a0 : array (B, p) or (p,), optional
        Initial student readouts of the starts when the readout is trained
        (default ``model.readout``); refused for a fixed readout.
    progress : bool
        Progress of the solver's time on stderr (:mod:`symquad.progress`): a
        tqdm bar on a terminal, plain lines otherwise.

    Returns
    -------
    BatchODESolution
        Per-start trajectories, status and divergence times; diverged starts
        never raise (check ``status`` / ``n_diverged``).
    """
    b = _setup(model, Q0, rho0, T, t_max, t_eval, method, max_norm, form, a0, progress)
    dense = _Dense(b.t_eval.size, b.y0.size)
    nfev, message = _solve(b.fun, b.y0, b.t_max, b.t_eval, method, rtol, atol, b.live, b.blame,
                           b.breaks, dense)
    b.bar.close()
    t, B = b.t_eval, b.B
    Q, rho, readout, risk, after = _records(b, t, dense.out.T)
    last_i = np.maximum(np.sum(~after, axis=1) - 1, 0)
    rows = np.arange(B)
    last = {"t": t[last_i].copy(), "Q": Q[rows, last_i].copy(), "rho": rho[rows, last_i].copy()}
    start_only = after[:, 0]                            # diverged before the first record
    last["Q"][start_only], last["rho"][start_only] = b.Q0[start_only], b.rho0[start_only]
    last["t"][start_only] = 0.0
    return BatchODESolution(model, t, Q, rho, risk, b.T, _status(b.t_div), b.t_div, last,
                            message, nfev, readout)


@dataclass
class _Batch:
    """One batch of starts ready for :func:`_solve` (what :func:`_setup` checked and built).

    ``y0`` stacks the starts' states ``(Q_b, ρ_b[, a_b])`` (``width`` numbers each:
    ``Q`` in ``[:nq]``, ``ρ`` in ``[nq:nr]``, the readout after); ``fun`` and
    ``blame`` are the solver's right-hand side and its step-collapse handler, which
    record each start's divergence time in ``t_div`` and clear its ``live`` flag.
    """

    model: object
    kern: object
    Q0: np.ndarray
    rho0: np.ndarray
    T: np.ndarray
    t_max: float
    t_eval: np.ndarray
    breaks: tuple
    lead: tuple
    B: int
    nq: int
    nr: int
    width: int
    trained: bool
    y0: np.ndarray
    t_div: np.ndarray
    live: np.ndarray
    fun: object
    blame: object
    bar: object


def _setup(model, Q0, rho0, T, t_max, t_eval, method, max_norm, form, a0, progress,
           keep=()) -> _Batch:
    """Check the arguments of :func:`integrate_batch` and build the batched right-hand side.

    Everything is checked before the kernels are built and the solver starts (`keep`,
    the start indices :func:`batch_first_crossings` keeps whole, included); see
    :func:`integrate_batch` for the arguments and for the divergence rule that ``fun``
    and ``blame`` implement.
    """
    declare(model, "integrate_batch")
    if method not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {method!r}")
    Q0, rho0, T = _batch_overlaps(model, Q0, rho0, T)
    n = Q0.shape[0]
    if any(not 0 <= i < n for i in keep) or len(set(keep)) != len(keep):
        raise ValueError(f"keep must hold distinct start indices in [0, {n}), got {list(keep)}")
    check_sphere(model, Q0)
    a_start = initial_readout(model, a0)
    trained = a_start is not None
    if trained:
        a_start = np.broadcast_to(a_start, (Q0.shape[0], model.p)).copy()
    t_max = check_positive("t_max", t_max)
    if t_eval is None:
        t_eval = np.linspace(0.0, t_max, 501)
    t_eval = as_real_array(t_eval, "t_eval")
    if t_eval.ndim != 1 or t_eval.size == 0 or np.any(np.diff(t_eval) <= 0) \
            or t_eval[0] < 0 or t_eval[-1] > t_max:
        raise ValueError("t_eval must be a non-empty increasing 1-d array within [0, t_max]")
    if max_norm is None:
        max_norm = 1e6 * np.maximum(np.maximum(1.0, np.max(np.abs(Q0.reshape(len(Q0), -1)),
                                                           axis=1)),
                                    float(np.max(np.abs(T))))
    else:
        max_norm = np.full(Q0.shape[0], check_positive("max_norm", max_norm))

    kern = kernels(model, form)
    lead = block_axis(model)
    B, p, k = rho0.shape[0], model.p, model.p_star
    size = int(np.prod(lead, dtype=int))
    nq = size * p * p
    nr = nq + size * p * k
    width = nr + (p if trained else 0)
    t_div = np.full(B, np.nan)
    live = np.ones(B, dtype=bool)
    bar = _progress(progress, t_max, f"ODE from {B} start{'s' if B > 1 else ''} "
                                     f"(p={p}, p*={k})", "time", integer=False)

    def fun(t, y):
        bar.set(t)
        Y = y.reshape(B, width)
        Q = Y[:, :nq].reshape((B,) + lead + (p, p))
        Q = 0.5 * (Q + np.swapaxes(Q, -1, -2))
        rho = Y[:, nq:nr].reshape((B,) + lead + (p, k))
        a = Y[:, nr:] if trained else None
        with np.errstate(over="ignore", invalid="ignore"):
            blocks = kern.rhs(Q, rho, T, a, t=t)
        out = np.concatenate([x.reshape(B, -1) for x in blocks], axis=1)
        # a start beyond max_norm or non-finite (state or slope) diverges here
        bad = live & ~(np.all(np.isfinite(Y), axis=1) & np.all(np.isfinite(out), axis=1)
                       & (np.max(np.abs(Y[:, :nq]), axis=1) < max_norm))
        if bad.any():
            t_div[bad] = t
            live[bad] = False
        out[~live] = 0.0
        return out.ravel()

    y0 = np.concatenate([Q0.reshape(B, nq), rho0.reshape(B, nr - nq)]
                        + ([a_start] if trained else []), axis=1).ravel()

    def blame(t, y):
        """Mark the live start with the largest relative slope (the one blowing up)."""
        if not live.any():
            return False
        Y = y.reshape(B, width)
        rate = np.max(np.abs(fun(t, y).reshape(B, width)), axis=1) / np.maximum(
            1.0, np.max(np.abs(Y), axis=1))
        rate[~live] = -np.inf
        worst = int(np.argmax(rate))
        t_div[worst] = t
        live[worst] = False
        return True

    return _Batch(model, kern, Q0, rho0, T, t_max, t_eval,
                  tuple(model.schedule.breakpoints(0.0, t_max)), lead, B, nq, nr, width,
                  trained, y0, t_div, live, fun, blame, bar)


def _records(b: _Batch, t, y, rows=slice(None)):
    """The recorded states of some starts at times ``t``: ``Q, ρ, a, ε`` and the NaN mask.

    ``y`` holds the solver's states at ``t``, shape ``(B·width, n)``.  ``Q`` is
    symmetrised (``½(Q + Qᵀ)``, as the right-hand side sees it), and a start's
    entries from its divergence time on are NaN (``after``, shape ``(len(rows), n)``:
    frozen, not a solution); the risk ``ε`` is the kernel's on these states.  Every
    operation is elementwise over starts and times, so a block of times or a subset
    of `rows` gives the same numbers as the whole array.
    """
    p, k, lead = b.model.p, b.model.p_star, b.lead
    n = t.size
    Y = y.reshape(b.B, b.width, n)[rows]
    m = Y.shape[0]
    Q = np.moveaxis(Y[:, :b.nq], -1, 1).reshape((m, n) + lead + (p, p))
    Q = 0.5 * (Q + np.swapaxes(Q, -1, -2))
    rho = np.moveaxis(Y[:, b.nq:b.nr], -1, 1).reshape((m, n) + lead + (p, k))
    readout = np.moveaxis(Y[:, b.nr:], -1, 1).copy() if b.trained else None
    after = t[None, :] >= b.t_div[rows, None]         # NaN t_div: all False
    Q[after] = np.nan
    rho[after] = np.nan
    if b.trained:
        readout[after] = np.nan
    risk = np.asarray(b.kern.risk(Q, rho, b.T, readout), dtype=float).reshape(m, n)
    return Q, rho, readout, risk, after


def _status(t_div):
    return np.where(np.isnan(t_div), OK, DIVERGED)


class _Dense:
    """Sink of :func:`_steps` that keeps every state: ``out`` (n_eval, size), NaN until written."""

    def __init__(self, n, size):
        self.out = np.full((n, size), np.nan)

    def __call__(self, i0, i1, y):
        self.out[i0:i1] = y


def first_crossings(t, risk, threshold):
    """First time each risk curve falls to ``threshold`` or below, linearly interpolated.

    The arithmetic behind :func:`symquad.numeric.landscape.escape_times` (which checks
    the arguments first).  A crossing is the first record ``j`` with
    ``ε_j <= threshold`` after a record above it (a NaN counts as above; a curve that
    starts below is not counted until it has been above), at
    ``t_{j-1} + (t_j − t_{j-1}) (ε_{j-1} − threshold) / (ε_{j-1} − ε_j)``.

    Parameters
    ----------
    t : ndarray (n,)
    risk : ndarray (..., n)
    threshold : float

    Returns
    -------
    ndarray (...,)
        NaN where the curve never crosses.
    """
    below = risk <= threshold
    # the risk starts above the plateau level; ignore a start already below it
    hit = below & np.cumsum(~below, axis=-1).astype(bool)
    any_hit = hit.any(axis=-1)
    i = np.argmax(hit, axis=-1)
    out = np.full(risk.shape[:-1], np.nan)
    flat_r = risk.reshape(-1, risk.shape[-1])
    flat_i = i.ravel()
    flat_ok = any_hit.ravel()
    res = out.ravel()
    for n in np.nonzero(flat_ok)[0]:
        j = flat_i[n]
        r0, r1 = flat_r[n, j - 1], flat_r[n, j]
        res[n] = t[j - 1] + (t[j] - t[j - 1]) * (r0 - threshold) / (r0 - r1)
    return res.reshape(out.shape)


@dataclass(frozen=True)
class BatchCrossings(MemberStatus):
    """First crossings of a risk level by ``B`` starts, from :func:`batch_first_crossings`.

    Attributes
    ----------
    times : ndarray, shape (B,)
        Each start's first crossing (:func:`first_crossings` of its recorded risk
        curve); NaN where it never crosses.
    threshold : float
    status, t_diverged, last_finite, message, nfev
        As in :class:`BatchODESolution`.
    kept : BatchODESolution
        The whole recorded trajectories of the starts asked for (`keep`, in that order).
    """

    times: np.ndarray
    threshold: float
    status: np.ndarray
    t_diverged: np.ndarray
    last_finite: dict = field(repr=False)
    message: str = ""
    nfev: int = 0
    kept: BatchODESolution | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        """Number of starts ``B``."""
        return self.times.size


#: Bytes of solver states one block of :func:`batch_first_crossings` holds (the risk's
#: temporaries take a few times this): a core's L2 cache.  The escape law's p = 5 solve
#: (384 starts, CPU seconds, one thread, load 1.5): 1.7 s with 64 KiB, 1.3 s with 256 KiB,
#: 1.1-1.2 s with 1 MiB, 1.2-1.35 s with 4 MiB, 1.4-1.5 s with 16 MiB (same numbers).
CROSSING_BLOCK_BYTES = 2**20


class _Crossings:
    """Sink of :func:`_steps` that keeps first crossings instead of the states.

    States are gathered into blocks of ``rows`` times; each block's records
    (:func:`_records`, over the starts not yet crossed and those in `keep`) are
    searched by :func:`first_crossings` with the start's previous record put in
    front, so a crossing between two blocks is interpolated as in the whole curve.
    Until the previous blocks are searched, a start that has not crossed was either
    above the threshold at its previous record or below at every record: the
    previous record alone then decides, as the whole curve does.  The last state
    received is held back until the next one or :meth:`close` (:func:`_steps`: a
    divergence can still be dated at that time).
    """

    def __init__(self, b: _Batch, threshold, keep, rows):
        self.b, self.threshold, self.keep = b, threshold, np.asarray(keep, dtype=int)
        self.buf = np.empty((rows + 1, b.y0.size))
        self.filled = 0
        self.first = 0                      # index in t_eval of buf[0]
        self.times = np.full(b.B, np.nan)
        self.open = np.ones(b.B, dtype=bool)
        self.wanted = np.zeros(b.B, dtype=bool)
        self.wanted[self.keep] = True
        self.prev_t = None                  # the previous block's last time and risks
        self.prev_risk = np.full(b.B, np.nan)
        self.last_t = np.zeros(b.B)         # last record before divergence (raw state)
        self.last_y = np.full((b.B, b.width), np.nan)
        self.has_last = np.zeros(b.B, dtype=bool)
        self.parts = []                     # the kept starts' records, block by block

    def __call__(self, i0, i1, y):
        done = 0
        while done < i1 - i0:
            take = min(i1 - i0 - done, self.buf.shape[0] - self.filled)
            self.buf[self.filled:self.filled + take] = y[done:done + take]
            self.filled += take
            done += take
            if self.filled == self.buf.shape[0]:
                self._search(self.filled - 1)
                self.buf[0] = self.buf[self.filled - 1]
                self.first += self.filled - 1
                self.filled = 1

    def close(self):
        """Search what is left; return the kept starts' records ``(Q, ρ, a, ε)``."""
        if self.filled:
            self._search(self.filled)
        if not self.parts:
            return None
        return tuple(None if x[0] is None else np.concatenate(x, axis=1)
                     for x in zip(*self.parts))

    def _search(self, n):
        b = self.b
        t = b.t_eval[self.first:self.first + n]
        y = self.buf[:n]
        # each start's last record before its divergence (all of them: NaN t_div)
        count = np.sum(~(t[None, :] >= b.t_div[:, None]), axis=1)
        got = np.nonzero(count)[0]
        self.last_y[got] = y.reshape(n, b.B, b.width)[count[got] - 1, got]
        self.last_t[got] = t[count[got] - 1]
        self.has_last[got] = True
        rows = np.nonzero(self.open | self.wanted)[0]
        if rows.size == 0:
            return
        Q, rho, readout, risk, _ = _records(b, t, y.T, rows)
        if self.wanted.any():
            sel = np.searchsorted(rows, self.keep)
            self.parts.append((Q[sel], rho[sel], None if readout is None else readout[sel],
                               risk[sel]))
        todo = self.open[rows]
        r, tt = risk[todo], t
        if self.prev_t is not None:
            r = np.concatenate([self.prev_risk[rows[todo], None], r], axis=1)
            tt = np.concatenate([[self.prev_t], t])
        found = first_crossings(tt, r, self.threshold)
        crossed = rows[todo][~np.isnan(found)]
        self.times[crossed] = found[~np.isnan(found)]
        self.open[crossed] = False
        self.prev_risk[rows] = risk[:, -1]
        self.prev_t = t[-1]


def _start_indices(keep):
    """`keep` as a list of ints; integers only (1.7 is refused, never truncated)."""
    try:
        items = list(keep)
    except TypeError:
        raise TypeError(f"keep must be a sequence of start indices (integers), got "
                        f"{keep!r}") from None
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_))
               for i in items):
        raise TypeError(f"keep must hold integer start indices, got {items!r}")
    return [int(i) for i in items]


def batch_first_crossings(model, Q0, rho0, T, t_max, threshold, t_eval=None, *, keep=(),
                          method: str = "RK45", rtol: float = 1e-8, atol: float = 1e-11,
                          max_norm: float | None = None, form: str | None = None, a0=None,
                          progress=False) -> BatchCrossings:
    """First crossing of ``threshold`` by each start's risk curve, without the curves.

    The same solve as :func:`integrate_batch` (same arguments, same steps, same
    records at `t_eval`), but the records are searched as the solver passes them,
    block by block of times (:data:`CROSSING_BLOCK_BYTES` of states), and only the
    starts in `keep` are kept whole: memory ``O(B·width)`` beyond the solver's own
    instead of ``O(n_eval·B·width)``.  ``times`` equals
    ``first_crossings(sol.t, sol.risk, threshold)`` of :func:`integrate_batch`'s
    solution bit for bit where the dense output is evaluated elementwise (DOP853; RK45
    and RK23 evaluate it as a matrix product, whose rounding may depend on the number
    of times in a piece).

    Parameters
    ----------
    threshold : float
        Risk level (finite).
    keep : sequence of int
        Starts whose whole trajectories are returned (``kept``), e.g. ``(0,)``.

    Returns
    -------
    BatchCrossings
    """
    threshold = check_real("threshold", threshold)
    keep = _start_indices(keep)
    b = _setup(model, Q0, rho0, T, t_max, t_eval, method, max_norm, form, a0, progress, keep)
    rows = max(1, CROSSING_BLOCK_BYTES // (8 * b.y0.size))
    sink = _Crossings(b, threshold, keep, rows)
    nfev, message = _solve(b.fun, b.y0, b.t_max, b.t_eval, method, rtol, atol, b.live,
                           b.blame, b.breaks, sink, rows)
    b.bar.close()
    recs = sink.close()
    last = {"t": sink.last_t.copy(), "Q": b.Q0.copy(), "rho": b.rho0.copy()}
    got = sink.has_last
    Q = sink.last_y[got, :b.nq].reshape((-1,) + b.lead + (model.p, model.p))
    last["Q"][got] = 0.5 * (Q + np.swapaxes(Q, -1, -2))
    last["rho"][got] = sink.last_y[got, b.nq:b.nr].reshape(last["rho"][got].shape)
    status = _status(b.t_div)
    kept = None
    if keep:
        Qk, rhok, ak, riskk = recs
        sub = {key: v[keep] for key, v in last.items()}
        kept = BatchODESolution(model, b.t_eval, Qk, rhok, riskk, b.T, status[keep],
                                b.t_div[keep], sub, message, nfev, ak)
    return BatchCrossings(sink.times, threshold, status, b.t_div, last, message, nfev, kept)


#: Solvers accepted by :func:`integrate_batch` (scipy's explicit Runge–Kutta classes).
METHODS = {"RK45": _ivp.RK45, "RK23": _ivp.RK23, "DOP853": _ivp.DOP853}
#: Seconds of solver bookkeeping per right-hand-side evaluation (a lower bound).
_SOLVER_OVERHEAD_S = 1e-4
#: Per solver: right-hand-side evaluations per step and the extent of its
#: stability region along the negative real axis (|h λ| beyond it is unstable).
_STEP_COST = {"RK45": (6, 3.3), "RK23": (3, 2.5), "DOP853": (12, 6.0)}


def _spectral_radius(kern, Q, rho, T, iterations=30, seed=0):
    """Largest |eigenvalue| of the Jacobian of ``(dQ, dρ)`` at one state (power iteration).

    Jacobian-vector products are forward differences of the kernel, so this
    costs ``iterations + 1`` right-hand-side evaluations at any ``p``.
    """
    # Q (p, p) or, with an input spectrum, (B, p, p) per block (docs/model.md §1a)
    nq = Q.size

    def sym(x):
        x = x.reshape(Q.shape)
        return 0.5 * (x + np.swapaxes(x, -1, -2))

    def f(y):
        blocks = kern.rhs(sym(y[:nq]), y[nq:].reshape(rho.shape), T)   # (dQ, drho[, ...])
        return np.concatenate([np.ravel(blocks[0]), np.ravel(blocks[1])])

    y = np.concatenate([Q.ravel(), rho.ravel()])
    f0 = f(y)
    v = np.random.default_rng(seed).standard_normal(y.size)
    v[:nq] = sym(v[:nq]).ravel()
    lam = 0.0
    h = 1e-7 * max(1.0, float(np.max(np.abs(y))))
    for _ in range(iterations):
        norm = float(np.linalg.norm(v))
        if not norm > 0 or not np.isfinite(norm):
            break
        v = v / norm
        w = (f(y + h * v) - f0) / h
        lam = float(np.linalg.norm(w))
        v = w
    return lam


def estimate_solve(model, states, T, horizon, batch, method="RK45", form=None) -> dict:
    """Cost of :func:`integrate_batch` over `horizon`, estimated before integrating.

    Over a long horizon an explicit solver's step is limited by stability,
    ``h <= c / ρ(J)`` (``ρ(J)`` the spectral radius of the Jacobian, ``c`` the
    extent of the method's stability region on the negative real axis), so it
    needs about ``horizon · ρ(J) / c`` steps.  ``ρ(J)`` is taken as the largest
    over `states` (e.g. the start and, for a comparison with data, the data's
    last state, where the slow tail is); the time per step is measured on a
    batch of `batch` starts.

    Parameters
    ----------
    states : sequence of ``(Q, rho)`` pairs
    T : array (p*, p*)
    horizon : float
    batch : int
        Number of starts integrated together.

    Returns
    -------
    dict
        ``nfev`` (estimated right-hand-side evaluations; within 0.9-1.4x of the
        actual count at horizon 2e4 for p = 2..16, σ = z² and z³ - 3z),
        ``seconds`` (a rough lower bound: 2-5x below measured times) and
        ``rate`` (the ``ρ(J)`` used).
    """
    import time

    check_model(model)
    kern = kernels(model, form)
    T = np.asarray(T, float)
    rate = max(_spectral_radius(kern, np.asarray(Q, float), np.asarray(r, float), T)
               for Q, r in states)
    per_step, reach = _STEP_COST[method]
    nfev = per_step * (200.0 + float(horizon) * rate / reach)
    Q, r = (np.asarray(a, float) for a in states[0])
    Qb = np.broadcast_to(Q, (batch,) + Q.shape).copy()
    rb = np.broadcast_to(r, (batch,) + r.shape).copy()
    best = math.inf
    for _ in range(3):
        tick = time.perf_counter()
        kern.rhs(Qb, rb, T)
        best = min(best, time.perf_counter() - tick)
    # + the solver's own work per evaluation (scipy's step control, the divergence
    # checks): 1.4e-4 to 1.8e-4 s measured at p = 2..16 on the development machine
    return {"nfev": nfev, "seconds": nfev * (best + _SOLVER_OVERHEAD_S), "rate": rate}


def _solve(fun, y0, t_max, t_eval, method, rtol, atol, live, blame, breaks, sink,
           max_rows=None):
    """:func:`_steps` with the solver's own array work on one BLAS thread.

    The Runge–Kutta stage sums and the dense output are matrix–vector products over the
    whole batch's state: with several BLAS threads their rounding depends on the thread
    count, so the same starts gave results differing in the last bit in the main process
    (default threads) and in a Dask worker (one thread) — measured on the escape law's
    384-start chunk at p = 5.  The kernels inside keep their own limit (`threads`).
    """
    with single_thread_blas():
        return _steps(fun, y0, t_max, t_eval, method, rtol, atol, live, blame, breaks, sink,
                      max_rows)


def _steps(fun, y0, t_max, t_eval, method, rtol, atol, live, blame, breaks, sink,
           max_rows=None):
    """Step ``method`` from 0 to ``t_max``, handing the states at `t_eval` to `sink`.

    ``sink(i0, i1, y)`` receives the states at ``t_eval[i0:i1]``, ``y`` of shape
    ``(i1 - i0, y0.size)``, in order of time, as the solver passes them: the starting
    state for the times at 0, then after each accepted step those it covers, evaluated
    by the step's dense output in pieces of at most `max_rows` times (all at once if
    None).  A divergence time is recorded (in `fun`) before the states it concerns are
    handed over, except at the time the solver stands at: it can still be set there
    (a restart or `blame` evaluates `fun` at ``solver.t``), so a sink that applies the
    NaN rule holds back the last state it received until the next one or the end.

    Restarts the solver from its last accepted state after any step in which
    `fun` marked a start as diverged (``live`` lost an entry).  If the step
    size collapses with no start marked, ``blame(t, y)`` marks the start that
    limits it (returns False when there is none) and the solve goes on.  The
    solver also stops and restarts at each time of `breaks` (a learning-rate
    schedule's kinks: no step crosses one).  Returns ``(nfev, message)``.
    """
    cls = METHODS[method]
    nxt = int(np.searchsorted(t_eval, 0.0, side="right"))
    if nxt:
        sink(0, nxt, np.broadcast_to(y0, (nxt, y0.size)))
    n_live = int(live.sum())
    bounds = [float(b) for b in breaks if 0.0 < b < t_max] + [float(t_max)]
    t_max = bounds.pop(0)
    # each piece before a breakpoint sees its own side of a jump up to its end
    piece = left_of(fun, t_max) if bounds else fun
    solver = cls(piece, 0.0, y0, t_max, rtol=rtol, atol=atol)
    nfev = 0
    while solver.status == "running" or (solver.status == "finished" and bounds):
        if solver.status == "finished":
            # a breakpoint reached: the next smooth piece starts from this state
            nfev += solver.nfev
            t_max = bounds.pop(0)
            piece = left_of(fun, t_max) if bounds else fun
            solver = cls(piece, solver.t, solver.y.copy(), t_max, rtol=rtol, atol=atol)
        t_old = solver.t
        message = solver.step()
        if solver.status == "failed":
            if int(live.sum()) == n_live and not blame(t_old, solver.y):
                raise RuntimeError(f"batched ODE integration failed at t = {t_old:.6g}: "
                                   f"{message}")
            # the step size collapsed on a start that diverged (or is blowing up):
            # it is frozen now, restart without it
            nfev += solver.nfev
            n_live = int(live.sum())
            solver = cls(piece, t_old, solver.y.copy(), t_max, rtol=rtol, atol=atol)
            continue
        stop = int(np.searchsorted(t_eval, solver.t, side="right"))
        if stop > nxt:
            # one dense output per step (DOP853's evaluates `fun` three more times)
            interp = solver.dense_output()
            while nxt < stop:
                end = stop if max_rows is None else min(stop, nxt + max_rows)
                sink(nxt, end, interp(t_eval[nxt:end]).T)
                nxt = end
        if int(live.sum()) < n_live and solver.status == "running":
            nfev += solver.nfev
            n_live = int(live.sum())
            solver = cls(piece, solver.t, solver.y.copy(), t_max, rtol=rtol, atol=atol)
    nfev += solver.nfev
    return nfev, "The solver successfully reached the end of the integration interval."

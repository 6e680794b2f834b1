"""Checks of the user's trajectories and arguments for
:func:`symquad.studies.validation.compare` (and the start and teacher of ``validate``).

Split out of :mod:`symquad.studies.validation` (which re-exports its names).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..numeric import simulate as S
from ..numeric.checks import as_overlaps, as_real_array, check_int as _check_int
from ..numeric.layout import block_teacher
from ..spectrum import block_axis, has_spectrum


def _check_teacher(model, T):
    """``T`` checked as teacher overlaps (shape, finite, symmetric PSD)."""

    # with Q = I and rho = 0 the Gram matrix is PSD exactly when T is (per block with an
    # input spectrum: T of shape (B, p*, p*))
    lead = block_axis(model)
    return as_overlaps(model, np.broadcast_to(np.eye(model.p), lead + (model.p, model.p)),
                       np.zeros(lead + (model.p, model.p_star)), T)[2]


def default_teacher(model):
    """The teacher overlaps of a run that gives none: ``I``, split over the blocks of an
    input spectrum like an isotropic teacher, ``T^b = f_b I`` (the simulators' default)."""
    T = np.eye(model.p_star)
    return block_teacher(model, T) if has_spectrum(model) else T


def _check_start(model, Q0, rho0, T):
    """Check initial overlaps (one start or one per replica) before any simulation."""

    # lazy: scipy
    from ..numeric.integrate import check_sphere

    Q0, rho0 = np.asarray(Q0), np.asarray(rho0)
    k = 2 + len(block_axis(model))          # (B, p, p) per start with an input spectrum
    if Q0.ndim == k and rho0.ndim == k:
        as_overlaps(model, Q0, rho0, T)
        check_sphere(model, Q0)
        return
    if Q0.ndim != k + 1 or rho0.ndim != k + 1 or Q0.shape[0] != rho0.shape[0]:
        shapes = ("(B, p, p) and (B, p, p*) (one per input block)" if k == 3
                  else "(p, p) and (p, p*)")
        raise ValueError(f"Q0 and rho0 must be {shapes} or carry the same leading "
                         f"replicas axis; got shapes {Q0.shape} and {rho0.shape}")
    for r in range(Q0.shape[0]):
        as_overlaps(model, Q0[r], rho0[r], T, names=(f"Q0[{r}]", f"rho0[{r}]", "T"))
    check_sphere(model, Q0)


def _check_times(t):
    """Every recorded time: 1-d, >= 3 of them, finite, >= 0, strictly increasing.

    Each error names the first offending index, so a NaN or a repeated time
    deep inside a long record is reported, not only a bad first or last time.
    """
    if t.ndim != 1 or t.size < 3:
        raise ValueError(f"t must be a 1-d array of >= 3 times, got shape {t.shape}")
    bad = np.flatnonzero(~np.isfinite(t))
    if bad.size:
        raise ValueError(f"t must be finite: t[{bad[0]}] = {float(t[bad[0]])!r} "
                         f"({bad.size} non-finite time(s))")
    if t[0] < 0:
        raise ValueError(f"t must be >= 0 (times steps/N), got t[0] = {float(t[0])!r}")
    step = np.diff(t)
    bad = np.flatnonzero(step <= 0)
    if bad.size:
        i = bad[0]
        raise ValueError(f"t must be strictly increasing: t[{i}] = {float(t[i])!r} is followed by "
                         f"t[{i + 1}] = {float(t[i + 1])!r} ({bad.size} such step(s))")
    # times so close that t - t[0] collapses would give the ODE solver repeated times
    if np.any(np.diff(t - t[0]) <= 0):
        raise ValueError("t must be strictly increasing after subtracting t[0] (the ODE "
                         "clock); some times differ by less than the float resolution")


def _as_trajectories(model, t, Q, rho, T):
    """Check user trajectories; return float arrays ``t (n,)``, ``Q (R,n,p,p)``,
    ``rho (R,n,p,p*)``, ``T (p*,p*)`` (errors name the parameter)."""
    p, k = model.p, model.p_star
    lead = block_axis(model)        # (B,) with an input spectrum: per-block overlaps
    tag = "B, " if lead else ""
    more = (f", B = {lead[0]} blocks of spectrum={model._field_text('spectrum')}"
            if lead else "")
    # non-finite entries are reported below with the replica and time they occur at
    out = [as_real_array(value, name, finite=False)
           for name, value in (("t", t), ("Q", Q), ("rho", rho))]
    t, Q, rho = out
    _check_times(t)
    n = t.size
    if Q.ndim == 3 + len(lead):
        Q = Q[None]
    if rho.ndim == 3 + len(lead):
        rho = rho[None]
    if Q.ndim != 4 + len(lead) or Q.shape[1:] != (n,) + lead + (p, p):
        raise ValueError(f"Q must have shape (replicas, n, {tag}p, p) or (n, {tag}p, p) with "
                         f"n = len(t) = {n}, p = {p}{more}; got {np.shape(out[1])}")
    if rho.ndim != 4 + len(lead) or rho.shape[1:] != (n,) + lead + (p, k):
        raise ValueError(f"rho must have shape (replicas, n, {tag}p, p_star) or (n, {tag}p, "
                         f"p_star) with n = {n}, p = {p}, p_star = {k}{more}; got "
                         f"{np.shape(out[2])}")
    if Q.shape[0] != rho.shape[0]:
        raise ValueError(f"Q and rho must have the same number of replicas, got {Q.shape[0]} "
                         f"and {rho.shape[0]}")
    for name, arr in (("Q", Q), ("rho", rho)):
        bad = ~np.isfinite(arr)
        if bad.any():
            r, i = np.argwhere(bad)[0][:2]
            raise ValueError(f"{name} must be finite; replica {r} has a non-finite entry at "
                             f"t = {t[i]:.6g} (drop diverged runs before comparing)")
    axes = tuple(range(2, Q.ndim))      # every axis after (replica, time)
    scale = np.maximum(1.0, np.max(np.abs(Q), axis=axes))
    asym = np.max(np.abs(Q - np.swapaxes(Q, -1, -2)), axis=axes) / scale
    if np.max(asym) > 1e-6:
        r, i = np.unravel_index(np.argmax(asym), asym.shape)
        raise ValueError(f"Q must be symmetric (relative asymmetry {asym[r, i]:.3g} > 1e-6 in "
                         f"replica {r} at t = {t[i]:.6g})")
    Q = 0.5 * (Q + np.swapaxes(Q, -1, -2))
    if T is None:
        T = default_teacher(model)
    for r in range(Q.shape[0]):
        # the ODE starts here, so the start must be a Gram matrix (later times are data)
        _, _, T = as_overlaps(model, Q[r, 0], rho[r, 0], T,
                              names=(f"Q[{r}, 0]", f"rho[{r}, 0]", "T"), tol=1e-6)
    return t, Q, rho, T


def _as_readout(model, readout, t, replicas):
    """Check a readout trajectory for `model`: ``(replicas, n, p)`` floats, or None.

    Required (and only accepted) when the model trains its readout; errors
    name ``readout`` and the shape expected.
    """

    if not model.readout_trained:
        if readout is not None:
            raise ValueError("readout is accepted only for a model that trains its readout "
                             "(lr_readout > 0); a fixed readout is model.readout "
                             f"(lr_readout = {model.lr_readout:g} here)")
        return None
    if readout is None:
        raise ValueError(f"readout is required: the model trains its readout (lr_readout = "
                         f"{model.lr_readout:g}), so the data must give a(t) as an array of "
                         f"shape (replicas, n, p) or (n, p) with n = len(t), p = {model.p}")
    a = as_real_array(readout, "readout")
    n, p = len(t), model.p
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.shape[1:] != (n, p) or a.shape[0] != replicas:
        raise ValueError(f"readout must have shape (replicas, n, p) = ({replicas}, {n}, {p}) "
                         f"or (n, p) with one replica; got {np.shape(readout)}")
    bad = ~np.isfinite(a)
    if bad.any():
        r, i = np.argwhere(bad)[0][:2]
        raise ValueError(f"readout must be finite; replica {r} has a non-finite entry at "
                         f"t = {t[i]:.6g} (drop diverged runs before comparing)")
    return a.astype(float)


#: compare warns when its ODE solve is estimated to take longer than this (seconds)
COMPARE_WARN_SECONDS = 30.0


def _check_ode_horizon(model, t, Q, rho, T):
    """Estimate the ODE solve of :func:`compare` over the data's times before doing it.

    On the slow tail an explicit solver's step is set by stability, so the
    cost grows linearly with the horizon (about 29 s per 10⁶ time units for
    the default model); :func:`symquad.numeric.ode_batch.estimate_solve`
    predicts it from the Jacobian at the first and last recorded states.
    Warns above ``COMPARE_WARN_SECONDS``, refuses above
    ``symquad.numeric.simulate.MAX_ESTIMATED_SECONDS``.
    """
    # lazy: scipy
    from ..numeric.ode_batch import estimate_solve

    horizon = float(t[-1] - t[0])
    try:
        est = estimate_solve(model, [(Q[0, 0], rho[0, 0]), (Q[0, -1], rho[0, -1])], T,
                             horizon, Q.shape[0])
    except (ArithmeticError, TypeError, ValueError):    # e.g. data far outside the ODE's domain
        return
    if not all(math.isfinite(v) for v in est.values()):
        return
    text = (f"compare: integrating the ODE over t in [{t[0]:.4g}, {t[-1]:.4g}] takes about "
            f"{est['nfev']:.3g} right-hand-side evaluations (stiffness {est['rate']:.3g} per "
            f"unit time), at least {S._duration(est['seconds'])}")
    if est["seconds"] > S.MAX_ESTIMATED_SECONDS:
        raise ValueError(f"{text}; limit {S._duration(S.MAX_ESTIMATED_SECONDS)}: compare a "
                         f"shorter time window (cut the tail of t)")
    if est["seconds"] > COMPARE_WARN_SECONDS:
        warnings.warn(text, RuntimeWarning, stacklevel=3)


def _check_whole_run(model, whole_run, N, a):
    """``(whole_run, N)`` of :func:`compare`, checked before any work.

    The SDE ensemble of the whole-run criteria starts from the data's overlaps
    and from ``model.readout``, so a trained readout's data must start there.
    """
    if whole_run not in (None, True, False):
        raise ValueError(f"whole_run must be None, True or False, got {whole_run!r}")
    if whole_run is None:
        whole_run = N is not None
    if not whole_run:
        return False, N
    if N is None:
        raise ValueError("whole_run=True needs N (the input dimension of the data)")
    N = _check_int(N, "N", 1)
    if a is not None:
        a0 = np.asarray([float(v) for v in model.readout])
        if not np.allclose(a[:, 0], a0, rtol=1e-9, atol=1e-12):
            raise ValueError(f"readout: the whole-run criteria start the SDE from "
                             f"model.readout = {a0.tolist()}, but the data's readout starts at "
                             f"{a[0, 0].tolist()} (first replica): give the model that "
                             f"readout, or whole_run=False")
    return True, N

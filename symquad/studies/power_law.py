r"""Power-law input spectra: learning-curve exponents, the truncation to ``L`` blocks, escape.

The inputs are ``x ~ N(0, Σ)`` with the ``L``-block truncation of a power law
(:func:`symquad.power_law_spectrum`, docs/model.md §1a): ``L`` blocks of fraction
``f_j = 1/L`` and eigenvalue ``s_j = j^{−α}/Z_L``, ``Z_L = (1/L) Σ_{i≤L} i^{−α}`` (so
``tr Σ/N = 1``), and the teacher's power per block ``T^j = t_j T`` with
``t_j = j^{−β}/Σ_{i≤L} i^{−β}`` (``β`` the teacher exponent).  Two studies, each a plain
function of scalar parameters returning a flat dict (a task :func:`symquad.sweep` maps
over a grid; ``examples/power_law_scaling.py`` runs them):

**Learning-curve exponent** (:func:`power_law_curve_study`).  Time is measured in units of
the fastest block, ``u = 2 η s_1 t``.  For the linear student and teacher (``σ = σ* = z``,
``p = p* = 1``) started at ``w = 0`` the per-block errors ``D_j = Q^j − 2ρ^j + T^j`` obey
(from the block drift of docs/derivation.md §1a with ``δ = λ − ν``)

.. math::  \dot D_j = −2η s_j D_j + η^2 f_j s_j (2ε + Δ), \qquad
           ε = \tfrac12 \sum_c s_c D_c, \qquad D_j(0) = t_j,

so that, to first order in ``η`` (gradient flow), ``ε(u) = ½ Σ_j s_j t_j e^{−u s_j/s_1}``
``= ½ Σ_j s_j t_j e^{−j^{−α} u}``.  For ``1 ≪ u ≪ L^α`` the sum is a Riemann sum of
``∫ j^{−(α+β)} e^{−j^{−α}u} dj = (1/α) Γ(γ_∞) u^{−γ_∞}`` (substitute ``x = j^{−α}u``), so

.. math::  ε(u) \propto u^{−γ_∞}, \qquad γ_∞ = (α + β − 1)/α \qquad (α + β > 1),

while for ``u ≳ L^α`` every block has been learned and the slowest one, ``e^{−L^{−α}u}``,
decays exponentially: **the truncation matters from ``u ≈ L^α`` on**.  The study fits
``log ε = a − γ log u`` by least squares over log-spaced times in a fixed window
``[u_from, u_to]``; once ``L^α ≫ u_to`` the fitted ``γ`` no longer depends on ``L`` (it
tends to ``γ_∞`` as the window moves to large ``u``; at a finite window it carries the
discreteness of the first blocks and the ``O(η)`` noise term).  The curve is the
integrated block ODE of the derived kernels (:func:`symquad.integrate`, any activation);
for the linear model it is checked against the exact solution of the system above,
``D(t) = e^{Mt}(D(0) − D_*) + D_*``, ``M = −2η diag(s) + η² (f∘s) sᵀ``
(:func:`linear_block_risk`, written from the definitions, not from the kernels).

**Plateau and escape of the quadratic network** (:func:`power_law_escape_study`).  The plateau
and escape analyses of docs/model.md §8 refuse a spectrum (they are derived for
``Q = qI``, ``ρ = 0``); here they are measured: for ``σ = z²`` the set ``ρ = 0`` is
invariant (``σ'`` is odd and the student fields are independent of the teacher's there),
the plateau is the end point of the block ODE started at ``ρ = 0``, ``Q^c = f_c I`` (the
random start's mean), its risk ``ε_pl``, and the growth rate ``κ`` of ``ρ`` is the largest
real part of the eigenvalues of ``∂(dρ)/∂ρ`` at the plateau (central differences of the
kernels' right-hand side over every entry ``ρ^c_km``; ``dρ`` is odd in ``ρ``, so the
differences are exact to ``O(h²)``).  Escape times (first time the risk falls halfway from
``ε_pl`` to the final risk) of the ODE from realised random starts (the exact law of
``w_k ~ N(0, I_N)`` per block, :func:`symquad.numeric.fluctuations.block_random_start`) and,
optionally, of SGD (the exact reduced simulator), next to the scale ``log(N)/(2κ)`` of the
linearised growth ``|ρ|² ∝ e^{2κt}/N``.
"""

from __future__ import annotations

import math

import numpy as np

from ..numeric.checks import check_int, check_positive
from ..numeric.fluctuations import block_random_start
from ..numeric.integrate import integrate
from ..numeric.kernels import kernels
from ..numeric.landscape import escape_times, random_start
from ..numeric.ode_batch import integrate_batch
from ..numeric.simulate import simulate
from ..spec import Model
from ..spectrum import block_axis, power_law_spectrum

__all__ = ["power_law_curve_study", "power_law_escape_study", "linear_block_risk", "fit_exponent",
           "asymptotic_exponent", "untruncated_exponent"]

#: Risks below this fraction of the start are not fitted: ``D_j = Q^j − 2ρ^j + T^j`` cancels
#: entries of the order of the start, so the solver's relative tolerance 1e-9 on them is an
#: absolute error of about 1e-9 ε(0) on the risk (the exponential tail of a truncation).
_FLOOR = 1e-6

#: Largest window ratio ``u_to / u_from`` (and horizon) accepted: the block ODE is stiff,
#: its cost grows with the ratio ``s_1/s_L = L^α`` of the block rates it resolves.
_MAX_U = 1e9


def asymptotic_exponent(alpha: float, teacher_exponent: float) -> float:
    """``γ_∞ = (α + β − 1)/α``: the gradient-flow exponent of ``L = ∞`` (NaN for ``α + β <= 1``)."""
    alpha, beta = float(alpha), float(teacher_exponent)
    return (alpha + beta - 1.0) / alpha if alpha > 0 and alpha + beta > 1 else float("nan")


def untruncated_exponent(alpha, teacher_exponent, u_from, u_to, blocks=100_000, points=100):
    r"""The fitted exponent of the gradient-flow sum without truncation on ``[u_from, u_to]``.

    ``ε(u) ∝ Σ_{j ≤ blocks} j^{−(α+β)} e^{−j^{−α} u}`` (module docstring; ``blocks`` far
    beyond ``u_to^{1/α}`` stands for ``L = ∞``), fitted as :func:`fit_exponent` on
    `points` log-spaced times: the ``L → ∞``, ``η → 0`` value a finite window gives, which
    differs from ``γ_∞`` by the discreteness of the first blocks.
    """
    u = np.geomspace(u_from, u_to, points)
    j = np.arange(1, int(blocks) + 1, dtype=float)
    a, b = float(alpha), float(teacher_exponent)
    risk = np.array([np.sum(j ** -(a + b) * np.exp(-j ** -a * x)) for x in u])
    return fit_exponent(u, risk, u_from, u_to)[0]


def fit_exponent(t, risk, lo, hi):
    r"""Least-squares fit of ``log ε = a − γ log t`` over the times in ``[lo, hi]``.

    Returns ``(γ, a, rms)``: the exponent, the intercept and the root-mean-square residual
    of ``log ε`` (a straight line in log–log coordinates has ``rms ≈ 0``).  Every point
    counts once: log-spaced times weigh every decade alike.  Raises ValueError with fewer
    than 3 positive finite points in the window.
    """
    t, risk = np.asarray(t, float), np.asarray(risk, float)
    use = (t >= lo) & (t <= hi) & np.isfinite(risk) & (risk > 0) & (t > 0)
    if use.sum() < 3:
        raise ValueError(f"fit window [{lo:.4g}, {hi:.4g}] holds {int(use.sum())} usable "
                         f"points; at least 3 are needed")
    x, y = np.log(t[use]), np.log(risk[use])
    slope, intercept = np.polyfit(x, y, 1)
    rms = float(np.sqrt(np.mean((y - (intercept + slope * x)) ** 2)))
    return float(-slope), float(intercept), rms


def linear_block_risk(spectrum, teacher, lr, t, noise=0.0, D0=None):
    r"""Exact risk of the linear block model (``σ = σ* = z``, ``p = p* = 1``, readouts 1).

    Solves ``Ḋ = M D + η² Δ (f∘s)``, ``M = −2η diag(s) + η² (f∘s) sᵀ`` (module docstring)
    by the matrix exponential, ``D(t) = e^{Mt}(D(0) − D_*) + D_*`` with ``M D_* = −η² Δ (f∘s)``,
    and returns ``ε(t) = ½ sᵀ D(t)``.  ``M`` is similar to the symmetric
    ``M' = F^{-1/2} M F^{1/2} = −2η diag(s) + η² v vᵀ``, ``v = √f ∘ s`` (``F = diag(f)``), so
    ``e^{Mt} = F^{1/2} V e^{Λt} Vᵀ F^{-1/2}`` with ``M' = V Λ Vᵀ`` (one symmetric
    eigendecomposition for every time).

    Parameters
    ----------
    spectrum : tuple of (f_j, s_j)
    teacher : sequence of float
        ``T^j`` (the teacher's power per block).
    lr : float
        ``η``.
    t : array (n,)
    noise : float
        Label-noise variance ``Δ``.
    D0 : array (B,), optional
        ``D_j(0) = Q^j − 2ρ^j + T^j``; default ``T^j`` (the start ``w = 0``).
    """
    f = np.array([float(x) for x, _ in spectrum])
    s = np.array([float(x) for _, x in spectrum])
    eta = float(lr)
    v = np.sqrt(f) * s
    lam, V = np.linalg.eigh(-2.0 * eta * np.diag(s) + eta ** 2 * np.outer(v, v))
    c = eta ** 2 * float(noise) * f * s
    # M D_* = -c, with M^{-1} = F^{1/2} V Λ^{-1} Vᵀ F^{-1/2}
    D_star = np.sqrt(f) * (V @ ((V.T @ (-c / np.sqrt(f))) / lam))
    D0 = np.asarray(teacher, float) if D0 is None else np.asarray(D0, float)
    left = 0.5 * (s * np.sqrt(f)) @ V                       # ½ sᵀ F^{1/2} V
    right = V.T @ ((D0 - D_star) / np.sqrt(f))              # Vᵀ F^{-1/2} (D(0) − D_*)
    tt = np.ravel(np.asarray(t, float))
    out = (np.exp(np.outer(tt, lam)) * right) @ left + 0.5 * s @ D_star
    return out.reshape(np.shape(t))


def _model(alpha, L, teacher_exponent, activation, p, p_star, lr, **fields):
    """``(model, T, s)``: the power-law model, its per-block teacher and its eigenvalues."""
    spectrum, teacher = power_law_spectrum(alpha, check_int(L, "L", 1), teacher_exponent)
    m = Model(p, p_star, lr, activation=activation, spectrum=spectrum, **fields)
    s = np.array([float(x) for _, x in spectrum])
    if block_axis(m):
        T = np.asarray(teacher)[:, None, None] * np.eye(p_star)
    else:                                   # L = 1 is the isotropic input (no block axis)
        T = np.eye(p_star)
    return m, T, s


def _zero_start(m):
    lead = block_axis(m)
    return np.zeros(lead + (m.p, m.p)), np.zeros(lead + (m.p, m.p_star))


def power_law_curve_study(alpha=2.0, L=16, teacher_exponent=0.0, lr=0.5, activation="z",
                         p=1, p_star=1, noise=0.0, u_from=10.0, u_to=1000.0, u_max=0.0,
                         n_times=241, start="zero", N=1000, seed=0):
    r"""The risk's decay on a power-law spectrum and its fitted exponent (module docstring).

    Parameters
    ----------
    alpha, L, teacher_exponent : float, int, float
        The spectrum ``s_j ∝ j^{−α}`` over ``L`` blocks and the teacher's ``t_j ∝ j^{−β}``
        (:func:`symquad.power_law_spectrum`).
    lr, activation, p, p_star, noise
        The model (``Model(p, p_star, lr, activation=..., noise=...)``; the teacher's
        activation is the student's).
    u_from, u_to : float
        The fit window in ``u = 2 η s_1 t`` (``0 < u_from < u_to <= 1e9``).
    u_max : float
        The horizon in ``u`` (0: ``10 u_to``).
    n_times : int
        Log-spaced recorded times between ``u = 0.01`` and the horizon (and ``u = 0``).
    start : {"zero", "random"}
        ``w = 0`` (``Q = ρ = 0``; a fixed point for ``σ = c z²``, use ``"random"``), or a
        draw of the exact law of ``w_k ~ N(0, I_N)`` per block at dimension `N` (`seed`).

    Returns
    -------
    dict
        Scalars ``exponent`` (the fitted ``γ``, ``ε ∝ t^{−γ}`` on the window),
        ``fit_rms`` (residual of ``log ε``), ``exponent_asymptotic`` (``γ_∞``),
        ``exponent_untruncated`` (:func:`untruncated_exponent` on the same window),
        ``exponent_exact`` and ``max_error_exact`` (the exponent of the linear model's
        exact solution on the same times, and the ODE's largest deviation from it relative
        to the starting risk; NaN for other models), ``truncation_u`` (``L^α``: the truncation matters beyond it),
        ``t_unit`` (``1/(2η s_1)``: ``t = u · t_unit``), ``risk_start``, ``risk_end``,
        ``ode_status``; arrays ``u``, ``risk`` and ``slope`` (the local exponent
        ``−d log ε/d log u``).
    """
    m, T, s = _model(alpha, L, teacher_exponent, activation, p, p_star, lr, noise=noise)
    u_from, u_to = check_positive("u_from", u_from), check_positive("u_to", u_to)
    if not u_from < u_to <= _MAX_U:
        raise ValueError(f"the fit window must satisfy 0 < u_from < u_to <= {_MAX_U:g}, got "
                         f"[{u_from:g}, {u_to:g}]")
    truncation = float(L) ** float(alpha)
    u_max = float(u_max) or min(_MAX_U, 10.0 * u_to)
    if not u_to <= u_max <= _MAX_U:
        raise ValueError(f"u_max must be in [u_to, {_MAX_U:g}] = [{u_to:g}, {_MAX_U:g}], got "
                         f"{u_max:g}")
    n_times = check_int(n_times, "n_times", 10, 100_000)
    unit = 1.0 / (2.0 * m.eta * float(s[0]))
    u = np.concatenate([[0.0], np.geomspace(min(0.01, u_from / 10), u_max, n_times - 1)])
    if start == "zero":
        Q0, rho0 = _zero_start(m)
    elif start == "random":
        if block_axis(m):
            Q0, rho0 = (x[0] for x in block_random_start(m, T, N, 1, seed=seed))
        else:
            Q0, rho0 = (x[0] for x in random_start(m, N, 1, seed=seed))
    else:
        raise ValueError(f"start must be 'zero' or 'random', got {start!r}")
    sol = integrate(m, Q0, rho0, T, u_max * unit, t_eval=u * unit, rtol=1e-9, atol=1e-14,
                    on_divergence="stop")
    risk = np.full(u.shape, np.nan)
    risk[:len(sol.risk)] = sol.risk
    floor = _FLOOR * risk[0]          # the exponential tail of a truncation: not fitted
    gamma, _, rms = fit_exponent(u, np.where(risk > floor, risk, np.nan), u_from, u_to)
    untruncated = (untruncated_exponent(alpha, teacher_exponent, u_from, u_to)
                   if alpha + teacher_exponent > 1 else float("nan"))
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = -np.gradient(np.log(risk[1:]), np.log(u[1:]))
    out = {"exponent": gamma, "fit_rms": rms,
           "exponent_asymptotic": asymptotic_exponent(alpha, teacher_exponent),
           "exponent_untruncated": untruncated,
           "exponent_exact": float("nan"), "max_error_exact": float("nan"),
           "truncation_u": truncation, "t_unit": unit, "risk_start": float(risk[0]),
           "risk_end": float(risk[-1]), "ode_status": sol.status,
           "u": u, "risk": risk, "slope": np.concatenate([[np.nan], slope])}
    if tuple(m.activation) == (0, 1) and m.p == m.p_star == 1 and start == "zero":
        teacher = np.ravel(T) if block_axis(m) else [1.0]
        exact = linear_block_risk(m.spectrum, teacher, m.eta, u * unit, noise=noise)
        out["exponent_exact"] = fit_exponent(u, np.where(risk > floor, exact, np.nan),
                                             u_from, u_to)[0]
        ok = np.isfinite(risk)
        out["max_error_exact"] = float(np.max(np.abs(risk[ok] - exact[ok])) / exact[0])
    return out


#: The plateau is converged when the largest ``|dQ|`` left is below this.
_PLATEAU_TOL = 1e-10


def _plateau(m, T, t_max, rounds=6):
    """The plateau: the block ODE from ``ρ = 0``, ``Q^c = f_c I``; ``(Q, ρ, risk, |drift|)``.

    Integrated over `t_max`, then again from there (up to `rounds` times) while the largest
    ``|dQ|`` left exceeds :data:`_PLATEAU_TOL`: the slowest block relaxes at a rate of
    order ``η s_L``, far below that of the isotropic plateau for a steep spectrum.
    """
    lead = block_axis(m)
    f = np.array([float(x) for x, _ in m.spectrum])[:, None, None] if lead else 1.0
    Q = f * np.broadcast_to(np.eye(m.p), lead + (m.p, m.p))
    rho = np.zeros(lead + (m.p, m.p_star))
    kern = kernels(m)
    for _ in range(rounds):
        # the start is symmetric on purpose: the plateau is the end point within rho = 0
        sol = integrate(m, Q, rho, T, t_max, t_eval=[0.0, t_max], rtol=1e-10, atol=1e-13,
                        warn_symmetric=False)
        Q, rho, risk = sol.Q[-1], sol.rho[-1], float(sol.risk[-1])
        drift = float(np.max(np.abs(kern.rhs(Q, rho, T)[0])))
        if drift < _PLATEAU_TOL:
            break
    return Q, rho, risk, drift


def _rho_growth_rate(m, Q, T, h=1e-6):
    r"""``κ``: the largest real part of the eigenvalues of ``∂(dρ)/∂ρ`` at ``(Q, ρ = 0)``.

    Central differences of the kernels' ``dρ`` over every entry of ``ρ`` (every block).
    """
    kern = kernels(m)
    shape = Q.shape[:-2] + (m.p, m.p_star)
    n = int(np.prod(shape))
    J = np.empty((n, n))
    for i in range(n):
        e = np.zeros(n)
        e[i] = h
        up = kern.rhs(Q, e.reshape(shape), T)[1]
        down = kern.rhs(Q, -e.reshape(shape), T)[1]
        J[:, i] = (np.ravel(up) - np.ravel(down)) / (2 * h)
    return float(np.max(np.linalg.eigvals(J).real))


def power_law_escape_study(alpha=1.0, L=4, teacher_exponent=0.0, p=2, p_star=1, lr=0.1,
                 activation="z**2", N=1000, replicas=16, seed=0, sgd=False,
                 sgd_replicas=16, t_max=0.0, n_times=401):
    r"""Plateau and escape of the quadratic network on a power-law spectrum (module docstring).

    Parameters
    ----------
    alpha, L, teacher_exponent
        The spectrum and the teacher's power per block (:func:`symquad.power_law_spectrum`;
        ``L = 1`` or ``α = 0`` is the isotropic input).
    p, p_star, lr, activation
        The model (``σ = σ*``, an even activation keeps ``ρ = 0`` invariant).
    N : int
        Input dimension of the random starts (and of SGD): a multiple of ``L`` with room
        in every block.
    replicas : int
        ODE runs from independent draws of the random start's exact law.
    sgd : bool
        Also run ``sgd_replicas`` replicas of the exact reduced SGD simulator.
    t_max : float
        Horizon (0: ``2 log(N)/(2κ) + 8/κ``, past the slowest escapes).

    Returns
    -------
    dict
        ``plateau_risk``, ``plateau_drift`` (largest ``|dQ|`` left at the plateau: its
        convergence), ``plateau_norms`` (``tr Q^c/p`` per block, as text), ``rate`` (``κ``),
        ``escape_scale`` (``log(N)/(2κ)``), ``final_risk``, ``threshold``, ``ode_median``,
        ``ode_q05``, ``ode_q95``, ``ode_escaped`` (fraction), and with `sgd` the same for
        SGD (``sgd_*``); array ``t`` and ``ode_risk_median`` (the median ODE risk curve).
    """
    m, T, _ = _model(alpha, L, teacher_exponent, activation, p, p_star, lr)
    N = check_int(N, "N", 1)
    replicas = check_int(replicas, "replicas", 2)
    Q_pl, _, risk_pl, drift = _plateau(m, T, 500.0 / m.eta)
    kappa = _rho_growth_rate(m, Q_pl, T)
    if not kappa > 0:
        raise ValueError(f"the plateau is stable (growth rate of rho {kappa:.3g} <= 0): no "
                         f"escape")
    scale = math.log(N) / (2 * kappa)
    t_max = float(t_max) or 2.0 * scale + 8.0 / kappa
    t = np.linspace(0.0, t_max, check_int(n_times, "n_times", 10, 100_000))
    if block_axis(m):
        Q0, rho0 = block_random_start(m, T, N, replicas, seed=seed)
    else:
        Q0, rho0 = random_start(m, N, replicas, seed=seed)
    sol = integrate_batch(m, Q0, rho0, T, t_max, t_eval=t, rtol=1e-8, atol=1e-11)
    final = float(np.nanmedian(sol.risk[:, -1]))
    threshold = final + 0.5 * (risk_pl - final)
    traces = np.trace(Q_pl, axis1=-2, axis2=-1) / m.p
    out = {"plateau_risk": risk_pl, "plateau_drift": drift,
           "plateau_norms": ":".join(f"{v:.6g}" for v in np.atleast_1d(traces)),
           "rate": kappa, "escape_scale": scale, "final_risk": final,
           "threshold": threshold, "t": t, "ode_risk_median": np.nanmedian(sol.risk, 0)}
    out.update(_escape_summary(escape_times(t, sol.risk, threshold), "ode"))
    if sgd:
        run = simulate(m, N=N, t_max=t_max, replicas=check_int(sgd_replicas, "sgd_replicas",
                                                                 2),
                       seed=seed + 1, t_eval=t, on_divergence="stop")
        out.update(_escape_summary(escape_times(run.t, run.risk, threshold), "sgd"))
    return out


def _escape_summary(times, prefix):
    x = np.asarray(times, float)
    ok = np.isfinite(x)
    out = {f"{prefix}_escaped": float(ok.mean())}
    for name, q in (("median", 0.5), ("q05", 0.05), ("q95", 0.95)):
        out[f"{prefix}_{name}"] = float(np.quantile(x[ok], q)) if ok.sum() >= 2 \
            else float("nan")
    return out

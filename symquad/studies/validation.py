r"""Validation of the ODE theory against Monte Carlo SGD: numbers, figures, scaling.

:func:`validate` runs SGD for a model (by default with the exact reduced
simulator, whose law is that of full SGD and whose cost per step does not grow
with ``N``), integrates the ODE (:func:`symquad.integrate`) from the *realised*
initial overlaps of every replica, and measures how far SGD is from the theory.

What is compared
----------------
For replica ``r`` and recorded time ``t_i``:

* the risk deviation ``ε_SGD(t_i) − ε_ODE(t_i)``;
* the overlap deviation ``D_r(t_i) = (‖Q_SGD − Q_ODE‖²_F + ‖ρ_SGD − ρ_ODE‖²_F)^{1/2}``.

Each replica's ODE starts from that replica's own ``(Q(0), ρ(0))``.  From a
random start this is necessary: ``ρ(0)`` has random entries of size ``N^{-1/2}``
whose replica mean is ``≈ 0``, and the ODE from the mean would never leave
the plateau.  From an informed start all replicas share the same initial
overlaps (the simulator realises them exactly), so one ODE serves all.

Escape
------
For a quadratic activation with ``T = I`` the plateau is the fixed point
``ρ = 0, Q = q I`` of the full ODE (:func:`symquad.plateau`).  A trajectory has
escaped at the first time its risk falls below
``ε_pl − f (ε_pl − ε_min)`` with ``f = escape_fraction`` (default ½) —
:func:`symquad.numeric.landscape.escape_threshold`, linear interpolation
between records.  "Before escape" of replica ``r`` means ``t < t_esc^ODE(r)``,
"after" means ``t >= t_esc^ODE(r)``.  At any fixed time before the escape SGD
and the ODE agree to ``O(N^{-1/2})`` (the finite-size scaling can be run from
the random start on such a window, ``fss_start="random"``).  But the SGD noise
that enters ρ on the plateau is of the same order ``N^{-1/2}`` as ``ρ(0)``
itself and is amplified with ρ at the plateau rate ``κ``, so the escape-time
difference ``t_esc^SGD − t_esc^ODE`` is ``O(1)`` and does not shrink with
``N``: SGD escapes at a random time around the ODE's, earlier on average (the
noise adds to ``‖ρ‖``), and near the escape the mean SGD risk drops below the
ODE's by many standard errors.  After the escape the two differ mostly by
that shift in time, and for ``p > p*`` they end at different points of the
zero-risk manifold (same risk, different overlaps): the noise has turned the
direction of ρ.  The report gives the distribution of the escape times and of
their difference.

Finite-size scaling
-------------------
For several ``N`` (default: 5 values over two decades), the mean over replicas
of the root-mean-square in time of ``D_r(t)`` on ``[0, t_fss]`` is measured
from an *informed* start (no plateau, so no escape-time jitter; see above),
and ``log D = a + b log N`` is fitted by weighted least squares
(:func:`scipy.optimize.curve_fit`, weights from the replica standard errors).
The theory predicts ``b = −1/2`` (fluctuations of a sum of ``N t`` steps of
size ``1/N``); the report gives ``b`` with its standard error.

Bands
-----
``band`` (default the central 95 % of the replicas, percentiles 2.5 and 97.5)
is where a single SGD run lies; the ODE is "inside the band" at a time if it
is within it up to ``1e-9`` (the two risks are computed by different routes, so
they agree at ``t = 0`` only to round-off).  The mean of the replicas carries
its own confidence interval ``± 3`` standard errors.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from numbers import Real

import numpy as np
from ..numeric.checks import check_int as _check_int

__all__ = ["validate", "ValidationReport", "finite_size_scaling", "informed_start", "STARTS"]

STARTS = ("random", "informed")
_BAND_TOL = 1e-9


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def informed_start(model, overlap=0.5):
    """Initial overlaps of the "informed" start: ``Q(0) = I_p``, ``ρ(0) = α P``.

    ``P`` (p×p*) is the orthogonal polar factor of a fixed pseudo-random
    matrix (the same for every seed), so its singular values are all 1 and
    every student unit has a non-zero overlap with the teacher; with
    ``0 < α < 1`` the Gram matrix ``[[I, αP], [αPᵀ, I]]`` is positive definite
    (eigenvalues ``1 ± α``).  ``ρ(0)`` of order one: no plateau.
    """
    if not isinstance(overlap, Real) or not 0 < overlap < 1:
        raise ValueError(f"overlap must be in (0, 1), got {overlap!r}")
    p, ps = model.p, model.p_star
    A = np.random.default_rng(20240229).standard_normal((p, ps))
    U, _, Vt = np.linalg.svd(A, full_matrices=False)
    return np.eye(p), overlap * (U @ Vt)


def _ode_per_replica(model, Q0, rho0, T, t, progress=False):
    """ODE trajectories from each initial state; arrays shaped like the SGD records."""
    from ..numeric.integrate import integrate

    R = Q0.shape[0]
    p, ps = model.p, model.p_star
    n = len(t)
    Q = np.full((R, n, p, p), np.nan)
    rho = np.full((R, n, p, ps), np.nan)
    risk = np.full((R, n), np.nan)
    status = []
    same = np.allclose(Q0, Q0[:1]) and np.allclose(rho0, rho0[:1])
    it = range(1 if same else R)
    if progress and not same:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="ODE from realised overlaps", leave=False)
    for r in it:
        sol = integrate(model, Q0[r], rho0[r], T, float(t[-1]) if t[-1] > 0 else 1e-9,
                        t_eval=t, rtol=1e-8, atol=1e-11, on_divergence="stop")
        m = len(sol.t)
        Q[r, :m], rho[r, :m], risk[r, :m] = sol.Q, sol.rho, sol.risk
        status.append(sol.status)
    if same:
        Q[:], rho[:], risk[:] = Q[0], rho[0], risk[0]
        status = status * R
    return Q, rho, risk, np.array(status), same


def _overlap_deviation(Qa, rhoa, Qb, rhob):
    return np.sqrt(np.sum((Qa - Qb) ** 2, axis=(-2, -1)) + np.sum((rhoa - rhob) ** 2,
                                                                    axis=(-2, -1)))


def _rms_over(mask, values):
    """Per-replica root mean square of `values` over the masked times (NaN if none)."""
    cnt = mask.sum(-1)
    s = np.where(mask, values ** 2, 0.0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, np.sqrt(s / np.maximum(cnt, 1)), np.nan)


def _describe(x):
    """Mean, standard error, median and 5/95 % quantiles of a sample (NaN-aware)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"n": 0, "mean": None, "se": None, "median": None, "q05": None, "q95": None}
    return {"n": int(x.size), "mean": float(x.mean()),
            "se": float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else None,
            "median": float(np.median(x)), "q05": float(np.quantile(x, 0.05)),
            "q95": float(np.quantile(x, 0.95)), "std": float(x.std(ddof=1)) if x.size > 1
            else None}


def _escape_setup(model, T, escape_fraction):
    """Plateau fixed point and escape threshold, or (None, reason)."""
    if not model.is_quadratic or not np.allclose(T, np.eye(model.p_star)):
        return None, None, "escape needs a quadratic activation and T = I"
    from ..numeric.landscape import escape_threshold, plateau
    try:
        fp = plateau(model)
    except ValueError as exc:
        return None, None, str(exc)
    if fp.rate <= 0:
        return fp, None, f"plateau is stable (rate {fp.rate:.3g} <= 0): no escape"
    return fp, float(escape_threshold(model, escape_fraction, fp)), ""




# ---------------------------------------------------------------------------
# finite-size scaling
# ---------------------------------------------------------------------------
def finite_size_scaling(model, Ns=(100, 300, 1000, 3000, 10000), t_max=10.0, replicas=64,
                        seed=0, start="informed", overlap=0.5, method="reduced",
                        n_times=51, progress=False):
    r"""Deviation SGD − ODE versus ``N`` and the fitted exponent.

    For each ``N``: ``D_r = [mean_{t ∈ (0, t_max]} D_r(t)²]^{1/2}`` (overlap
    deviation, module docstring) for every replica; ``D(N)`` is its replica
    mean with standard error ``s(N)``.  The fit ``log D = a + b log N`` uses
    the standard errors of ``log D`` (``s/D``) as absolute uncertainties.

    Returns
    -------
    dict
        ``N``, ``deviation``, ``deviation_se``, ``exponent``, ``exponent_se``,
        ``intercept``, ``chi2_per_dof``, ``start``, ``t_max``, ``replicas``.
    """
    from scipy.optimize import curve_fit

    from ..numeric.simulate import simulate

    Ns = [_check_int(n, "fss N", 1) for n in Ns]
    if len(Ns) < 3:
        raise ValueError(f"finite-size scaling needs >= 3 values of N, got {Ns}")
    if max(Ns) / min(Ns) < 10:
        raise ValueError("finite-size scaling: the N values should span at least a decade")
    if start not in STARTS:
        raise ValueError(f"start must be one of {STARTS}, got {start!r}")
    kwargs = {}
    if start == "informed":
        kwargs["Q0"], kwargs["rho0"] = informed_start(model, overlap)
    t = np.linspace(0.0, t_max, n_times)
    dev, se = [], []
    for i, N in enumerate(Ns):
        run = simulate(model, N=N, t_max=t_max, replicas=replicas, seed=seed + 7919 * (i + 1),
                       method=method, t_eval=t, on_divergence="stop", progress=progress,
                       **kwargs)
        ok = run.status == "ok"
        if ok.sum() < 2:
            raise ValueError(f"finite-size scaling: SGD diverged at N={N} "
                             f"({run.n_diverged}/{replicas} replicas); reduce lr")
        Q, rho, _, _, _ = _ode_per_replica(model, run.Q[ok, 0], run.rho[ok, 0], run.T, run.t)
        d = _overlap_deviation(run.Q[ok], run.rho[ok], Q, rho)
        per = _rms_over(np.broadcast_to(run.t > 0, d.shape), d)
        dev.append(float(per.mean()))
        se.append(float(per.std(ddof=1) / math.sqrt(per.size)))
    dev, se = np.array(dev), np.array(se)
    x, y, sy = np.log(Ns), np.log(dev), se / dev
    (b, a), cov = curve_fit(lambda x, b, a: a + b * x, x, y, p0=(-0.5, float(y[0] + 0.5 * x[0])),
                            sigma=sy, absolute_sigma=True)
    resid = (y - (a + b * x)) / sy
    return {"N": [int(n) for n in Ns], "deviation": dev.tolist(), "deviation_se": se.tolist(),
            "exponent": float(b), "exponent_se": float(math.sqrt(cov[0, 0])),
            "intercept": float(a), "chi2_per_dof": float(np.sum(resid ** 2) / (len(Ns) - 2)),
            "start": start, "t_max": float(t_max), "replicas": int(replicas),
            "measure": "replica mean of the RMS over t in (0, t_max] of "
                       "(||Q_SGD-Q_ODE||_F^2 + ||rho_SGD-rho_ODE||_F^2)^(1/2)"}


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------
@dataclass
class ValidationReport:
    """Result of :func:`validate`: configuration, numbers, trajectories, figures.

    Attributes
    ----------
    config : dict
        Model and run parameters.
    numbers : dict
        All summary numbers (JSON-serialisable): deviations before/after the
        escape, band coverage, escape-time statistics, finite-size scaling.
    t : ndarray (n,)
    sgd_risk, ode_risk : ndarray (replicas, n)
    sgd_Q, ode_Q : ndarray (replicas, n, p, p)
    sgd_rho, ode_rho : ndarray (replicas, n, p, p*)
    """

    config: dict
    numbers: dict
    t: np.ndarray = field(repr=False)
    sgd_risk: np.ndarray = field(repr=False)
    ode_risk: np.ndarray = field(repr=False)
    sgd_Q: np.ndarray = field(repr=False)
    ode_Q: np.ndarray = field(repr=False)
    sgd_rho: np.ndarray = field(repr=False)
    ode_rho: np.ndarray = field(repr=False)
    invariant_study: dict | None = field(default=None, repr=False)

    # -- numbers --------------------------------------------------------------
    def to_dict(self) -> dict:
        """Configuration and numbers (a copy; no trajectories)."""
        return json.loads(self.to_json())

    def to_json(self, indent=2) -> str:
        """The configuration and all numbers as a JSON string."""
        return json.dumps({"config": self.config, "numbers": self.numbers}, indent=indent,
                          allow_nan=False, default=_json_default)

    def summary(self) -> str:
        """Printable summary table."""
        c, n = self.config, self.numbers
        lines = [f"symquad validate: {c['model']}",
                 f"  N={c['N']}, replicas={c['replicas']}, t_max={c['t_max']:g}, "
                 f"start={c['start']}, method={c['method']}, seed={c['seed']}"]
        if n["diverged_replicas"]:
            lines.append(f"  WARNING: {n['diverged_replicas']} replicas diverged "
                         f"(excluded from the statistics)")
        lines.append("")
        lines.append(f"  {'quantity':44s} {'mean':>10s} {'5%':>10s} {'95%':>10s}")
        for phase in ("whole_run", "before_escape", "after_escape"):
            for key, label in (("risk_rms", "|risk SGD-ODE| (RMS in t)"),
                               ("overlap_rms", "overlap deviation (RMS in t)")):
                d = n["deviation"].get(phase, {}).get(key)
                if d and d["n"]:
                    lines.append(f"  {label + ', ' + phase.replace('_', ' '):44s} "
                                 f"{d['mean']:10.3g} {d['q05']:10.3g} {d['q95']:10.3g}")
        b = n["band"]
        lines.append(f"  ODE risk inside the SGD {b['percentiles'][0]:g}-{b['percentiles'][1]:g}% "
                     f"band: {100 * b['ode_inside_fraction']:.1f}% of times")
        lines.append(f"  max |mean SGD risk - ODE| / s.e.: {b['max_mean_z']:.2f} "
                     f"(inside ±3 s.e. at {100 * b['mean_inside_3se_fraction']:.1f}% of times)")
        bb = n.get("band_before_escape", {})
        if bb.get("max_mean_z") is not None and n["escape"].get("defined"):
            lines.append(f"  same, before the first ODE escape (t <= {bb['t_end']:.4g}): "
                         f"{bb['max_mean_z']:.2f} s.e.")
        e = n["escape"]
        if e.get("defined"):
            s, o, dd = e["sgd"], e["ode"], e["difference"]
            lines.append(f"  plateau risk {e['plateau_risk']:.4g}, escape threshold "
                         f"{e['threshold']:.4g}, plateau rate {e['plateau_rate']:.4g}")
            if s["n"]:
                lines.append(f"  escape time SGD: mean {s['mean']:.4g} ± {s['std'] or 0:.3g} "
                             f"(5-95%: {s['q05']:.4g}-{s['q95']:.4g}), escaped "
                             f"{e['sgd_escaped']}/{e['replicas']}")
            if o["n"]:
                lines.append(f"  escape time ODE: mean {o['mean']:.4g} ± {o['std'] or 0:.3g}, "
                             f"escaped {e['ode_escaped']}/{e['replicas']}")
            if dd["n"]:
                lines.append(f"  t_esc(SGD) - t_esc(ODE), same replica: mean {dd['mean']:.3g} "
                             f"± {dd['se'] or 0:.2g} (s.e.), std {dd['std'] or 0:.3g}")
                lines.append("  (SGD noise on the plateau is as large as rho(0) ~ N^-1/2: the "
                             "escape time shifts by O(1) at any N)")
        else:
            lines.append(f"  escape: not applicable ({e.get('reason', '')})")
        f = n.get("finite_size_scaling")
        if f:
            lines.append(f"  finite-size scaling ({f['start']} start, N={f['N'][0]}..{f['N'][-1]}): "
                         f"deviation ~ N^({f['exponent']:.3f} ± {f['exponent_se']:.3f}) "
                         f"[theory -1/2], chi2/dof {f['chi2_per_dof']:.2f}")
        inv = n.get("invariant_drift")
        if inv:
            lines.append("  implicit bias: " + inv["text"].replace("\n", "\n  "))
        lines.append(f"  runtime: {n['runtime_s']:.1f} s")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    # -- figures --------------------------------------------------------------
    def figures(self) -> dict:
        """Matplotlib figures ``{"risk", "overlaps", "fss", "escape"}`` of the report."""
        from ..plotting import validation_figures

        return validation_figures(self)

    def save(self, folder="symquad_report") -> dict:
        """Write ``report.json``, ``summary.txt``, ``trajectories.npz`` and PNG figures.

        Returns a dict name -> path of the files written.
        """
        from ..plotting import plot_invariant_drift, save_figure
        from .store import atomic_write     # temporary file + rename: no half-written file

        os.makedirs(folder, exist_ok=True)
        paths = {}
        paths["json"] = os.path.join(folder, "report.json")
        data = self.to_json().encode("utf-8")
        atomic_write(paths["json"], lambda fh: fh.write(data))
        paths["summary"] = os.path.join(folder, "summary.txt")
        text = (self.summary() + "\n").encode("utf-8")
        atomic_write(paths["summary"], lambda fh: fh.write(text))
        paths["trajectories"] = os.path.join(folder, "trajectories.npz")
        atomic_write(paths["trajectories"], lambda fh: np.savez_compressed(
            fh, t=self.t, sgd_risk=self.sgd_risk, ode_risk=self.ode_risk, sgd_Q=self.sgd_Q,
            ode_Q=self.ode_Q, sgd_rho=self.sgd_rho, ode_rho=self.ode_rho))
        for name, fig in self.figures().items():
            paths[name] = os.path.join(folder, f"{name}.png")
            save_figure(fig, paths[name])
        if self.invariant_study is not None:
            paths["invariant_drift"] = plot_invariant_drift(
                self.invariant_study, os.path.join(folder, "invariant_drift.png"))
        return paths


def _json_default(obj):
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _finite_or_none(values):
    return [float(v) if np.isfinite(v) else None for v in values]


# ---------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------
def validate(model=None, N=2000, t_max=None, replicas=64, start="random", seed=0, *,
             method="reduced", n_times=201, band=(2.5, 97.5), escape_fraction=0.5,
             overlap=0.5, fss=True, fss_N=None, fss_t_max=None, fss_replicas=None,
             fss_start="informed", invariant=True, invariant_N=(250, 500, 1000, 2000),
             invariant_replicas=16, progress=False):
    r"""Compare SGD with the ODE theory for `model`; return a :class:`ValidationReport`.

    Parameters
    ----------
    model : symquad.Model, optional
        Default :data:`symquad.spec.DEFAULT_MODEL`.
    N : int
        Input dimension of the SGD runs (``>= 1``).
    t_max : float, optional
        Final time.  Default: for a random start with an escape,
        ``2.5 · log(N) / (2κ)`` (κ the plateau growth rate of ρ, so the
        escape, predicted at ``≈ log(N)/(2κ)`` plus a relaxation, is inside the
        window); otherwise ``10/η``.
    replicas : int
        Independent SGD runs (``>= 2``).
    start : {"random", "informed"}
        ``"random"``: ``w_k ~ N(0, I)``, ``T = I`` (plateau and escape);
        ``"informed"``: ``Q(0) = I``, ``ρ(0) = α P`` with ``α`` = `overlap` and
        ``P`` a fixed p×p* matrix with orthonormal columns (no plateau).
    seed : int
        Seed of the simulations (the same seed gives the same report numbers).
    method : {"reduced", "full"}
        Simulator (see :func:`symquad.simulate`).
    n_times : int
        Number of recorded times.
    band : (float, float)
        Percentiles of the replica band.
    escape_fraction : float
        ``f`` in the escape threshold ``ε_pl − f(ε_pl − ε_min)``.
    overlap : float
        ``α`` of the informed start.
    fss : bool
        Run the finite-size scaling.
    fss_N, fss_t_max, fss_replicas, fss_start
        Finite-size scaling: N values (default 100, 300, 1000, 3000, 10000),
        time window (default ``min(t_max, max(5, 2/η))``), replicas (default
        `replicas`) and start (default ``"informed"``, see the module docstring).
    invariant : bool
        Measure the drift of the implicit-bias invariant ``S = ρ(ρᵀρ)^(-1/2)``
        along SGD as a function of N (random start from a time after the early
        re-randomisation, and an informed start), with a fitted exponent; see
        :func:`symquad.studies.invariant_drift.invariant_drift_study`.  Needs ``p >= p*``.
    invariant_N, invariant_replicas
        The N values and replicas per N of that study (t_max as the main run).
    progress : bool
        tqdm progress bars.

    Returns
    -------
    ValidationReport
    """
    import time

    from ..numeric.simulate import simulate
    from ..spec import DEFAULT_MODEL, check_model

    t_start = time.perf_counter()
    model = DEFAULT_MODEL if model is None else model
    check_model(model)
    N = _check_int(N, "N", 1)
    replicas = _check_int(replicas, "replicas", 2)
    n_times = _check_int(n_times, "n_times", 3)
    if start not in STARTS:
        raise ValueError(f"start must be one of {STARTS}, got {start!r}")
    if not (len(band) == 2 and 0 <= band[0] < band[1] <= 100):
        raise ValueError(f"band must be two percentiles 0 <= lo < hi <= 100, got {band!r}")
    if not 0 < escape_fraction < 1:
        raise ValueError(f"escape_fraction must be in (0, 1), got {escape_fraction!r}")
    T = np.eye(model.p_star)
    if start == "random":
        fp, threshold, reason = _escape_setup(model, T, escape_fraction)
    else:
        fp, threshold, reason = None, None, "informed start: no plateau"
    if t_max is None:
        if threshold is not None:
            t_max = float(np.ceil(2.5 * math.log(max(N, 2)) / (2 * fp.rate)))
        else:
            t_max = float(np.ceil(10.0 / model.eta))
    if isinstance(t_max, bool) or not isinstance(t_max, Real) or not math.isfinite(t_max) \
            or t_max <= 0:
        raise ValueError(f"t_max must be a finite number > 0, got {t_max!r}")
    t_max = float(t_max)

    kwargs = {}
    if start == "informed":
        kwargs["Q0"], kwargs["rho0"] = informed_start(model, overlap)
    t_eval = np.linspace(0.0, t_max, n_times)
    run = simulate(model, N=N, t_max=t_max, replicas=replicas, seed=seed, method=method,
                   t_eval=t_eval, on_divergence="stop", progress=progress, **kwargs)
    ok = run.status == "ok"
    n_ok = int(ok.sum())
    if n_ok < 2:
        from ..numeric.errors import DivergenceError
        raise DivergenceError(
            f"validate: SGD diverged in {run.n_diverged}/{replicas} replicas (first at "
            f"t = {np.nanmin(run.t_diverged):.4g}); reduce lr", np.nanmin(run.t_diverged),
            {k: v[0] for k, v in run.last_finite.items()}, partial=run)
    t = run.t
    oQ, orho, orisk, ostatus, shared = _ode_per_replica(model, run.Q[:, 0], run.rho[:, 0],
                                                       run.T, t, progress)
    # statistics over the replicas whose SGD and ODE stayed finite
    good = ok & (ostatus == "ok")
    d_risk = run.risk - orisk
    d_ov = _overlap_deviation(run.Q, run.rho, oQ, orho)

    numbers = {"diverged_replicas": int(run.n_diverged),
               "ode_diverged_replicas": int(np.sum(ostatus != "ok")),
               "replicas_used": int(good.sum())}

    # escape times
    escape = {"defined": threshold is not None, "reason": reason}
    if threshold is not None:
        from ..numeric.landscape import escape_times
        ts = escape_times(t, run.risk[good], threshold)
        to = escape_times(t, orisk[good], threshold)
        escape.update({
            "plateau_risk": float(fp.risk), "plateau_q": float(fp.q),
            "plateau_rate": float(fp.rate), "threshold": threshold,
            "fraction": escape_fraction, "replicas": int(good.sum()),
            "sgd_escaped": int(np.isfinite(ts).sum()), "ode_escaped": int(np.isfinite(to).sum()),
            "sgd": _describe(ts), "ode": _describe(to), "difference": _describe(ts - to),
            "sgd_times": _finite_or_none(ts), "ode_times": _finite_or_none(to),
            "definition": "first time the risk falls below plateau_risk - fraction * "
                          "(plateau_risk - minimum_risk), linear interpolation between records",
        })
        t_split = np.where(np.isfinite(to), to, np.inf)[:, None]
    else:
        t_split = np.full((int(good.sum()), 1), np.inf)
    numbers["escape"] = escape

    # deviations by phase
    tt = np.broadcast_to(t, (int(good.sum()), len(t)))
    phases = {"whole_run": np.ones_like(tt, bool), "before_escape": tt < t_split,
              "after_escape": tt >= t_split}
    dev = {}
    for name, mask in phases.items():
        if start == "informed" and name != "whole_run":
            continue
        dev[name] = {"risk_rms": _describe(_rms_over(mask, d_risk[good])),
                     "overlap_rms": _describe(_rms_over(mask, d_ov[good])),
                     "risk_max_abs": _describe(np.where(mask, np.abs(d_risk[good]), 0).max(-1))}
    numbers["deviation"] = dev

    # bands
    sr = run.risk[good]
    lo, hi = np.percentile(sr, band[0], axis=0), np.percentile(sr, band[1], axis=0)
    scale = np.maximum(1.0, np.abs(sr).max(0))
    if shared:
        ode_curve = orisk[good][0]
        inside = (ode_curve >= lo - _BAND_TOL * scale) & (ode_curve <= hi + _BAND_TOL * scale)
    else:
        # each replica's own ODE vs the band: fraction of (replica, time) pairs inside
        oc = orisk[good]
        inside = ((oc >= lo - _BAND_TOL * scale) & (oc <= hi + _BAND_TOL * scale)).mean(0)
    mean_dev = d_risk[good].mean(0)
    se = d_risk[good].std(0, ddof=1) / math.sqrt(good.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(se > 0, np.abs(mean_dev) / se,
                     np.where(np.abs(mean_dev) <= _BAND_TOL * scale, 0.0, np.inf))
    # the mean deviation on the plateau: times before the earliest ODE escape
    pre = t < np.min(t_split)
    numbers["band_before_escape"] = {
        "t_end": float(t[pre][-1]) if pre.any() else None,
        "max_mean_z": float(np.max(z[pre])) if pre.any() else None,
        "max_abs_mean_risk_deviation": float(np.max(np.abs(mean_dev[pre]))) if pre.any()
        else None,
        "max_se": float(np.max(se[pre])) if pre.any() else None,
        "description": "mean over replicas of risk_SGD - risk_ODE(own start) at times before "
                       "the earliest ODE escape, in standard errors",
    }
    numbers["band"] = {
        "percentiles": [float(band[0]), float(band[1])],
        "ode_inside_fraction": float(np.mean(inside)),
        "ode_outside_times": [float(x) for x in t[np.asarray(inside) < 1]][:50],
        "max_mean_z": float(np.max(z)),
        "max_se": float(np.max(se)),
        "mean_inside_3se_fraction": float(np.mean(z <= 3)),
        "description": ("replica band of the SGD risk; for a random start each replica's "
                        "own ODE is tested against the band" if not shared else
                        "replica band of the SGD risk vs the (common) ODE risk"),
    }
    numbers["final_risk"] = {"sgd": _describe(sr[:, -1]), "ode": _describe(orisk[good][:, -1])}

    if fss:
        fss_t = float(fss_t_max) if fss_t_max is not None else float(min(t_max, max(5.0, 2.0 / model.eta)))
        fss_N = list(fss_N) if fss_N is not None else [100, 300, 1000, 3000, 10000]
        numbers["finite_size_scaling"] = finite_size_scaling(
            model, Ns=fss_N, t_max=fss_t, replicas=fss_replicas or replicas, seed=seed,
            start=fss_start, overlap=overlap, method=method, progress=progress)
    study = None
    if invariant and model.p >= model.p_star:
        # docs/model.md §8.4 at finite N: drift of S = rho (rho^T rho)^(-1/2) vs N
        from .invariant_drift import invariant_drift_study, summarize_drift_study
        study = invariant_drift_study(model, Ns=list(invariant_N), t_max=t_max,
                                      replicas=invariant_replicas, seed=seed, method=method,
                                      progress=progress)
        numbers["invariant_drift"] = summarize_drift_study(study)
    numbers["runtime_s"] = time.perf_counter() - t_start

    config = {"model": repr(model), "p": model.p, "p_star": model.p_star, "lr": model.lr,
              "eta": model.eta, "noise": model.noise, "activation": model.activation_str,
              "lr_scaling": model.lr_scaling, "N": N, "t_max": t_max, "replicas": replicas,
              "start": start, "seed": seed, "method": method, "n_times": n_times,
              "overlap": overlap if start == "informed" else None,
              "replicas_share_ode": bool(shared),
              "ode_start": ("common initial overlaps (realised exactly by the simulator)"
                            if shared else "each replica's realised initial overlaps")}
    return ValidationReport(config=config, numbers=numbers, t=t, sgd_risk=run.risk,
                            ode_risk=orisk, sgd_Q=run.Q, ode_Q=oQ, sgd_rho=run.rho,
                            ode_rho=orho, invariant_study=study)

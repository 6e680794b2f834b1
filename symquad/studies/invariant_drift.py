r"""Finite-N SGD: drift of the implicit-bias invariant ``S = ρ(ρᵀρ)^{-1/2}`` against N.

The ODE conserves ``S`` on the invariant set (:mod:`symquad.numeric.invariants`);
at finite ``N`` SGD noise of size ``N^{-1/2}`` makes it diffuse.  This study runs
SGD at several ``N`` (:func:`symquad.simulate`), measures the drift of ``S`` per
replica and fits ``drift ∝ N^b`` (``b = −1/2`` expected).  The validation report
(:func:`symquad.validate`) runs it; :func:`symquad.plotting.plot_invariant_drift`
draws it.
"""

from __future__ import annotations

import math
from numbers import Integral

import numpy as np

# the module, not simulate: looked up when called, so a replacement at the source
# (the tests' forbid / monkeypatch of symquad.numeric.simulate.simulate) takes effect
from ..numeric import simulate as _sim
from ..numeric.checks import MAX_TIMES, check_int
from ..numeric.invariants import S_or_nan, _teacher, invariant_S, random_stiefel
from ..progress import note
from .applicability import require_analysis

__all__ = ["invariant_drift_study", "summarize_drift_study"]


def invariant_drift_study(model, Ns, t_max, replicas, seed, sigma_ref=0.2,
                          informed_scale=0.3, q0=None, method="reduced",
                          n_save=101, T=None, protocols=("random", "informed"),
                          progress=False) -> dict:
    r"""Drift of ``S = ρ(ρᵀρ)^{-1/2}`` along finite-N SGD, as a function of N.

    Two protocols, each with ``replicas`` independent SGD runs per ``N``
    (:func:`symquad.simulate`, reduced simulator by default):

    * ``"random"``: the usual random start (``Q(0) ≈ q0 I``, ``ρ(0) ~ 1/√N``).
      ``S`` is not defined / re-randomised while ``ρ`` is as small as the SGD
      noise, so the drift is measured from ``t_ref``, the first saved time at
      which the smallest singular value of ``ρ`` reaches ``sigma_ref``, to
      ``t_max``.  The total rotation ``‖S(t_max) − S(first saved t > 0)‖_F`` is
      reported as well (it does not shrink like ``N^{-1/2}``).
    * ``"informed"``: ``Q(0) = q0 I``, ``ρ(0) = informed_scale · S_0`` with ``S_0``
      Haar-random (a point of the invariant set, so the ODE conserves ``S``
      exactly); drift ``‖S(t_max) − S_0‖_F``.

    For each protocol and ``N`` the mean drift over replicas and its standard
    error are returned, and a least-squares fit of ``log drift = a + b log N``
    (weights from the standard errors) gives the exponent ``b`` (``−1/2``
    expected for diffusive noise of size ``N^{-1/2}``) with its standard error.

    Parameters
    ----------
    model : Model
        ``p >= p*``; a changed specification field that the conservation of
        ``S`` is not established for is refused by name
        (:mod:`symquad.studies.applicability`, ``"invariant_drift"``).
    Ns : sequence of int
        Input dimensions (at least 2 distinct values).
    t_max : float
        Final time (should be after convergence for ``"random"``).
    replicas : int
        Independent runs per ``N`` (``>= 2``).
    seed : int
        Base seed; run ``(protocol, N)`` uses an independent stream.
    sigma_ref : float
        Threshold on ``σ_min(ρ)`` that defines ``t_ref`` (random start).
    informed_scale : float
        ``‖ρ(0)‖₂`` of the informed start.
    q0 : float, optional
        Initial ``Q = q0 I`` of the informed start (default: 1).
    method : {"reduced", "full"}
    n_save : int
        Number of saved times.
    T : array, optional
        Teacher overlap (identity by default).
    protocols : tuple of {"random", "informed"}
        Which protocols to run (both by default).
    progress : bool
        Progress on stderr (:mod:`symquad.progress`): a line per ``N`` and the
        simulations' progress (a bar on a terminal, plain lines otherwise).

    Returns
    -------
    dict
        ``{"Ns", "t", "settings", <protocol>: {...}}``; each protocol holds
        ``mean``, ``sem`` (per N), ``per_replica`` drifts and
        ``fit = {"exponent", "exponent_se", "prefactor"}``; ``"random"`` also has
        ``n_valid``, ``t_ref`` (mean per N) and ``total_rotation``.
        ``S_example_random`` / ``S_example_informed`` hold one replica's ``S(t)``
        at the largest N (NaN where ρ is rank deficient), ``S0_informed`` the
        informed start's ``S``.
    """
    require_analysis(model, "invariant_drift")
    Ns = [int(n) for n in Ns]
    if len(set(Ns)) < 2:
        raise ValueError(f"Ns must contain at least 2 distinct values, got {Ns}")
    if any(n < model.p + model.p_star for n in Ns):
        raise ValueError(f"every N must be >= p + p_star = {model.p + model.p_star}, got {Ns}")
    if isinstance(replicas, bool) or not isinstance(replicas, Integral) or replicas < 2:
        raise ValueError(f"replicas must be an integer >= 2, got {replicas!r}")
    if not t_max > 0:
        raise ValueError(f"t_max must be > 0, got {t_max!r}")
    if model.p < model.p_star:
        raise ValueError("the drift study needs p >= p_star (S is undefined otherwise)")
    protocols = tuple(protocols)
    if not protocols or any(pr not in ("random", "informed") for pr in protocols):
        raise ValueError(f"protocols must be a non-empty subset of ('random', 'informed'), "
                         f"got {protocols!r}")

    n_save = check_int(n_save, "n_save", 3, MAX_TIMES)
    p, k = model.p, model.p_star
    T = _teacher(T, k)
    q0 = 1.0 if q0 is None else float(q0)
    streams = np.random.SeedSequence(seed).spawn(2 * len(Ns) + 1)
    S0 = random_stiefel(p, k, np.random.default_rng(streams[-1]))
    t_eval = np.linspace(0.0, t_max, n_save)
    out = {"Ns": np.array(Ns), "t": t_eval, "settings": dict(
        model=repr(model), t_max=t_max, replicas=replicas, seed=seed, sigma_ref=sigma_ref,
        informed_scale=informed_scale, q0=q0, method=method, protocols=protocols)}
    acc = {name: [] for name in protocols}
    for idx, N in enumerate(Ns):
        note(progress, f"drift study of S: N = {N} ({idx + 1} of {len(Ns)}), {replicas} "
                       f"replicas, protocols {', '.join(protocols)}")
        last = idx == len(Ns) - 1
        if "random" in protocols:
            seed_r = int(streams[2 * idx].generate_state(1)[0])
            run = _sim.simulate(model, N, t_max, replicas, seed_r, method=method, T=T,
                                t_eval=t_eval, progress=progress)
            acc["random"].append(_drift_random(np.asarray(run.rho), t_eval, sigma_ref))
            if last:
                out["S_example_random"] = S_or_nan(np.asarray(run.rho)[0])
        if "informed" in protocols:
            seed_i = int(streams[2 * idx + 1].generate_state(1)[0])
            run = _sim.simulate(model, N, t_max, replicas, seed_i, method=method,
                                Q0=q0 * np.eye(p), rho0=informed_scale * S0, T=T, t_eval=t_eval,
                                progress=progress)
            rho = np.asarray(run.rho)
            acc["informed"].append(
                {"drift": np.linalg.norm(invariant_S(rho[:, -1]) - S0, axis=(-2, -1))})
            if last:
                out["S_example_informed"] = S_or_nan(rho[0])
                out["S0_informed"] = S0
    for name, per_N in acc.items():
        drifts = [d["drift"] for d in per_N]
        mean = np.array([d.mean() if d.size else np.nan for d in drifts])
        sem = np.array([d.std(ddof=1) / math.sqrt(d.size) if d.size > 1 else np.nan
                        for d in drifts])
        res = {"mean": mean, "sem": sem, "per_replica": drifts,
               "fit": _power_fit(np.array(Ns, float), mean, sem)}
        if name == "random":
            res["n_valid"] = np.array([d.size for d in drifts])
            res["t_ref"] = np.array([d["t_ref"] for d in per_N])
            res["total_rotation"] = np.array([d["total_rotation"] for d in per_N])
        out[name] = res
    return out


def _drift_random(rho, t, sigma_ref):
    """Drift of S from ``t_ref`` (first time ``σ_min(ρ) >= sigma_ref``) to the end, per replica.

    Replicas that never reach the threshold are left out (their count is
    ``replicas − n_valid``).  ``total_rotation`` is the mean ``‖S(end) − S(t_1)‖_F``
    from the first saved time after 0.
    """
    smin = np.linalg.svd(rho, compute_uv=False)[..., -1]
    drift, tref = [], []
    for r in range(rho.shape[0]):
        hit = np.nonzero(smin[r] >= sigma_ref)[0]
        if hit.size == 0 or not np.all(np.isfinite(rho[r, -1])):
            continue
        drift.append(np.linalg.norm(invariant_S(rho[r, -1]) - invariant_S(rho[r, hit[0]])))
        tref.append(t[hit[0]])
    total = np.linalg.norm(S_or_nan(rho[:, -1]) - S_or_nan(rho[:, 1]), axis=(-2, -1))
    return {"drift": np.array(drift), "t_ref": float(np.mean(tref)) if tref else np.nan,
            "total_rotation": float(np.nanmean(total))}


def summarize_drift_study(study) -> dict:
    """Plain-Python (JSON-ready) numbers of :func:`invariant_drift_study`, plus a text table."""
    out = {"Ns": [int(n) for n in study["Ns"]], "settings": {
        k: (list(v) if isinstance(v, tuple) else v) for k, v in study["settings"].items()}}
    lines = [f"drift of S = rho (rho^T rho)^(-1/2) along SGD; N = {out['Ns']}"]
    for key in ("random", "informed"):
        if key not in study:
            continue
        res = study[key]
        entry = {"mean": [float(x) for x in res["mean"]],
                 "sem": [float(x) for x in res["sem"]],
                 "exponent": res["fit"]["exponent"], "exponent_se": res["fit"]["exponent_se"],
                 "prefactor": res["fit"]["prefactor"]}
        if key == "random":
            entry.update(n_valid=[int(x) for x in res["n_valid"]],
                         t_ref=[float(x) for x in res["t_ref"]],
                         total_rotation=[float(x) for x in res["total_rotation"]])
        out[key] = entry
        lines.append(f"  {key:8s} mean  " + " ".join(f"{x:.4f}" for x in entry["mean"]))
        lines.append(f"  {'':8s} s.e.  " + " ".join(f"{x:.4f}" for x in entry["sem"]))
        lines.append(f"  {'':8s} fitted exponent {entry['exponent']:.3f} "
                     f"± {entry['exponent_se']:.3f} (diffusive noise: -0.5)")
    out["text"] = "\n".join(lines)
    return out


def _power_fit(N, y, se):
    """Weighted fit ``log y = a + b log N``; returns exponent ``b`` and its standard error."""
    ok = np.isfinite(y) & np.isfinite(se) & (y > 0) & (se > 0)
    if ok.sum() < 2:
        return {"exponent": np.nan, "exponent_se": np.nan, "prefactor": np.nan}
    x, ly = np.log(N[ok]), np.log(y[ok])
    w = (y[ok] / se[ok]) ** 2            # var(log y) ≈ (se/y)²
    X = np.vstack([np.ones_like(x), x]).T
    cov = np.linalg.inv(X.T @ (X * w[:, None]))
    a, b = cov @ (X.T @ (w * ly))
    return {"exponent": float(b), "exponent_se": float(math.sqrt(cov[1, 1])),
            "prefactor": float(math.exp(a))}

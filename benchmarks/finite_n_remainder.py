r"""Is the remainder of the O(1/N) mean o(1/N)?  ``N·(mean − ODE) = c + d/N + e/N²`` at small N.

Issue 22: ``E[X](t) = x(t) + c(t)/N + O(N⁻²)`` (docs/derivation.md §8.3a) was checked at
N = 500 … 4000, where the standard error of ``y_N = N·(mean − ODE)`` grows like
``√(N/replicas)`` and the remainder ``y_N − c`` is far below it, so it was never seen to
vanish.  Here the exact reduced simulator (``sq.simulate(method="reduced")``: the law of
the N-dimensional SGD at every N, cost per step independent of N) runs many replicas from
one shared start (``Σ(0) = 0``, ``c(0) = 0``) at small N, and at each time

* ``y_N ± s_N`` (mean and standard error over the replicas) is fitted by weighted least
  squares with ``c + d/N`` and ``c + d/N + e/N²`` (the replicas of different N are
  independent): the fitted ``c`` must agree with ``Fluctuations.risk_mean_correction``;
* ``y_N − c_ε`` with ``c_ε`` the derived coefficient is fitted by ``d/N`` (no constant):
  a missing ``O(1/N)`` source would leave a constant there, and the χ² of this fit says
  whether the data allow one; ``N·(y_N − c_ε)`` (which tends to ``d``
  when the remainder is ``O(N⁻²)``) is printed with its error ``N·s_N``;
* power: the fitted ``c`` against ``(1 ± 0.05)·c_ε`` (a source of 5 % of the correction
  missing, or one too many), in its standard errors; and the constant-only fit
  ``y_N = c``, whose χ² says whether the remainder ``d/N`` is resolved at all.

The same for every entry of the state (Q, ρ, a trained readout) at the last time,
against ``Fluctuations.mean_correction``.  Replicas that diverge (σ = z² is unbounded:
at N = 100 about 1 in 10⁴ blows up) are excluded and counted; the bulk they leave is
what the expansion describes (their probability falls faster than any power of 1/N).

Usage::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/finite_n_remainder.py --out FILE.json
    python benchmarks/finite_n_remainder.py --cases noise --N 100 200 400 --replicas 4000

Cost: ``replicas · N · t_max`` reduced-simulator steps per (case, N); ``--max-steps``
refuses a plan above it before anything runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

#: The cases of issue 22 (tests/test_second_order_sim.py's informed starts, T = I): default
#: N values, replicas and times.  The unrepresentable teacher's expansion is flagged
#: invalid below N ≈ 300 (Fluctuations.expansion_valid), the noise case's σ = z² SGD is
#: heavy-tailed below N ≈ 100 (replicas on their way to a blow-up).
CASES = {
    "noise": dict(N=(100, 200, 400, 800, 1600), replicas=100_000, t_max=4.0, n_times=6),
    "readout": dict(N=(100, 200, 400, 800, 1600), replicas=50_000, t_max=4.0, n_times=6),
    "unrepresentable": dict(N=(300, 600, 1200, 2400), replicas=40_000, t_max=6.0, n_times=4),
}
#: Most simulator steps (replicas × N × t_max, summed) a run may plan without --max-steps.
MAX_STEPS = 2e12
#: Relative size of the "missing source" of the power row.
WRONG = 0.05
CHUNK = 20_000


def case(name):
    """``(model, Q0, rho0, T)`` of a case (the models of tests/test_second_order_sim.py)."""
    import symquad as sq
    I2 = np.eye(2)
    if name == "noise":
        return sq.Model(2, 2, 0.3, noise=0.5), 0.8 * I2, np.array([[.5, .1], [.1, .5]]), I2
    if name == "readout":
        return (sq.Model(2, 2, 0.3, noise=0.1, lr_readout=0.3), 0.8 * I2,
                np.array([[.5, .1], [.1, .5]]), I2)
    if name == "unrepresentable":
        return (sq.Model(3, 2, 0.3, activation="z**2", teacher_activation="z**3 - 3*z",
                         lr_readout=0.2),
                np.eye(3), np.array([[.6, .1], [.1, .6], [.3, .3]]), I2)
    raise ValueError(f"case must be one of {list(CASES)}, got {name!r}")


def _seed(name, N, chunk, seed=0):
    """One seed per (case, N, chunk, --seed): independent streams, the same numbers on a rerun."""
    entropy = [list(CASES).index(name), N, chunk] + ([seed] if seed else [])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def measure(name, N, replicas, times, chunk=CHUNK, seed=0):
    r"""``y = N·(mean − ODE)`` of the risk at `times` and of the state at the last time.

    Returns a dict: ``risk``/``risk_se`` (n,), ``state``/``state_se`` (dim,), the derived
    ``c_risk`` (n,) and ``c_state`` (dim,), ``valid`` (the expansion's flag at each time),
    ``used`` and ``diverged`` replica counts and the simulator's ``seconds``.
    """
    import symquad as sq
    model, Q0, rho0, T = case(name)
    fl = sq.fluctuations(model, Q0, rho0, T, N, times, second_order=True)
    lay = fl.layout
    trained = model.readout_trained
    x_end = lay.pack(fl.Q[-1], fl.rho[-1], fl.readout[-1] if trained else None)
    s1 = np.zeros(len(times) + lay.dim)
    s2 = np.zeros_like(s1)
    used = diverged = 0
    tick = time.perf_counter()
    for k, start in enumerate(range(0, replicas, chunk)):
        R = min(chunk, replicas - start)
        run = sq.simulate(model, N=N, t_max=float(times[-1]), replicas=R, seed=_seed(name, N, k, seed),
                          Q0=Q0, rho0=rho0, T=T, t_eval=times, on_divergence="stop")
        if not np.allclose(run.t, times):
            raise RuntimeError(f"the simulator recorded {run.t}, not {times}")
        ok = np.all(np.isfinite(run.risk), axis=1)
        X = lay.pack(run.Q[ok, -1], run.rho[ok, -1], run.readout[ok, -1] if trained else None)
        y = np.concatenate([N * (run.risk[ok] - fl.risk), N * (X - x_end)], axis=1)
        s1 += y.sum(0)
        s2 += (y * y).sum(0)
        used += int(ok.sum())
        diverged += int((~ok).sum())
    seconds = time.perf_counter() - tick
    mean = s1 / used
    se = np.sqrt(np.maximum(s2 / used - mean ** 2, 0.0) * used / (used - 1) / used)
    n = len(times)
    return dict(N=N, risk=mean[:n], risk_se=se[:n], state=mean[n:], state_se=se[n:],
                c_risk=np.asarray(fl.risk_mean_correction), c_state=fl.mean_correction[-1],
                valid=np.asarray(fl.expansion_valid), used=used, diverged=diverged,
                seconds=seconds)


def wls(Ns, y, se, powers):
    r"""Weighted least squares ``y_N = Σ_j β_j N^(−powers_j)``: ``(β, cov(β), χ², dof)``.

    The points are independent (replicas of different N), with variances ``se²``.
    """
    Ns, y, se = (np.asarray(v, float) for v in (Ns, y, se))
    A = np.stack([Ns ** (-float(k)) for k in powers], axis=1) / se[:, None]
    b = y / se
    cov = np.linalg.inv(A.T @ A)
    beta = cov @ A.T @ b
    chi2 = float(np.sum((A @ beta - b) ** 2))
    return beta, cov, chi2, len(y) - len(powers)


def chi2_p(chi2, dof):
    """Upper tail of χ² with `dof` degrees of freedom (1 for dof <= 0 fits, which are exact)."""
    from scipy.stats import chi2 as dist
    return float(dist.sf(chi2, dof)) if dof > 0 else 1.0


def analyse(Ns, y, se, c):
    """Fits of one quantity ``y_N ± se_N`` over N against the derived ``c``: a JSON-ready dict.

    * ``"c+d/N"``, ``"c+d/N+e/N2"``: ``c`` free; ``z = (c_fit − c)/se``, and ``z_plus``,
      ``z_minus`` the same against ``(1 ± WRONG) c`` (power against a missing source);
    * ``"c only"``: ``y_N = c_fit`` at every N; its χ² p-value small means the remainder
      (the ``d/N``) is resolved;
    * ``"fixed c"``: ``y_N − c = d/N`` (the remainder O(N⁻²)) and ``"fixed c, d/N+e/N2"``.
    """
    y, se = np.asarray(y, float), np.asarray(se, float)
    out = {}
    for label, powers in (("c only", (0,)), ("c+d/N", (0, 1)), ("c+d/N+e/N2", (0, 1, 2))):
        beta, cov, chi2, dof = wls(Ns, y, se, powers)
        c_se = float(math.sqrt(cov[0, 0]))
        out[label] = dict(c=float(beta[0]), c_se=c_se, chi2=chi2, dof=dof, p=chi2_p(chi2, dof),
                          z=float((beta[0] - c) / c_se),
                          z_plus=float((beta[0] - (1 + WRONG) * c) / c_se),
                          z_minus=float((beta[0] - (1 - WRONG) * c) / c_se))
        if len(powers) > 1:
            out[label].update(d=float(beta[1]), d_se=float(math.sqrt(cov[1, 1])))
    for label, powers in (("fixed c", (1,)), ("fixed c, d/N+e/N2", (1, 2))):
        beta, cov, chi2, dof = wls(Ns, y - c, se, powers)
        out[label] = dict(d=float(beta[0]), d_se=float(math.sqrt(cov[0, 0])), chi2=chi2,
                          dof=dof, p=chi2_p(chi2, dof))
    return out


def study(name, Ns, replicas, times, progress=print, seed=0):
    """Every N of one case, then the fits of the risk at each time and of each state entry."""
    rows = []
    for N in Ns:
        rows.append(measure(name, N, replicas, times, seed=seed))
        r = rows[-1]
        progress(f"  {name} N={N}: {r['used']} replicas ({r['diverged']} diverged), "
                 f"{r['seconds']:.0f} s; N(mean-ODE) at t={times[-1]:g}: "
                 f"{r['risk'][-1]:.3f} +- {r['risk_se'][-1]:.3f} (c_eps {r['c_risk'][-1]:.3f})")
    # an entry without spread (none in these cases) has no fit
    return reanalyse(dict(
        case=name, N=list(Ns), times=list(map(float, times)), replicas=replicas,
        rows=[{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()}
              for r in rows]))


def table(res) -> str:
    """Markdown: per time, N·(mean − ODE) at each N, the fits, and N·(y − c_ε)."""
    lines = []
    Ns, rows = res["N"], res["rows"]
    head = " | ".join(f"N = {N}" for N in Ns)
    pct = f"{100 * WRONG:g} %"
    lines.append(f"| `{res['case']}` t | c_ε | {head} | c fit: c + d/N (χ² p) | "
                 f"c fit: c + d/N + e/N² | c fixed: d (χ² p) | c only: χ² p | "
                 f"z of c ± {pct} |")
    lines.append("|" + " --- |" * (len(Ns) + 7))
    for j, fit in enumerate(res["risk_fits"], start=1):
        cells = [f"{r['risk'][j]:.3f} ± {r['risk_se'][j]:.3f}" for r in rows]
        q, l, fx = fit["c+d/N+e/N2"], fit["c+d/N"], fit["fixed c"]
        lines.append(
            f"| {res['times'][j]:g} | {rows[0]['c_risk'][j]:.3f} | " + " | ".join(cells)
            + f" | {l['c']:.3f} ± {l['c_se']:.3f} ({l['p']:.2g}) | {q['c']:.3f} ± {q['c_se']:.3f}"
            f" | {fx['d']:.1f} ± {fx['d_se']:.1f} ({fx['p']:.2g}) | {fit['c only']['p']:.2g} | "
            f"{l['z_plus']:.1f} / {l['z_minus']:.1f} |")
    lines.append("")
    lines.append("N·(N(mean − ODE) − c_ε) at the last time (→ d when the remainder is O(1/N²)): "
                 + ", ".join(f"N = {r['N']}: {r['N'] * (r['risk'][-1] - r['c_risk'][-1]):.1f} ± "
                             f"{r['N'] * r['risk_se'][-1]:.1f}" for r in rows))
    fits = [f for f in res["state_fits"] if f is not None]
    if fits:
        z = [abs(f["c+d/N"]["z"]) for f in fits]
        ps = [f["fixed c"]["p"] for f in fits]
        lines.append(f"State at t = {res['times'][-1]:g} ({len(fits)} entries): c + d/N fit − "
                     f"derived c within {max(z):.2f} s.e. (largest); χ² p of d/N with c fixed: "
                     f"smallest {min(ps):.2g}.")
    lines.append("Diverged replicas per N: " + ", ".join(str(r["diverged"]) for r in rows)
                 + "; expansion valid at every time: "
                 + ", ".join("yes" if all(r["valid"]) else "NO" for r in rows) + ".")
    return "\n".join(lines)


def reanalyse(res):
    """The fits of a study again from its rows (a JSON file of an earlier run)."""
    rows, Ns = res["rows"], res["N"]
    res["risk_fits"] = [analyse(Ns, [r["risk"][j] for r in rows], [r["risk_se"][j] for r in rows],
                                rows[0]["c_risk"][j]) for j in range(1, len(res["times"]))]
    res["state_fits"] = [
        None if min(r["state_se"][i] for r in rows) <= 1e-9 else
        analyse(Ns, [r["state"][i] for r in rows], [r["state_se"][i] for r in rows],
                rows[0]["c_state"][i]) for i in range(len(rows[0]["state"]))]
    return res


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--N", nargs="+", type=int, help="default: the case's (CASES)")
    parser.add_argument("--replicas", type=int, help="default: the case's (CASES)")
    parser.add_argument("--t-max", type=float, help="default: the case's (CASES)")
    parser.add_argument("--seed", type=int, default=0,
                        help="another set of replicas (0: the recorded run's)")
    parser.add_argument("--n-times", type=int, help="recorded times (default: the case's)")
    parser.add_argument("--out", help="write every number as JSON here")
    parser.add_argument("--from-json", help="only the tables of an earlier run's JSON file "
                                            "(its fits made again)")
    parser.add_argument("--max-steps", type=float, default=MAX_STEPS,
                        help="refuse plans above this many simulator steps (replicas x N x t_max)")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as fh:
            for res in json.load(fh):
                print(table(reanalyse(res)) + "\n")
        return 0
    if args.N and min(args.N) < 2:
        parser.error("--N: every N must be >= 2")
    if args.replicas is not None and args.replicas < 2:
        parser.error("--replicas must be >= 2")
    if args.t_max is not None and not args.t_max > 0:
        parser.error("--t-max must be > 0")
    if args.seed < 0 or (args.n_times is not None and args.n_times < 2):
        parser.error("--seed must be >= 0 and --n-times >= 2")
    plan = []
    for name in args.cases:
        spec = CASES[name]
        Ns = tuple(args.N or spec["N"])
        if len(Ns) < 3:
            parser.error("--N: at least 3 values (the fits have up to 3 coefficients)")
        t_max = args.t_max or spec["t_max"]
        plan.append((name, Ns, args.replicas or spec["replicas"],
                     np.linspace(0, t_max, args.n_times or spec["n_times"])))
    steps = sum(R * sum(Ns) * float(t[-1]) for _, Ns, R, t in plan)
    if steps > args.max_steps:
        parser.error(f"the plan needs {steps:.3g} simulator steps, above --max-steps "
                     f"{args.max_steps:.3g}")
    print(f"plan: {steps:.3g} reduced-simulator steps", flush=True)
    results = []
    for name, Ns, R, times in plan:
        results.append(study(name, Ns, R, times, progress=lambda s: print(s, flush=True),
                             seed=args.seed))
        print(table(results[-1]), flush=True)
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

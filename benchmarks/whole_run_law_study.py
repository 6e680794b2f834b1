r"""Where do the laws of SGD and of the verdict's SDE differ?  Issue 22's variant, many replicas.

The verdict's ``whole_run_law`` criterion (symquad/studies/whole_run.py) compares, by the
two-sample KS test, five rotation-invariant statistics of SGD replicas with those of SDE
replicas from the same start.  On issue 22's variant (``z²`` student, erf teacher,
``p = 6, p* = 2``, lr 0.1, trained readout 0.1, weight decay 1e-3, label noise 0.1,
validate's informed start, ``t ≤ 100``) it false-FAILed 4 of 20 seeds at ``N = 1000``
with 32 replicas.  This script runs many replicas of one simulator from validate's
informed start and saves, at every recorded time, the statistics of
:func:`symquad.studies.whole_run.invariant_statistics` and the readout's squared norm
(``--out FILE.npz``); ``--compare A.npz B.npz …`` prints their means and variances at
chosen times with standard errors, and the difference of each run from the first in
units of its standard error.

Usage::

    B="OMP_NUM_THREADS=1 nice -n 10 python benchmarks/whole_run_law_study.py"
    $B --method reduced --replicas 1024 --seed 100 --out runs/law/sgd.npz
    $B --method sde --finite-n --replicas 512 --seed 200 --out runs/law/sde_fn.npz
    $B --method sde --finite-n --dt 0.05 --replicas 256 --seed 300 --out runs/law/sde_fn_dt05.npz
    python benchmarks/whole_run_law_study.py --compare runs/law/sgd.npz runs/law/sde_fn.npz
    python benchmarks/whole_run_law_study.py --law runs/law/sgd.npz runs/law/sde_fn.npz

Cost: the reduced simulator ``~0.2 s`` per replica at ``N = 1000, t ≤ 100`` (it grows
with ``N``), the SDE with the O(1/N) drift ``~1 s`` per replica whatever ``N`` (2-core
machine, shared).
"""

from __future__ import annotations

import sys
import time

import numpy as np

import symquad as sq
from symquad.entry import ArgumentParser
from symquad.studies.validation import informed_start
from symquad.studies.whole_run import (N_TEST, STATISTICS, _holm, _test_indices,
                                      invariant_statistics)

#: Issue 22's variant (benchmarks/calibrate_verdict.py's row "variant: erf teacher, p = 6").
VARIANT = sq.Model(6, 2, 0.1, teacher_activation="erf", lr_readout=0.1, weight_decay=1e-3,
                   noise=0.1)
NAMES = STATISTICS + ("|a|^2",)


def run(args) -> dict:
    """The statistics ``(stat, replica, time)`` of one simulator's replicas."""
    model = VARIANT
    Q0, rho0 = informed_start(model)
    t_eval = np.linspace(0.0, args.t_max, args.n_times)
    t0 = time.perf_counter()
    kw = dict(method=args.method)
    if args.method == "sde":
        kw.update(finite_n=args.finite_n, dt=args.dt)
    out = []
    for c in range(0, args.replicas, args.chunk):
        r = sq.simulate(model, N=args.N, t_max=args.t_max, replicas=min(args.chunk,
                        args.replicas - c), seed=args.seed + c, Q0=Q0, rho0=rho0,
                        t_eval=t_eval, on_divergence="stop", **kw)
        a2 = np.sum(r.readout ** 2, axis=-1)
        out.append(np.concatenate([invariant_statistics(r.risk, r.Q, r.rho), a2[None]]))
        print(f"{c + r.Q.shape[0]}/{args.replicas} replicas, {time.perf_counter() - t0:.0f} s",
              flush=True)
    return {"stats": np.concatenate(out, axis=1), "t": r.t, "N": args.N,
            "method": args.method, "finite_n": bool(args.finite_n), "dt": args.dt or 0.0,
            "seconds": time.perf_counter() - t0}


def compare(files, times) -> str:
    """Means and variances at `times` of each file's statistics, with standard errors."""
    data = [dict(np.load(f)) for f in files]
    lines = []
    for s, name in enumerate(NAMES):
        lines.append(f"\n{name}:  mean ± s.e. [z vs first]   variance ± s.e. [z vs first]")
        for tt in times:
            row = [f"  t = {tt:g}"]
            ref = None
            for f, d in zip(files, data):
                i = int(np.argmin(np.abs(d["t"] - tt)))
                x = d["stats"][s, :, i]
                x = x[np.isfinite(x)]
                R = len(x)
                m, v = x.mean(), x.var(ddof=1)
                se_m = np.sqrt(v / R)
                c = x - m
                se_v = np.sqrt(max(np.mean(c ** 4) - v ** 2 * (R - 3) / (R - 1), 0) / R)
                if ref is None:
                    ref = (m, se_m, v, se_v)
                    row.append(f"{m:.5g} ± {se_m:.2g}, {v:.3g} ± {se_v:.2g} (R={R})")
                else:
                    zm = (m - ref[0]) / np.hypot(se_m, ref[1])
                    zv = (v - ref[2]) / np.hypot(se_v, ref[3])
                    row.append(f"{m:.5g} ± {se_m:.2g} [{zm:+.1f}], {v:.3g} ± {se_v:.2g} "
                               f"[{zv:+.1f}]")
            lines.append(" | ".join(row))
    return "\n".join(lines)


def replay(sgd_file, sde_file, pairs, replicas=32, alpha=0.01, seed=0) -> int:
    """How often the law criterion FAILs on random disjoint-within-a-pair subsamples.

    Each pair draws `replicas` SGD and `replicas` SDE replicas (without replacement) from
    the two files and applies ``whole_run_law``'s test: two-sample KS on the five
    statistics at its ``N_TEST`` times, Holm at `alpha`.  With both files from SGD (or
    the same file split in two, ``--law A.npz A.npz`` uses the halves) it measures the
    test's own level on this model.
    """
    from scipy.stats import ks_2samp
    a_all = np.load(sgd_file)["stats"][:5]
    b_all = np.load(sde_file)["stats"][:5]
    if sgd_file == sde_file:
        half = a_all.shape[1] // 2
        a_all, b_all = a_all[:, :half], a_all[:, half:]
    idx = _test_indices(np.load(sgd_file)["t"], N_TEST)
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(pairs):
        a = a_all[:, rng.choice(a_all.shape[1], replicas, replace=False)]
        b = b_all[:, rng.choice(b_all.shape[1], replicas, replace=False)]
        p = [ks_2samp(a[s][:, i], b[s][:, i]).pvalue for s in range(5) for i in idx]
        fails += bool(_holm(p, alpha)[1].any())
    return fails


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", choices=("reduced", "sde"), default="reduced")
    ap.add_argument("--finite-n", action="store_true")
    ap.add_argument("--dt", type=float, default=None)
    ap.add_argument("--N", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--t-max", type=float, default=100.0)
    ap.add_argument("--n-times", type=int, default=201)
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", nargs="*", default=None)
    ap.add_argument("--times", type=float, nargs="*", default=[10, 25, 50, 100])
    ap.add_argument("--law", nargs=2, default=None, metavar=("SGD.npz", "SDE.npz"),
                    help="replay the law criterion on --pairs random pairs of 32 + 32")
    ap.add_argument("--pairs", type=int, default=400)
    args = ap.parse_args(argv)
    if args.replicas < 2 or args.N < 1 or args.t_max <= 0 or args.n_times < 2 or args.chunk < 1:
        ap.error("replicas >= 2, N >= 1, t-max > 0, n-times >= 2 and chunk >= 1 are needed")
    if args.law:
        k = replay(*args.law, args.pairs)
        print(f"law criterion FAILs {k}/{args.pairs} pairs ({args.law[1]} against {args.law[0]})")
        return 0
    if args.compare:
        print(compare(args.compare, args.times))
        return 0
    if not args.out:
        ap.error("--out FILE.npz is needed")
    res = run(args)
    np.savez(args.out, **res)
    print(f"saved {args.out} ({res['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The mean-deviation test side by side: Student's t alone and with the predicted law.

For a floor model (default: label noise 0.1, ``p = 3, p* = 2, lr = 0.3``, informed start,
``N = 1000``, 32 replicas), each seed's SGD data are compared with the true theory and
with ``lr`` ±3 %; printed: the combined test's largest z (``max_z``, the verdict's) and
Student's t alone (``max_z_student``) with the time of the largest, and the predicted
risk s.d. (``fluctuations(...).risk_std``) against the replicas' (median, range over the
run).  docs/benchmarks.md, "Recalibration with the predicted law of the replica mean".

Usage::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/mean_test_side_by_side.py --seeds 0 1 2
"""

from __future__ import annotations

import sys

import numpy as np

import symquad as sq
from symquad.entry import ArgumentParser
from symquad.numeric.fluctuations import fluctuations


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--N", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=32)
    parser.add_argument("--noise", type=float, default=0.1)
    args = parser.parse_args(argv)
    m = sq.Model(3, 2, 0.3, noise=args.noise)
    for seed in args.seeds:
        rep = sq.validate(m, N=args.N, replicas=args.replicas, seed=seed, start="informed",
                          fss=False, invariant=False, whole_run=False, resolution=False)
        md = rep.numbers["mean_deviation"]
        line = [f"seed {seed}: true {rep.verdict} z {md['max_z']:.2f} (Student "
                f"{md['max_z_student']:.2f})"]
        for lr in (1.03 * m.lr, 0.97 * m.lr):
            c = sq.compare(m.replace(lr=lr), rep.t, rep.sgd_Q, rep.sgd_rho, rep.T, N=args.N,
                           whole_run=False, resolution=False)
            w = c.numbers["mean_deviation"]
            line.append(f"lr {lr:.3f}: z {w['max_z']:.2f} (Student {w['max_z_student']:.2f}) "
                        f"at t = {w['t_at_max_z']:.3g}")
        fl = fluctuations(m, rep.sgd_Q[0, 0], rep.sgd_rho[0, 0], rep.T, args.N,
                          rep.t - rep.t[0], second_order=True)
        ratio = fl.risk_std[1:] / (rep.sgd_risk - rep.ode_risk).std(0, ddof=1)[1:]
        line.append(f"predicted/replicas' s.d. median {np.median(ratio):.2f}, range "
                    f"{ratio.min():.2f}-{ratio.max():.2f}")
        print("; ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cost of the erf diffusion matrix (symquad/runtime/special_diffusion.py) against its cost law.

For each (p, p*) and readout setting: CPU seconds of one ``Kernels.diffusion`` at a
random state (field variances near 1: 12 Price nodes), of a batch of 16 states (the
SDE's replicas), the cost law's arcsine count (``erf_diffusion_cost``, 24 nodes) and
the estimate that refuses large models (``erf_diffusion_seconds``), side by side.

    OMP_NUM_THREADS=1 python benchmarks/bench_erf_diffusion.py [--repeat 3]
"""

import argparse
import time

import numpy as np

import symquad as sq
from symquad.numeric.kernels import erf_diffusion_seconds
from symquad.runtime.special_diffusion import erf_diffusion_cost


def state(p, ps, rng):
    n = p + ps
    G = rng.standard_normal((n, n + 3))
    C = G @ G.T / (n + 3)
    return C[:p, :p], C[:p, p:], C[p:, p:]


def seconds(k, args, repeat):
    best = np.inf
    for _ in range(repeat):
        t = time.process_time()
        k.diffusion(*args)
        best = min(best, time.process_time() - t)
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'p':>3} {'p*':>3} {'trained':>7} {'one state (s)':>14} {'16 states (s)':>14} "
          f"{'law (asin)':>11} {'ns/asin':>8} {'estimate (s)':>12}")
    for p, ps in ((2, 1), (4, 2), (6, 2), (8, 2), (12, 3)):
        for trained in (False, True):
            m = sq.Model(p, ps, 0.5, activation="erf", noise=0.1,
                         lr_readout=0.2 if trained else 0.0)
            k = sq.kernels(m)
            Q, rho, T = state(p, ps, rng)
            one = seconds(k, (Q, rho, T), args.repeat)
            batch = (np.broadcast_to(Q, (16, p, p)), np.broadcast_to(rho, (16, p, ps)), T)
            many = seconds(k, batch, 1) if p <= 8 else float("nan")
            law = erf_diffusion_cost(p, ps, trained)
            print(f"{p:>3} {ps:>3} {str(trained):>7} {one:>14.4f} {many:>14.4f} {law:>11.3g} "
                  f"{one / law * 1e9:>8.1f} {erf_diffusion_seconds(m):>12.3g}", flush=True)


if __name__ == "__main__":
    main()

"""Cost of an input spectrum: the block kernels against B, the reduced simulator against B and N.

* **Kernels** (``sq.kernels(model).rhs`` of a spectrum model, docs/derivation.md §1a): the
  moment module at ``Ω`` with ``B (p + p*)`` legs plus the generated block assembly.
  Expected law: the four-point sum ``O(p² n²)`` does not depend on ``B``, the three-point
  sum against the legs is ``O(p n · B n)`` and the assembly ``O(B p (p + p*))``, so the
  time is ``a + b·B`` with ``b/a`` small at small ``B``.  Reported: the median time of one
  right-hand side per ``B``, beside the isotropic kernels (``B = 0`` in the table), with the
  library's default BLAS threads and pinned to one thread, side by side in one run.
* **Reduced simulator** (``sq.simulate(method="reduced")``): per step ``O(R B n² (n + b))``
  and independent of ``N``; reported: seconds per step per replica against ``B`` and ``N``.

Usage::

    python benchmarks/bench_spectrum.py                     # kernels and simulator, defaults
    python benchmarks/bench_spectrum.py --p 8 --p-star 2 --blocks 1 2 4 8 16 32 64
    python benchmarks/bench_spectrum.py --simulator --N 1000 10000 100000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import symquad as sq
from symquad.numeric.kernels import single_thread_blas


def _spectrum(B):
    """``B`` equal blocks with eigenvalues ``1, 1/2, …, 1/B`` (exact rationals)."""
    return ",".join(f"1/{B}:1/{j + 1}" for j in range(B)) if B > 1 else "1:2"


def _point(p, ps, B, seed=0):
    rng = np.random.default_rng(seed)
    n = p + ps
    V = rng.standard_normal((B, n, n + 3)) / np.sqrt(B * (n + 3))
    C = V @ np.swapaxes(V, -1, -2)
    return C[:, :p, :p].copy(), C[:, :p, p:].copy(), C[:, p:, p:].copy()


def _median(f, repeats):
    f()                                   # warm: loading, first call
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def kernels_table(p, ps, activation, blocks, repeats):
    print(f"kernels: p = {p}, p* = {ps}, activation {activation}; median of {repeats} calls "
          f"of rhs (ms); B = 0 is the isotropic model")
    print("| B | default BLAS | one thread | ratio to isotropic (default) |")
    print("|---|---|---|---|")
    base = None
    for B in [0] + list(blocks):
        if B == 0:
            m = sq.Model(p, ps, 0.1, activation=activation)
            Q, rho, T = (x[0] for x in _point(p, ps, 1))
        else:
            m = sq.Model(p, ps, 0.1, activation=activation, spectrum=_spectrum(B))
            Q, rho, T = _point(p, ps, B)
        k = sq.kernels(m, form="tensor")
        t_def = _median(lambda: k.rhs(Q, rho, T), repeats)
        with single_thread_blas():
            t_one = _median(lambda: k.rhs(Q, rho, T), repeats)
        base = t_def if base is None else base
        print(f"| {B} | {1e3 * t_def:.3g} | {1e3 * t_one:.3g} | {t_def / base:.2f} |")


def simulator_table(p, ps, blocks, Ns, replicas, steps):
    print(f"\nreduced simulator: p = {p}, p* = {ps}, {replicas} replicas, {steps} steps; "
          "microseconds per step and replica")
    print("| B | " + " | ".join(f"N = {N}" for N in Ns) + " |")
    print("|---|" + "---|" * len(Ns))
    warm = sq.Model(p, ps, 0.05, spectrum=_spectrum(blocks[0]))
    sq.simulate(warm, N=1000 - 1000 % blocks[0], t_max=0.01, replicas=2, method="reduced")
    for B in blocks:
        m = sq.Model(p, ps, 0.05, spectrum=_spectrum(B))
        row = []
        for N in Ns:
            N = N - N % B
            t0 = time.perf_counter()
            sq.simulate(m, N=N, t_max=steps / N, replicas=replicas, seed=0, method="reduced",
                        t_eval=[0.0, steps / N])
            row.append(1e6 * (time.perf_counter() - t0) / (steps * replicas))
        print(f"| {B} | " + " | ".join(f"{x:.3g}" for x in row) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--p", type=int, default=4)
    ap.add_argument("--p-star", type=int, default=2)
    ap.add_argument("--activation", default="z**3 - 3*z")
    ap.add_argument("--blocks", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--simulator", action="store_true", help="only the simulator table")
    ap.add_argument("--kernels", action="store_true", help="only the kernels table")
    ap.add_argument("--N", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--steps", type=int, default=500)
    args = ap.parse_args()
    if not args.simulator:
        kernels_table(args.p, args.p_star, args.activation, args.blocks, args.repeats)
    if not args.kernels:
        simulator_table(args.p, args.p_star, [b for b in args.blocks if b <= 16], args.N,
                        args.replicas, args.steps)


if __name__ == "__main__":
    main()

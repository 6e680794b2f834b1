"""erf(z/√2) against the field: a published result and a peer's compiled ODE (issue 17).

1. **Saad & Solla's symmetric plateau.**  For the soft committee machine (readouts
   1, ``K = M`` units, ``T = I``, erf(z/√2)) Saad & Solla (Phys. Rev. E 52, 4225
   (1995), the symmetric phase of the small-η analysis) give the symmetric fixed
   point ``Q = C = 1/(2K − 1)``, ``R = S = 1/√(K(2K − 1))`` and the plateau error
   ``ε = (K/π)(π/6 − K arcsin(1/(2K)))`` (0.0203 at K = 3).  symquad's kernels
   (``sq.kernels(Model(..., activation="erf", readout=1, teacher_readout=1))``)
   give the fixed point of the gradient-flow part (``η → 0``: the drift divided
   by a tiny ``η``) on the unspecialised subspace ``Q_ij = q``, ``ρ_in = r`` by a
   root search from ``(0.5, 0.5)``; the script prints both.
2. **The erf right-hand side beside committee_learning's compiled one**
   (``committee_learning/ode/erf.pyx`` + ``erf_integrals.cpp`` of
   arn4/committe-learning: Cython/C++ loops over Saad & Solla's I3, I4), when
   ``SYMQUAD_PEER_PATH`` points at a checkout built with ``python setup.py
   build_ext --inplace`` (outside this repository; it is imported from there,
   never copied).  The peer measures time as ``τ = steps·η/(pN)``: its right-hand
   side is ``(p/η)`` times symquad's, with ``gamma_over_p = η/p``; every row first
   checks ``peer = (p/η)·symquad`` (and the risks) to 1e-10 relative, then times
   one unbatched call (CPU time of this process, best of ``--repeat`` below
   ``--long`` seconds, one call above), p = 2 … ``--max-p``, label noise 0.  A
   ReLU column (symquad only: no peer has ReLU with the η² term) up to
   ``--relu-max-p``.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 SYMQUAD_PEER_PATH=/path/to/committe-learning \\
        python benchmarks/bench_erf.py [--max-p 256] [--p-star 2] [--repeat 3]
"""

import importlib
import os
import pathlib
import platform
import sys
import time
import timeit
import types
import warnings

import numpy as np
from scipy.optimize import fsolve

import symquad as sq
from symquad.entry import ArgumentParser


def load_peer():
    """(erf_updates, erf_risk) of committee_learning from ``$SYMQUAD_PEER_PATH``, or None.

    Only the compiled ``ode/cython_erf`` and ``_cython/risk`` extensions (and the
    ``_config`` they import) are loaded: the package ``__init__`` files import
    torch and the other ODEs, which the comparison does not need.
    """
    path = os.environ.get("SYMQUAD_PEER_PATH")
    if not path:
        return None
    root = pathlib.Path(path)
    for candidate in (root / "committee_learning",
                      root / "committee_learning" / "committee_learning", root):
        if any((candidate / "ode").glob("cython_erf*.so")):
            break
    else:
        return None
    for name, folder in (("committee_learning", candidate),
                         ("committee_learning.ode", candidate / "ode"),
                         ("committee_learning._cython", candidate / "_cython")):
        mod = types.ModuleType(name)
        mod.__path__ = [str(folder)]
        sys.modules[name] = mod
    erf = importlib.import_module("committee_learning.ode.cython_erf")
    risk = importlib.import_module("committee_learning._cython.risk")
    return erf.erf_updates, risk.erf_risk


def cpu_seconds(fn, repeat, long):
    """CPU seconds of one call: best of `repeat` auto-ranged timings, or one call if slow."""
    start = time.process_time()
    fn()
    first = time.process_time() - start
    if first > long:
        return first
    timer = timeit.Timer(fn, timer=time.process_time)
    number, _ = timer.autorange()
    number = max(1, number // 4)
    return min(timer.repeat(repeat=repeat, number=number)) / number


def point(p, k, rng):
    n = p + k
    G = rng.standard_normal((n, n + 2))
    C = G @ G.T / (n + 2)
    return C[:p, :p].copy(), C[:p, p:].copy(), C[p:, p:].copy()


def saad_solla_plateau(Ks=(2, 3, 4, 5)):
    print("# 1. Saad & Solla's symmetric plateau (K = M, readouts 1, T = I, eta -> 0): the fixed "
          "point of the unspecialised subspace Q_ij = q, rho_in = r")
    print(f"{'K':>3} {'q':>10} {'1/(2K-1)':>10} {'r':>10} {'1/sqrt(K(2K-1))':>16} "
          f"{'eps symquad':>13} {'eps formula':>13} {'|diff|':>9}")
    for K in Ks:
        model = sq.Model(p=K, p_star=K, lr=1e-9, activation="erf", readout=1,
                         teacher_readout=1)
        kern = sq.kernels(model)
        T = np.eye(K)

        def drift(x):
            dQ, drho = kern.rhs(np.full((K, K), x[0]), np.full((K, K), x[1]), T)
            return [dQ[0, 0] / model.eta, drho[0, 0] / model.eta]
        x = fsolve(drift, [0.5, 0.5])
        eps = kern.risk(np.full((K, K), x[0]), np.full((K, K), x[1]), T)
        formula = K / np.pi * (np.pi / 6 - K * np.arcsin(1 / (2 * K)))
        print(f"{K:>3} {x[0]:>10.6f} {1 / (2 * K - 1):>10.6f} {x[1]:>10.6f} "
              f"{1 / np.sqrt(K * (2 * K - 1)):>16.6f} {eps:>13.8f} {formula:>13.8f} "
              f"{abs(eps - formula):>9.1e}")


def rhs_table(max_p, p_star, repeat, long, relu_max_p):
    peer = load_peer()
    print(f"\n# 2. one erf RHS (unbatched), p* = {p_star}, label noise 0; CPU seconds per call")
    print("# peer: " + ("committee_learning (arn4/committe-learning) cython_erf.erf_updates from "
                        "$SYMQUAD_PEER_PATH" if peer else "not available (set SYMQUAD_PEER_PATH)"))
    print(f"{'p':>5} {'symquad erf':>12} {'peer erf':>10} {'peer/symquad':>13} "
          f"{'max rel diff':>13} {'symquad relu':>13}")
    rng = np.random.default_rng(0)
    p = 2
    while p <= max_p:
        model = sq.Model(p=p, p_star=p_star, lr=0.3, activation="erf")
        Q, rho, T = point(p, p_star, rng)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # the cost estimate at large p
            kern = sq.kernels(model)
        t_ours = cpu_seconds(lambda: kern.rhs(Q, rho, T), repeat, long)
        t_peer, diff = None, None
        if peer is not None:
            updates, risk = peer
            call = lambda: updates(Q, rho, T, 0, model.eta / p, 0.0, 1)     # noqa: E731
            Phi, Psi = call()
            dQ, drho = kern.rhs(Q, rho, T)
            scale = p / model.eta
            diff = max(np.max(np.abs(scale * ours - theirs)) / np.max(np.abs(theirs))
                       for ours, theirs in ((dQ, Phi), (drho, Psi)))
            r_theirs, r_ours = risk(Q, rho, T), kern.risk(Q, rho, T)
            diff = max(diff, abs(r_theirs - r_ours) / abs(r_theirs))
            assert diff < 1e-10, f"peer and symquad differ at p={p}: {diff:.2e}"
            t_peer = cpu_seconds(call, repeat, long)
        t_relu = None
        if p <= relu_max_p:
            relu = sq.kernels(model.replace(activation="relu"))
            t_relu = cpu_seconds(lambda: relu.rhs(Q, rho, T), repeat, long)

        def fmt(x):
            return "-" if x is None else f"{x:.3g}"
        print(f"{p:>5} {fmt(t_ours):>12} {fmt(t_peer):>10} "
              f"{(f'{t_peer / t_ours:.2f}x' if t_peer else '-'):>13} "
              f"{(f'{diff:.1e}' if diff is not None else '-'):>13} {fmt(t_relu):>13}",
              flush=True)
        p *= 2


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-p", type=int, default=256)
    parser.add_argument("--p-star", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--long", type=float, default=2.0,
                        help="a first call longer than this (s) is the measurement")
    parser.add_argument("--relu-max-p", type=int, default=32)
    parser.add_argument("--no-plateau", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    print(f"# {platform.machine()} {platform.system()}, {os.cpu_count()} cores, load "
          f"{', '.join(f'{x:.2f}' for x in load)}; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, NUMBA_NUM_THREADS="
          f"{os.environ.get('NUMBA_NUM_THREADS', 'unset')}; numpy {np.__version__}")
    if not args.no_plateau:
        saad_solla_plateau()
    rhs_table(args.max_p, args.p_star, args.repeat, args.long, args.relu_max_p)
    print(f"# load at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

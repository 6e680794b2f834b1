"""Cost per evaluation of the erf/ReLU kernels (issue 17, phase 1).

* **closed forms** (generated, numpy): erf I4, ReLU I2/J2/I3, erf-student I4 with
  ReLU teachers, per element on arrays of 10^6 entries;
* **ReLU four-point quadrature** (numba, threads over elements: NUMBA_NUM_THREADS), per evaluation, on the index
  quadruples ``(k, l, a, b)`` (``k ≤ l``, ``a ≤ b``: the symmetries of I4) of
  three states of ``p + p*`` fields, ``p = 64, p* = 4``:
  ``start``  — Q ≈ I, ρ ≈ 0 (random init at large N: weak correlations),
  ``mid``    — a random Wishart covariance with n + 8 degrees of freedom,
  ``late``   — every student within 1e-4 (relative) of a teacher (the aligned end
               state: many fields close to the plane of two students),
  and the implied time of one full ``O(p² (p+p*)²)`` sum (unique quadruples only);
* **the sums' route** (:func:`symquad.numeric.special.relu_four_point_sums`, what the
  drift calls: index coincidences, vectorised loops) timed on the same three states, one
  full sum each, per unique quadruple.

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/bench_special.py [--p 64] [--p-star 4] [--sample 200000]
"""

import time

import numpy as np

from symquad.entry import ArgumentParser
from symquad.numeric import special as NS

ERF = NS.special_kernels("erf", "erf")
RELU = NS.special_kernels("relu", "relu")
ERF_RELU = NS.special_kernels("erf", "relu")


def states(p, pk, rng):
    n = p + pk
    out = {}
    G = np.eye(n) + 0.02 * rng.standard_normal((n, n))
    out["start"] = G @ G.T
    G = rng.standard_normal((n, n + 8))
    out["mid"] = G @ G.T / (n + 8)
    teachers = np.linalg.qr(rng.standard_normal((200, pk)))[0].T * np.sqrt(200)
    students = teachers[np.arange(p) % pk] * 1.0 + 1e-4 * rng.standard_normal((p, 200))
    W = np.vstack([students, teachers])
    out["late"] = W @ W.T / 200
    return out


def quadruples(p, n, sample, rng):
    """A random sample of the unique quadruples k <= l < p, a <= b < n."""
    k = rng.integers(0, p, sample)
    l = rng.integers(0, p, sample)
    a = rng.integers(0, n, sample)
    b = rng.integers(0, n, sample)
    k, l = np.minimum(k, l), np.maximum(k, l)
    a, b = np.minimum(a, b), np.maximum(a, b)
    return k, l, a, b


def best_of(fn, repeat=3, clock=time.perf_counter):
    times = []
    for _ in range(repeat):
        t = clock()
        fn()
        times.append(clock() - t)
    return min(times)


def main():
    ap = ArgumentParser()
    ap.add_argument("--p", type=int, default=64)
    ap.add_argument("--p-star", type=int, default=4)
    ap.add_argument("--sample", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    p, pk = args.p, args.p_star
    import os
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; numba threads "
          f"{os.environ.get('NUMBA_NUM_THREADS', 'default')}")
    n = p + pk

    m = 1_000_000
    G = rng.standard_normal((m, 4, 6))
    C = G @ np.swapaxes(G, 1, 2) / 6
    e4 = (C[:, 0, 0], C[:, 0, 1], C[:, 1, 1], C[:, 0, 2], C[:, 0, 3], C[:, 1, 2], C[:, 1, 3],
          C[:, 2, 2], C[:, 2, 3], C[:, 3, 3])
    e2 = (C[:, 0, 0], C[:, 0, 1], C[:, 1, 1])
    e3 = (C[:, 0, 0], C[:, 0, 1], C[:, 0, 2], C[:, 1, 2], C[:, 2, 2])
    print("closed forms (numpy, ns per element, arrays of 1e6; wall / CPU):")
    for name, fn, args_ in (("erf I4", ERF.I4_ss, e4), ("erf I3", ERF.I3_s, e3),
                            ("relu I2", RELU.I2_ss, e2), ("relu J2", RELU.J2, e2),
                            ("relu I3", RELU.I3_s, e3), ("erf-student relu-teacher I4", ERF_RELU.I4_tt, e4)):
        t = best_of(lambda: fn(*args_), args.repeat)
        c = best_of(lambda: fn(*args_), args.repeat, time.process_time)
        print(f"  {name:30s} {t / m * 1e9:8.1f} / {c / m * 1e9:8.1f} ns")

    NS.relu_four_point(1.0, 0.1, 1.0, 0.2, 0.3, 0.1, 0.0, 1.0, 0.2, 1.0)    # compile / load cache
    unique = (p * (p + 1) // 2) * (n * (n + 1) // 2)
    print(f"\nrelu four-point quadrature (numba), p = {p}, p* = {pk}: "
          f"{unique} unique quadruples per RHS; sample of {args.sample}")
    for state, Cs in states(p, pk, rng).items():
        k, l, a, b = quadruples(p, n, args.sample, rng)
        ent = (Cs[k, k], Cs[k, l], Cs[l, l], Cs[k, a], Cs[k, b], Cs[l, a], Cs[l, b], Cs[a, a],
               Cs[a, b], Cs[b, b])
        for sa, sb in (("relu", "relu"), ("erf", "erf")):
            run = lambda: NS.relu_four_point(*ent, sigma_a=sa, sigma_b=sb)  # noqa: E731
            wall = best_of(run, args.repeat) / args.sample
            cpu = best_of(run, args.repeat, time.process_time) / args.sample
            print(f"  {state:5s} sigma_a={sa:4s} sigma_b={sb:4s}: {wall * 1e6:6.2f} us wall, "
                  f"{cpu * 1e6:6.2f} us CPU per evaluation -> {wall * unique:7.2f} s wall per "
                  f"full sum")

    # the route of the drift: relu_four_point_sums over every unique quadruple of the state
    print(f"\nrelu four-point sums (relu_four_point_sums: index coincidences, vectorised "
          f"loops), p = {p}, p* = {pk}, one full sum per state")
    w = np.concatenate([np.full(p, 1.0 / p), -np.ones(pk)])[None]
    for state, Cs in states(p, pk, rng).items():
        for teacher in ("relu", "erf"):
            run = lambda: NS.relu_four_point_sums(Cs[None], w, p, (teacher,))  # noqa: E731
            run()
            wall = best_of(run, args.repeat)
            cpu = best_of(run, args.repeat, time.process_time)
            print(f"  {state:5s} teacher={teacher:4s}: {wall:7.3f} s wall, {cpu:7.3f} s CPU per "
                  f"full sum = {cpu / unique * 1e6:6.3f} us CPU per unique quadruple")


if __name__ == "__main__":
    main()

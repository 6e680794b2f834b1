"""Cost of one ODE right-hand-side evaluation.

Side by side in one run:
  * the generated matrix-form kernel (width independent, O((p+p*)^3)),
  * a live ``sympy.lambdify`` of the same equations written out entry by entry
    (what a user gets without codegen; only feasible for small p),
  * the committed entry-by-entry generated kernels where they exist,
and the growth of the matrix-form kernel's cost with p from 1 to 512.

    python benchmarks/bench_kernels.py [--max-p 512] [--lambdify-max-p 6] [--repeat 5]
"""

import argparse
import timeit

import numpy as np
import sympy as sp

import symquad as sq


def _point(p, k, rng):
    n = p + k
    G = rng.standard_normal((n, n + 2))
    C = G @ G.T / (n + 2)
    return C[:p, :p].copy(), C[:p, p:].copy(), C[p:, p:].copy()


def time_call(fn, repeat):
    """Best-of-`repeat` seconds per call, with the call count auto-scaled to ~0.05 s."""
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    number = max(1, number // 4)
    return min(timer.repeat(repeat=repeat, number=number)) / number


def live_lambdify(model):
    eq = sq.derive(model, form="matrix")
    risk, dQ, drho = eq.explicit()
    Qs, Rs, Ts = eq.entry_symbols
    args = sorted(set(Qs) | set(Rs) | set(Ts), key=lambda s: s.name)
    f = sp.lambdify(args + [eq.eta, eq.noise], [dQ, drho], "numpy")
    index = {}
    for name, M in (("Q", Qs), ("rho", Rs), ("T", Ts)):
        for i in range(M.rows):
            for j in range(M.cols):
                index.setdefault(M[i, j], (name, i, j))
    where = [index[s] for s in args]

    def rhs(Q, rho, T):
        mats = {"Q": Q, "rho": rho, "T": T}
        return f(*[mats[n][i, j] for n, i, j in where], model.eta, model.noise)
    return rhs


def main(max_p=512, lambdify_max_p=6, repeat=5, p_star=2):
    rng = np.random.default_rng(0)
    print(f"# one RHS evaluation, p* = {p_star}; best of {repeat}; times in microseconds")
    print(f"{'p':>5} {'matrix kernel':>14} {'entry kernel':>13} {'live lambdify':>14} "
          f"{'lambdify/matrix':>16}")
    p = 1
    rows = []
    while p <= max_p:
        model = sq.Model(p=p, p_star=p_star, lr=0.1, noise=0.1)
        Q, rho, T = _point(p, p_star, rng)
        k_matrix = sq.kernels(model, form="matrix")
        t_matrix = time_call(lambda: k_matrix.rhs(Q, rho, T), repeat)
        t_entries = t_live = None
        try:
            from symquad._generated import ENTRY_MODULES
            if (p, p_star) in ENTRY_MODULES:
                k_entries = sq.kernels(model, form="entries")
                t_entries = time_call(lambda: k_entries.rhs(Q, rho, T), repeat)
        except ImportError:  # pragma: no cover
            pass
        if p <= lambdify_max_p:
            live = live_lambdify(model)
            np.testing.assert_allclose(np.array(live(Q, rho, T)[0], dtype=float),
                                       k_matrix.rhs(Q, rho, T)[0], rtol=1e-10, atol=1e-12)
            t_live = time_call(lambda: live(Q, rho, T), repeat)

        def fmt(x):
            return f"{x * 1e6:.1f}" if x is not None else "-"
        ratio = f"{t_live / t_matrix:.1f}x" if t_live else "-"
        print(f"{p:>5} {fmt(t_matrix):>14} {fmt(t_entries):>13} {fmt(t_live):>14} {ratio:>16}",
              flush=True)
        rows.append((p, t_matrix))
        p *= 2
    if len(rows) >= 3:
        ps, ts = np.array(rows).T
        big = ps >= 64
        if big.sum() >= 2:
            slope = np.polyfit(np.log(ps[big]), np.log(ts[big]), 1)[0]
            print(f"# matrix kernel cost ~ p^{slope:.2f} for p >= 64 "
                  f"(O(p^3) matrix products; BLAS makes small p overhead-bound)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-p", type=int, default=512)
    parser.add_argument("--lambdify-max-p", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--p-star", type=int, default=2)
    args = parser.parse_args()
    main(args.max_p, args.lambdify_max_p, args.repeat, args.p_star)

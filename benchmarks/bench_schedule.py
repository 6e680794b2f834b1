"""Learning-rate schedules: cost of the scheduled ODE, of the optimiser, and the optimum's gain.

Three measurements, side by side in one run (ratios only; the machine is shared):

1. ``integrate`` with each schedule family against the constant lr (same model, start,
   tolerances): wall time and right-hand-side evaluations;
2. ``optimal_schedule``: seconds per adjoint gradient (one forward and one backward solve)
   against one forward ODE solve of the same problem;
3. ``--table``: on the quadratic model (sigma = z^2, label noise), the final risk at
   ``t_final`` of the best constant lr, the best inverse schedule lr/(1 + t/tau) and the
   optimal piecewise-constant schedule; written as a Markdown table (``--out``).

Usage::

    PYTHONPATH=. python benchmarks/bench_schedule.py            # 1 and 2
    PYTHONPATH=. python benchmarks/bench_schedule.py --table --out docs/optimal-schedule-table.md
"""

import argparse
import os
import time

import numpy as np
from scipy.optimize import minimize, minimize_scalar

import symquad as sq


def _start(m, seed=0):
    rng = np.random.default_rng(seed)
    return np.eye(m.p), 0.2 * rng.uniform(0.5, 1.0, (m.p, m.p_star)), np.eye(m.p_star)


def bench_integrate(repeat=3):
    m = sq.Model(p=4, p_star=2, lr=0.1, noise=0.1)
    Q, rho, T = _start(m)
    rows = []
    for sched in ("constant", "inverse:50", "power:20:0.7", "step:30=0.5:60=0.25",
                  "table:0=1:40=0.5:80=0.2"):
        mm = m.replace(lr_schedule=sched)
        sq.integrate(mm, Q, rho, T, 100.0)            # kernels built, modules loaded
        best, nfev = np.inf, 0
        for _ in range(repeat):
            tick = time.perf_counter()
            sol = sq.integrate(mm, Q, rho, T, 100.0)
            best = min(best, time.perf_counter() - tick)
            nfev = sol.nfev
        rows.append((sched, best, nfev))
    base = rows[0][1]
    print("integrate, Model(p=4, p_star=2, lr=0.1, noise=0.1), t_max=100 (best of "
          f"{repeat}); load {os.getloadavg()[0]:.1f}")
    for sched, sec, nfev in rows:
        print(f"  {sched:26s} {sec * 1e3:8.1f} ms  {nfev:6d} rhs  x{sec / base:.2f}")


def bench_gradient():
    from symquad.numeric.layout import state_layout
    from symquad.numeric.optimal import _Problem
    m = sq.Model(p=2, p_star=1, lr=0.2, noise=0.5)
    Q, rho, T = _start(m)
    prob = _Problem(m, state_layout(m).pack(Q, rho), T, np.linspace(0, 20, 21), 1e-9, 1e-12)
    etas = np.full(20, 0.2)
    prob.value_and_gradient(etas)
    tick = time.perf_counter()
    prob.forward(etas, dense=False)
    one = time.perf_counter() - tick
    tick = time.perf_counter()
    prob.value_and_gradient(etas)
    grad = time.perf_counter() - tick
    tick = time.perf_counter()
    sq.integrate(m.replace(lr_schedule="inverse:10"), Q, rho, T, 20.0, rtol=1e-9, atol=1e-12)
    integ = time.perf_counter() - tick
    print(f"optimal_schedule, Model(p=2, p_star=1, lr=0.2, noise=0.5), 20 pieces to t=20; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"  one forward solve      {one * 1e3:8.1f} ms")
    print(f"  one adjoint gradient   {grad * 1e3:8.1f} ms  (x{grad / one:.1f} the forward solve)")
    print(f"  integrate (scheduled)  {integ * 1e3:8.1f} ms")


def best_constant(final, m, lr_max):
    """Grid, then a bounded search in the best grid point's bracket (a diverging lr is
    inf: Brent's method alone on the whole range stalls at the divergent edge)."""
    grid = np.linspace(0.02, 1.0, 50) * lr_max
    values = [final(m.replace(lr=float(lr))) for lr in grid]
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    return minimize_scalar(lambda lr: final(m.replace(lr=lr)), bounds=(lo, hi),
                           method="bounded", options={"xatol": 1e-6})


def table(out=None, p=2, p_star=1, noise=0.5, t_final=20.0, lr_max=1.0, n_pieces=20,
          constant_only=False):
    m = sq.Model(p=p, p_star=p_star, lr=0.2, noise=noise)
    Q, rho, T = _start(m)

    def final(model):
        try:
            return float(sq.integrate(model, Q, rho, T, t_final, t_eval=[t_final]).risk[-1])
        except sq.DivergenceError:
            return np.inf

    tick = time.perf_counter()
    const = best_constant(final, m, lr_max)
    if constant_only:
        print(f"| best constant | lr = {const.x:.4g} | {const.fun:.6g} |")
        return const.fun

    def inv(v):
        lr, tau = v
        if not (0 < lr <= 2 * lr_max and tau > 0):
            return np.inf
        return final(m.replace(lr=lr, lr_schedule=("inverse", tau)))
    grid = [(lr, tau) for lr in np.linspace(0.1, 1.0, 7) * lr_max for tau in (1, 3, 10, 30)]
    start = min(grid, key=inv)
    best_inv = minimize(inv, start, method="Nelder-Mead", options={"xatol": 1e-5,
                                                                     "fatol": 1e-12})
    opt = sq.optimal_schedule(m.replace(lr=float(const.x)), t_final, Q0=Q, rho0=rho, T=T,
                              lr_max=lr_max, n_pieces=n_pieces)
    seconds = time.perf_counter() - tick
    lines = [
        f"Final risk at t_final = {t_final:g} of `Model(p={p}, p_star={p_star}, noise={noise})` "
        f"(sigma = z^2) from Q(0) = I, rho(0) of `benchmarks/bench_schedule.py` (seed 0), "
        f"lr <= {lr_max:g}:",
        "",
        "| schedule | parameters | risk at t_final | vs optimal |",
        "| --- | --- | --- | --- |",
        f"| best constant | lr = {const.x:.4g} | {const.fun:.6g} | {const.fun / opt.risk_final:.3f}x |",
        f"| best inverse lr/(1 + t/tau) | lr = {best_inv.x[0]:.4g}, tau = {best_inv.x[1]:.4g} "
        f"| {best_inv.fun:.6g} | {best_inv.fun / opt.risk_final:.3f}x |",
        f"| optimal ({n_pieces} pieces, adjoint + L-BFGS-B) | lr from {opt.lr.max():.3g} to "
        f"{opt.lr[-1]:.3g} | {opt.risk_final:.6g} | 1 |",
        "",
        f"({opt.n_gradients} adjoint gradients; whole table {seconds:.0f} s at load "
        f"{os.getloadavg()[0]:.1f}.)",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "w") as fh:
            fh.write(text)
    return const.fun, best_inv.fun, opt.risk_final


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--t-final", type=float, default=20.0)
    ap.add_argument("--n-pieces", type=int, default=20)
    ap.add_argument("--constant-only", action="store_true",
                    help="only the best constant lr's row of the table")
    args = ap.parse_args()
    if args.table or args.constant_only:
        table(args.out, t_final=args.t_final, n_pieces=args.n_pieces,
              constant_only=args.constant_only)
    else:
        bench_integrate()
        bench_gradient()

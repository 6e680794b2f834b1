"""Implicit bias (docs/model.md §8.3 and §8.4): S = ρ(ρᵀρ)^{-1/2} and the closest solution.

Writes three figures and prints the numbers behind them:

1. ``implicit_bias_S.png`` — entries of S(t) for the ODE (lines) and one SGD run
   (dots), from an informed start (ρ0 = 0.3·S0, Q0 = I: a point of the invariant
   set, so the ODE keeps S exactly) and from a random start (ρ0 ~ N^{-1/2}: SGD
   re-randomises S while ρ is as small as its own noise; the ODE, started from the
   realised overlaps, keeps the S of the start).
2. ``implicit_bias_distances.png`` — for ODE runs from random points of the
   invariant set (``sq.invariant_set_point``): distance (in overlap space) of the end
   point to the Procrustes point ``sq.closest_solution`` vs to Haar-random points of
   the zero-risk manifold (``sq.random_manifold_points``); and for SGD at the
   largest N the same from the informed start.
3. ``implicit_bias_drift.png`` — drift of S along SGD vs N
   (``sq.invariant_drift_study``, drawn by ``sq.plot_invariant_drift``).

    python examples/implicit_bias.py [--quick] [--out DIR] [--format png|pdf|svg]

Default output folder ``./symquad_examples/implicit_bias``. The full run's drift
study is the expensive part (reduced simulator, cost ∝ N·t_max·replicas); the
runtime is measured and printed.
"""

import time
from pathlib import Path

import numpy as np

import symquad as sq

DEFAULT_OUT = Path("symquad_examples") / "implicit_bias"
FORMATS = ("png", "pdf", "svg")


def overlap_distance(Q1, rho1, Q2, rho2):
    """Frobenius distance between overlap points (stacked in the leading axes)."""
    return np.sqrt(((Q1 - Q2) ** 2).sum((-2, -1)) + ((rho1 - rho2) ** 2).sum((-2, -1)))


def random_orthonormal(p, k, rng):
    """A Haar-random p×k matrix with orthonormal columns (QR of a Gaussian, signs fixed)."""
    q, r = np.linalg.qr(rng.standard_normal((p, k)))
    return q * np.sign(np.diag(r))


def figure_S(m, N, t_max, seed, out):
    rng = np.random.default_rng(seed)
    p, k = m.p, m.p_star
    S0 = random_orthonormal(p, k, rng)
    t_eval = np.linspace(0, t_max, 201)
    panels, numbers = [], {}
    # informed start
    Q0, rho0 = np.eye(p), 0.3 * S0
    ode = sq.integrate(m, Q0, rho0, np.eye(k), t_max, t_eval=t_eval, rtol=1e-10, atol=1e-13)
    run = sq.simulate(m, N, t_max, 1, seed, Q0=Q0, rho0=rho0, t_eval=t_eval)
    S_ode = sq.invariant_S(ode.rho)
    S_sgd = sq.invariant_S(run.rho[0])
    numbers["informed: ODE max|S(t)-S0|"] = float(np.abs(S_ode - S0).max())
    numbers["informed: SGD |S(t_max)-S0|_F"] = float(np.linalg.norm(S_sgd[-1] - S0))
    panels.append((ode.t, S_ode, run.t, S_sgd, f"informed start, N = {N}"))
    # random start: ODE from the realised overlaps of the SGD run
    run = sq.simulate(m, N, t_max, 1, seed + 1, t_eval=t_eval)
    Q0r, rho0r = run.Q[0, 0], run.rho[0, 0]
    ode = sq.integrate(m, Q0r, rho0r, run.T, t_max, t_eval=t_eval, rtol=1e-10, atol=1e-13)
    S_ode = sq.invariant_S(ode.rho)
    S_sgd = sq.invariant_S(run.rho[0])     # ρ ~ N^{-1/2} is small but has full rank
    numbers["random: ODE from realised start, max|S(t)-S(0)|"] = float(
        np.abs(S_ode - S_ode[0]).max())
    numbers["random: SGD |S(t_max)-S(0)|_F"] = float(np.linalg.norm(S_sgd[-1] - S_sgd[0]))
    panels.append((ode.t, S_ode, run.t, S_sgd, f"random start, N = {N}"))
    fig = sq.S_trajectories_figure(
        panels, title=r"$S = \rho(\rho^\top\rho)^{-1/2}$ along the ODE and one SGD run; "
                      f"p = {p}, p* = {k}, η = {m.eta:g}, σ = z²")
    sq.save_figure(fig, out)
    return numbers


def figure_distances(m, n_starts, n_random, N, replicas, t_max, seed, out):
    rng = np.random.default_rng(seed)
    p, k = m.p, m.p_star
    T = np.eye(k)
    d_proc, d_rand_min, d_rand = [], [], []
    for _ in range(n_starts):
        Q0, rho0, _ = sq.invariant_set_point(p, k, rng, q_perp=np.zeros(p - k))
        sol = sq.integrate(m, Q0, rho0, T, 10 * t_max, rtol=1e-10, atol=1e-13)
        c = sq.closest_solution(m, Q0, rho0, T)
        others = sq.random_manifold_points(p, k, n_random, rng, T)
        d_proc.append(overlap_distance(sol.Q[-1], sol.rho[-1], c.Q, c.rho))
        dr = overlap_distance(sol.Q[-1], sol.rho[-1], others.Q, others.rho)
        d_rand_min.append(dr.min())
        d_rand.extend(dr[:50])
    # SGD from the informed start.  Q0 = I has a non-zero block on the complement of
    # span(rho), so the approach to the manifold is algebraic (~1/t); compare the
    # manifold point the run is heading to, zero_risk_point(S(rho_end)), with the
    # Procrustes point of the start and with random manifold points.
    S0 = random_orthonormal(p, k, rng)
    Q0, rho0 = np.eye(p), 0.3 * S0
    run = sq.simulate(m, N, 3 * t_max, replicas, seed, Q0=Q0, rho0=rho0)
    c = sq.closest_solution(m, Q0, rho0, T)
    reached = sq.zero_risk_point(sq.invariant_S(run.rho[:, -1]), T, p)
    d_sgd = overlap_distance(reached.Q, reached.rho, c.Q, c.rho)
    others = sq.random_manifold_points(p, k, n_random, rng, T)
    d_sgd_rand = overlap_distance(reached.Q[:, None], reached.rho[:, None],
                                  others.Q[None], others.rho[None])
    groups = [("ODE end → Procrustes point", np.maximum(d_proc, 1e-16)),
              ("ODE end → random manifold points", np.asarray(d_rand)),
              (f"SGD (N = {N}) point reached → Procrustes", d_sgd),
              (f"SGD point reached → nearest of {n_random} random", d_sgd_rand.min(1))]
    fig = sq.distance_strip_figure(groups, rng=rng, xlabel="distance in overlap space (Q, ρ)",
                                   title="end point vs the closest (Procrustes) zero-risk "
                                         "solution")
    sq.save_figure(fig, out)
    return {"ODE: max distance to Procrustes": float(np.max(d_proc)),
            f"ODE: min distance to {n_random} random manifold points": float(np.min(d_rand_min)),
            "SGD informed: risk at the end (mean)": float(np.mean(run.risk[:, -1])),
            "SGD informed: mean distance reached point -> Procrustes": float(d_sgd.mean()),
            "SGD informed: mean distance reached point -> nearest random point": float(
                d_sgd_rand.min(1).mean())}


def main(quick=False, out=DEFAULT_OUT, seed=0, fmt="png"):
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    m = sq.DEFAULT_MODEL
    if quick:
        N_fig, Ns, reps, t_max = 2000, [250, 1000], 8, 150.0
    else:
        N_fig, Ns, reps, t_max = 8000, [500, 1000, 2000, 4000, 8000], 32, 250.0
    print(f"[1/3] S(t) along the ODE and one SGD run (N={N_fig}) ...", flush=True)
    numbers = figure_S(m, N_fig, t_max, seed, out / f"implicit_bias_S.{fmt}")
    print("[2/3] end points vs the closest solution ...", flush=True)
    numbers.update(figure_distances(m, 20, 2000, N_fig, 8 if quick else 16, t_max / 3,
                                    seed + 10, out / f"implicit_bias_distances.{fmt}"))
    print(f"[3/3] drift of S along SGD for N = {Ns} ({reps} replicas each) ...", flush=True)
    study = sq.invariant_drift_study(m, Ns, t_max, reps, seed + 20, progress=not quick)
    sq.plot_invariant_drift(study, out / f"implicit_bias_drift.{fmt}")
    for key, val in numbers.items():
        print(f"{key}: {val:.3g}")
    for key in ("random", "informed"):
        res = study[key]
        print(f"drift of S along SGD ({key} start): N={[int(n) for n in study['Ns']]}")
        print("   mean  " + "  ".join(f"{x:.4f}" for x in res["mean"]))
        print("   s.e.  " + "  ".join(f"{x:.4f}" for x in res["sem"]))
        fit = res["fit"]
        print(f"   fit exponent {fit['exponent']:.3f} ± {fit['exponent_se']:.3f}")
    print(f"random start: t_ref = {study['random']['t_ref']}, total rotation of S from "
          f"t=t_1 = {study['random']['total_rotation']}")
    print(f"figures written to {out.resolve()}; runtime {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    parser = sq.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small N and few replicas")
    parser.add_argument("--out", default=str(DEFAULT_OUT),
                        help=f"output folder (default ./{DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=FORMATS, default="png",
                        help="figure file format (pdf, svg: vector; default png)")
    args = parser.parse_args()
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    raise SystemExit(sq.run_main(main, args.quick, args.out, args.seed, args.format))

"""The three phases of learning from a random start (docs/model.md §8.1), from the ODEs.

Integrates the default model (``sq.DEFAULT_MODEL``) from ``Q0 = I`` and ``ρ0`` with
entries of size ``1/√N`` and plots the risk, the student norms (diagonal of ``Q``) and
the teacher overlaps ``|ρ|`` against ``t = steps/N``: (i) the norms relax while ``ρ``
stays tiny, (ii) a long plateau at the risk of the ODE's plateau fixed point
(``sq.plateau``, dotted line; it includes the ``η²`` term, so it is not the
gradient-flow value), during which ``ρ`` grows like ``e^{κt}``, (iii) the escape and
the convergence. The predicted escape time (``sq.escape_time`` for the ODE from a
random start at this ``N``) is marked.

    python examples/phases.py [--N 1e6] [--t-max 600] [--out DIR] [--format png|pdf|svg]

Writes ``DIR/phases.png`` (or ``.pdf``/``.svg``; default ``DIR`` ``./symquad_examples/phases``).
"""

import time
from pathlib import Path

import numpy as np

import symquad as sq

DEFAULT_OUT = Path("symquad_examples") / "phases"
FORMATS = ("png", "pdf", "svg")


def main(N=1e6, t_max=600.0, out=DEFAULT_OUT, seed=0, fmt="png"):
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    m = sq.DEFAULT_MODEL
    print(f"model {m!r}, N = {N:.3g}: integrating the ODE to t = {t_max:g} ...", flush=True)
    rng = np.random.default_rng(seed)
    rho0 = rng.standard_normal((m.p, m.p_star)) / np.sqrt(N)
    sol = sq.integrate(m, np.eye(m.p), rho0, np.eye(m.p_star), t_max,
                       t_eval=np.linspace(0, t_max, 2001))
    fp = sq.plateau(m)
    print(f"plateau: q = {fp.q:.4f}, risk = {fp.risk:.4f}, growth rate of rho kappa = "
          f"{fp.rate:.4f}; predicting the escape time ...", flush=True)
    pred = sq.escape_time(m, int(N), sgd_noise=False, n_samples=64, seed=seed)
    fig = sq.phases_figure(m, sol, fp.risk, float(pred), N)
    path = sq.save_figure(fig, out / f"phases.{fmt}")
    print(f"final risk {sol.risk[-1]:.3g}; predicted escape (ODE, random start) "
          f"{float(pred):.1f} (quartiles {pred.quartiles[0]:.1f}-{pred.quartiles[2]:.1f})")
    print(f"wrote {path}; runtime {time.perf_counter() - start:.1f} s")
    return sol


if __name__ == "__main__":
    parser = sq.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--N", type=float, default=1e6, help="input dimension (default 1e6)")
    parser.add_argument("--t-max", type=float, default=600.0, help="final time (default 600)")
    parser.add_argument("--out", default=str(DEFAULT_OUT),
                        help=f"output folder (default ./{DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=FORMATS, default="png",
                        help="figure file format (pdf, svg: vector; default png)")
    args = parser.parse_args()
    if not 1 <= args.N < float("inf"):
        parser.error(f"--N must be a finite number >= 1, got {args.N}")
    if not 0 < args.t_max < float("inf"):
        parser.error(f"--t-max must be a finite number > 0, got {args.t_max}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    # errors (e.g. an unwritable --out) end as one line and exit status 2, no traceback
    raise SystemExit(sq.run_main(main, args.N, args.t_max, args.out, args.seed, args.format))

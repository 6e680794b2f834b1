"""Validate the ODE theory against SGD simulations (plateau, escape, N^-1/2 scaling).

    python examples/validate_quickstart.py [--quick] [--out DIR] [--format png|pdf|svg]

It (1) simulates SGD with both simulators (``method="full"`` and ``"reduced"``) for
a short time and shows that they give the same overlap statistics, (2) runs
``sq.validate`` from a random start (plateau and escape) and (3) from an informed
start (``ρ(0)`` of order one), printing both reports and writing them (JSON numbers,
PNG figures, trajectories) to ``DIR/random`` and ``DIR/informed`` (default
``./symquad_examples/validate_quickstart``). The runtime is measured and printed.
"""

import time
from pathlib import Path

import numpy as np

import symquad as sq

DEFAULT_OUT = Path("symquad_examples") / "validate_quickstart"


def main(quick=False, out=DEFAULT_OUT, fmt="png"):
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)       # an unusable --out fails now, not after the runs
    m = sq.Model(p=4, p_star=2, lr=0.3)          # p > p*: overparameterised student

    # 1. the two simulators: same law, very different cost
    N, R = (200, 64) if quick else (2000, 256)
    print(f"[1/3] SGD with both simulators, N={N}, {R} replicas, t_max=2 ...", flush=True)
    for method in ("full", "reduced"):
        tic = time.perf_counter()
        run = sq.simulate(m, N=N, t_max=2.0, replicas=R, seed=1, method=method)
        print(f"  {method:8s} mean risk at t=2: {run.risk[:, -1].mean():.4f} "
              f"± {run.risk[:, -1].std() / np.sqrt(R):.4f}   "
              f"({time.perf_counter() - tic:.1f} s)", flush=True)

    # 2. ODE vs SGD from a random start: plateau, escape, spread of escape times
    kw = dict(N=300, replicas=8, fss_N=[50, 200, 800, 3200], fss_replicas=8,
              fss_t_max=3.0) if quick else dict(N=4000, replicas=64)
    print(f"[2/3] validate from a random start (N={kw['N']}, {kw['replicas']} replicas) ...",
          flush=True)
    report = sq.validate(m, start="random", seed=0, **kw)
    print(report)
    report.save(out / "random", format=fmt)

    # 3. informed start (ρ(0) of order one): no plateau; the ODE stays in the SGD band
    print("[3/3] validate from an informed start ...", flush=True)
    report = sq.validate(m, start="informed", seed=0, t_max=15.0, fss=False,
                         **{k: v for k, v in kw.items() if not k.startswith("fss")})
    print(report)
    report.save(out / "informed", format=fmt)
    print(f"reports written to {out.resolve()}; runtime {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    parser = sq.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small N and few replicas")
    parser.add_argument("--out", default=str(DEFAULT_OUT),
                        help=f"output folder (default ./{DEFAULT_OUT})")
    parser.add_argument("--format", choices=("png", "pdf", "svg"), default="png",
                        help="figure file format (pdf, svg: vector; default png)")
    args = parser.parse_args()
    raise SystemExit(sq.run_main(main, args.quick, args.out, args.format))

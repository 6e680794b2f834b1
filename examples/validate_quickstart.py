"""Validate the ODE theory against SGD simulations (plateau, escape, N^-1/2 scaling).

Run from the repository root::

    python examples/validate_quickstart.py            # about a minute on 2 cores
    python examples/validate_quickstart.py --quick    # a few seconds

It (1) simulates SGD with both simulators for a few steps and shows that they
give the same overlaps statistics, (2) runs :func:`symquad.validate` from a
random start (plateau and escape) and from an informed start, and writes both
reports (JSON + PNG) under ``./symquad_report_examples/``.
"""

import argparse

import numpy as np

import symquad as sq


def main(quick=False):
    m = sq.Model(p=4, p_star=2, lr=0.3)          # p > p*: overparameterised student

    # 1. the two simulators: same law, very different cost
    N, R = (200, 64) if quick else (2000, 256)
    for method in ("full", "reduced"):
        run = sq.simulate(m, N=N, t_max=2.0, replicas=R, seed=1, method=method)
        print(f"{method:8s} mean risk at t=2: {run.risk[:, -1].mean():.4f} "
              f"± {run.risk[:, -1].std() / np.sqrt(R):.4f}")

    # 2. ODE vs SGD from a random start: plateau, escape, spread of escape times
    kw = dict(N=300, replicas=8, fss_N=[50, 200, 800, 3200], fss_replicas=8,
              fss_t_max=3.0) if quick else dict(N=4000, replicas=64)
    report = sq.validate(m, start="random", seed=0, **kw)
    print(report)
    report.save("symquad_report_examples/random")

    # 3. informed start (ρ(0) of order one): no plateau; the ODE stays in the SGD band
    report = sq.validate(m, start="informed", seed=0, t_max=15.0, fss=False,
                         **{k: v for k, v in kw.items() if not k.startswith("fss")})
    print(report)
    report.save("symquad_report_examples/informed")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    main(parser.parse_args().quick)

"""Weight-space Hessian of the population risk at W = 0, the plateau and the minimum.

Exact spectra (``sq.hessian_spectrum``, from the risk of ``sq.derive``) drawn as
bars (N·eigenvalue, multiplicity), against the eigenvalues of the numeric Hessian of
the actual N-dimensional risk (``sq.weight_hessian`` at ``sq.critical_weights``,
crosses), for p < p*, p = p* and p > p* (docs/model.md §8.5). Titles give the
(negative, zero, positive) counts and the split of the zero modes into directions
tangent to the critical manifold and extra ones from overparameterisation.

    python examples/hessian_spectra.py [--N 12] [--out DIR] [--format png|pdf|svg]

Writes ``DIR/hessian_spectra.png`` (or ``.pdf``/``.svg``; default ``DIR``
``./symquad_examples/hessian_spectra``).
"""

import time
from pathlib import Path

import numpy as np

import symquad as sq

CASES = [(2, 3), (3, 3), (5, 3)]   # p < p*, p = p*, p > p*
POINTS = ("origin", "plateau", "minimum")
DEFAULT_OUT = Path("symquad_examples") / "hessian_spectra"
FORMATS = ("png", "pdf", "svg")


def main(N=12, out=DEFAULT_OUT, fmt="png"):
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for row, (p, k) in enumerate(CASES):
        m = sq.Model(p=p, p_star=k, lr=0.1)
        panels = []
        for point in POINTS:
            print(f"p={p} p*={k} {point}: exact spectrum and numeric {p * N}x{p * N} "
                  f"Hessian ...", flush=True)
            spec = sq.hessian_spectrum(m, point, N)
            W, Ws = sq.critical_weights(m, point, N, seed=row)
            ev = np.linalg.eigvalsh(sq.weight_hessian(m, W, Ws))
            err = np.max(np.abs(ev - spec.eigenvalues)) / np.max(np.abs(ev))
            panels.append({"model": m, "point": point, "spec": spec, "numeric": ev})
            print(f"  {spec!r}\n  max relative difference numeric vs exact: {err:.1e}")
        rows.append(panels)
    path = sq.save_figure(sq.hessian_spectra_figure(rows, N), out / f"hessian_spectra.{fmt}")
    print(f"wrote {path}; runtime {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    ap = sq.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, default=12, help="input dimension (default 12)")
    ap.add_argument("--out", default=str(DEFAULT_OUT),
                    help=f"output folder (default ./{DEFAULT_OUT})")
    ap.add_argument("--format", choices=FORMATS, default="png",
                    help="figure file format (pdf, svg: vector; default png)")
    a = ap.parse_args()
    raise SystemExit(sq.run_main(main, a.N, a.out, a.format))

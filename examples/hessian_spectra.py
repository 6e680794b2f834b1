"""Weight-space Hessian of the population risk at W = 0, the plateau and the minimum.

Exact spectra (``sq.hessian_spectrum``, from the risk of ``sq.derive``) drawn as
bars (N·eigenvalue, multiplicity), against the eigenvalues of the numeric Hessian of
the actual N-dimensional risk (``sq.weight_hessian`` at ``sq.critical_weights``,
crosses), for p < p*, p = p* and p > p* (docs/model.md §8.5). Titles give the
(negative, zero, positive) counts and the split of the zero modes into directions
tangent to the critical manifold and extra ones from overparameterisation.

    python examples/hessian_spectra.py [--N 12] [--out DIR]

Writes ``DIR/hessian_spectra.png`` (default ``./symquad_examples/hessian_spectra``).
"""

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import symquad as sq  # noqa: E402

CASES = [(2, 3), (3, 3), (5, 3)]   # p < p*, p = p*, p > p*
POINTS = ("origin", "plateau", "minimum")
DEFAULT_OUT = Path("symquad_examples") / "hessian_spectra"


def main(N=12, out=DEFAULT_OUT):
    start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(len(CASES), len(POINTS), figsize=(12, 8), sharey=False)
    for row, (p, k) in enumerate(CASES):
        m = sq.Model(p=p, p_star=k, lr=0.1)
        for col, point in enumerate(POINTS):
            print(f"p={p} p*={k} {point}: exact spectrum and numeric {p * N}x{p * N} "
                  f"Hessian ...", flush=True)
            ax = axes[row, col]
            spec = sq.hessian_spectrum(m, point, N)
            vals = np.array([float(v) for v in spec.exact]) * N
            mult = np.array(list(spec.exact.values()))
            W, Ws = sq.critical_weights(m, point, N, seed=row)
            ev = np.linalg.eigvalsh(sq.weight_hessian(m, W, Ws))
            err = np.max(np.abs(ev - spec.eigenvalues)) / np.max(np.abs(ev))
            u, c = np.unique(np.round(ev * N, 8), return_counts=True)
            ax.vlines(vals, 0, mult, color="C0", lw=3, alpha=0.6, label="exact (symbolic)")
            ax.plot(u, c, "rx", label="numeric N-dim Hessian")
            ax.axvline(0, color="k", lw=0.5)
            ax.set_title(f"p={p}, p*={k}, {point}: (−,0,+)={spec.counts}\n"
                         f"zero modes: {spec.tangent_zero_modes} tangent + "
                         f"{spec.extra_zero_modes} extra", fontsize=8)
            ax.set_xlabel("N · eigenvalue")
            ax.set_ylabel("multiplicity")
            print(f"  {spec!r}\n  max relative difference numeric vs exact: {err:.1e}")
            if row == 0 and col == 0:
                ax.legend(fontsize=7)
    fig.suptitle(f"Weight-space Hessian of the population risk (T = I, N = {N})")
    fig.tight_layout()
    path = out / "hessian_spectra.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}; runtime {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, default=12, help="input dimension (default 12)")
    ap.add_argument("--out", default=str(DEFAULT_OUT),
                    help=f"output folder (default ./{DEFAULT_OUT})")
    a = ap.parse_args()
    raise SystemExit(sq.run_main(main, a.N, a.out))

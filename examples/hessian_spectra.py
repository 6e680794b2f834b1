"""Hessian spectra of the population risk at W = 0, the plateau and the minimum.

Exact spectra (``sq.hessian_spectrum``, from the risk of ``sq.derive``) drawn as
eigenvalue-vs-multiplicity stems, overlaid with the eigenvalues of the numeric
Hessian of the actual N-dimensional risk (finite differences of the kernel risk
at randomly oriented critical weights); prints the counts and the zero modes.

    python examples/hessian_spectra.py [--N 12]
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import symquad as sq  # noqa: E402
from symquad.numeric import landscape as L  # noqa: E402
from symquad.symbolic import hessian as H  # noqa: E402

CASES = [(2, 3), (3, 3), (5, 3)]   # p < p*, p = p*, p > p*


def main(N=12, out=Path(__file__).resolve().parent / "figures" / "hessian_spectra.png"):
    fig, axes = plt.subplots(len(CASES), 3, figsize=(12, 8), sharey=False)
    for row, (p, k) in enumerate(CASES):
        m = sq.Model(p=p, p_star=k, lr=0.1)
        for col, point in enumerate(H.POINTS):
            ax = axes[row, col]
            blocks = H.hessian_blocks(m, point)
            spec = blocks.spectrum(N)
            vals = np.array([float(v) for v in spec]) * N
            mult = np.array(list(spec.values()))
            W, Ws = L.critical_weights(m, point, N, seed=row)
            ev = np.linalg.eigvalsh(L.weight_hessian(m, W, Ws)) * N
            u, c = np.unique(np.round(ev, 8), return_counts=True)
            ax.vlines(vals, 0, mult, color="C0", lw=3, alpha=0.6, label="exact (symbolic)")
            ax.plot(u, c, "rx", label="numeric N-dim Hessian")
            ax.axvline(0, color="k", lw=0.5)
            neg, zero, pos = blocks.counts(N)
            zm = blocks.zero_modes(N)
            ax.set_title(f"p={p}, p*={k}, {point}: (−,0,+)=({neg},{zero},{pos})\n"
                         f"zero modes: {zm['tangent']} tangent + {zm['extra']} extra",
                         fontsize=8)
            ax.set_xlabel("N · eigenvalue")
            ax.set_ylabel("multiplicity")
            print(f"p={p} p*={k} N={N} {point:8s} counts={blocks.counts(N)} zero modes={zm} "
                  f"spectrum N*λ: {dict(sorted(((float(v) * N, n) for v, n in spec.items())))}")
            if row == 0 and col == 0:
                ax.legend(fontsize=7)
    fig.suptitle(f"Weight-space Hessian of the population risk (T = I, N = {N})")
    fig.tight_layout()
    out.parent.mkdir(exist_ok=True)
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, default=12)
    main(ap.parse_args().N)

"""Stage 4b: the zero-risk manifold and its dimension p·p* − p*(p*+1)/2.

From the risk of ``symquad.derive``: ε = ½ tr(AC)² + tr((AC)²) (identity), hence
ε = ½(tr M)² + ‖M‖² with M = (WᵀW/p − W*ᵀW*/p*)/N, so ε = 0 ⇔ WᵀW/p = W*ᵀW*/p*.
In overlap space, at fixed T ≻ 0, the zero set is Z_T = {Φ_T = 0} with
Φ_T(Q, ρ) = (Q − ρT⁻¹ρᵀ, ρᵀρ − (p/p*)T²); dΦ_T is onto, so dim Z_T = dim ker dΦ_T.
Prints the statement as LaTeX (exact ranks) and checks the dimension numerically
(three maps: constraint, O(p) orbit, weights) for p up to 20; p < p*: Z_T is empty.

    python derivations/04_manifold.py [--p 3 --p-star 2] [--p-max 20]
"""

import argparse

from symquad.numeric.invariants import manifold_dimension, manifold_rank_deficiency
from symquad.symbolic.manifold import manifold_latex


def main(p=3, p_star=2, p_max=20):
    print(manifold_latex(p, p_star))
    print(manifold_latex(1, 2))
    rows = []
    for pp in range(1, p_max + 1):
        for k in sorted({1, max(1, pp // 2), pp}):
            d = manifold_rank_deficiency(pp, k, seed=pp * 100 + k)
            assert d["constraint"] == d["orbit"] == d["weights"] == manifold_dimension(pp, k)
            rows.append(f"{pp:3d} {k:3d} {d['formula']:5d} {d['constraint']:5d} "
                        f"{d['orbit']:5d} {d['weights']:5d}")
    print("%   p  p*  formula  ker dPhi  orbit  weights   (numeric, random manifold point)")
    print("\n".join("% " + r for r in rows))
    print("% numeric rank deficiencies == p p* - p*(p*+1)/2: OK")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=int, default=3)
    parser.add_argument("--p-star", type=int, default=2)
    parser.add_argument("--p-max", type=int, default=20)
    args = parser.parse_args()
    main(args.p, args.p_star, args.p_max)

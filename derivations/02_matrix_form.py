"""Stage 2: expectations of quadratic forms reduced to traces and matrix words.

Prints E[δ zzᵀ], E[δ² zzᵀ] and E[δ²] for δ = zᵀAz + κ − √Δ ξ, z = (λ, ν) ~ N(0, C),
as words in A (= diag(c a, −c* b), the readouts times the z² coefficients) and
C (= [[Q, ρ], [ρᵀ, T]]), the moment kinds read off the local polynomials, then
checks the block expansion against the entry-by-entry route, with the default and
with general readouts.

    python derivations/02_matrix_form.py
"""

import sympy as sp

from symquad import Model, derive
from symquad.symbolic.matrix_form import matrix_moments, word_level


def _show(words):
    return " + ".join(f"({sp.sstr(c)})·{''.join(w)}" for w, c in sorted(words.items()))


def main():
    words = word_level()
    print("E[δ zzᵀ]  =", _show(words["outer1"]))
    print("E[δ² zzᵀ] =", _show(words["outer2"]))
    print("E[δ]      =", words["scalar1"])
    print("ε         =", words["risk"])
    for kind, recipe in matrix_moments().items():
        print(f"moment {kind}:", recipe)
    models = [Model(p=p, p_star=k, lr=1.0) for p, k in [(1, 1), (2, 1), (2, 2), (3, 2)]]
    models.append(Model(p=2, p_star=2, lr=1.0, readout=(1, "1/3"), teacher_readout=(2, -1)))
    for m in models:
        a = derive(m, form="matrix").explicit()
        b = derive(m, form="entries").explicit()
        assert sp.expand(a[0] - b[0]) == 0
        assert (a[1] - b[1]).applyfunc(sp.expand).is_zero_matrix
        assert (a[2] - b[2]).applyfunc(sp.expand).is_zero_matrix
    print("matrix form == entry-by-entry form for (p, p*) in {(1,1), (2,1), (2,2), (3,2)} "
          "and general readouts: OK")


if __name__ == "__main__":
    main()

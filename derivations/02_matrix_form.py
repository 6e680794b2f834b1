"""Stage 2: expectations of quadratic forms reduced to traces and matrix words.

Prints E[δ zzᵀ], E[δ² zzᵀ] and E[δ²] for δ = zᵀAz − √Δ ξ, z = (λ, ν) ~ N(0, C),
as words in A (= diag(I/p, −I/p*)), B (= diag(I/p, 0)) and C (= [[Q, ρ], [ρᵀ, T]]),
then checks the block expansion against the entry-by-entry route.

    python derivations/02_matrix_form.py
"""

import sympy as sp

from symquad import Model, derive
from symquad.symbolic.matrix_form import _expect_error_power_outer
from symquad.symbolic.quadforms import expect_forms


def _show(words):
    return " + ".join(f"({sp.sstr(c)})·{''.join(w)}" for w, c in sorted(words.items()))


def main():
    print("E[δ zzᵀ]  =", _show(_expect_error_power_outer(1)))
    print("E[δ² zzᵀ] =", _show(_expect_error_power_outer(2)))
    print("E[(zᵀAz)²] =", expect_forms([("A",), ("A",)]))
    for p, k in [(1, 1), (2, 1), (2, 2), (3, 2)]:
        m = Model(p=p, p_star=k, lr=1.0)
        a = derive(m, form="matrix").explicit()
        b = derive(m, form="entries").explicit()
        assert sp.expand(a[0] - b[0]) == 0
        assert (a[1] - b[1]).applyfunc(sp.expand).is_zero_matrix
        assert (a[2] - b[2]).applyfunc(sp.expand).is_zero_matrix
    print("matrix form == entry-by-entry form for (p, p*) in {(1,1), (2,1), (2,2), (3,2)}: OK")


if __name__ == "__main__":
    main()

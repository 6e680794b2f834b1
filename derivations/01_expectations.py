"""Stage 1: Gaussian expectations of monomials in the local fields (Wick/Isserlis).

Derives and prints E[monomial] for the fields (λ_1..λ_p, ν_1..ν_p*) of a model
with symbolic covariance [[Q, ρ], [ρᵀ, T]], and cross-checks the engine against
sympy.stats on fields written as combinations of independent normals.

    python derivations/01_expectations.py [--p 2 --p-star 1]
"""

import argparse

import sympy as sp
from sympy import stats

from symquad import Model
from symquad.symbolic.entries import model_fields
from symquad.symbolic.symbols import latex_names
from symquad.symbolic.wick import GaussianFields


def main(p=2, p_star=1):
    model = Model(p=p, p_star=p_star, lr=1.0)
    fields = model_fields(model)
    lam = fields.fields[:p]
    nu = fields.fields[p:p + p_star]
    names = latex_names(p, p_star)
    examples = [lam[0] ** 2, lam[0] ** 2 * nu[0] ** 2, lam[0] ** 4 * nu[0] ** 2,
                lam[-1] ** 2 * lam[0] * nu[-1]]
    for expr in examples:
        value = fields.expectation(expr)
        print(f"E[{sp.latex(expr, symbol_names=names)}] = {sp.latex(value, symbol_names=names)}")

    # cross-check: z = L g with independent g ~ N(0, 1), covariance L Lᵀ
    a, b, c = sp.symbols("a b c", real=True)
    L = sp.Matrix([[a, 0], [b, c]])
    g = sp.Matrix([stats.Normal("g1", 0, 1), stats.Normal("g2", 0, 1)])
    z = L * g
    x, y = sp.symbols("x y")
    engine = GaussianFields((x, y), L * L.T)
    for i, j in [(2, 2), (3, 1), (4, 0)]:
        via_stats = sp.expand(stats.E(sp.expand(z[0] ** i * z[1] ** j)))
        assert sp.expand(engine.moment((i, j)) - via_stats) == 0
    print("cross-check against sympy.stats: OK")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=int, default=2)
    parser.add_argument("--p-star", type=int, default=1)
    args = parser.parse_args()
    main(args.p, args.p_star)

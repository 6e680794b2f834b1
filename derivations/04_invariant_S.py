"""Stage 4a: implicit bias — when is S = ρ(ρᵀρ)^{-1/2} conserved by the ODEs?

Proves with SymPy, from ``symquad.derive`` (η and Δ symbolic, so the η² term and the
label noise are included), that S is conserved exactly on the invariant set

    I_T = {rank ρ = p*, [Q, SSᵀ] = 0, SᵀQS, ρᵀρ, T commute pairwise},

prints the statement, the proof steps and exact counterexamples as LaTeX, and
cross-checks by a second route: the exact dS/dt of each counterexample against the
generated numpy kernel + numeric polar derivative, and conservation along
``sq.integrate`` from a random point of I_T (and its failure off I_T).

    python derivations/04_invariant_S.py [--p 3 --p-star 2]
"""

import argparse

import numpy as np
import sympy as sp

import symquad as sq
from symquad.numeric import invariants as ninv
from symquad.symbolic.invariants import ode_explicit, prove_conservation


def main(p=3, p_star=2):
    model = sq.Model(p=p, p_star=p_star, lr=0.1, noise=0.25)
    proof = prove_conservation(model)
    print(proof.latex())

    # second route 1: exact counterexample dS/dt == kernels + numeric polar derivative
    eta = ode_explicit(model)[3]
    for ce in proof.counterexamples:
        exact = np.array(ce["dS"].subs(eta, sp.nsimplify(model.eta)), dtype=float)
        numeric = ninv.dS_dt(model, *(np.array(ce[k], dtype=float) for k in ("Q", "rho", "T")))
        assert np.allclose(exact, numeric, rtol=0, atol=1e-12), ce["name"]
        print(f"% counterexample '{ce['name']}': exact dS/dt == numeric "
              f"(max |dS/dt| = {np.abs(exact).max():.3g})")

    # second route 2: integrate from a random point of I_T, and from one off it
    rng = np.random.default_rng(0)
    Q0, rho0, T = ninv.invariant_set_point(p, p_star, rng)
    sol = sq.integrate(model, Q0, rho0, T, t_max=200, rtol=1e-9, atol=1e-12)
    drift_in = np.abs(sq.invariant_S(sol.rho) - sq.invariant_S(rho0)).max()
    print(f"% ODE from a random point of I_T: max_t |S(t) - S(0)| = {drift_in:.2e}")
    assert drift_in < 1e-10
    if proof.counterexamples:
        ce = proof.counterexamples[0]
        Q1, rho1, T1 = (np.array(ce[k], dtype=float) for k in ("Q", "rho", "T"))
        sol = sq.integrate(model, Q1, rho1, T1, t_max=200, rtol=1e-9, atol=1e-12)
        drift_out = np.abs(sq.invariant_S(sol.rho) - sq.invariant_S(rho1)).max()
        print(f"% ODE from counterexample '{ce['name']}': max_t |S(t) - S(0)| = "
              f"{drift_out:.2e}")
        assert drift_out > 1e-3
    print("% second routes: OK")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=int, default=3)
    parser.add_argument("--p-star", type=int, default=2)
    args = parser.parse_args()
    main(args.p, args.p_star)

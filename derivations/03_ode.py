"""Stage 3: the ODEs and the risk, derived from the network, the loss and the SGD step.

Prints the per-sample increments N ΔQ, N Δρ of one SGD step (from the update
rule w_k ← w_k − η ∂ℓ/∂w_k − (ηλ/N) w_k, symquad.symbolic.update), the drift in
moment form, then the risk and the ODEs as LaTeX, and checks the generated
kernel against the derivation at a random point.

    python derivations/03_ode.py [--p 3 --p-star 2 --form matrix|entries]
"""

import argparse

import numpy as np
import sympy as sp

import symquad as sq
from symquad.symbolic.moments import moment_drift
from symquad.symbolic.network import network
from symquad.symbolic.update import increments


def main(p=3, p_star=2, form=None):
    model = sq.Model(p=p, p_star=p_star, lr=0.25, noise=0.1)
    net = network(model)
    dQ_inc, drho_inc, _ = increments(model)
    md = moment_drift(model)
    print("loss ℓ =", net.loss)
    print("per sample: N ΔQ_kl =", dQ_inc)
    print("per sample: N Δρ_km =", drho_inc)
    print("drift: dQ_kl/dt =", md.dQ)
    print("drift: dρ_km/dt =", md.drho)
    eq = sq.derive(model, form=form)
    print(eq.latex())

    risk, dQ, drho = eq.explicit()
    Qs, Rs, Ts = eq.entry_symbols
    rng = np.random.default_rng(0)
    G = rng.standard_normal((p + p_star, p + p_star + 2))
    C = G @ G.T / (p + p_star + 2)
    Q, rho, T = C[:p, :p], C[:p, p:], C[p:, p:]
    values = {eq.eta: model.eta, eq.noise: model.noise}
    for M, A in ((Qs, Q), (Rs, rho), (Ts, T)):
        values.update({M[i, j]: A[i, j] for i in range(M.rows) for j in range(M.cols)})
    dQ_num = np.array(dQ.subs(values), dtype=float)
    dQ_kernel, _ = sq.kernels(model).rhs(Q, rho, T)
    assert np.allclose(dQ_kernel, dQ_num, rtol=1e-12, atol=1e-12)
    print("generated kernel == derivation at a random point: OK")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=int, default=3)
    parser.add_argument("--p-star", type=int, default=2)
    parser.add_argument("--form", choices=("matrix", "entries"))
    args = parser.parse_args()
    main(args.p, args.p_star, args.form)

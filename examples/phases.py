"""The three phases of learning from a random start (docs/model.md §8.1), from the ODEs.

Integrates the default model from Q0 = I and ρ0 with entries of size 1/√N and
plots the risk, the student norms (diagonal of Q) and the teacher overlaps |ρ|:
norm learning, a long plateau at the gradient-flow plateau risk, then the escape.

    python examples/phases.py [--N 1e6] [--t-max 600] [--out phases.png]
"""

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import symquad as sq  # noqa: E402


def main(N=1e6, t_max=600.0, out="phases.png", seed=0):
    m = sq.DEFAULT_MODEL
    rng = np.random.default_rng(seed)
    rho0 = rng.standard_normal((m.p, m.p_star)) / np.sqrt(N)
    sol = sq.integrate(m, np.eye(m.p), rho0, np.eye(m.p_star), t_max,
                       t_eval=np.linspace(0, t_max, 2001))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    axes[0].semilogy(sol.t, sol.risk)
    axes[0].set(xlabel="t = steps / N", ylabel="risk ε",
                title=f"p={m.p}, p*={m.p_star}, lr={m.lr}")
    for i in range(m.p):
        axes[1].plot(sol.t, sol.Q[:, i, i], label=f"$Q_{{{i + 1}{i + 1}}}$")
    axes[1].set(xlabel="t", ylabel="student norms", title="norm learning")
    axes[1].legend(fontsize=7)
    for i in range(m.p):
        for k in range(m.p_star):
            axes[2].semilogy(sol.t, np.abs(sol.rho[:, i, k]) + 1e-16)
    axes[2].set(xlabel="t", ylabel=r"$|\rho_{ik}|$", title="teacher overlaps: plateau, escape")
    fig.suptitle(f"ODE from Q0 = I, ρ0 ~ N^(-1/2) with N = {N:.0e}")
    fig.savefig(out, dpi=120)
    print(f"wrote {out}; final risk {sol.risk[-1]:.3g}")
    return sol


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--N", type=float, default=1e6)
    parser.add_argument("--t-max", type=float, default=600.0)
    parser.add_argument("--out", default="phases.png")
    args = parser.parse_args()
    main(args.N, args.t_max, args.out)

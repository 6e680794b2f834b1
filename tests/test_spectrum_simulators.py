"""Simulators with an input spectrum (issue 24, step 4): the reduced law, the full law, the ODE.

* **One reduced step is the literal N-dimensional step** (``tests/literal_sgd.py``, numpy
  from the definitions) on weights and inputs built from the same numbers: an explicit
  orthonormal basis of every block, ``P_c x^μ = √s_c (E_c g^μ_c + E'_c L^c_μ)``; the
  per-block Gram matrices agree to round-off (sphere, weight decay, batch, trained
  readout, noise included).
* **The reduced simulator has the law of full SGD** with ``x ~ N(0, Σ)``: two-sample
  Kolmogorov–Smirnov tests on the risk and per-block statistics (``tr Q^c``, ``Q^c_12``,
  ``|ρ^c|²``, ``ρ^c_11``) at three times, Bonferroni at family level 0.01; power: the
  reduced simulator with the eigenvalues in the other order is rejected.
* **The ODE against SGD** from an informed per-block start: the replicas' mean risk lies
  within its standard errors of the block ODE (after asserting the errors are small),
  while the isotropic ODE from the same total overlaps is rejected on the same data;
  the reduced simulator at ``N = 1000`` in the default run, full SGD at ``N = 1000`` in the
  slow run.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ks_2samp, norm

import symquad as sq
import symquad.numeric.simulate as simmod
from literal_sgd import literal_step
from spectrum_mc import informed_block_start
from symquad.spectrum import block_sizes

ALPHA = 0.01
SPECTRUM = "1/4:2,3/4:1/2"


# --------------------------------------------------------------------------- one step
@pytest.mark.parametrize("fields", [
    dict(),
    dict(constraint="sphere", weight_decay=0.3, batch_size=3, noise=0.2, lr_readout=0.4,
         readout=(0.5, -0.2, 0.3)),
    dict(activation="z**3 - 3*z", teacher_activation="z**2 + z", batch_size=2,
         loss="correlation", constraint="sphere"),
])
def test_one_reduced_step_is_the_literal_step_with_those_inputs(fields):
    m = sq.Model(3, 2, 0.7, spectrum="1/3:2,1/6:1,1/2:1/3", **fields)
    N, R = 48, 2
    rng = np.random.default_rng(3)
    X0, T = simmod._block_initial_coordinates(m, N, R, None, None, None, rng)
    st = simmod._BlockReducedStepper(m, N, R, X0, rng, rng, rng)
    a0 = st.readout()
    B, n, b = m.n_blocks, m.p + m.p_star, m.batch_size
    g = rng.standard_normal((R, B, b, n))
    L = np.tril(rng.standard_normal((R, B, b, b)))
    xi = 0.3 * rng.standard_normal((R, b)) if m.noise else None
    sizes = block_sizes(m.spectrum, N)
    cuts = np.cumsum((0,) + sizes)
    scales = np.sqrt([float(s) for _, s in m.spectrum])
    frames = [np.linalg.qr(rng.standard_normal((size, n + b)))[0] for size in sizes]
    st.apply(g, L, xi)
    Q_red, rho_red = st.gram()
    for r in range(R):
        W = np.zeros((m.p, N))
        Ws = np.zeros((m.p_star, N))
        x = np.zeros((b, N))
        for c in range(B):
            E = frames[c]
            W[:, cuts[c]:cuts[c + 1]] = np.sqrt(N) * X0[r, c, :m.p] @ E[:, :n].T
            Ws[:, cuts[c]:cuts[c + 1]] = np.sqrt(N) * X0[r, c, m.p:] @ E[:, :n].T
            x[:, cuts[c]:cuts[c + 1]] = scales[c] * (g[r, c] @ E[:, :n].T + L[r, c] @ E[:, n:].T)
        noise = (xi[r] / np.sqrt(m.noise)) if xi is not None else np.zeros(b)
        W1, a1 = literal_step(m, W, Ws, x, noise, a0[r])
        for c in range(B):
            Wc, Wsc = W1[:, cuts[c]:cuts[c + 1]], Ws[:, cuts[c]:cuts[c + 1]]
            np.testing.assert_allclose(Q_red[r, c], Wc @ Wc.T / N, rtol=0, atol=1e-12)
            np.testing.assert_allclose(rho_red[r, c], Wc @ Wsc.T / N, rtol=0, atol=1e-12)
        np.testing.assert_allclose(st.readout()[r], a1, rtol=0, atol=1e-14)


def test_block_simulators_need_room_in_every_block():
    m = sq.Model(3, 2, 0.1, spectrum="1/8:2,7/8:1")
    with pytest.raises(ValueError, match="every block needs at least p \\+ p_star \\+ "
                                         "batch_size = 6"):
        sq.simulate(m, N=40, t_max=0.1, replicas=2)
    with pytest.raises(ValueError, match="N must be a multiple of 8"):
        sq.simulate(m, N=100, t_max=0.1, replicas=2)


def test_same_seed_same_numbers():
    m = sq.Model(2, 1, 0.2, spectrum=SPECTRUM, batch_size=2)
    for method in ("reduced", "full"):
        a = sq.simulate(m, N=40, t_max=0.5, replicas=3, seed=7, method=method)
        b = sq.simulate(m, N=40, t_max=0.5, replicas=3, seed=7, method=method)
        np.testing.assert_array_equal(a.Q, b.Q)
        assert a.Q.shape == (3, len(a.t), 2, 2, 2) and a.T.shape == (2, 1, 1)


# --------------------------------------------------------------------------- the laws
def statistics(run, times):
    out = {}
    for t in times:
        i = int(np.argmin(np.abs(run.t - t)))
        tag = f"(t={run.t[i]:g})"
        out["risk" + tag] = run.risk[:, i]
        for c in range(run.Q.shape[2]):
            Q, rho = run.Q[:, i, c], run.rho[:, i, c]
            if run.model.constraint != "sphere":
                out[f"trQ{c}" + tag] = np.trace(Q, axis1=1, axis2=2)
            out[f"Q{c}_12" + tag] = Q[:, 0, 1]
            out[f"|rho{c}|^2" + tag] = np.sum(rho ** 2, axis=(1, 2))
            out[f"rho{c}_11" + tag] = rho[:, 0, 0]
    return out


def pvalues(a, b, times):
    sa, sb = statistics(a, times), statistics(b, times)
    return {k: ks_2samp(sa[k], sb[k]).pvalue for k in sa}


def _laws(fields, N, replicas, t_max, seed):
    m = sq.Model(3, 2, 0.1, spectrum=SPECTRUM, **fields)
    common = dict(N=N, t_max=t_max, replicas=replicas, t_eval=np.linspace(0, t_max, 4))
    full = sq.simulate(m, method="full", seed=seed, **common)
    red = sq.simulate(m, method="reduced", seed=seed + 1, **common)
    times = full.t[1:]
    pv = pvalues(red, full, times)
    assert min(pv.values()) > ALPHA / len(pv), sorted(pv.items(), key=lambda kv: kv[1])[:3]
    wrong = sq.simulate(m.replace(spectrum="1/4:1/2,3/4:2"), method="reduced", seed=seed + 2,
                        **common)
    pw = pvalues(wrong, full, times)
    assert min(pw.values()) < ALPHA / len(pw)          # power: a wrong spectrum is rejected


def test_the_reduced_simulator_has_the_law_of_full_sgd():
    _laws(dict(noise=0.1), N=120, replicas=400, t_max=3.0, seed=11)


@pytest.mark.slow
@pytest.mark.parametrize("fields", [
    dict(constraint="sphere", weight_decay=0.3, batch_size=3, lr_readout=0.3, noise=0.2),
    dict(activation="erf", teacher_activation="z**2 + z"),
])
def test_the_reduced_simulator_has_the_law_of_full_sgd_slow(fields):
    _laws(fields, N=200, replicas=1000, t_max=3.0, seed=13)


# --------------------------------------------------------------------------- the ODE

def _ode_against_sgd(method, N, replicas, seed):
    m = sq.Model(3, 2, 0.3, spectrum=SPECTRUM, noise=0.05)
    Q0, rho0, T = informed_block_start(m)
    t = np.linspace(0.0, 4.0, 9)
    run = sq.simulate(m, N=N, t_max=4.0, replicas=replicas, seed=seed, method=method,
                      Q0=Q0, rho0=rho0, T=T, t_eval=t)
    ode = sq.integrate(m, Q0, rho0, T, 4.0, t_eval=run.t)
    mean = run.risk.mean(0)
    se = run.risk.std(0, ddof=1) / np.sqrt(replicas)
    # precision: the standard errors are small against the risk's own decrease
    assert se[1:].max() < 0.1 * (ode.risk[0] - ode.risk[-1])
    z_max = norm.isf(ALPHA / (2 * (len(t) - 1)))
    z = (mean[1:] - ode.risk[1:]) / se[1:]
    assert np.abs(z).max() < z_max, z
    # the isotropic ODE from the same total overlaps (Σ_c Q^c, …) fails the same data
    iso = sq.integrate(m.replace(spectrum="1:1"), Q0.sum(0), rho0.sum(0), T.sum(0), 4.0,
                       t_eval=run.t)
    z_iso = (mean[1:] - iso.risk[1:]) / se[1:]
    assert np.abs(z_iso).max() > z_max, z_iso
    # ... and so does the isotropic ODE started from the fields' covariance Ω (the same
    # risk at t = 0: only the dynamics differ)
    w = np.array([float(x) for _, x in m.spectrum])[:, None, None]
    omega = sq.integrate(m.replace(spectrum="1:1"), (w * Q0).sum(0), (w * rho0).sum(0),
                         (w * T).sum(0), 4.0, t_eval=run.t)
    assert omega.risk[0] == pytest.approx(ode.risk[0], rel=1e-12)
    z_omega = (mean[1:] - omega.risk[1:]) / se[1:]
    assert np.abs(z_omega).max() > z_max, z_omega
    return z, z_iso, z_omega


def test_the_block_ode_follows_reduced_sgd_at_n_1000():
    _ode_against_sgd("reduced", 1000, 64, 21)


@pytest.mark.slow
def test_the_block_ode_follows_full_sgd_at_n_1000():
    _ode_against_sgd("full", 1000, 64, 23)

"""Conversions to the τ clock and to un-normalised outputs (symquad.conventions).

Two independent routes: (1) SGD with un-normalised outputs written here from its
definition, step by step against SGD in symquad's convention on the rescaled
weights (exact, to rounding); (2) the same un-normalised SGD at N = 500,
recorded on the τ clock, against symquad's ODE converted back with
``t_from_tau`` and ``overlaps_to_unnormalised`` (statistical).
"""

import numpy as np
import pytest

import symquad as sq


@pytest.mark.parametrize("lr_scaling", ["fixed", "width"])
def test_time_round_trip_and_value(lr_scaling):
    m = sq.Model(p=4, p_star=2, lr=0.1, lr_scaling=lr_scaling)
    t = np.array([0.0, 1.5, 200.0])
    tau = sq.tau_from_t(m, t)
    assert np.allclose(tau, t * m.eta / 4)            # τ = steps·η/(pN) with t = steps/N
    assert np.allclose(sq.t_from_tau(m, tau), t, rtol=1e-15)
    assert np.isclose(sq.rate_per_tau(m, 0.5), 0.5 * 4 / m.eta)
    # the un-normalised clock uses the other code's learning rate η' = η/p
    assert np.allclose(sq.tau_from_t(m, t, unnormalised=True), t * (m.eta / 4) / 4)


def test_model_and_overlaps_round_trip():
    m = sq.from_unnormalised(3, 2, 0.05, noise=0.01)
    assert m.eta == pytest.approx(3 * 0.05) and m.noise == 0.01
    back = sq.to_unnormalised(m)
    assert back["lr"] == pytest.approx(0.05) and (back["p"], back["p_star"]) == (3, 2)
    assert sq.from_unnormalised(**back) == m
    rng = np.random.default_rng(0)
    Q, rho, T = rng.standard_normal((5, 3, 3)), rng.standard_normal((5, 3, 2)), np.eye(2)
    Qs, rhos, Ts = sq.overlaps_from_unnormalised(m, Q, rho, T)
    assert np.allclose(Qs, 3 * Q) and np.allclose(rhos, np.sqrt(6) * rho) and np.allclose(Ts, 2 * T)
    for a, b in zip(sq.overlaps_to_unnormalised(m, Qs, rhos, Ts), (Q, rho, T)):
        assert np.allclose(a, b, rtol=1e-14)
    # a cubic activation rescales with p^(1/3)
    m3 = sq.from_unnormalised(2, 1, 0.01, activation=(0, 0, 0, 1))
    assert m3.eta == pytest.approx(0.01 * 2 ** (2 / 3))


def test_bad_input():
    with pytest.raises(ValueError, match="homogeneous"):
        sq.from_unnormalised(2, 1, 0.1, activation=(0, 1, 1))
    m = sq.Model(p=2, p_star=1, lr=0.1)
    with pytest.raises(ValueError, match="rho"):
        sq.overlaps_from_unnormalised(m, np.eye(2), np.zeros((2, 2)), np.eye(1))
    with pytest.raises(ValueError, match="t must be finite"):
        sq.tau_from_t(m, -1.0)
    with pytest.raises(TypeError):
        sq.tau_from_t("model", 1.0)


def _unnormalised_sgd(W, Ws, lr, steps, rng, record=()):
    """Un-normalised SGD, ŷ = Σ λ², y = Σ ν²; W (R, p, N); returns overlaps at `record`."""
    N = W.shape[-1]
    out = {}
    for s in range(steps + 1):
        if s in record:
            out[s] = (W @ W.swapaxes(-1, -2) / N, W @ Ws.T / N)
        if s == steps:
            break
        x = rng.standard_normal((W.shape[0], N))
        lam = np.einsum("rkn,rn->rk", W, x) / np.sqrt(N)
        nu = x @ Ws.T / np.sqrt(N)
        delta = (lam**2).sum(-1) - (nu**2).sum(-1)
        W = W - lr * (delta[:, None, None] * 2 * lam[:, :, None]) * x[:, None, :] / np.sqrt(N)
    return W, out


def test_unnormalised_sgd_is_symquad_sgd_on_rescaled_weights():
    """Step by step, same inputs: the map of weights and learning rate is exact."""
    p, k, N, lr, steps = 3, 2, 40, 0.02, 300
    m = sq.from_unnormalised(p, k, lr)
    rng = np.random.default_rng(1)
    W0, Ws = rng.standard_normal((1, p, N)), rng.standard_normal((k, N))
    Wu, _ = _unnormalised_sgd(W0, Ws, lr, steps, np.random.default_rng(7))
    # symquad's convention, written from docs/model.md §1-§2 on w~ = √p w', w~* = √p* w*'
    W, Wst = np.sqrt(p) * W0[0], np.sqrt(k) * Ws
    data = np.random.default_rng(7)
    for _ in range(steps):
        x = data.standard_normal((1, N))[0]
        lam, nu = W @ x / np.sqrt(N), Wst @ x / np.sqrt(N)
        delta = (lam**2).sum() / p - (nu**2).sum() / k
        W = W - m.eta * (delta * 2 * lam / p)[:, None] * x[None, :] / np.sqrt(N)
    Q, rho, _ = sq.overlaps_from_unnormalised(m, Wu[0] @ Wu[0].T / N, Wu[0] @ Ws.T / N,
                                              Ws @ Ws.T / N)
    assert np.abs(Q - W @ W.T / N).max() < 1e-10 * np.abs(Q).max()
    assert np.abs(rho - W @ Wst.T / N).max() < 1e-10 * np.abs(rho).max()
    assert np.abs(Q - np.eye(p)).max() > 0.1          # the weights did move


def test_unnormalised_sgd_on_tau_clock_follows_converted_ode():
    """Un-normalised SGD recorded at τ = steps·η'/(pN) against symquad's ODE, converted back."""
    p, k, N, lr, R = 2, 1, 500, 0.1, 12
    m = sq.from_unnormalised(p, k, lr)
    rng = np.random.default_rng(3)
    Ws = rng.standard_normal((k, N))
    Ws *= np.sqrt(N) / np.linalg.norm(Ws, axis=1, keepdims=True)    # T' = I
    # informed start: each student row 0.3 w* + independent noise of variance 0.5
    W0 = 0.3 * Ws[None, :, :].repeat(p, 1) + np.sqrt(0.5) * rng.standard_normal((R, p, N))
    taus = np.array([0.0, 0.25, 0.5, 1.0])
    steps = np.round(sq.t_from_tau(m, taus, unnormalised=True) * N).astype(int)
    assert np.allclose(steps, taus * p * N / lr)
    _, rec = _unnormalised_sgd(W0, Ws, lr, int(steps[-1]), rng, record=set(steps))
    Qu = np.stack([rec[s][0] for s in steps], 1)          # (R, n, p, p)
    ru = np.stack([rec[s][1] for s in steps], 1)
    # ODE per replica from its realised start, in symquad's units, then back
    T = np.eye(k)
    Q0, r0, T0 = sq.overlaps_from_unnormalised(m, Qu[:, 0], ru[:, 0], T)
    t_eval = steps / N
    dev = []
    for r in range(R):
        sol = sq.integrate(m, Q0[r], r0[r], T0, t_eval[-1], t_eval=t_eval)
        Qo, ro, _ = sq.overlaps_to_unnormalised(m, sol.Q, sol.rho, T0)
        dev.append(np.concatenate([(Qu[r] - Qo).reshape(len(taus), -1),
                                   (ru[r] - ro).reshape(len(taus), -1)], 1))
    dev = np.array(dev)                                   # (R, n, entries)
    mean, se = dev.mean(0), dev.std(0, ddof=1) / np.sqrt(R)
    assert se[1:].max() < 0.05                            # precision of the check
    assert np.abs(Qu[:, -1, 0, 1] - Qu[:, 0, 0, 1]).mean() > 0.2   # the overlaps did move
    z = np.abs(mean[1:]) / se[1:]
    assert z.max() < 5, z

"""Two-sample tests: the reduced simulator has the law of full SGD.

For each configuration, ``R`` replicas of each simulator are run at small ``N``
and the empirical distributions of the risk and of several overlap entries at
several times are compared by Kolmogorov–Smirnov tests
(:func:`scipy.stats.ks_2samp`).  Multiple testing: with ``m`` tests the family is
rejected when the smallest p-value is below ``α/m`` (Bonferroni, family-wise
level ``α = 0.01``), so a correct simulator fails with probability <= 1 %.
The power check runs the same family against a deliberately wrong reduced
simulator (no chi-square part: the input is replaced by its projection on the
span of the weights, so ``‖x‖²/N`` loses its out-of-span part) and requires the
family to be rejected.
"""

import numpy as np
import pytest
from scipy.stats import ks_2samp

import symquad as sq
from symquad.numeric.simulate import simulate

ALPHA = 0.01
REPLICAS = 600


def _statistics(run, times):
    """Named samples (over replicas) at the recorded times closest to `times`."""
    out = {}
    p, ps = run.model.p, run.model.p_star
    for t in times:
        i = int(np.argmin(np.abs(run.t - t)))
        out[f"risk(t={run.t[i]:g})"] = run.risk[:, i]
        out[f"Q11(t={run.t[i]:g})"] = run.Q[:, i, 0, 0]
        if p > 1:
            out[f"Q12(t={run.t[i]:g})"] = run.Q[:, i, 0, 1]
        out[f"rho11(t={run.t[i]:g})"] = run.rho[:, i, 0, 0]
        out[f"rho_last(t={run.t[i]:g})"] = run.rho[:, i, p - 1, ps - 1]
    return out


def _family_pvalues(a, b, times):
    sa, sb = _statistics(a, times), _statistics(b, times)
    return {k: ks_2samp(sa[k], sb[k]).pvalue for k in sa}


CONFIGS = {
    # default-like quadratic network from a random start, with label noise
    "random-start": dict(model=sq.Model(p=3, p_star=2, lr=0.2, noise=0.2), N=30,
                         t_max=6.0, kwargs={}),
    # singular initial Gram matrix (W = 0) and a non-quadratic activation,
    # general teacher overlaps
    "singular-start": dict(model=sq.Model(p=2, p_star=2, lr=0.2, noise=0.1,
                                          activation=(0, 1, 1)),
                           N=20, t_max=3.0,
                           kwargs=dict(Q0=np.zeros((2, 2)), rho0=np.zeros((2, 2)),
                                       T=np.array([[1.0, 0.4], [0.4, 0.6]]))),
}


def _runs(cfg, replicas, seed, residual=True):
    common = dict(N=cfg["N"], t_max=cfg["t_max"], replicas=replicas,
                  t_eval=np.linspace(0, cfg["t_max"], 7), **cfg["kwargs"])
    full = simulate(cfg["model"], method="full", seed=seed, **common)
    red = simulate(cfg["model"], method="reduced", seed=seed + 1, _residual=residual, **common)
    return full, red


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_reduced_matches_full_in_law(name):
    cfg = CONFIGS[name]
    full, red = _runs(cfg, replicas=REPLICAS, seed=100)
    times = [cfg["t_max"] / 3, 2 * cfg["t_max"] / 3, cfg["t_max"]]
    pvals = _family_pvalues(full, red, times)
    worst = min(pvals, key=pvals.get)
    assert pvals[worst] > ALPHA / len(pvals), (
        f"{name}: {worst} differs (p = {pvals[worst]:.2e} < {ALPHA}/{len(pvals)})")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_power_wrong_reduced_variant_is_rejected(name):
    cfg = CONFIGS[name]
    full, wrong = _runs(cfg, replicas=REPLICAS, seed=100, residual=False)
    times = [cfg["t_max"] / 3, 2 * cfg["t_max"] / 3, cfg["t_max"]]
    pvals = _family_pvalues(full, wrong, times)
    assert min(pvals.values()) < ALPHA / len(pvals), (
        f"{name}: the test has no power against the variant without the chi-square part "
        f"(smallest p = {min(pvals.values()):.2e})")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_reduced_matches_full_in_law_large(name):
    """More replicas and a larger N (slow)."""
    cfg = dict(CONFIGS[name])
    cfg["N"] = 200
    full, red = _runs(cfg, replicas=1500, seed=7)
    times = [cfg["t_max"] / 3, 2 * cfg["t_max"] / 3, cfg["t_max"]]
    pvals = _family_pvalues(full, red, times)
    worst = min(pvals, key=pvals.get)
    assert pvals[worst] > ALPHA / len(pvals), (
        f"{name}: {worst} differs (p = {pvals[worst]:.2e})")


def test_wrong_variant_is_private():
    import inspect
    params = inspect.signature(simulate).parameters
    assert all(not name.lstrip("_").startswith("residual") or name.startswith("_")
               for name in params)
    assert "residual" not in params

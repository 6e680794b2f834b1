import math
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import symquad as sq
from symquad.numeric.ode_batch import integrate_batch


def test_the_batched_solver_gives_the_same_bits_for_any_blas_thread_count():
    # the escape law's first chunk in the sweep benchmark (p = 5, 384 starts, 6000 times)
    # differed in the last bit between the main process (2 BLAS threads) and a Dask worker
    # (1 thread): the solver's stage sums and dense output ran on the user's BLAS threads;
    # this smaller batch (384 starts, 1000 times to t = 10) differed the same way
    m = sq.Model(p=5, p_star=1, lr=0.1, lr_scaling="width")
    B, t_max = 384, 10.0
    Q0 = np.broadcast_to(np.eye(5), (B, 5, 5)).copy()
    rho0 = 1e-4 * np.random.default_rng(3).standard_normal((B, 5, 1))
    t_eval = np.linspace(0.0, t_max, 1000)
    runs = []
    for threads in (2, 1):
        with threadpool_limits(threads, user_api="blas"):
            runs.append(integrate_batch(m, Q0, rho0, np.eye(1), t_max, t_eval=t_eval))
    for name in ("Q", "rho", "risk"):
        assert np.array_equal(getattr(runs[0], name), getattr(runs[1], name), equal_nan=True), name


def test_the_spheres_second_order_evaluates_d_on_the_kernels_blas_threads(monkeypatch):
    # second_order on the sphere reads the unconstrained D^u; it called the diffusion
    # function directly, outside the kernels' BLAS limit, so a user's thread count reached
    # D's products there (and their rounding) while the LNA's evaluation of D was limited
    import threadpoolctl
    from symquad.numeric import kernels as kmod

    m = sq.Model(p=3, p_star=2, lr=0.3, noise=0.1, constraint="sphere")
    k = sq.kernels(m, form="tensor")
    assert k.threads == 1
    seen = []
    original = kmod._diffusion_function

    def spying(*args, **kwargs):
        fun = original(*args, **kwargs)

        def call(*a, **kw):
            seen.append({d["num_threads"] for d in threadpoolctl.threadpool_info()
                         if d["user_api"] == "blas"})
            return fun(*a, **kw)
        return call

    monkeypatch.setattr(kmod, "_diffusion_function", spying)
    Q = np.eye(3)
    Q[0, 1] = Q[1, 0] = 0.2
    rho = np.full((3, 2), 0.1)
    with threadpool_limits(2, user_api="blas"):
        if not {d["num_threads"] for d in threadpoolctl.threadpool_info()
                if d["user_api"] == "blas"} == {2}:
            pytest.skip("the BLAS library here does not take a thread count of 2")
        k.second_order(Q, rho, np.eye(2))
    assert seen and all(threads == {1} for threads in seen), seen


def _blas_threads():
    import threadpoolctl
    return {d["num_threads"] for d in threadpoolctl.threadpool_info() if d["user_api"] == "blas"}


def _spy_on_derivatives(monkeypatch, names):
    """Record the BLAS thread counts inside each call of the drift derivatives' `names`."""
    from symquad.numeric import kernels as kmod
    seen, original = {}, kmod._derivatives

    class Spy:
        def __init__(self, der):
            self._der = der

        def __getattr__(self, name):
            target = getattr(self._der, name)
            if name not in names:
                return target

            def call(*a, **kw):
                seen.setdefault(name, []).append(_blas_threads())
                return target(*a, **kw)
            return call

    monkeypatch.setattr(kmod, "_derivatives", lambda *a, **kw: Spy(original(*a, **kw)))
    return seen


def _a_state():
    Q = np.eye(3)
    Q[0, 1] = Q[1, 0] = 0.2
    return Q, np.full((3, 2), 0.1), np.eye(2)


@pytest.mark.parametrize("constraint", ["none", "sphere"])
def test_the_drifts_derivatives_run_on_the_kernels_blas_threads(monkeypatch, constraint):
    # second_order's f₁ and Hessian, the LNA's Jacobian and curvature ran on the user's
    # BLAS threads while the drift and D beside them were limited: their rounding
    # followed the user's thread count
    names = {"f1_sources", "hessian", "jacobian", "curvature", "risk_curvature"}
    m = sq.Model(p=3, p_star=2, lr=0.3, noise=0.1, constraint=constraint)
    k = sq.kernels(m, form="tensor")
    assert k.threads == 1
    seen = _spy_on_derivatives(monkeypatch, names)
    Q, rho, T = _a_state()
    S = 1e-3 * np.eye(k.layout.dim)
    with threadpool_limits(2, user_api="blas"):
        if _blas_threads() != {2}:
            pytest.skip("the BLAS library here does not take a thread count of 2")
        k.second_order(Q, rho, T)
        # as fluctuations() calls it: D (and the sphere's D^u) given
        diffusion = (k._diffusion_pair(Q, rho, T, both=True) if constraint == "sphere"
                     else (k._diffusion_pair(Q, rho, T), None))
        k._lna_terms(Q, rho, T, None, S, diffusion=diffusion)
        k._lna_terms(Q, rho, T, None, S, second_order=True, diffusion=diffusion)
        k._risk_curvature(Q, rho, T, None, S)
    assert set(seen) == names
    assert all(threads == {1} for calls in seen.values() for threads in calls), seen


def test_the_public_derivatives_run_on_the_kernels_blas_threads(monkeypatch):
    # jacobian(), risk_gradient() and risk_hessian() are the LNA's derivatives (the same
    # DriftDerivatives calls) but ran on the user's BLAS threads while the LNA's were
    # limited: their rounding followed the user's thread count, and J from jacobian()
    # could differ in the last bits from the J the LNA used
    names = {"jacobian", "risk_gradient", "risk_hessian"}
    m = sq.Model(p=3, p_star=2, lr=0.3, noise=0.1)
    k = sq.kernels(m, form="tensor")
    assert k.threads == 1
    seen = _spy_on_derivatives(monkeypatch, names)
    Q, rho, T = _a_state()
    with threadpool_limits(2, user_api="blas"):
        if _blas_threads() != {2}:
            pytest.skip("the BLAS library here does not take a thread count of 2")
        k.jacobian(Q, rho, T)
        k.risk_gradient(Q, rho, T)
        k.risk_hessian(Q, rho, T)
    assert set(seen) == names
    assert all(threads == {1} for calls in seen.values() for threads in calls), seen

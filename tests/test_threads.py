"""The kernels' BLAS thread count: one by default, a keyword and SYMQUAD_THREADS otherwise."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import threadpoolctl

import symquad as sq
from conftest import random_overlaps
from symquad.numeric.kernels import BLAS_LIMIT_FIELDS, THREADS_ENV, blas_threads


def _blas_threads_now():
    info = threadpoolctl.threadpool_info()
    return {d["num_threads"] for d in info if d["user_api"] == "blas"}


def test_thread_count_from_keyword_environment_or_one(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert blas_threads() == 1 and blas_threads(3) == 3
    monkeypatch.setenv(THREADS_ENV, "4")
    assert blas_threads() == 4 and blas_threads(2) == 2        # the keyword wins
    for bad in ("0", "two", "2.5", "5000"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(ValueError, match=THREADS_ENV):
            blas_threads()
    monkeypatch.delenv(THREADS_ENV)
    for bad in (0, -1, 1.5, True, "2", 2000):
        with pytest.raises(ValueError, match="threads must be an integer from 1 to 1024"):
            blas_threads(bad)
    with pytest.raises(ValueError, match="threads"):
        sq.kernels(sq.Model(2, 1, 0.1), threads=0)


@pytest.mark.skipif(not _blas_threads_now(), reason="no BLAS library seen by threadpoolctl")
def test_large_kernels_run_their_products_on_the_requested_threads(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    m = sq.Model(BLAS_LIMIT_FIELDS - 1, 1, 0.1)
    seen = []

    def probe(k):
        def rhs(*args):
            seen.append(_blas_threads_now())
            return k._rhs(*args)
        return dataclasses.replace(k, _rhs=rhs)

    Q, rho, T = random_overlaps(m.p, m.p_star, np.random.default_rng(0))
    probe(sq.kernels(m)).rhs(Q, rho, T)
    probe(sq.kernels(m, threads=2)).rhs(Q, rho, T)
    monkeypatch.setenv(THREADS_ENV, "2")
    probe(sq.kernels(m)).rhs(Q, rho, T)
    assert seen == [{1}, {2}, {2}]
    assert sq.kernels(m).threads == 2 and sq.kernels(m, threads=1).threads == 1


def test_default_single_thread_is_bit_identical_whatever_the_users_blas_setting():
    # the promise of the default: the same bits with the library on 1 or 2 threads outside
    m = sq.Model(BLAS_LIMIT_FIELDS, 2, 0.1)
    Q, rho, T = random_overlaps(m.p, m.p_star, np.random.default_rng(1))
    k = sq.kernels(m, form="tensor")
    outs = []
    for n in (1, 2):
        with threadpoolctl.threadpool_limits(limits=n, user_api="blas"):
            outs.append(k.rhs(Q, rho, T))
    assert all(np.array_equal(a, b) for a, b in zip(*outs))


def test_integrate_takes_the_thread_count():
    m = sq.Model(2, 1, 0.1)
    Q0, rho0 = np.eye(2), np.array([[0.2], [0.1]])
    a = sq.integrate(m, Q0, rho0, np.eye(1), 1.0, threads=2)
    b = sq.integrate(m, Q0, rho0, np.eye(1), 1.0)
    np.testing.assert_array_equal(a.Q, b.Q)       # below 48 fields no limit applies at all
    with pytest.raises(ValueError, match="threads"):
        sq.integrate(m, Q0, rho0, np.eye(1), 1.0, threads=0)

"""Batched ODE integration (symquad.numeric.ode_batch) against one-by-one integration."""

import numpy as np
import pytest

import symquad as sq
from symquad.numeric.ode_batch import integrate_batch

from conftest import random_overlaps


def test_batch_equals_one_by_one_integration():
    """Each start of one vectorised solve follows its own single `integrate` trajectory."""
    m = sq.Model(p=3, p_star=2, lr=0.3, noise=0.1)
    rng = np.random.default_rng(4)
    starts = [random_overlaps(3, 2, rng, scale=0.5) for _ in range(5)]
    T = starts[0][2]
    Q0 = np.stack([s[0] for s in starts])
    # same T for all: rebuild rho so that every Gram matrix stays PSD
    rho0 = np.stack([0.3 * s[1] for s in starts])
    t_eval = np.linspace(0, 15, 31)
    batch = integrate_batch(m, Q0, rho0, T, 15.0, t_eval, rtol=1e-10, atol=1e-12)
    assert batch.n_diverged == 0 and list(batch.status) == ["ok"] * 5
    assert batch.Q.shape == (5, 31, 3, 3) and batch.risk.shape == (5, 31)
    for b in range(5):
        one = sq.integrate(m, Q0[b], rho0[b], T, 15.0, t_eval, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(batch.Q[b], one.Q, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(batch.rho[b], one.rho, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(batch.risk[b], one.risk, rtol=1e-7, atol=1e-9)


def test_per_start_divergence_is_reported_and_does_not_stop_the_others():
    m = sq.Model(p=2, p_star=1, lr=0.3)
    qs = (1.0, 3.0, 10.0, 0.5)
    Q0 = np.stack([q * np.eye(2) for q in qs])
    rho0 = 0.1 * np.ones((4, 2, 1))
    t_eval = np.linspace(0, 20, 201)
    batch = integrate_batch(m, Q0, rho0, np.eye(1), 20.0, t_eval)
    assert list(batch.status) == ["ok", "diverged", "diverged", "ok"]
    for b, q in enumerate(qs):
        one = sq.integrate(m, Q0[b], rho0[b], np.eye(1), 20.0, t_eval, on_divergence="stop")
        if one.status == "ok":
            assert np.isnan(batch.t_diverged[b])
            np.testing.assert_allclose(batch.risk[b], one.risk, rtol=1e-6, atol=1e-9)
            np.testing.assert_array_equal(batch.last_finite["Q"][b], batch.Q[b, -1])
        else:
            # the blow-up time of a start: as fast as the single solve resolves it
            assert abs(batch.t_diverged[b] - one.t_diverged) < 1e-3 * one.t_diverged
            after = batch.t >= batch.t_diverged[b]
            assert np.all(np.isnan(batch.risk[b, after]))
            assert np.all(np.isfinite(batch.risk[b, ~after]))
            assert batch.last_finite["t"][b] < batch.t_diverged[b]
    assert "DIVERGED: 2/4" in batch.summary()


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(Q0=np.eye(3)), ValueError, r"Q0 must have shape \(B, p, p\)"),
    (dict(rho0=np.zeros((2, 2, 2))), ValueError, "rho0 must have shape"),
    (dict(Q0=np.stack([np.eye(2)] * 3)), ValueError, "same number of starts"),
    (dict(Q0=np.stack([np.eye(2), -np.eye(2)])), ValueError, "start 1 .* positive semi-definite"),
    (dict(t_max=-1.0), ValueError, "t_max"),
    (dict(method="Euler"), ValueError, "method must be one of"),
    (dict(max_norm=0.0), ValueError, "max_norm"),
])
def test_bad_input_names_parameter(kwargs, err, match):
    args = dict(Q0=np.stack([np.eye(2)] * 2), rho0=np.zeros((2, 2, 1)), T=np.eye(1),
                t_max=1.0)
    args.update(kwargs)
    with pytest.raises(err, match=match):
        integrate_batch(sq.Model(p=2, p_star=1, lr=0.1), **args)



@pytest.mark.parametrize("m", [sq.Model(p=2, p_star=1, lr=0.3),
                               sq.Model(p=2, p_star=1, lr=0.3, lr_readout=0.2)],
                         ids=["fixed readout", "trained readout"])
def test_streamed_crossings_equal_escape_times_of_the_dense_curves(m, monkeypatch):
    """batch_first_crossings against escape_times of integrate_batch's whole risk curves.

    The dense route holds every record and searches each curve at once; the streamed
    one searches blocks of records as the solver passes them.  Same solver steps, so
    the crossing times, divergence records and kept trajectories must agree bit for
    bit, with blocks of the default size and of one record each (then every crossing
    falls between two blocks and each step's dense output is evaluated in pieces).
    """
    from symquad.numeric import ode_batch
    qs = (1.0, 3.0, 10.0, 0.5, 0.05)
    Q0 = np.stack([q * np.eye(2) for q in qs])
    rho0 = 0.1 * np.ones((5, 2, 1))
    rho0[4] *= 0.1
    t_eval = np.linspace(0, 12, 121)
    args = (m, Q0, rho0, np.eye(1), 12.0)
    base = integrate_batch(*args, t_eval, method="DOP853")
    width = Q0[0].size + rho0[0].size + (m.p if m.readout_trained else 0)
    one_record = 8 * 5 * width                # bytes of one record of the 5 starts
    crossed = []
    # the last case: start 2 is beyond max_norm at t = 0, diverged before its first record
    for thr, block, norm in ((1.3, None, None), (0.9, None, None), (0.9, one_record, None),
                             (0.3, one_record, None), (0.9, one_record, 5.0)):
        if block is not None:
            monkeypatch.setattr(ode_batch, "CROSSING_BLOCK_BYTES", block)
        dense = integrate_batch(*args, t_eval, method="DOP853", max_norm=norm) if norm else base
        expected = sq.escape_times(dense.t, dense.risk, thr)
        got = ode_batch.batch_first_crossings(*args, thr, t_eval, keep=(3, 0, 2),
                                              method="DOP853", max_norm=norm)
        np.testing.assert_array_equal(got.times, expected)
        crossed.append(np.isfinite(expected))
        np.testing.assert_array_equal(got.status, dense.status)
        np.testing.assert_array_equal(got.t_diverged, dense.t_diverged)
        for key in ("t", "Q", "rho"):
            np.testing.assert_array_equal(got.last_finite[key], dense.last_finite[key])
        np.testing.assert_array_equal(got.kept.t, dense.t)
        for key in ("Q", "rho", "risk", "readout"):
            want = getattr(dense, key)
            if want is None:
                assert got.kept.readout is None
            else:
                np.testing.assert_array_equal(getattr(got.kept, key), want[[3, 0, 2]])
    assert dense.t_diverged[2] == 0 and np.isnan(dense.risk[2]).all()
    # the cases are there: crossings found, and curves that never cross
    assert sum(c.sum() for c in crossed) >= 8 and not all(c.all() for c in crossed)
    if not m.readout_trained:
        # the two large starts diverge (NaN from then on); start 3 starts below 1.3
        assert list(base.status) == ["ok", "diverged", "diverged", "ok", "ok"]
        assert list(crossed[0]) == [True, False, False, False, True]


@pytest.mark.parametrize("keep", [(2,), (-1,), (0, 0)])
def test_bad_keep_is_refused_before_the_kernels_are_built(keep, monkeypatch):
    # `keep` is bad input like the others: refused by name before any work, here the
    # kernels (a first call of a form may generate its module) and the progress bar
    from symquad.numeric import ode_batch

    def no_kernels(*args, **kwargs):
        raise AssertionError("the kernels were built before keep was checked")
    monkeypatch.setattr(ode_batch, "kernels", no_kernels)
    with pytest.raises(ValueError, match=r"keep must hold distinct start indices in \[0, 2\)"):
        ode_batch.batch_first_crossings(sq.Model(p=2, p_star=1, lr=0.1),
                                        np.stack([np.eye(2)] * 2), np.zeros((2, 2, 1)),
                                        np.eye(1), 1.0, 0.5, keep=keep)


@pytest.mark.parametrize("keep", [(1.7,), (True,), ("0",), 3])
def test_keep_holds_integers_only(keep):
    # 1.7 was truncated to start 1 and a string failed in int() without naming keep
    from symquad.numeric import ode_batch
    with pytest.raises(TypeError, match="keep must"):
        ode_batch.batch_first_crossings(sq.Model(p=2, p_star=1, lr=0.1),
                                        np.stack([np.eye(2)] * 2), np.zeros((2, 2, 1)),
                                        np.eye(1), 1.0, 0.5, keep=keep)


@pytest.mark.parametrize("t_eval", [np.arange(1, 49) * 0.25, np.array([12.0]),
                                    np.array([0.0, 12.0])],
                         ids=["from 0.25, records at the breakpoints", "one record",
                              "two records"])
def test_streamed_crossings_across_lr_schedule_breakpoints(t_eval, monkeypatch):
    """The streamed search against the dense curves where the solver restarts at a step
    schedule's breakpoints (t = 3 and 6, both records), with no record at t = 0 and with
    one or two records; DOP853, blocks of the default size and of one record."""
    from symquad.numeric import ode_batch
    m = sq.Model(p=2, p_star=1, lr=0.3, lr_schedule=("step", ((3, 0.7), (6, 0.4))))
    assert m.schedule.breakpoints(0.0, 12.0) == (3, 6)
    qs = (1.0, 3.0, 0.5, 0.05)
    Q0 = np.stack([q * np.eye(2) for q in qs])
    rho0 = 0.1 * np.ones((4, 2, 1))
    rho0[3] *= 0.1
    args = (m, Q0, rho0, np.eye(1), 12.0)
    dense = integrate_batch(*args, t_eval, method="DOP853")
    for block in (None, 8 * Q0[0].size * 4 + 8 * rho0[0].size * 4):
        if block is not None:
            monkeypatch.setattr(ode_batch, "CROSSING_BLOCK_BYTES", block)
        for thr in (0.9, 0.3):
            got = ode_batch.batch_first_crossings(*args, thr, t_eval, keep=(1,),
                                                  method="DOP853")
            np.testing.assert_array_equal(got.times, sq.escape_times(dense.t, dense.risk, thr))
            np.testing.assert_array_equal(got.t_diverged, dense.t_diverged)
            for key in ("t", "Q", "rho"):
                np.testing.assert_array_equal(got.last_finite[key], dense.last_finite[key])
            np.testing.assert_array_equal(got.kept.risk, dense.risk[[1]])
    if t_eval.size > 2:
        # the cases are there: start 1 diverges, some starts cross between records
        assert list(dense.status) == ["ok", "diverged", "ok", "ok"]
        assert [np.isfinite(sq.escape_times(dense.t, dense.risk, thr)).sum()
                for thr in (0.9, 0.3)] == [3, 2]

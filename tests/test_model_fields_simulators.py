"""Every field of the model specification: the reduced simulator has the law of full SGD.

* **Two-sample tests per field** (alone, and all seven combined): ``R`` replicas of
  each simulator from a random start, compared at three fixed times by
  Kolmogorov–Smirnov tests (:func:`scipy.stats.ks_2samp`) on the risk and on
  overlap statistics that do not depend on the basis of ``R^N`` (``tr Q``, ``Q_12``,
  ``‖ρ‖_F²``, ``ρ_11``, and ``Σ_k a_k``, ``a_1`` for a trained readout; ``tr Q = p``
  is exact on the sphere and checked apart).  Multiple testing: Bonferroni over
  every KS test of the file's field families together (family-wise level
  ``ALPHA = 0.01``).  Power, asserted: the same family rejects the reduced
  simulator of a model whose field is changed by half (or switched off).
* **The mini-batch's inputs outside the span.**  The reduced simulator draws the
  Gram matrix of the ``b`` inputs' components outside the weights' span as
  ``L Lᵀ`` with ``L`` the Bartlett factor of a ``Wishart_b(N − k, I)`` matrix.
  Checked twice: the law of the drawn ``L Lᵀ`` against Gram matrices of explicit
  Gaussian vectors of ``R^{N−k}`` (KS, with power against wrong degrees of
  freedom), and one compiled reduced step against the literal N-dimensional step
  with inputs built from the same numbers (equal to round-off), so the factor is
  used as it is drawn.  Then reduced vs full at ``N = p + p* + b + 1``, where the
  out-of-span part is largest.
* Same seed, same numbers (both methods, a changed model); and the general kernels
  (flag ``general`` of the steppers) give the classic kernels' numbers bit for bit
  on a classic model.
"""

from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import ks_2samp

import symquad as sq
from conftest import random_overlaps
from literal_sgd import (assert_full_step_is_literal, assert_reduced_step_is_literal, bartlett,
                         on_the_sphere)
import symquad.numeric.simulate as simmod
from symquad.numeric import _sgd_kernels
from symquad.numeric.simulate import simulate

ALPHA = 0.01
BASE = dict(p=3, p_star=2, lr=0.2, noise=0.2)
READOUT = (Fraction(1, 2), Fraction(-1, 6), Fraction(1, 3))
TEACHER_READOUT = (Fraction(3, 4), Fraction(-1, 4))
SIGMA_STAR = "z**3/2 - 3*z/2"

#: field -> (its change, a wrong change that the family must reject)
FIELDS = {
    "teacher_activation": (dict(teacher_activation=SIGMA_STAR),
                           dict(teacher_activation="z**3/2 - z")),
    "readout": (dict(readout=READOUT),
                dict(readout=(Fraction(5, 12), Fraction(1, 12), Fraction(1, 3)))),
    "teacher_readout": (dict(teacher_readout=TEACHER_READOUT),
                        dict(teacher_readout=(Fraction(5, 8), Fraction(1, 8)))),
    "lr_readout": (dict(lr_readout=0.2), dict(lr_readout=0.1)),
    "weight_decay": (dict(weight_decay=0.5), dict(weight_decay=0.25)),
    "batch_size": (dict(batch_size=4), dict(batch_size=2)),
    "constraint": (dict(constraint="sphere"), dict(constraint="none")),
}
_ALL = {k: v for change, _ in FIELDS.values() for k, v in change.items()}
FIELDS["combination"] = (_ALL, {**_ALL, "batch_size": 2})

DEFAULT = dict(N=40, t_max=3.0, replicas=2000)
SLOW = dict(N=100, t_max=3.0, replicas=3000)


def statistics(run, times):
    """Named samples over the replicas at the recorded times closest to `times`."""
    out = {}
    sphere = run.model.constraint == "sphere"
    for t in times:
        i = int(np.argmin(np.abs(run.t - t)))
        Q, rho, tag = run.Q[:, i], run.rho[:, i], f"(t={run.t[i]:g})"
        out["risk" + tag] = run.risk[:, i]
        if not sphere:
            out["trQ" + tag] = np.trace(Q, axis1=1, axis2=2)
        out["Q12" + tag] = Q[:, 0, 1]
        out["|rho|^2" + tag] = np.sum(rho**2, axis=(1, 2))
        out["rho11" + tag] = rho[:, 0, 0]
        if run.readout is not None:
            out["sum a" + tag] = run.readout[:, i].sum(axis=1)
            out["a1" + tag] = run.readout[:, i, 0]
    return out


def pvalues(a, b, times):
    """KS p-values of `a`'s statistics against the same statistics of `b`."""
    sa, sb = statistics(a, times), statistics(b, times)
    assert sa.keys() <= sb.keys()
    return {k: ks_2samp(sa[k], sb[k]).pvalue for k in sa}


def family_size(model):
    """Number of KS tests of one field's family (3 times)."""
    per_time = 4 + (model.constraint != "sphere") + 2 * model.readout_trained
    return 3 * per_time


#: Bonferroni over every family of this file (the fields and the small-N batch test).
N_TESTS = sum(family_size(sq.Model(**BASE, **change)) for change, _ in FIELDS.values()) \
    + family_size(sq.Model(**BASE, batch_size=4))
THRESHOLD = ALPHA / N_TESTS


def runs(model, N, t_max, replicas, seed):
    common = dict(N=N, t_max=t_max, replicas=replicas, t_eval=np.linspace(0, t_max, 4))
    return (simulate(model, method="full", seed=seed, **common),
            simulate(model, method="reduced", seed=seed + 1, **common))


def check_field(name, N, t_max, replicas, seed):
    change, wrong = FIELDS[name]
    model = sq.Model(**BASE, **change)
    assert set(model.changed_fields()) == set(change)
    full, red = runs(model, N, t_max, replicas, seed)
    times = [t_max / 3, 2 * t_max / 3, t_max]
    if model.constraint == "sphere":
        for run in (full, red):
            assert np.max(np.abs(np.diagonal(run.Q, axis1=-2, axis2=-1) - 1)) < 1e-12
    if model.readout_trained:
        assert full.readout.shape == red.readout.shape == (replicas, 4, model.p)
    p = pvalues(full, red, times)
    assert len(p) == family_size(model)
    worst = min(p, key=p.get)
    assert p[worst] > THRESHOLD, (
        f"{name}: {worst} differs between the simulators (p = {p[worst]:.2e} < "
        f"{THRESHOLD:.2e}, Bonferroni over {N_TESTS})")
    # power: the family tells a changed field from the right one at this many replicas
    other = simulate(sq.Model(**BASE, **wrong), method="reduced", seed=seed + 2, N=N,
                     t_max=t_max, replicas=replicas, t_eval=np.linspace(0, t_max, 4))
    if other.readout is None and full.readout is not None:
        pytest.fail("the wrong variant must keep the state blocks")
    p_wrong = pvalues(full, other, times)
    assert min(p_wrong.values()) < THRESHOLD, (
        f"{name}: no power against {wrong} (smallest p = {min(p_wrong.values()):.2e})")


@pytest.mark.parametrize("name", list(FIELDS))
def test_reduced_simulator_has_the_law_of_full_sgd(name):
    check_field(name, seed=10 * list(FIELDS).index(name), **DEFAULT)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FIELDS))
def test_reduced_simulator_has_the_law_of_full_sgd_large(name):
    check_field(name, seed=500 + 10 * list(FIELDS).index(name), **SLOW)


# ---- the inputs' Gram matrix outside the span -------------------------------------------
def _stepper(model, N, replicas, Q0, rho0, T, seed=0):
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)]
    X0, T = simmod._initial_coordinates(model, N, replicas, Q0, rho0, T, rngs[0])
    return simmod._ReducedStepper(model, N, replicas, X0, rngs[1], rngs[2], rngs[3])


def _gram_pvalues(A, B):
    """KS p-values of the entries, trace and log-determinant of two samples of b×b Gram matrices."""
    b = A.shape[-1]
    out = {}
    for i in range(b):
        for j in range(i + 1):
            out[f"G{i}{j}"] = ks_2samp(A[:, i, j], B[:, i, j]).pvalue
    out["trace"] = ks_2samp(np.trace(A, axis1=1, axis2=2), np.trace(B, axis1=1, axis2=2)).pvalue
    out["logdet"] = ks_2samp(np.linalg.slogdet(A)[1], np.linalg.slogdet(B)[1]).pvalue
    return out


def test_batch_inputs_outside_the_span_have_the_wishart_law():
    """The drawn ``L Lᵀ`` has the law of the Gram matrix of b Gaussian vectors of R^{N−k}."""
    b, N, steps = 4, 12, 20_000
    model = sq.Model(**BASE, batch_size=b)
    st = _stepper(model, N, 1, np.eye(3) * 0.8, np.zeros((3, 2)) + 0.1, np.eye(2))
    assert st.residual and st.k == 5
    _, S, L, _ = st.draw(steps)
    assert S.shape == (steps, 1, b) and L.shape == (steps, 1, b * (b - 1) // 2)
    F = bartlett(S[:, 0], L[:, 0], b)
    drawn = F @ np.swapaxes(F, 1, 2)
    Z = np.random.default_rng(1).standard_normal((steps, b, N - st.k))
    explicit = Z @ np.swapaxes(Z, 1, 2)
    p = _gram_pvalues(drawn, explicit)
    assert min(p.values()) > ALPHA / len(p), p
    # power: the same family rejects a Bartlett factor with every diagonal dof N − k
    wrong_S = np.random.default_rng(2).chisquare(N - st.k, size=(steps, b))
    F = bartlett(wrong_S, L[:, 0], b)
    p = _gram_pvalues(F @ np.swapaxes(F, 1, 2), explicit)
    assert min(p.values()) < ALPHA / len(p), p


@pytest.mark.parametrize("kwargs", [dict(batch_size=3), {**_ALL, "batch_size": 3}],
                         ids=["batch", "combination"])
def test_one_reduced_batch_step_is_the_literal_step_with_those_inputs(kwargs):
    """The compiled step uses the drawn factor as the inputs' out-of-span coordinates
    (the literal step on inputs rebuilt in R^N gives the new overlaps and readout)."""
    model = sq.Model(**{**BASE, **kwargs})
    Q0, rho0, T = random_overlaps(3, 2, np.random.default_rng(4))
    assert_reduced_step_is_literal(model, *on_the_sphere(model, Q0, rho0), T)


@pytest.mark.parametrize("kwargs", [dict(batch_size=3), {**_ALL, "batch_size": 3}],
                         ids=["batch", "combination"])
def test_one_full_step_is_the_literal_step(kwargs):
    """The full simulator's compiled step == the literal step on the same inputs and noise
    (so what both simulators share, the readouts, σ*, the shrink and the rates, is checked
    against the definitions, not only against each other)."""
    model = sq.Model(**{**BASE, **kwargs})
    Q0, rho0, T = random_overlaps(3, 2, np.random.default_rng(6))
    assert_full_step_is_literal(model, *on_the_sphere(model, Q0, rho0), T)


def test_small_N_batch_reduced_matches_full():
    """N = p + p* + b + 1: the out-of-span Gram matrix of the batch matters most."""
    model = sq.Model(**BASE, batch_size=4)
    N, t_max = 10, 2.0
    full, red = runs(model, N, t_max, 3000, seed=31)
    p = pvalues(full, red, [t_max / 3, 2 * t_max / 3, t_max])
    assert len(p) == family_size(model)
    worst = min(p, key=p.get)
    assert p[worst] > THRESHOLD, (worst, p[worst])


def test_reduced_batch_needs_room_for_the_batch_outside_the_span():
    with pytest.raises(ValueError, match="batch_size=4 needs N >="):
        simulate(sq.Model(**BASE, batch_size=4), N=8, t_max=1.0, replicas=2)


# ---- reproducibility and the classic kernels ------------------------------------------
@pytest.mark.parametrize("method", ["reduced", "full"])
def test_same_seed_same_numbers_for_a_changed_model(method):
    model = sq.Model(**BASE, **_ALL)
    kw = dict(N=30, t_max=1.0, replicas=5, method=method)
    a, b, c = (simulate(model, seed=s, **kw) for s in (3, 3, 4))
    for name in ("Q", "rho", "risk", "readout"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert not np.array_equal(a.Q, c.Q)


@pytest.fixture
def force_general(monkeypatch):
    """Steppers built while active run the general kernels, whatever the model; and a
    record of which compiled kernels ran."""
    calls = []
    init = simmod._Stepper.__init__

    def general_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.general = True
    for name in ("reduced_steps_general", "full_update_general", "reduced_steps",
                 "reduced_steps_lanes", "full_update"):
        kernel = getattr(_sgd_kernels, name)

        def spy(*args, _kernel=kernel, _name=name):
            calls.append(_name)
            return _kernel(*args)
        monkeypatch.setattr(_sgd_kernels, name, spy)

    def use(flag):
        monkeypatch.setattr(simmod._Stepper, "__init__", general_init if flag else init)
    return use, calls


@pytest.mark.parametrize("method, replicas", [("reduced", 2), ("reduced", 9), ("full", 3)])
def test_general_kernels_give_the_classic_numbers_bit_for_bit(method, replicas, force_general):
    use, calls = force_general
    model = sq.Model(3, 2, 0.2, noise=0.3)           # classic: every field at its default
    assert model.changed_fields() == ()
    kw = dict(N=40, t_max=2.0, replicas=replicas, seed=8, method=method)
    use(False)
    classic = simulate(model, **kw)
    ran_classic = set(calls)
    calls.clear()
    use(True)
    general = simulate(model, **kw)
    ran_general = set(calls)
    assert ran_general and all(name.endswith("general") for name in ran_general)
    assert ran_classic and not any(name.endswith("general") for name in ran_classic)
    for name in ("Q", "rho", "risk"):
        assert np.array_equal(getattr(classic, name), getattr(general, name)), name
    assert classic.readout is None and general.readout is None


@pytest.mark.parametrize("method", ["reduced", "full"])
@pytest.mark.parametrize("kwargs", [_ALL, dict(activation="z**2 - 1", readout=READOUT,
                                               teacher_readout=TEACHER_READOUT)],
                         ids=["combination", "readouts-with-constant"])
def test_recorded_risk_is_the_kernels_risk_for_a_changed_model(method, kwargs):
    """The simulators' risk (Isserlis, symquad.numeric.simulate) == the generated kernels'
    risk at the recorded overlaps and readout: two routes for σ*, readouts, a trained a."""
    model = sq.Model(**BASE, **kwargs)
    run = simulate(model, N=40, t_max=2.0, replicas=4, seed=1, method=method,
                   t_eval=[0.0, 1.0, 2.0])
    risk = sq.kernels(model).risk(run.Q, run.rho, run.T, run.readout)
    assert np.all(run.risk > 1e-3)
    np.testing.assert_allclose(run.risk, risk, rtol=1e-12)

r"""The block drift of an input spectrum (issue 24, docs/derivation.md §1a) checked three ways.

* **Entry route for blocks** (:func:`symquad.symbolic.blocks.block_entries`): Wick's
  theorem on the joint Gaussian of the fields and the block fields ``μ^c = W P_c x/√N``,
  covariance written out from the definitions, no Stein's lemma and no moment kinds.  The
  kernels (matrix and tensor forms: the isotropic moment modules at ``Ω`` with the block
  fields as legs, and the generated block assembly) agree with it to 1e-12 at
  ``(p, p*) ≤ (3, 2)``, ``B = 2, 3``.
* **One N-dimensional SGD step** with ``x ~ N(0, Σ)`` written in numpy from the
  definitions (``tests/spectrum_mc.py``), at ``p = 6``, ``p* = 3``, ``B = 3`` for ``σ = z²``,
  ``z³ − 3z`` (teacher ``z² + z``), erf, and ``z²`` with the sphere, weight decay, a batch of
  3 and a trained non-uniform readout: the kernels lie within a Bonferroni bound of
  standard errors of the mean increments (precision and the O(1/N) bias asserted first);
  a wrong spectrum and the isotropic kernels at the total overlaps are rejected.
* **B = 1**: one block of eigenvalue 1 runs today's moment kernels bit for bit, and
  ``Σ = s I`` equals the isotropic model with ``η s``, ``λ/s`` at overlaps ``s (Q, ρ, T)``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.stats import norm

import symquad as sq
from symquad.numeric import kernels as kmod
from symquad.spectrum import block_sizes
from symquad.symbolic.blocks import block_entries_at
from spectrum_mc import block_overlaps, block_weights, flat_rhs, mean_increments

#: Family-wise level of each Monte Carlo comparison (Bonferroni over its entries).
ALPHA = 1e-3
#: Standard errors must be below this fraction of the largest |value| ...
PRECISION = 0.05
#: ... and the O(1/N) bias (+3 of its standard errors) below this fraction of them.
BIAS_FRACTION = 0.3


def random_blocks(p, p_star, B, rng, sphere=False):
    """Per-block overlaps of random weights cut into ``B`` coordinate blocks."""
    sizes = (40,) * B
    W, Ws = block_weights(p, p_star, sizes, rng, sphere=sphere)
    return block_overlaps(W, Ws, sizes)


CASES = {
    "z2, B=2": (dict(p=2, p_star=1), "1/4:2,3/4:3/5"),
    "z2 sphere, weight decay, batch, noise, B=3": (
        dict(p=2, p_star=1, constraint="sphere", weight_decay=0.3, batch_size=2, noise=0.2),
        "1/4:2,1/4:1,1/2:1/3"),
    "z2 (3, 2), B=2": (dict(p=3, p_star=2, noise=0.1), "1/3:3,2/3:1/2"),
    "z2 (3, 2), B=3": (dict(p=3, p_star=2), "1/4:2,1/4:1,1/2:1/3"),
    "z3 - 3z, trained non-uniform readout, B=2": (
        dict(p=2, p_star=2, activation="z**3 - 3*z", teacher_activation="z**2 + z",
             readout=(1 / 2, -1 / 4), lr_readout=0.2, noise=0.1), "1/4:2,3/4:3/5"),
    "correlation loss, sphere, B=2": (
        dict(p=2, p_star=1, loss="correlation", constraint="sphere", noise=0.3),
        "1/3:5/2,2/3:1/4"),
}
SLOW_CASES = {
    "z3 - 3z sphere (3, 2), B=2": (
        dict(p=3, p_star=2, activation="z**3 - 3*z", constraint="sphere", batch_size=3),
        "1/2:3/2,1/2:1/2"),
    "z2 + z/2 (2, 1), B=3": (
        dict(p=2, p_star=1, activation="z**2 + z/2", weight_decay=0.1), "1/3:3,1/3:1,1/3:1/4"),
}


def _check_entry_route(fields, spectrum):
    model = sq.Model(lr=0.3, spectrum=spectrum, **fields)
    rng = np.random.default_rng(11)
    Q, rho, T = random_blocks(model.p, model.p_star, model.n_blocks, rng,
                              sphere=model.constraint == "sphere")
    a = (np.array([0.4, -0.3, 0.2][:model.p]) if model.readout_trained else None)
    ref = block_entries_at(model, Q, rho, T, a)
    forms = ("matrix", "tensor") if model.is_quadratic else ("tensor",)
    for form in forms:
        k = sq.kernels(model, form=form)
        got = k.rhs(Q, rho, T, a)
        assert abs(k.risk(Q, rho, T, a) - ref[0]) <= 1e-12 * abs(ref[0])
        for x, y in zip(got, ref[1:]):
            assert x.shape == y.shape
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-12 * np.abs(y).max(),
                                       err_msg=f"{form}: {fields} {spectrum}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_block_kernels_equal_the_entry_route_for_blocks(case):
    _check_entry_route(*CASES[case])


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SLOW_CASES))
def test_block_kernels_equal_the_entry_route_for_blocks_slow(case):
    _check_entry_route(*SLOW_CASES[case])


def test_a_schedule_runs_the_block_kernels_at_the_instantaneous_step():
    m = sq.Model(2, 1, 0.3, spectrum="1/4:2,3/4:3/5", lr_schedule="inverse:4",
                 weight_decay=0.1)
    Q, rho, T = random_blocks(2, 1, 2, np.random.default_rng(3))
    at = sq.kernels(m).rhs(Q, rho, T, t=2.0)
    const = sq.kernels(m.replace(lr=0.3 / (1 + 2.0 / 4), lr_schedule="constant")).rhs(Q, rho, T)
    for x, y in zip(at, const):
        np.testing.assert_allclose(x, y, rtol=1e-15, atol=1e-17)


# --------------------------------------------------------------------------- B = 1
@pytest.mark.parametrize("fields, form", [
    (dict(activation="z**3 - 3*z", noise=0.2), "tensor"),
    (dict(activation="erf", teacher_activation="z**2"), "tensor"),
    (dict(constraint="sphere", weight_decay=0.2, batch_size=2, noise=0.1), "matrix"),
    (dict(lr_readout=0.3, readout=(0.5, -0.2, 0.1)), "matrix"),
    (dict(lr_readout=0.3), "tensor"),
])
def test_one_block_of_eigenvalue_one_is_todays_moment_kernels_bit_for_bit(fields, form):
    """The block path (legs, block assembly) at B = 1, s = f = 1 reproduces every bit of the
    isotropic moment kernels; a model with the default spectrum never takes it."""
    m = sq.Model(3, 2, 0.3, **fields)
    rng = np.random.default_rng(2)
    Q, rho, T = (x[0] for x in random_blocks(3, 2, 1, rng, sphere=m.constraint == "sphere"))
    a = np.array([0.3, -0.2, 0.5]) if m.readout_trained else None
    block = dataclasses.replace(kmod._block_kernels(m, form), _params=kmod._params(m))
    iso = sq.kernels(m, form=form)
    assert iso.source == block.source
    got, want = block.rhs(Q[None], rho[None], T[None], a), iso.rhs(Q, rho, T, a)
    for i, (x, y) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(x[0] if i < 2 else x, y)
    assert block.risk(Q[None], rho[None], T[None], a) == iso.risk(Q, rho, T, a)


@pytest.mark.parametrize("fields", [
    dict(), dict(activation="z**3 - 3*z", weight_decay=0.2, batch_size=3, noise=0.3),
    dict(activation="erf", lr_readout=0.4), dict(teacher_activation="z**2 + z", noise=0.1)])
def test_one_block_of_eigenvalue_s_is_the_rescaled_isotropic_model(fields):
    """``x ~ N(0, sI)`` is the isotropic model of the weights ``√s w``: step ``η s``, weight
    decay ``λ/s``, overlaps ``s (Q, ρ, T)``, and ``d(sQ)/dt = s dQ/dt`` (a second route)."""
    s = 1.7
    m = sq.Model(3, 2, 0.3, spectrum=f"1:{s}", **fields)
    iso = sq.Model(3, 2, 0.3 * s, **{**fields, "weight_decay": fields.get(
        "weight_decay", 0.0) / s})
    Q, rho, T = random_blocks(3, 2, 1, np.random.default_rng(4))
    a = np.array([0.3, -0.2, 0.5]) if m.readout_trained else None
    got = sq.kernels(m).rhs(Q, rho, T, a)
    want = sq.kernels(iso).rhs(s * Q[0], s * rho[0], s * T[0], a)
    for i, (x, y) in enumerate(zip(got, want)):
        x = s * x[0] if i < 2 else x
        np.testing.assert_allclose(x, y, rtol=1e-13, atol=1e-13 * np.abs(y).max())
    assert sq.kernels(m).risk(Q, rho, T, a) == pytest.approx(
        sq.kernels(iso).risk(s * Q[0], s * rho[0], s * T[0], a), rel=1e-13)


# --------------------------------------------------------------------------- legs
@pytest.mark.parametrize("activation, form", [("z**2", "matrix"), ("z**3 - 3*z", "tensor"),
                                              ("erf", "tensor"), ("relu", "tensor")])
def test_legs_equal_to_the_fields_give_the_three_point_sum_and_are_linear(activation, form):
    m = sq.Model(3, 2, 0.3, activation=activation,
                 teacher_activation="erf" if activation == "relu" else None, noise=0.1)
    mod, _, extra = kmod._moment_module(m, form)
    Q, rho, T = (x[0] for x in random_blocks(3, 2, 1, np.random.default_rng(6)))
    a, b = np.array([0.3, -0.2, 0.5]), np.array([0.5, 0.5])
    G, Gt, B, R = mod.moments(Q, rho, T, a, b, 0.1, True, *extra)
    C = np.block([[Q, rho], [rho.T, T]])
    GL, none, BL, RL = mod.moments(Q, rho, T, a, b, 0.1, True, *extra, legs=C)
    assert none is None
    np.testing.assert_array_equal(GL, np.concatenate([G, Gt], axis=-1))
    np.testing.assert_array_equal(BL, B)
    np.testing.assert_array_equal(RL, R)
    # a leg enters linearly: E[σ'(λ_k) (x μ + y ν) δ] = x E[σ'(λ_k) μ δ] + y E[σ'(λ_k) ν δ]
    L = np.random.default_rng(7).standard_normal((2, 5, 4))
    one = mod.moments(Q, rho, T, a, b, 0.1, False, *extra, legs=L[0])[0]
    two = mod.moments(Q, rho, T, a, b, 0.1, False, *extra, legs=L[1])[0]
    both = mod.moments(Q, rho, T, a, b, 0.1, False, *extra, legs=0.3 * L[0] - 2 * L[1])[0]
    np.testing.assert_allclose(both, 0.3 * one - 2 * two, rtol=0,
                               atol=1e-13 * np.abs(both).max())


# --------------------------------------------------------------------------- shapes
def test_the_kernels_take_and_return_block_shapes_and_refuse_a_total_teacher():
    m = sq.Model(2, 1, 0.1, spectrum="1/4:2,3/4:3/5")
    Q, rho, T = random_blocks(2, 1, 2, np.random.default_rng(0))
    k = sq.kernels(m)
    dQ, drho = k.rhs(Q, rho, T)
    assert dQ.shape == (2, 2, 2) and drho.shape == (2, 2, 1)
    batch = k.rhs(np.stack([Q, Q]), np.stack([rho, rho]), T)
    np.testing.assert_array_equal(batch[0][1], dQ)
    with pytest.raises(ValueError, match=r"T \(2, 1, 1\).*block_teacher"):
        k.rhs(Q, rho, T.sum(0))
    with pytest.raises(ValueError, match="spectrum"):
        sq.kernels(m, form="entries")


# --------------------------------------------------------------------------- one SGD step
MC_SPECTRUM = "1/4:2,1/4:1,1/2:1/2"
MC_READOUT = (0.3, -0.1, 0.2, 0.25, -0.2, 0.1)
MC_VARIANTS = {
    "z2": dict(),
    # the cubic's increments are heavy-tailed: smaller weights (scale 0.5) keep the
    # standard errors below PRECISION of the values
    "z3 - 3z": dict(activation="z**3 - 3*z", teacher_activation="z**2 + z", lr=0.25),
    "erf": dict(activation="erf"),
    "relu/erf": dict(activation="relu", teacher_activation="erf"),
    "z2 sphere, weight decay, batch, trained readout": dict(
        constraint="sphere", weight_decay=0.2, batch_size=3, lr_readout=0.5,
        readout=MC_READOUT),
}


def _one_step(name, N, n, seed):
    kw = {"lr": 0.5, **MC_VARIANTS[name]}
    model = sq.Model(6, 3, noise=0.25, spectrum=MC_SPECTRUM, **kw)
    rng = np.random.default_rng(seed)
    sizes = block_sizes(model.spectrum, N)
    scales = [float(s) for _, s in model.spectrum]
    W, Ws = block_weights(6, 3, sizes, rng, sphere=model.constraint == "sphere",
                          scale=0.5 if name == "z3 - 3z" else 1.0)
    Q, rho, T = block_overlaps(W, Ws, sizes)
    out = mean_increments(model, W, Ws, sizes, scales, n, rng)
    (mean, se), (bias, bias_se) = out["e"], out["d"]
    theory = flat_rhs(sq.kernels(model).rhs(Q, rho, T))
    z_max = norm.isf(ALPHA / (2 * mean.size))
    # the test has power: standard errors small against the values, O(1/N) bias small
    assert se.max() < PRECISION * np.abs(theory).max(), (name, se.max(), np.abs(theory).max())
    assert ((np.abs(bias) + 3 * bias_se) / se).max() < BIAS_FRACTION, name
    z = (mean - theory) / se
    assert np.abs(z).max() < z_max, (name, np.abs(z).max(), z_max)
    return model, (Q, rho, T), mean, se, z_max


@pytest.mark.parametrize("name", ["z2", "erf"])
def test_the_kernels_equal_one_sgd_step_with_structured_inputs(name):
    model, (Q, rho, T), mean, se, z_max = _one_step(name, N=2000, n=20000, seed=5)
    # power: the eigenvalues in the other order, and the isotropic model at the total
    # overlaps (sum of the blocks' increments), are far outside the bound
    wrong = model.replace(spectrum="1/4:1/2,1/4:1,1/2:2")
    assert np.abs((mean - flat_rhs(sq.kernels(wrong).rhs(Q, rho, T))) / se).max() > 5 * z_max
    iso = sq.kernels(model.replace(spectrum="1:1"))
    dQ, drho = iso.rhs(Q.sum(0), rho.sum(0), T.sum(0))
    B, p = model.n_blocks, model.p
    nq = p * (p + 1) // 2
    q_blocks = mean[:B * nq].reshape(B, nq).sum(0)
    q_se = np.sqrt((se[:B * nq].reshape(B, nq) ** 2).sum(0))     # an upper bound on it
    assert np.abs((q_blocks - dQ[np.triu_indices(p)]) / q_se).max() > z_max


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MC_VARIANTS))
def test_the_kernels_equal_one_sgd_step_with_structured_inputs_slow(name):
    _one_step(name, N=4000, n=80000, seed=9)

"""The matrix kernel: same numbers as the kernels it replaced, each product formed once."""

import pathlib
from fractions import Fraction

import numpy as np

import symquad as sq
from symquad.codegen import render

DATA = pathlib.Path(__file__).resolve().parent / "data" / "quadratic_matrix_reference.npz"


def _cases():
    d = np.load(DATA)
    for i in range(int(d["n_cases"])):
        eta, Delta, c, p, k = d[f"{i}_params"]
        yield (i, d[f"{i}_Q"], d[f"{i}_rho"], d[f"{i}_T"], float(eta), float(Delta), float(c),
               int(p), int(k), d[f"{i}_dQ"], d[f"{i}_drho"], d[f"{i}_risk"])


def _kernels(eta, Delta, c, p, k):
    model = sq.Model(p=p, p_star=k, lr=eta, noise=Delta, activation=(0, 0, Fraction(repr(c))))
    kern = sq.kernels(model)
    assert kern.form == "matrix"
    return kern


def test_kernel_unchanged_against_frozen_reference():
    """Relative 1e-12 (max-norm over each output) against the 0.2 kernel's recorded outputs.

    The reference file was written by the kernel of symquad 0.2 (before the
    model specification): the default model's numbers are unchanged.
    """
    n = 0
    batched = 0
    for i, Q, rho, T, eta, Delta, c, p, k, dQ0, drho0, risk0 in _cases():
        kern = _kernels(eta, Delta, c, p, k)
        dQ, drho = kern.rhs(Q, rho, T)
        risk = np.asarray(kern.risk(Q, rho, T))
        for name, new, old in (("dQ", dQ, dQ0), ("drho", drho, drho0), ("risk", risk, risk0)):
            assert new.shape == old.shape, (i, name)
            err = np.max(np.abs(new - old)) / np.max(np.abs(old))
            assert err < 1e-12, f"case {i} (p={p}, p*={k}, batch {Q.shape[:-2]}): {name} {err:.2e}"
        np.testing.assert_array_equal(dQ, np.swapaxes(dQ, -1, -2))
        n += 1
        batched += Q.ndim > 2
    assert n >= 50 and batched >= 25


def test_unbatched_path_equals_batched_path():
    """A 2-d call and the same input with a batch axis agree."""
    for i, Q, rho, T, eta, Delta, c, p, k, *_ in _cases():
        if Q.ndim != 2:
            continue
        kern = _kernels(eta, Delta, c, p, k)
        one = kern.rhs(Q, rho, T)
        many = kern.rhs(Q[None], rho[None], T)
        for a, b in zip(one, many):
            np.testing.assert_allclose(a, b[0], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(kern.risk(Q, rho, T), kern.risk(Q[None], rho[None], T[None])[0],
                                   rtol=1e-13, atol=1e-15)


def test_each_product_formed_once():
    """Every matrix product of the moments is a different one (shared prefixes, sliced blocks)."""
    text = render.render_matrix_module()
    body = text[text.index("def moments"):text.index("def risk")]
    products = [line.split("=", 1)[1].strip() for line in body.splitlines()
                if " @ " in line and "legs" not in line]
    assert len(products) == len(set(products)) == 2
    # with legs (an input spectrum's block fields) one more product, of the shared prefix
    legs = [line for line in body.splitlines() if " @ legs" in line]
    assert len(legs) == 1 and legs[0].count(" @ ") == 1 and "(C_p * wA" in legs[0], legs
    # the student rows only: no (p+p*)×(p+p*)×(p+p*) product is formed
    assert all(pr.startswith("(C_p") or pr.startswith("(C_A_C_p") for pr in products), products


def test_assembled_dQ_is_symmetric_to_the_last_bit():
    rng = np.random.default_rng(7)
    for model in (sq.Model(4, 2, 0.3, noise=0.2), sq.Model(3, 2, 0.2, constraint="sphere"),
                  sq.Model(3, 3, 0.1, readout=(1, 2, 3), lr_readout=0.2, weight_decay=0.1)):
        G = rng.standard_normal((model.p + model.p_star,) * 2)
        C = G @ G.T
        if model.constraint == "sphere":
            d = np.sqrt(np.diag(C))
            C = C / np.outer(d, d)
        Q, rho, T = C[:model.p, :model.p], C[:model.p, model.p:], C[model.p:, model.p:]
        dQ = sq.kernels(model).rhs(Q, rho, T)[0]
        np.testing.assert_array_equal(dQ, dQ.T)


def test_mixed_batch_axes_broadcast():
    """An unbatched Q with a batch of rho (and the reverse) broadcasts like the 2-d calls."""
    rng = np.random.default_rng(3)
    p, k = 3, 2
    G = rng.standard_normal((p + k, p + k + 2))
    C = G @ G.T / (p + k + 2)
    Q, T = C[:p, :p], C[p:, p:]
    rhos = np.stack([C[:p, p:], 0.5 * C[:p, p:]])
    kern = sq.kernels(sq.Model(p, k, 0.3, noise=0.1, activation="1.5*z**2"))
    dQ, drho = kern.rhs(Q, rhos, T)
    risk = kern.risk(Q, rhos, T)
    assert dQ.shape == (2, p, p) and drho.shape == (2, p, k) and risk.shape == (2,)
    for b in range(2):
        one = kern.rhs(Q, rhos[b], T)
        np.testing.assert_allclose(dQ[b], one[0], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(drho[b], one[1], rtol=1e-13, atol=1e-15)


def test_uniform_block_kernel_equals_general_moment_kernel():
    """The block-form kernel (uniform fixed readouts) and the general moment kernel agree."""
    import symquad.numeric.kernels as K
    rng = np.random.default_rng(11)
    models = [sq.Model(4, 2, 0.3, noise=0.2), sq.Model(3, 2, 0.2, readout=1, teacher_readout="1/3",
                                                        weight_decay=0.2, batch_size=5),
              sq.Model(2, 3, 0.1, activation="2*z**2 + 1", teacher_activation="z**2 - 1/2",
                       readout="-1/2")]
    for model in models:
        fast = sq.kernels(model)
        assert fast.source == "symquad._generated.quadratic_matrix_uniform"
        mod, _ = K._committed("quadratic_matrix", required=("moments", "risk"))
        extra = tuple(float(c[j]) for c, j in ((model.activation, 2), (model.teacher_activation, 2),
                                               (model.activation, 0), (model.teacher_activation, 0)))
        general = K._moment_kernels(model, "matrix", mod, "general", extra)
        for _ in range(3):
            G = rng.standard_normal((model.p + model.p_star,) * 2)
            C = G @ G.T / 3
            Q, rho, T = C[:model.p, :model.p], C[:model.p, model.p:], C[model.p:, model.p:]
            for x, y in zip(fast.rhs(Q, rho, T), general.rhs(Q, rho, T)):
                assert np.max(np.abs(x - y)) <= 1e-12 * np.max(np.abs(y))
            assert abs(fast.risk(Q, rho, T) - general.risk(Q, rho, T)) <= 1e-12 * abs(
                general.risk(Q, rho, T))

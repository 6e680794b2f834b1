"""The lean matrix kernel: same numbers as the kernel it replaced, each product formed once."""

import pathlib

import numpy as np
import pytest

import symquad._generated.quadratic_matrix as mod
from symquad.codegen import render

DATA = pathlib.Path(__file__).resolve().parent / "data" / "quadratic_matrix_reference.npz"


def _cases():
    d = np.load(DATA)
    for i in range(int(d["n_cases"])):
        eta, Delta, c, p, k = d[f"{i}_params"]
        yield (i, d[f"{i}_Q"], d[f"{i}_rho"], d[f"{i}_T"], float(eta), float(Delta), float(c),
               int(p), int(k), d[f"{i}_dQ"], d[f"{i}_drho"], d[f"{i}_risk"])


def test_kernel_unchanged_against_frozen_reference():
    """Relative 1e-12 (max-norm over each output) against the previous kernel's outputs."""
    n = 0
    batched = 0
    for i, Q, rho, T, eta, Delta, c, p, k, dQ0, drho0, risk0 in _cases():
        dQ, drho = mod.rhs(Q, rho, T, eta, Delta, p, k, c)
        risk = np.asarray(mod.risk(Q, rho, T, p, k, c))
        for name, new, old in (("dQ", dQ, dQ0), ("drho", drho, drho0), ("risk", risk, risk0)):
            assert new.shape == old.shape, (i, name)
            err = np.max(np.abs(new - old)) / np.max(np.abs(old))
            assert err < 1e-12, f"case {i} (p={p}, p*={k}, batch {Q.shape[:-2]}): {name} {err:.2e}"
        np.testing.assert_array_equal(dQ, np.swapaxes(dQ, -1, -2))
        n += 1
        batched += Q.ndim > 2
    assert n >= 50 and batched >= 25


def test_unbatched_path_equals_batched_path():
    """The 2-d fast path and the batch path agree (each input also sent with a batch axis)."""
    for i, Q, rho, T, eta, Delta, c, p, k, *_ in _cases():
        if Q.ndim != 2:
            continue
        one = mod.rhs(Q, rho, T, eta, Delta, p, k, c)
        many = mod.rhs(Q[None], rho[None], T, eta, Delta, p, k, c)
        for a, b in zip(one, many):
            np.testing.assert_allclose(a, b[0], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(mod.risk(Q, rho, T, p, k, c),
                                   mod.risk(Q[None], rho[None], T[None], p, k, c)[0],
                                   rtol=1e-13, atol=1e-15)


def test_each_product_formed_once():
    """Two p×p×p products (Q², Q³) and no repeated product in the generated rhs."""
    text = render.render_matrix_module()
    body = text[text.index("def _rhs_single"):text.index("def _risk_batched")]
    products = [line.split("=")[1].strip() for line in body.splitlines() if " @ " in line]
    assert len(products) == len(set(products)) == 7
    cubic = [pr for pr in products if pr.split(" @ ")[0].startswith("Q")
             and pr.split(" @ ")[1] in ("Q", "Q_Q")]
    assert len(cubic) == 2


@pytest.mark.parametrize("word, transposed", [(("Q", "rho", "rhoT"), ("rho", "rhoT", "Q")),
                                              (("rho", "T", "rhoT"), ("rho", "T", "rhoT"))])
def test_transpose_of_words(word, transposed):
    assert render._transpose_word(word) == transposed


def test_mixed_batch_axes_broadcast():
    """An unbatched Q with a batch of rho (and the reverse) broadcasts like the 2-d calls."""
    rng = np.random.default_rng(3)
    p, k = 3, 2
    G = rng.standard_normal((p + k, p + k + 2))
    C = G @ G.T / (p + k + 2)
    Q, T = C[:p, :p], C[p:, p:]
    rhos = np.stack([C[:p, p:], 0.5 * C[:p, p:]])
    dQ, drho = mod.rhs(Q, rhos, T, 0.3, 0.1, p, k, 1.5)
    risk = mod.risk(Q, rhos, T, p, k, 1.5)
    assert dQ.shape == (2, p, p) and drho.shape == (2, p, k) and risk.shape == (2,)
    for b in range(2):
        one = mod.rhs(Q, rhos[b], T, 0.3, 0.1, p, k, 1.5)
        np.testing.assert_allclose(dQ[b], one[0], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(drho[b], one[1], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(risk[b], mod.risk(Q, rhos[b], T, p, k, 1.5), rtol=1e-13)

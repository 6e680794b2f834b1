"""Every field of the model specification: the kernels' routes agree with the entry route.

For every specification field alone (``teacher_activation``, ``readout``,
``teacher_readout``, ``lr_readout``, ``weight_decay``, ``batch_size``,
``constraint``) and for combinations of them, at every ``(p, p*) <= (3, 3)``:

* the tensor kernels, and the matrix kernels wherever ``σ = c z² + c0`` and
  ``σ* = c* z² + c0*``, equal the entry-by-entry kernels to 1e-12 relative, block by
  block (``dQ``, ``dρ`` and, for a trained readout, ``da``) and for the risk, at
  random positive-definite overlaps (unit diagonal of ``Q`` on the sphere) and,
  for a trained readout, at a current readout ``a`` that is not ``a(0)``;
* each field really changes the numbers (so the agreement is not that of two
  routes ignoring it);
* ``derive(model, "matrix").explicit()`` equals ``derive(model, "entries").explicit()``
  exactly (SymPy) on small changed models;
* the multiprecision reference :func:`symquad.symbolic.tensor.reference_entries`
  (the derived tensor-form polynomials summed entry by entry in 40-digit
  arithmetic) equals the float64 kernels of a changed model at ``p = 16``.

The entry route takes the expectations of the explicit per-sample network by
Wick's theorem; the matrix and tensor routes evaluate moment kinds — independent
evaluations of the one drift assembly of :mod:`symquad.symbolic.update`.  That
assembly itself (the update rule of each field) is checked against a Monte Carlo of
an N-dimensional SGD step in tests/test_model_fields_one_step.py.

A representative subset runs by default; the whole grid is marked ``slow``.
"""

import importlib
from fractions import Fraction
from functools import lru_cache

import numpy as np
import pytest
import sympy as sp

import symquad as sq
from conftest import random_overlaps
from symquad._generated import ENTRY_MODULES
from symquad.codegen.render import render_entries_module
from symquad.kernel_files import load_module_text

SIZES = [(p, k) for p in (1, 2, 3) for k in (1, 2, 3)]
RTOL = 1e-12


def uneven_readout(width, offset=0):
    """Unequal rationals of both signs, summing to something other than 1 (so the
    constant ``c0 Σa − c0* Σb`` of an activation with a constant term is not zero)."""
    return tuple(Fraction((-1) ** ((j + offset) // 2) * (j + offset + 2), 2 * width + 3)
                 for j in range(width))


# Each case: Model keyword arguments as a function of (p, p*).  Base σ = z² unless given.
CASES = {
    "teacher_activation": lambda p, k: dict(teacher_activation="z**3 - 3*z"),
    "teacher_activation_quadratic": lambda p, k: dict(teacher_activation="3*z**2/2 - 1/2"),
    "readout": lambda p, k: dict(readout=uneven_readout(p), activation="z**2 - 1"),
    "teacher_readout": lambda p, k: dict(teacher_readout=uneven_readout(k, 1)),
    "lr_readout": lambda p, k: dict(lr_readout=0.4),
    "weight_decay": lambda p, k: dict(weight_decay=0.15),
    "batch_size": lambda p, k: dict(batch_size=3),
    "constraint": lambda p, k: dict(constraint="sphere"),
    # all seven fields, quadratic (matrix and tensor routes)
    "combination_quadratic": lambda p, k: dict(
        activation="z**2 - 1", teacher_activation="3*z**2/2 + 1/2", readout=uneven_readout(p),
        teacher_readout=uneven_readout(k, 1), lr_readout=0.4, weight_decay=0.15, batch_size=3,
        constraint="sphere"),
    # six fields with a non-quadratic teacher (tensor route)
    "combination_tensor": lambda p, k: dict(
        teacher_activation="z**3 - 3*z", readout=uneven_readout(p),
        teacher_readout=uneven_readout(k, 1), lr_readout=0.4, weight_decay=0.15, batch_size=3,
        constraint="sphere"),
}
#: Second base activation (odd and even powers; tensor route only).
TENSOR_BASE = "z + z**2"



def make_model(case, p, p_star, base=None):
    kwargs = CASES[case](p, p_star)
    if base is not None:
        kwargs["activation"] = base
    return sq.Model(p=p, p_star=p_star, lr=0.3, noise=0.25, **kwargs)


def _structure(model):
    """The model with every value that is a kernel argument reset (one module per structure)."""
    return model.replace(lr=1.0, noise=0.0, readout=None, teacher_readout=None,
                         weight_decay=0.0, batch_size=1, lr_scaling="fixed",
                         lr_readout=1.0 if model.readout_trained else 0.0)


@lru_cache(maxsize=None)
def _entry_module(structure):
    committed = ENTRY_MODULES.get((structure.p, structure.p_star))
    if committed and structure == sq.Model(structure.p, structure.p_star, 1.0):
        return importlib.import_module(f"symquad._generated.{committed}")
    # rendered in memory: no kernel cache is touched
    return load_module_text(render_entries_module(structure), "entry_reference")


class EntryRoute:
    """The entry-by-entry kernels of a model, called like :class:`symquad.Kernels`."""

    def __init__(self, model):
        self.model = model
        self.mod = _entry_module(_structure(model))
        self.b = np.array([float(c) for c in model.teacher_readout])
        self.params = tuple(model.kernel_params()[name] for name in self.mod.PARAMS)

    def _a(self, a):
        return np.array([float(c) for c in self.model.readout]) if a is None else a

    def rhs(self, Q, rho, T, a=None):
        dQ, drho, da = self.mod.rhs(Q, rho, T, self._a(a), self.b, self.params)
        return (dQ, drho, da) if self.model.readout_trained else (dQ, drho)

    def risk(self, Q, rho, T, a=None):
        return float(self.mod.risk(Q, rho, T, self._a(a), self.b))


def state_point(model, rng):
    """Random positive-definite overlaps (unit diagonal on the sphere) and a readout.

    The readout is a current value different from ``a(0)`` for a trained readout
    (None, i.e. the fixed readout, otherwise).
    """
    p, k = model.p, model.p_star
    Q, rho, T = random_overlaps(p, k, rng)
    if model.constraint == "sphere":
        d = np.sqrt(np.diag(Q))
        Q, rho = Q / np.outer(d, d), rho / d[:, None]
    a = None
    if model.readout_trained:
        a = np.array([float(c) for c in model.readout]) * 1.4 + rng.normal(0, 0.2, p)
    return Q, rho, T, a


def assert_blocks_close(got, ref, what, sphere=False):
    assert len(got) == len(ref), what
    for name, g, r in zip(("dQ", "drho", "da"), got, ref):
        if sphere and name == "dQ":
            # the sphere keeps every Q_kk = 1: the diagonal drift vanishes in both routes
            assert np.max(np.abs(np.diagonal(r))) < 1e-14, what
            assert np.max(np.abs(np.diagonal(g))) < 1e-14, what
            if r.shape[0] == 1:
                continue
        scale = np.max(np.abs(r))
        assert scale > 1e-4, f"{what}: block {name} is ~0 (scale {scale:.2g}); no test"
        err = np.max(np.abs(np.asarray(g) - r))
        assert err <= RTOL * scale, f"{what}: {name} differs by {err / scale:.2e} relative"


def assert_routes_agree(model, points=2, seed=0):
    """Tensor (and matrix, where it applies) kernels == entry route at `points` random states."""
    forms = ["tensor"] + (["matrix"] if model.is_quadratic else [])
    entry = EntryRoute(model)
    rng = np.random.default_rng(seed)
    for _ in range(points):
        Q, rho, T, a = state_point(model, rng)
        ref_rhs, ref_risk = entry.rhs(Q, rho, T, a), entry.risk(Q, rho, T, a)
        assert len(ref_rhs) == (3 if model.readout_trained else 2)
        for form in forms:
            kern = sq.kernels(model, form)
            assert kern.form == form
            what = f"{form} vs entries, {model!r}"
            assert_blocks_close(kern.rhs(Q, rho, T, a), ref_rhs, what,
                                sphere=model.constraint == "sphere")
            risk = kern.risk(Q, rho, T, a)
            assert abs(risk - ref_risk) <= RTOL * abs(ref_risk), (what, risk, ref_risk)
    return Q, rho, T, a, ref_rhs, ref_risk


def assert_field_matters(model, Q, rho, T, a, ref_rhs, ref_risk):
    """The model without its specification fields gives other numbers (by > 1e-3)."""
    classic = sq.Model(model.p, model.p_star, model.lr, noise=model.noise,
                       activation=model.activation, lr_scaling=model.lr_scaling)
    other = EntryRoute(classic)
    rhs = other.rhs(Q, rho, T)
    mine = np.concatenate([np.ravel(x) for x in ref_rhs[:2]])
    theirs = np.concatenate([np.ravel(x) for x in rhs])
    change = np.max(np.abs(mine - theirs)) / np.max(np.abs(mine))
    change = max(change, abs(other.risk(Q, rho, T) - ref_risk) / abs(ref_risk))
    assert change > 1e-3, f"{model!r}: the changed fields do not change the drift or risk"


def run_case(case, p, p_star, base=None, seed=0, points=2):
    model = make_model(case, p, p_star, base)
    assert set(model.changed_fields()) >= set(_changed_expected(case)), model
    out = assert_routes_agree(model, points=points, seed=seed)
    assert_field_matters(model, *out)


def _changed_expected(case):
    if case.startswith("combination"):
        return ("readout", "teacher_readout", "lr_readout", "weight_decay", "batch_size",
                "constraint", "teacher_activation")
    return ("teacher_activation",) if case.startswith("teacher_activation") else (case,)


@pytest.fixture(autouse=True)
def _own_cache(isolated_cache):
    """Tensor modules of uncommitted activation pairs are generated into a fresh cache."""
    return isolated_cache


# ---- default run: the cheap committed-entry fields at every size, the rest at (2, 2) ----
@pytest.mark.parametrize("p, p_star", SIZES)
@pytest.mark.parametrize("case", ["weight_decay", "batch_size", "teacher_readout"])
def test_parameter_fields_every_size(case, p, p_star):
    """σ = σ* = z² with a fixed readout: the committed entry kernels serve these fields."""
    run_case(case, p, p_star, seed=10 * p + p_star)


@pytest.mark.parametrize("case", sorted(set(CASES) - {"weight_decay", "batch_size",
                                                     "teacher_readout"}))
def test_structural_fields_at_2_2(case):
    run_case(case, 2, 2, seed=22)


@pytest.mark.parametrize("case, p, p_star", [("combination_tensor", 3, 1),
                                             ("constraint", 1, 2),
                                             ("lr_readout", 3, 3)])
def test_structural_fields_other_sizes(case, p, p_star):
    run_case(case, p, p_star, seed=7)


def test_non_quadratic_base_with_every_field_combined():
    """σ = z + z², tensor route only, every field but σ* changed, at (2, 1)."""
    run_case("combination_tensor", 2, 1, base=TENSOR_BASE, seed=3)


# ---- the whole grid (slow) -------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("p, p_star", SIZES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_field_every_size(case, p, p_star):
    run_case(case, p, p_star, seed=100 + 10 * p + p_star, points=3)


@pytest.mark.slow
@pytest.mark.parametrize("p, p_star", SIZES)
@pytest.mark.parametrize("case", sorted(set(CASES) - {"teacher_activation_quadratic",
                                                     "combination_quadratic"}))
def test_every_field_every_size_non_quadratic_base(case, p, p_star):
    run_case(case, p, p_star, base=TENSOR_BASE, seed=200 + 10 * p + p_star)


# ---- the symbolic matrix form, exactly -------------------------------------------------
def _exactly_equal(x, y):
    if isinstance(x, sp.MatrixBase):
        return x.shape == y.shape and all(sp.expand(e) == 0 for e in (x - y))
    return sp.expand(x - y) == 0


def _free(exprs):
    out = set()
    for x in exprs:
        out |= x.free_symbols if not isinstance(x, sp.MatrixBase) else \
            set().union(*[e.free_symbols for e in x])
    return {s.name for s in out}


@pytest.mark.parametrize("p, p_star, kwargs, expect_symbols", [
    (2, 1, dict(activation="z**2 - 1", readout=(1, Fraction(-1, 2)),
                teacher_readout=Fraction(1, 3), weight_decay=0.1, batch_size=3),
     {"weight_decay", "batch_size"}),
    (2, 2, dict(teacher_activation="3*z**2/2 + 1", readout=(2, Fraction(1, 3)),
                lr_readout=0.2, weight_decay=0.1, batch_size=2),
     {"weight_decay", "batch_size", "lr_readout", "a_1", "a_2"}),
])
def test_symbolic_matrix_form_equals_entry_form_exactly(p, p_star, kwargs, expect_symbols):
    model = sq.Model(p=p, p_star=p_star, lr=0.3, noise=0.2, **kwargs)
    matrix = sq.derive(model, "matrix").explicit()
    entries = sq.derive(model, "entries").explicit()
    assert len(matrix) == len(entries) == (4 if model.readout_trained else 3)
    assert expect_symbols <= _free(matrix), _free(matrix)
    for x, y in zip(matrix, entries):
        assert _exactly_equal(x, y)


def test_symbolic_matrix_form_refuses_the_sphere_by_name():
    with pytest.raises(ValueError, match="constraint='sphere'"):
        sq.derive(sq.Model(2, 1, 0.3, constraint="sphere"), "matrix")


# ---- multiprecision reference at p = 16 -------------------------------------------------
def _mp_case(scale=1.0):
    p, k = 16, 4
    model = sq.Model(p=p, p_star=k, lr=0.3, noise=0.2, teacher_activation="z**3 - 3*z",
                     readout=uneven_readout(p), teacher_readout=uneven_readout(k, 1),
                     lr_readout=0.4, weight_decay=0.15, batch_size=3, constraint="sphere")
    rng = np.random.default_rng(16)
    Q, rho, T = random_overlaps(p, k, rng, scale=scale)
    d = np.sqrt(np.diag(Q))
    Q, rho = Q / np.outer(d, d), rho / d[:, None]
    a = np.array([float(c) for c in model.readout]) + rng.normal(0, 0.1, p)
    return model, Q, rho, T, a


def test_mpmath_reference_equals_kernels_of_a_changed_model_at_p16():
    from symquad.symbolic.tensor import reference_entries
    model, Q, rho, T, a = _mp_case()
    dq, drho, da = [(0, 0), (0, 1), (5, 14)], [(3, 2), (15, 0)], [0, 11]
    ref = reference_entries(model, Q, rho, T, dq, drho, risk=True, readout=a, da_entries=da)
    kern = sq.kernels(model)
    dQ, dRho, dA = kern.rhs(Q, rho, T, a)
    got = {("risk",): kern.risk(Q, rho, T, a)}
    got.update({("dQ", i, j): dQ[i, j] for i, j in dq})
    got.update({("drho", i, m): dRho[i, m] for i, m in drho})
    got.update({("da", i): dA[i] for i in da})
    assert set(got) == set(ref)
    # the sphere keeps Q_kk: its drift is exactly zero in both
    assert float(ref[("dQ", 0, 0)]) == 0 and abs(got[("dQ", 0, 0)]) < 1e-14
    scales = {"dQ": np.max(np.abs(dQ)), "drho": np.max(np.abs(dRho)), "da": np.max(np.abs(dA)),
              "risk": abs(got[("risk",)])}
    for key, value in ref.items():
        err = abs(got[key] - float(value))
        assert err <= 1e-13 * scales[key[0]], (key, got[key], float(value))
    # and not trivially: the off-diagonal and readout entries are of order the block scale
    assert min(abs(float(ref[key])) for key in ref if key != ("dQ", 0, 0)) > 1e-4

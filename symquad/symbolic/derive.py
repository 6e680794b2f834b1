"""``derive(model)``: the risk and the order-parameter ODEs of a model.

Three routes, chosen by ``form``, all built on the one assembly of the drift
from the update rule (:mod:`symquad.symbolic.update`):

* ``"matrix"`` (``σ = c z² + c0``, ``σ* = c* z² + c0*``, no constraint; the
  default for such models): width-independent expressions in the
  MatrixSymbols ``Q, ρ, T`` (and ``D_a``, ``D_b`` for non-uniform readouts)
  (:mod:`symquad.symbolic.matrix_form`);
* ``"tensor"`` (any polynomial activations, the default otherwise):
  width-independent index sums of the derived 2-, 3- and 4-point functions
  ``I_2, J_2, I_3, I_4`` of the combined covariance ``C = [[Q, ρ], [ρᵀ, T]]``
  (:mod:`symquad.symbolic.tensor`);
* ``"entries"`` (any polynomial activations, small widths): explicit
  expressions in the entry symbols ``Q_ij, ρ_im, T_lm``
  (:mod:`symquad.symbolic.entries`), the independent reference.

The routes must agree exactly (``tests/test_routes_agree.py``).  Fields of
the model specification that are off (weight decay 0, batch size 1) drop out
of the equations; the learning parameters that are on stay symbols
(``eq.params`` gives their values), as ``η`` and ``Δ`` always do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import sympy as sp

from ..spec import Model, check_model
from ..stages import declare
from . import blocks, entries, matrix_form, tensor
from .symbols import (ETA, NOISE, P, P_STAR, PARAMS, matrix_symbols, overlap_symbols,
                      readout_symbols)
from .network import readout_values
from .update import switched_off
from .latex import equations_latex

__all__ = ["Equations", "derive", "FORMS"]

FORMS = ("matrix", "tensor", "entries")


def _substitute(expr, values):
    if expr is None:
        return None
    if isinstance(expr, sp.MatrixBase):
        return expr.xreplace(values).applyfunc(sp.expand)
    return expr.xreplace(values)


@dataclass(frozen=True)
class Equations:
    """Derived risk and ODE right-hand sides of a model.

    Attributes
    ----------
    model : Model
    form : {"matrix", "tensor", "entries"}
    risk : Expr
        Population risk ``ε = ½ E[(ŷ − y_clean)²]``.
    dQ, drho : MatrixExpr, Matrix or Expr
        ``dQ/dt`` (p×p) and ``dρ/dt`` (p×p*); in tensor form the expressions
        of ``dQ_kl/dt`` and ``dρ_km/dt`` as index sums (see :attr:`definitions`).
    da : MatrixExpr, Matrix, Expr or None
        ``da/dt`` of a trained readout (None for a fixed one).
    symbols : tuple
        ``(Q, rho, T)``: MatrixSymbols (matrix form) or entry-symbol matrices;
        ``(C, w)`` (IndexedBase) in tensor form.
    eta, noise : Symbol
        The symbols standing for ``η`` (step size) and ``Δ`` (label-noise variance).
    """

    model: Model
    form: str
    risk: sp.Expr
    dQ: sp.Basic
    drho: sp.Basic
    symbols: tuple
    eta: sp.Symbol = ETA
    noise: sp.Symbol = NOISE
    _matrix: object = field(default=None, repr=False, compare=False)
    da: sp.Basic = None

    @property
    def params(self) -> dict:
        """Numerical values of the scalar symbols for this model."""
        m = declare(self.model, "derive(form=%r)" % self.form)
        # every kernel parameter (symbols.PARAMS, read off the fields' metadata), by name
        given = m.kernel_params()
        values = {sym: sp.nsimplify(given[sym.name]) for sym in PARAMS}
        if self.form in ("matrix", "tensor"):
            values.update({P: m.p, P_STAR: m.p_star})
        return values

    @property
    def definitions(self) -> dict:
        """Tensor form: ``{I_2(a,b): ..., J_2(k,l): ..., I_3(k,j,a): ..., I_4(k,l,a,b): ...}``."""
        if self.form != "tensor":
            raise ValueError(f"definitions exist in tensor form only (this is {self.form!r})")
        return dict(self._matrix)

    def explicit(self):
        """``(risk, dQ, drho)`` — and ``da`` for a trained readout — entry by entry.

        Explicit SymPy in the entry symbols (and ``a_1..a_p`` for a trained
        readout), with the fixed readouts' values, ``η`` and ``Δ`` symbolic and
        the other learning parameters symbolic when switched on.  In tensor
        form this runs the entry route (its cost grows fast with ``p``; it
        checks the size first).
        """
        if "spectrum" in self.model.changed_fields():
            raise ValueError("explicit() does not support the model field spectrum (the "
                             "entry route for blocks, symquad.symbolic.blocks.block_entries, "
                             "is the explicit per-block reference)")
        values = {**readout_values(self.model), **switched_off(self.model)}
        if self.form == "matrix":
            _check_explicit_matrix_size(self.model)
            out = matrix_form.explicit(self.model, self._matrix)
        else:
            risk, dQ, drho, da = (entries.derive_entries(self.model) if self.form == "tensor"
                                  else (self.risk, self.dQ, self.drho, self.da))
            out = (risk, dQ, drho) + (() if da is None else (da,))
        return tuple(sp.expand(_substitute(x, values)) if not isinstance(x, sp.MatrixBase)
                     else _substitute(x, values) for x in out)

    @property
    def entry_symbols(self):
        """Entry-symbol matrices ``(Q, rho, T)`` used by :meth:`explicit`."""
        return overlap_symbols(self.model.p, self.model.p_star)

    def latex(self, standalone: bool = False) -> str:
        """The risk and both ODEs as LaTeX (an ``align*`` block, or a whole document)."""
        declare(self.model, "the LaTeX equations")
        return equations_latex(self, standalone=standalone)

    def __repr__(self) -> str:
        p, k = self.model.p, self.model.p_star
        if self.form == "tensor":
            terms = sum(len(sp.Add.make_args(v)) for v in self._matrix.values())
            return (f"Equations(form='tensor', model={self.model!r}, "
                    f"I2/J2/I3/I4: {terms} terms, any width)")
        da = f", da: {p}x1" if self.da is not None else ""
        return (f"Equations(form={self.form!r}, model={self.model!r}, "
                f"dQ: {p}x{p}, drho: {p}x{k}{da}, risk: {sp.count_ops(self.risk)} ops)")


def default_form(model: Model) -> str:
    """``"matrix"`` for quadratic ``σ``, ``σ*`` without a constraint, else ``"tensor"``."""
    return "matrix" if model.is_quadratic and model.constraint == "none" else "tensor"


def _check_explicit_matrix_size(model: Model) -> None:
    """Refuse or warn before evaluating the matrix form on explicit p×p symbol matrices.

    That costs about ``59 s · (p/16)^3.7`` (measured on 2 shared cores at
    ``p* = 2``: 4.6 s at p = 8, 20 s at 12, 59 s at 16); the limits are the
    entry route's (:data:`~symquad.symbolic.entries.ENTRY_WARN_SECONDS`, ``..._REFUSE_...``).
    """
    import warnings
    estimate = 59.0 * (model.p / 16) ** 3.7
    if estimate > entries.ENTRY_REFUSE_SECONDS:
        raise ValueError(
            f"explicit() at p={model.p} would take about {estimate:.3g} s (> "
            f"{entries.ENTRY_REFUSE_SECONDS:.0f} s allowed; it grows like p^3.7); the "
            f"matrix form itself (eq.risk, eq.dQ, eq.drho) is width independent")
    if estimate > entries.ENTRY_WARN_SECONDS:
        warnings.warn(f"explicit() at p={model.p} will take about {estimate:.3g} s",
                      RuntimeWarning, stacklevel=3)


def derive(model: Model, form: str | None = None) -> Equations:
    """Derive the population risk and the ODEs of ``model``.

    Parameters
    ----------
    model : Model
    form : {"matrix", "tensor", "entries"}, optional
        Default: ``"matrix"`` for quadratic activations (student and teacher)
        without a constraint, else ``"tensor"``.

    Returns
    -------
    Equations
        ``η`` and ``Δ`` are kept as symbols (``eq.eta``, ``eq.noise``), and so
        are the other learning parameters when switched on; ``eq.params`` maps
        them to the model's values.
    """
    check_model(model)
    if form is None:
        form = default_form(model)
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    declare(model, f"derive(form={form!r})")
    if not model.schedule.is_constant:
        # a schedule changes no expression: the drift of the constant-eta model with the
        # symbol eta read as eta(t) = eta s(t) (docs/model.md); derived untimed, kept on it
        eqs = derive(model.replace(lr_schedule="constant"), form)
        return dataclasses.replace(eqs, model=model)
    off = switched_off(model)
    if "spectrum" in model.changed_fields():
        # the moment kinds and the risk are the isotropic model's at Ω; the per-block drift
        # in those kinds is derived from the update rule through the projectors (blocks.py)
        iso = derive(model.replace(spectrum="1:1"), form)
        md = blocks.block_moment_drift(model)
        return dataclasses.replace(iso, model=model, dQ=_substitute(md.dQ, off),
                                   drho=_substitute(md.drho, off), da=_substitute(md.da, off))
    if form == "matrix":
        eqs = matrix_form.derive_matrix_form(model)
        return Equations(model, form, _substitute(eqs.risk, off), _substitute(eqs.dQ, off),
                         _substitute(eqs.drho, off), matrix_symbols(), _matrix=eqs,
                         da=_substitute(eqs.da, off))
    if form == "tensor":
        risk, dQ, drho, da, definitions = tensor.tensor_equations(model)
        return Equations(model, form, risk, _substitute(dQ, off), _substitute(drho, off),
                         (tensor.COV, tensor.WEIGHT), _matrix=definitions,
                         da=_substitute(da, off))
    risk, dQ, drho, da = entries.derive_entries(model)
    values = {**readout_values(model), **off}
    return Equations(model, form, sp.expand(_substitute(risk, values)), _substitute(dQ, values),
                     _substitute(drho, values), overlap_symbols(model.p, model.p_star),
                     da=_substitute(da, values))

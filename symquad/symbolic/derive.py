"""``derive(model)``: the risk and the order-parameter ODEs of a model.

Three routes, chosen by ``form``:

* ``"matrix"`` (σ(z) = c z², the default for quadratic models): width
  independent expressions in the MatrixSymbols ``Q, ρ, T``
  (:mod:`symquad.symbolic.matrix_form`);
* ``"tensor"`` (any polynomial activation, the default for non-quadratic
  ones): width-independent index sums of the derived 2-, 3- and 4-point
  functions ``I_2, J_2, I_3, I_4`` of the combined covariance
  ``C = [[Q, ρ], [ρᵀ, T]]`` (:mod:`symquad.symbolic.tensor`);
* ``"entries"`` (any polynomial activation, small widths): explicit
  expressions in the entry symbols ``Q_ij, ρ_im, T_lm``
  (:mod:`symquad.symbolic.entries`).

Both start from the model's network, loss and SGD update
(:mod:`symquad.symbolic.network`) and must agree exactly
(``tests/test_routes_agree.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from ..spec import Model, check_model
from . import entries, matrix_form, tensor
from .symbols import ETA, NOISE, P, P_STAR, matrix_symbols, overlap_symbols

__all__ = ["Equations", "derive", "FORMS"]

FORMS = ("matrix", "tensor", "entries")


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

    @property
    def params(self) -> dict:
        """Numerical values of the scalar symbols for this model."""
        values = {ETA: sp.nsimplify(self.model.eta), NOISE: sp.nsimplify(self.model.noise)}
        if self.form in ("matrix", "tensor"):
            values.update({P: self.model.p, P_STAR: self.model.p_star})
        return values

    @property
    def definitions(self) -> dict:
        """Tensor form: ``{I_2(a,b): ..., J_2(k,l): ..., I_3(k,j,a): ..., I_4(k,l,a,b): ...}``."""
        if self.form != "tensor":
            raise ValueError(f"definitions exist in tensor form only (this is {self.form!r})")
        return dict(self._matrix)

    def explicit(self):
        """``(risk, dQ, drho)`` as explicit SymPy in the entry symbols (η, Δ symbolic).

        In tensor form this runs the entry route (its cost grows fast with
        ``p``; it checks the size first).
        """
        if self.form == "entries":
            return self.risk, self.dQ, self.drho
        if self.form == "tensor":
            return entries.derive_entries(self.model)
        _check_explicit_matrix_size(self.model)
        return matrix_form.explicit(self.model, self._matrix)

    @property
    def entry_symbols(self):
        """Entry-symbol matrices ``(Q, rho, T)`` used by :meth:`explicit`."""
        return overlap_symbols(self.model.p, self.model.p_star)

    def latex(self, standalone: bool = False) -> str:
        """The risk and both ODEs as LaTeX (an ``align*`` block, or a whole document)."""
        from .latex import equations_latex
        return equations_latex(self, standalone=standalone)

    def __repr__(self) -> str:
        p, k = self.model.p, self.model.p_star
        if self.form == "tensor":
            terms = sum(len(sp.Add.make_args(v)) for v in self._matrix.values())
            return (f"Equations(form='tensor', model={self.model!r}, "
                    f"I2/J2/I3/I4: {terms} terms, any width)")
        return (f"Equations(form={self.form!r}, model={self.model!r}, "
                f"dQ: {p}x{p}, drho: {p}x{k}, risk: {sp.count_ops(self.risk)} ops)")


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
        Default: ``"matrix"`` for a quadratic activation, else ``"tensor"``.

    Returns
    -------
    Equations
        ``η`` and ``Δ`` are kept as symbols (``eq.eta``, ``eq.noise``);
        ``eq.params`` maps them to the model's values.
    """
    check_model(model)
    if form is None:
        form = "matrix" if model.is_quadratic else "tensor"
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if form == "matrix":
        eqs = matrix_form.derive_matrix_form(model)
        return Equations(model, form, eqs.risk, eqs.dQ, eqs.drho, matrix_symbols(),
                         _matrix=eqs)
    if form == "tensor":
        risk, dQ, drho, definitions = tensor.tensor_equations(model)
        return Equations(model, form, risk, dQ, drho, (tensor.COV, tensor.WEIGHT),
                         _matrix=definitions)
    risk, dQ, drho = entries.derive_entries(model)
    return Equations(model, form, risk, dQ, drho,
                     overlap_symbols(model.p, model.p_star))

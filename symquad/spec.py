"""The model specification: the single input of every derivation stage.

A :class:`Model` fixes everything that defines the learning problem of docs/model.md:

* student ``ŷ = (1/p) Σ_k σ(λ_k)`` with ``λ_k = w_k·x/√N``;
* teacher ``y = (1/p*) Σ_l σ(ν_l) + √Δ ξ`` with ``ν_l = w*_l·x/√N``;
* loss ``ℓ = ½ (ŷ − y)²`` and one-pass SGD ``w_k ← w_k − η ∂ℓ/∂w_k``;
* time ``t = steps / N``.

It is frozen and hashable and imports nothing but the standard library, so the
numeric runtime can use it without SymPy.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Integral, Rational, Real

__all__ = ["Model", "LR_SCALINGS", "check_model"]

#: Learning-rate conventions.  ``"fixed"``: the SGD step size is ``η = lr``
#: whatever the width.  ``"width"``: ``η = lr · p`` (the convention under which
#: the escape rate depends on ``p*`` only at leading order in η, see
#: docs/model.md §4).
LR_SCALINGS = ("fixed", "width")


def _to_fraction(value, name: str) -> Fraction:
    """Exact rational from an int, Fraction, float or numeric string."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got a bool")
    if isinstance(value, (Integral, Rational)):
        return Fraction(value)
    if isinstance(value, Real):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be finite, got {value!r}")
        # repr() gives the shortest decimal that round-trips, so 0.1 -> 1/10.
        return Fraction(repr(float(value)))
    if isinstance(value, str):
        try:
            return Fraction(value)
        except ValueError:
            pass
    raise TypeError(f"{name} must be a rational number, got {value!r}")


def _parse_activation(activation) -> tuple[Fraction, ...]:
    """Coefficients ``(c0, c1, ..., cd)`` of the polynomial ``σ(z) = Σ c_j z^j``.

    Accepts a coefficient sequence (lowest order first), a string such as
    ``"z**2 + z/2"`` or a SymPy expression in ``z``.  Strings and expressions are
    parsed with SymPy, imported only here, so coefficient tuples keep the
    numeric runtime SymPy-free.
    """
    if isinstance(activation, (tuple, list)):
        coeffs = tuple(_to_fraction(c, f"activation[{j}]") for j, c in enumerate(activation))
    else:
        try:
            import sympy
        except ImportError as exc:  # pragma: no cover - sympy is a dependency
            raise TypeError(
                "activation given as an expression needs SymPy; pass coefficients "
                "(c0, c1, ..., cd) instead") from exc
        z = sympy.Symbol("z")
        try:
            expr = sympy.sympify(activation, locals={"z": z}) if isinstance(activation, str) \
                else sympy.sympify(activation)
        except (sympy.SympifyError, TypeError, SyntaxError) as exc:
            raise ValueError(
                f"activation must be a polynomial in z, could not parse {activation!r}") from exc
        extra = expr.free_symbols - {z}
        if extra:
            raise ValueError(
                f"activation must be a polynomial in z alone; it also contains "
                f"{sorted(map(str, extra))}")
        if not expr.is_polynomial(z):
            raise ValueError(f"activation must be a polynomial in z, got {expr}")
        poly = sympy.Poly(expr, z)
        if not all(c.is_rational for c in poly.all_coeffs()):
            raise ValueError(
                f"activation coefficients must be rational numbers, got {expr}")
        coeffs = tuple(Fraction(int(c.p), int(c.q)) for c in reversed(poly.all_coeffs()))
    while len(coeffs) > 1 and coeffs[-1] == 0:
        coeffs = coeffs[:-1]
    if len(coeffs) < 2:
        raise ValueError(
            "activation must be a non-constant polynomial in z (degree >= 1); a constant "
            "activation has zero gradient")
    return coeffs


def _format_activation(coeffs: tuple[Fraction, ...]) -> str:
    terms = []
    for j, c in enumerate(coeffs):
        if c == 0:
            continue
        mono = "" if j == 0 else ("z" if j == 1 else f"z**{j}")
        if j == 0:
            terms.append(str(c))
        elif c == 1:
            terms.append(mono)
        else:
            terms.append(f"{c}*{mono}" if c.denominator == 1 else f"({c})*{mono}")
    return " + ".join(terms).replace("+ -", "- ")


@dataclass(frozen=True)
class Model:
    """Teacher–student two-layer network trained by one-pass SGD.

    Parameters
    ----------
    p : int
        Student width (number of hidden units), ``p >= 1``.
    p_star : int
        Teacher width, ``p_star >= 1``.
    lr : float
        Learning rate, ``lr > 0``.  The SGD step size is ``η = lr`` or
        ``η = lr · p`` depending on `lr_scaling`.
    noise : float, optional
        Label-noise variance ``Δ >= 0`` (``y`` gets ``+ √Δ ξ``).
    activation : str, sequence or SymPy expression, optional
        The polynomial ``σ(z)``; ``"z**2"`` (coefficients ``(0, 0, 1)``) by default.
    lr_scaling : {"fixed", "width"}, optional
        ``"fixed"``: ``η = lr``; ``"width"``: ``η = lr · p``.

    Examples
    --------
    >>> Model(p=3, p_star=2, lr=0.2)
    Model(p=3, p_star=2, lr=0.2, noise=0.0, activation='z**2', lr_scaling='fixed')
    """

    p: int
    p_star: int
    lr: float
    noise: float = 0.0
    activation: tuple = field(default=(0, 0, 1))
    lr_scaling: str = "fixed"

    def __post_init__(self):
        for name in ("p", "p_star"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise TypeError(f"{name} must be an integer >= 1, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value}")
            object.__setattr__(self, name, int(value))
        for name, lower_ok in (("lr", False), ("noise", True)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real):
                raise TypeError(f"{name} must be a real number, got {value!r}")
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
            if name == "lr" and value <= 0:
                raise ValueError(f"lr must be > 0 (allowed range: (0, inf)), got {value}")
            if name == "noise" and value < 0:
                raise ValueError(
                    f"noise (label-noise variance) must be >= 0 (allowed range: [0, inf)), "
                    f"got {value}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "activation", _parse_activation(self.activation))
        if self.lr_scaling not in LR_SCALINGS:
            raise ValueError(
                f"lr_scaling must be one of {LR_SCALINGS}, got {self.lr_scaling!r}")

    # ---- derived quantities -------------------------------------------------
    @property
    def eta(self) -> float:
        """The SGD step size ``η`` (``lr`` or ``lr·p``, see `lr_scaling`)."""
        return self.lr * self.p if self.lr_scaling == "width" else self.lr

    @property
    def degree(self) -> int:
        """Degree of the activation polynomial."""
        return len(self.activation) - 1

    @property
    def is_quadratic(self) -> bool:
        """True when ``σ(z) = c z² + c0`` (``c ≠ 0``): the matrix-form route applies.

        The constant ``c0`` cancels in ``ŷ − y`` and so does not matter.
        """
        return self.degree == 2 and self.activation[1] == 0

    @property
    def activation_str(self) -> str:
        """The activation as a SymPy-parsable string in ``z``."""
        return _format_activation(self.activation)

    @property
    def structure_key(self) -> str:
        """Stable hash of what the symbolic ODE depends on: ``(p, p*, σ)``.

        The learning rate and the noise enter the generated kernels as arguments,
        so models that differ only in them share kernels.  Unlike ``hash()`` this
        does not change between Python processes.
        """
        text = f"p={self.p};p_star={self.p_star};activation={self.activation_str}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def replace(self, **changes) -> "Model":
        """A copy with some fields changed (validated like a new model)."""
        values = {f: getattr(self, f) for f in
                  ("p", "p_star", "lr", "noise", "activation", "lr_scaling")}
        values.update(changes)
        return Model(**values)

    def __repr__(self) -> str:
        return (f"Model(p={self.p}, p_star={self.p_star}, lr={self.lr!r}, "
                f"noise={self.noise!r}, activation={self.activation_str!r}, "
                f"lr_scaling={self.lr_scaling!r})")


def check_model(model, name: str = "model") -> Model:
    """Return ``model`` if it is a :class:`Model`, else raise a TypeError naming ``name``."""
    if not isinstance(model, Model):
        raise TypeError(f"{name} must be a symquad.Model, got {type(model).__name__}")
    return model


#: The built-in default model (plateau and escape within t ≈ 100 from a random
#: start at N ~ 10^3-10^4).  Used by ``symquad validate`` and the examples.
DEFAULT_MODEL = Model(p=4, p_star=2, lr=0.1)

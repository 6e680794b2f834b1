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

import ast
import hashlib
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Integral, Rational, Real

__all__ = ["Model", "LR_SCALINGS", "MAX_DEGREE", "check_model", "parse_polynomial"]

#: Learning-rate conventions.  ``"fixed"``: the SGD step size is ``η = lr``
#: whatever the width.  ``"width"``: ``η = lr · p`` (the convention under which
#: the escape rate depends on ``p*`` only at leading order in η, see
#: docs/model.md §4).
LR_SCALINGS = ("fixed", "width")


# A rational written as a string: "3", "-1/2", "0.25", "1.5e-3" (nothing else is read).
_NUMBER_STRING = re.compile(
    r"[+-]?(\d+/\d+|(\d+\.?\d*|\.\d+)([eE](?P<exp>[+-]?\d{1,9}))?)")


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
        match = _NUMBER_STRING.fullmatch(value.strip())
        # a bounded exponent: Fraction("1e-99999999") would build a huge power of ten
        if match and abs(int(match.group("exp") or 0)) <= 400:
            return Fraction(value.strip())
        raise ValueError(f"{name} must be a rational number such as '3', '-1/2' or '0.25' "
                         f"(decimal exponent within +-400), got {value!r}")
    raise TypeError(f"{name} must be a rational number, got {value!r}")


#: Largest activation degree a Model accepts.  The derivation's cost grows
#: quickly with the degree (Wick expectations of products of up to ``2d + 2``
#: Gaussian fields): entry kernels for p=2, p*=1 with every coefficient
#: non-zero took 5 s at degree 3 and 13 s at degree 4 on a shared 2-core
#: machine, and degree 6 took minutes.  The cap is checked on the syntax tree
#: before any arithmetic, so ``"z**1000000"`` is refused at once.
MAX_DEGREE = 8

#: Longest activation string accepted (a polynomial of degree <= MAX_DEGREE
#: needs far less); bounds the parser's work before it starts.
MAX_ACTIVATION_CHARS = 1000

# Bound on the size (bits of numerator or denominator) of any coefficient met
# while parsing: powers of constants are checked against it before they are
# computed, so "10**10**10"-like strings cannot make the parser hang.
_MAX_COEFF_BITS = 4096

_ALLOWED_SYNTAX = "numbers, the variable z, + - * / ** (non-negative integer exponents) and parentheses"


def _syntax_error(activation: str, what: str) -> ValueError:
    return ValueError(
        f"activation must be a polynomial in z written with {_ALLOWED_SYNTAX}; "
        f"{what} in {activation!r}")


def _degree_bound(node, activation: str) -> int:
    """Upper bound of the degree of the polynomial that ``node`` denotes.

    Walks the syntax tree once, refusing every node that is not part of the
    polynomial grammar (calls, attributes, names other than ``z``, ...), before
    any arithmetic is done.  The bound is what the degree cap is checked on.
    """
    if isinstance(node, ast.Expression):
        return _degree_bound(node.body, activation)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _syntax_error(activation, f"the constant {value!r} is not a real number")
        return 0
    if isinstance(node, ast.Name):
        if node.id != "z":
            raise ValueError(
                f"activation must be a polynomial in z alone; it also contains the name "
                f"{node.id!r} (in {activation!r})")
        return 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        return _degree_bound(node.operand, activation)
    if isinstance(node, ast.BinOp):
        left = _degree_bound(node.left, activation)
        if isinstance(node.op, ast.Pow):
            return left * _exponent(node.right, activation)
        right = _degree_bound(node.right, activation)
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return max(left, right)
        if isinstance(node.op, ast.Mult):
            return left + right
        if isinstance(node.op, ast.Div):
            if right:
                raise _syntax_error(activation, "division by an expression in z (not a polynomial)")
            return left
        raise _syntax_error(activation, f"the operator {type(node.op).__name__} is not allowed")
    raise _syntax_error(activation, f"{type(node).__name__.lower()} "
                                    f"{ast.unparse(node)!r} is not allowed")


def _exponent(node, activation: str) -> int:
    """A non-negative integer literal exponent, at most MAX_DEGREE."""
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
        node = node.operand
    if not (isinstance(node, ast.Constant) and type(node.value) is int):
        raise _syntax_error(activation, f"the exponent {ast.unparse(node)!r} is not a "
                                        f"non-negative integer literal")
    if node.value > MAX_DEGREE:
        raise ValueError(
            f"activation: exponent {node.value} exceeds the degree cap; the activation's "
            f"degree must be in [1, {MAX_DEGREE}] (symquad.spec.MAX_DEGREE), in {activation!r}")
    return node.value


# Polynomials are tuples of Fractions, lowest order first.
def _poly_add(a, b, sign=1):
    n = max(len(a), len(b))
    a, b = a + (Fraction(0),) * (n - len(a)), b + (Fraction(0),) * (n - len(b))
    return tuple(x + sign * y for x, y in zip(a, b))


def _poly_mul(a, b):
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return tuple(out)


def _poly_pow(a, n: int, activation: str):
    bits = max(max(c.numerator.bit_length(), c.denominator.bit_length()) for c in a)
    if bits * n > _MAX_COEFF_BITS:
        raise ValueError(f"activation: coefficients too large (more than {_MAX_COEFF_BITS} "
                         f"bits) in {activation!r}")
    out = (Fraction(1),)
    for _ in range(n):
        out = _poly_mul(out, a)
    return out


def _evaluate(node, activation: str):
    """Exact coefficients of the (already vetted) syntax tree ``node``."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, activation)
    if isinstance(node, ast.Constant):
        return (_to_fraction(node.value, "activation"),)
    if isinstance(node, ast.Name):
        return (Fraction(0), Fraction(1))
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, activation)
        return value if isinstance(node.op, ast.UAdd) else tuple(-c for c in value)
    left = _evaluate(node.left, activation)
    if isinstance(node.op, ast.Pow):
        return _poly_pow(left, _exponent(node.right, activation), activation)
    right = _evaluate(node.right, activation)
    if isinstance(node.op, ast.Add):
        return _poly_add(left, right)
    if isinstance(node.op, ast.Sub):
        return _poly_add(left, right, -1)
    if isinstance(node.op, ast.Mult):
        return _poly_mul(left, right)
    divisor = _trim(right)
    if len(divisor) > 1:
        raise _syntax_error(activation, "division by an expression in z (not a polynomial)")
    if divisor[0] == 0:
        raise ValueError(f"activation: division by zero in {activation!r}")
    return tuple(c / divisor[0] for c in left)


def _trim(coeffs):
    while len(coeffs) > 1 and coeffs[-1] == 0:
        coeffs = coeffs[:-1]
    return coeffs


def parse_polynomial(activation: str) -> tuple[Fraction, ...]:
    """Exact coefficients ``(c0, ..., cd)`` of a polynomial written as a string in ``z``.

    A restricted parser: the string is read with :func:`ast.parse` (which only
    builds a syntax tree, it runs nothing) and only numbers, the name ``z``,
    ``+ - * /``, ``**`` with a non-negative integer literal exponent, unary
    signs and parentheses are allowed.  Decimal literals are exact
    (``"0.5*z**2"`` gives ``(0, 0, 1/2)``, the same as the tuple
    ``(0, 0, 0.5)``).  The degree cap ``MAX_DEGREE`` is checked on the syntax
    tree before any arithmetic.

    Raises
    ------
    ValueError
        Naming ``activation`` and what is not allowed.
    """
    if len(activation) > MAX_ACTIVATION_CHARS:
        raise ValueError(f"activation string too long ({len(activation)} characters; allowed "
                         f"at most {MAX_ACTIVATION_CHARS})")
    try:
        tree = ast.parse(activation.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"activation must be a polynomial in z; could not parse "
                         f"{activation!r} ({type(exc).__name__})") from None
    try:
        bound = _degree_bound(tree, activation)
        if bound > MAX_DEGREE:
            raise ValueError(
                f"activation {activation!r} has degree up to {bound}; the degree must be "
                f"in [1, {MAX_DEGREE}] (symquad.spec.MAX_DEGREE)")
        return _trim(_evaluate(tree, activation))
    except RecursionError:
        raise ValueError(f"activation {activation!r} is nested too deeply") from None


def _coefficient_sequence(activation) -> bool:
    """True for a list, tuple or 1-d array of coefficients (not a string)."""
    if isinstance(activation, (tuple, list)):
        return True
    return hasattr(activation, "__array__") and getattr(activation, "ndim", None) == 1


def _parse_activation(activation) -> tuple[Fraction, ...]:
    """Coefficients ``(c0, c1, ..., cd)`` of the polynomial ``σ(z) = Σ c_j z^j``.

    Accepts a coefficient sequence (lowest order first), a string such as
    ``"z**2 + z/2"`` (read by :func:`parse_polynomial`, which never executes
    it) or a SymPy expression in ``z`` (read through its string form by the
    same parser, so SymPy is not imported here).  The degree must be in
    ``[1, MAX_DEGREE]``.
    """
    if isinstance(activation, str):
        coeffs = parse_polynomial(activation)
    elif _coefficient_sequence(activation):
        coeffs = _trim(tuple(_to_fraction(c, f"activation[{j}]")
                             for j, c in enumerate(activation)))
    elif type(activation).__module__.split(".")[0] == "sympy":
        coeffs = parse_polynomial(str(activation))
    else:
        raise TypeError(
            f"activation must be a string in z, a sequence of coefficients (c0, c1, ..., cd) "
            f"or a SymPy expression, got {type(activation).__name__}")
    if len(coeffs) - 1 > MAX_DEGREE:
        raise ValueError(f"activation has degree {len(coeffs) - 1}; the degree must be in "
                         f"[1, {MAX_DEGREE}] (symquad.spec.MAX_DEGREE)")
    if len(coeffs) < 2:
        raise ValueError(
            "activation must be a non-constant polynomial in z (degree in "
            f"[1, {MAX_DEGREE}]); a constant activation has zero gradient")
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

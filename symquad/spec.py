"""The model specification: the single input of every derivation stage.

A :class:`Model` fixes everything that defines the learning problem of docs/model.md:

* student ``ŷ = Σ_k a_k σ(λ_k)`` with ``λ_k = w_k·x/√N`` (default ``a_k = 1/p``);
* teacher ``y = Σ_m b_m σ*(ν_m) + √Δ ξ`` with ``ν_m = w*_m·x/√N`` (default
  ``σ* = σ``, ``b_m = 1/p*``);
* loss ``ℓ = ½ (ŷ − y)²`` and one-pass SGD on mini-batches of ``b`` samples,
  ``w_k ← w_k − η ∂ℓ/∂w_k − (ηλ/N) w_k``, an optionally trained readout
  ``a_k ← a_k − (η_a/N) ∂ℓ/∂a_k`` and an optional spherical constraint;
* time ``t = steps / N``.

Every field carries metadata (validation kind, help text, allowed range, CLI
flag) from which the CLI, the sweep tasks and persistence are built
(:func:`model_fields`).  Routines that were derived for the classic model call
:func:`require`, which refuses every specification field they do not handle
by name.  The model is frozen and hashable and imports nothing but the
standard library, so the numeric runtime can use it without SymPy.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
from dataclasses import dataclass, field, fields
from fractions import Fraction
from numbers import Integral, Rational, Real

# ACTIVATION_LABELS lives with the descriptions (the floor below), re-exported here
from ._describe import ACTIVATION_LABELS, _polynomial, describe_model
from .schedule import parse_schedule
from .spectrum import (ISOTROPIC, MAX_BLOCKS, blocks_key, parse_spectrum, spectrum_text,
                       stand_in_spectrum)

__all__ = ["Model", "LR_SCALINGS", "CONSTRAINTS", "MAX_DEGREE", "MAX_WIDTH", "MAX_RATE", "MAX_BATCH_SIZE", "CLASSIC_FIELDS",
           "check_model", "require", "LOSSES", "error_signal_weight", "model_fields", "default_readout", "parse_polynomial",
           "NAMED_ACTIVATIONS", "ACTIVATION_LABELS", "activation_label", "activation_kind",
           "activation_key", "activation_tag", "special_module_name"]

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
            try:
                return Fraction(value.strip())
            except ZeroDivisionError:           # "1/0": bad input, not a bug
                raise ValueError(f"{name} must be a rational number with a non-zero "
                                 f"denominator, got {value!r}") from None
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

#: The non-polynomial activations, by name (names the parser knows; nothing is evaluated).
#: ``"erf"`` is **erf(z/√2)** = 2Φ(z) − 1, the convention of Saad & Solla (1995) and Goldt
#: et al. (2019) (σ'(z) = √(2/π) e^{−z²/2}); ``"relu"`` is max(0, z).
NAMED_ACTIVATIONS = ("erf", "relu")


def activation_key(act):
    """Canonical hashable form: ``"erf"``, ``"relu"`` or a tuple of Fractions.

    Raises
    ------
    ValueError
        For an unknown name, an empty tuple or a polynomial of degree 0.
    """
    if isinstance(act, str):
        if act not in NAMED_ACTIVATIONS:
            raise ValueError(f"activation must be one of {NAMED_ACTIVATIONS} or a coefficient "
                             f"tuple, got {act!r}")
        return act
    coeffs = tuple(Fraction(c) for c in act)
    while len(coeffs) > 1 and coeffs[-1] == 0:
        coeffs = coeffs[:-1]
    if len(coeffs) < 2:
        raise ValueError(f"a polynomial activation must have degree >= 1, got {act!r}")
    return coeffs


def activation_tag(act) -> str:
    """An activation as a Python identifier part: ``erf``, ``relu`` or ``poly_<coefficients>``."""
    act = activation_key(act)
    if isinstance(act, str):
        return act
    return "poly_" + "_".join(str(c).replace("/", "o").replace("-", "m") for c in act)


def special_module_name(student, teacher) -> str:
    """``special_<student>_<teacher>`` (polynomials by their coefficients)."""
    return f"special_{activation_tag(student)}_{activation_tag(teacher)}"



_NAMED_HINT = ("for erf(z/√2) or max(0, z) give the names 'erf' or 'relu' "
               "(activation='erf')")


def activation_kind(activation) -> str:
    """``"polynomial"`` for a coefficient tuple, else the name (``"erf"``, ``"relu"``)."""
    return activation if isinstance(activation, str) else "polynomial"


def activation_label(activation, tex: bool = False) -> str:
    """Human-readable activation: ``erf(z/√2)``, ``max(0, z)`` or the polynomial (``z**3 - 3*z``).

    The named activations always print with their convention (erf means
    ``erf(z/√2)``); `tex` gives LaTeX math for them.
    """
    if isinstance(activation, str):
        return ACTIVATION_LABELS[activation][1 if tex else 0]
    if tex:
        return _polynomial(activation, tex=True)
    return _format_activation(activation)


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
                f"activation must be a polynomial in z alone or one of the names "
                f"{NAMED_ACTIVATIONS}; it also contains the name {node.id!r} (in "
                f"{activation!r}; {_NAMED_HINT})")
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
    if isinstance(node, ast.Call):
        raise _syntax_error(activation, f"the call {ast.unparse(node)!r} is not allowed "
                                        f"({_NAMED_HINT})")
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


def _exact_literals(tree, source: str) -> None:
    """Replace every decimal literal of `tree` by the exact rational its text denotes.

    Python's parser reads ``0.1`` as the nearest float (and ``1e400`` as
    inf); the coefficient is meant as written, so each float literal is read
    again from its own text (:func:`_to_fraction`, bounded exponent):
    ``"0.1000000000000000055511151231257827*z"`` keeps all its digits, as the
    same number does in a readout or a coefficient string.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, float):
            text = ast.get_source_segment(source, node)
            node.value = _to_fraction(text.replace("_", "") if text else repr(node.value),
                                      "activation")


def parse_polynomial(activation: str) -> tuple[Fraction, ...]:
    """Exact coefficients ``(c0, ..., cd)`` of a polynomial written as a string in ``z``.

    A restricted parser: the string is read with :func:`ast.parse` (which only
    builds a syntax tree, it runs nothing) and only numbers, the name ``z``,
    ``+ - * /``, ``**`` with a non-negative integer literal exponent, unary
    signs and parentheses are allowed.  Decimal literals are exact rationals
    read from their text, never through a float (``"0.5*z**2"`` gives
    ``(0, 0, 1/2)``, ``"0.1000000000000000055511151231257827*z"`` keeps every
    digit; :func:`_exact_literals`).  The degree cap ``MAX_DEGREE`` is checked on the syntax
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
        _exact_literals(tree, activation.strip())
        return _trim(_evaluate(tree, activation))
    except RecursionError:
        raise ValueError(f"activation {activation!r} is nested too deeply") from None


def _coefficient_sequence(activation) -> bool:
    """True for a list, tuple or 1-d array of coefficients (not a string)."""
    if isinstance(activation, (tuple, list)):
        return True
    return hasattr(activation, "__array__") and getattr(activation, "ndim", None) == 1


def _parse_activation(activation, name: str = "activation"):
    """Coefficients ``(c0, c1, ..., cd)`` of the polynomial ``σ(z) = Σ c_j z^j``, or a name.

    Accepts one of :data:`NAMED_ACTIVATIONS` (``"erf"`` for erf(z/√2),
    ``"relu"``; case and surrounding spaces ignored; returned as the name), a
    coefficient sequence (lowest order first), a string such as ``"z**2 +
    z/2"`` (read by :func:`parse_polynomial`, which never executes it) or a
    SymPy expression in ``z`` (read through its string form by the same
    parser, so SymPy is not imported here).  The degree must be in ``[1,
    MAX_DEGREE]``.  `name` (``"activation"`` or ``"teacher_activation"``) is
    the parameter the errors name.
    """
    try:
        coeffs = _activation_coefficients(activation)
    except (TypeError, ValueError) as exc:
        if name == "activation":
            raise
        raise type(exc)(f"{name}: {exc}") from None
    return coeffs


def _activation_coefficients(activation):
    if isinstance(activation, str) and activation.strip().lower() in NAMED_ACTIVATIONS:
        return activation.strip().lower()
    if isinstance(activation, str):
        coeffs = parse_polynomial(activation)
    elif _coefficient_sequence(activation):
        coeffs = _trim(tuple(_to_fraction(c, f"activation[{j}]")
                             for j, c in enumerate(activation)))
    elif type(activation).__module__.split(".")[0] == "sympy":
        coeffs = parse_polynomial(str(activation))
    else:
        raise TypeError(
            f"activation must be a string in z, one of the names {NAMED_ACTIVATIONS}, a "
            f"sequence of coefficients (c0, c1, ..., cd) or a SymPy expression, got "
            f"{type(activation).__name__}")
    if len(coeffs) - 1 > MAX_DEGREE:
        raise ValueError(f"activation has degree {len(coeffs) - 1}; the degree must be in "
                         f"[1, {MAX_DEGREE}] (symquad.spec.MAX_DEGREE)")
    if len(coeffs) < 2:
        raise ValueError(
            "activation must be a non-constant polynomial in z (degree in "
            f"[1, {MAX_DEGREE}]); a constant activation has zero gradient")
    return coeffs


def _activation_text(activation) -> str:
    """A polynomial as a string in ``z``; a name as itself (both read back by Model)."""
    return activation if isinstance(activation, str) else _format_activation(activation)


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


#: Constraints on the student weights.  ``"none"``: plain SGD.  ``"sphere"``:
#: after every step each student row is renormalised to ``|w_k|² = N``, so
#: ``Q_kk = 1`` (docs/model.md §2).
CONSTRAINTS = ("none", "sphere")

#: The per-sample losses, declared once: name -> the coefficient ``c`` of the student's
#: output in the loss's *error signal* ``e = ∂ℓ/∂ŷ = c ŷ − y``.  ``"square"``: ``ℓ = ½(ŷ −
#: y)²``, ``e = ŷ − y`` (``c = 1``); ``"correlation"``: ``ℓ = −y ŷ``, ``e = −y`` (``c = 0``:
#: the student's own output drops out of the gradient).  Every gradient of the model is
#: ``e`` times a factor of the network alone (``∂ℓ/∂λ_k = e a_k σ'(λ_k)``, ``∂ℓ/∂a_k = e
#: σ(λ_k)``), so the per-sample definition (:mod:`symquad.symbolic.network`), the moment
#: evaluators and the simulators read ``c`` from here (:func:`error_signal_weight`) and
#: nowhere else.  The risk every stage reports stays the square-loss generalisation error
#: ``ε = ½E[(ŷ − y*)²]`` whatever the loss.
LOSSES = {"square": 1, "correlation": 0}


def error_signal_weight(model) -> int:
    """The coefficient ``c`` of ``ŷ`` in the error signal ``e = c ŷ − y`` of `model`'s loss."""
    return LOSSES[model.loss]

#: Largest readout learning rate and weight decay a Model accepts.  Both are
#: rates of the dynamics in the time unit ``t = steps/N``; at ``10^12`` every time
#: scale is below ``10^-12`` of a unit of time, so the stiff solvers need ``10^12``
#: times finer steps than the run's length can resolve, and at ``weight_decay =
#: 1e100`` ``integrate`` never finished (``1e20`` took 4.5 s, the step control
#: still resolving it).  ``lr`` and ``noise`` are not bounded: with an activation
#: of scale ``c`` the dynamics depend on ``lr·c²`` and ``noise/c²`` (see
#: :func:`symquad.numeric.checks.check_float_activation`), so ``lr = 1e97`` is a
#: meaningful value for ``c = 1e-50``.
MAX_RATE = 1e12

#: Largest student or teacher width a Model accepts.  Every route holds ``p × p``
#: and ``p × p*`` overlaps per replica and time and costs at least ``p²`` per
#: step (the tensor routes ``p³`` and more): at this width one overlap matrix is
#: 134 MB and a single ODE step of the matrix form takes seconds, so anything
#: wider would exhaust memory or run for days before a result (``validate --p
#: 12000`` allocated 5.6 GB before any other check).  Checked when the Model is
#: made, so every entry point refuses a wider model before any work.
MAX_WIDTH = 4096

#: Largest mini-batch a Model accepts: a step costs ``O(b)`` in every
#: simulator, and ``b`` enters the drift as ``η²/b``.
MAX_BATCH_SIZE = 2**20

#: Fields that exist since symquad 0.1 (positional order of :class:`Model`);
#: the others are the model-specification fields of docs/model.md §2.
CLASSIC_FIELDS = ("p", "p_star", "lr", "noise", "activation", "lr_scaling")


#: The kinds of Model field (metadata ``role``); a field's role decides how it enters the
#: generated code and so every cache (:meth:`Model.structure_text`, :meth:`Model.stand_in`):
#:
#: * ``"structure"``: the generated code depends on its value (the widths, the activations,
#:   the constraint, a loss): the structure key and every stand-in model hold the value;
#: * ``"param"``: its value is an argument of the kernels at call time (a kernel parameter
#:   with ``param=``, a readout, the learning rate): not in the structure key, except that
#:   ``switch=ON`` puts whether it is on (not at its default) into the key, and stand-ins use
#:   the value ``ON`` then (a trained readout adds the state block ``a``).  ``switch`` may be
#:   a function of the value (the stand-in's value), and ``keyed=`` a function giving the
#:   part of the value the generated code depends on (the key then holds ``name=keyed(value)``
#:   instead of ``name=on``): the spectrum's number of blocks ``B``, whose fractions and
#:   eigenvalues are call-time arguments;
#: * ``"time"``: a function of time evaluated at run time (a learning-rate schedule): the key
#:   holds whether it is on (the kernels then take ``t``), stand-ins keep its value.
#:
#: Whatever the role, a field beyond :data:`CLASSIC_FIELDS` at a non-default value is refused
#: by every stage that does not declare it (:mod:`symquad.stages`, docs/extending.md).
FIELD_ROLES = ("structure", "param", "time")


def _meta(kind, help, range_text, flag=None, *, role, **extra):
    """Metadata of one Model field: validation kind, help text, allowed range, CLI flag, role."""
    if role not in FIELD_ROLES:
        raise ValueError(f"a Model field's role must be one of {FIELD_ROLES}, got {role!r}")
    return {"kind": kind, "help": help, "range": range_text, "flag": flag, "role": role,
            **extra}


def _check_integer(name, value, lower, upper=None):
    allowed = f"in [{lower}, {upper}]" if upper is not None else f">= {lower}"
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer {allowed}, got {value!r}")
    if value < lower or (upper is not None and value > upper):
        raise ValueError(f"{name} must be an integer {allowed}, got {value}")
    return int(value)


def _check_float(name, value, positive, what=None, upper=None):
    label = f"{name} ({what})" if what else name
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if upper is not None and value > upper:
        low = "(0" if positive else "[0"
        raise ValueError(f"{label} must be in {low}, {upper:g}] (symquad.spec.MAX_RATE: "
                         f"beyond it every time scale of the dynamics is below 1e-12 and the "
                         f"solvers cannot resolve it), got {value:g}")
    hi = "inf)" if upper is None else f"{upper:g}]"
    if positive and value <= 0:
        raise ValueError(f"{label} must be > 0 (allowed range: (0, {hi}), got {value}")
    if value < 0:
        raise ValueError(f"{label} must be >= 0 (allowed range: [0, {hi}), got {value}")
    return value


#: Largest magnitude of a readout weight.  Every numeric route turns the weights
#: into float64 and multiplies two of them with the activation's moments (the
#: risk has ``a_k a_l E[σσ]``), so a weight must keep its square far inside
#: float64's ``10^±308``; ``1e400`` (beyond float64) was an OverflowError deep
#: inside a run.
MAX_READOUT = 1e100


def _bounded_weight(value: Fraction, name: str) -> Fraction:
    if abs(value) > Fraction(MAX_READOUT):
        magnitude = len(str(abs(value.numerator))) - len(str(value.denominator))
        raise ValueError(f"{name} must be a number in [-1e100, 1e100] (float64 routes square "
                         f"it; symquad.spec.MAX_READOUT), got about 1e{magnitude}")
    return value


def _check_readout(name, value, width, width_name):
    """Output weights as a tuple of exact rationals of length `width`.

    A scalar means the same weight for every unit (``readout=1``: un-normalised
    output ``Σ_k σ(λ_k)``); a sequence must have length `width`.
    """
    if isinstance(value, bytes) or not (_coefficient_sequence(value) or isinstance(
            value, (Real, Rational, str))):
        raise TypeError(f"{name} must be a number or a sequence of {width} numbers "
                        f"(one per unit), got {type(value).__name__}")
    if not _coefficient_sequence(value):
        return (_bounded_weight(_to_fraction(value, name), name),) * width
    values = tuple(_bounded_weight(_to_fraction(v, f"{name}[{i}]"), f"{name}[{i}]")
                   for i, v in enumerate(value))
    if len(values) != width:
        raise ValueError(f"{name} must have length {width_name} = {width} (one weight per "
                         f"unit), got {len(values)}")
    return values


def _format_number(value: Fraction) -> str:
    """An exact rational as it can be passed back: ``1``, ``'1/3'``, or a float repr."""
    if value.denominator == 1:
        return str(value.numerator)
    if value.denominator <= 1000:
        return repr(str(value))
    return repr(float(value))


def _format_readout(values) -> str:
    if len(set(values)) == 1:
        return _format_number(values[0])
    return "(" + ", ".join(_format_number(v) for v in values) + ")"


def default_readout(width: int) -> tuple:
    """The default output weights ``(1/width, …, 1/width)`` (outputs are averages)."""
    return (Fraction(1, width),) * width


@dataclass(frozen=True)
class Model:
    """Teacher–student two-layer network trained by one-pass SGD (docs/model.md).

    The per-sample model is

    * student ``ŷ = Σ_k a_k σ(λ_k)``, ``λ_k = w_k·x/√N``;
    * teacher ``y = Σ_m b_m σ*(ν_m) + √Δ ξ``, ``ν_m = w*_m·x/√N``;
    * loss ``ℓ = ½ (ŷ − y)²``; each step averages the gradient over ``b``
      fresh samples and moves ``w_k ← w_k − η ∂ℓ/∂w_k − (ηλ/N) w_k``,
      ``a_k ← a_k − (η_a/N) ∂ℓ/∂a_k``, then applies the constraint;
    * time ``t = steps/N``.

    Parameters
    ----------
    p, p_star : int
        Student and teacher widths, ``>= 1``.
    lr : float
        Learning rate, ``> 0``; the step size is ``η = lr`` or ``η = lr·p``
        (`lr_scaling`).
    noise : float, optional
        Label-noise variance ``Δ >= 0``.
    activation : str, sequence or SymPy expression, optional
        The student's ``σ(z)``: a polynomial (``"z**2"`` by default), or one of
        the names ``"erf"`` — meaning **erf(z/√2)**, the convention of Saad &
        Solla (1995) — and ``"relu"`` (``max(0, z)``).  Stored as the
        coefficient tuple or the name.
    lr_scaling : {"fixed", "width"}, optional
        ``"fixed"``: ``η = lr``; ``"width"``: ``η = lr·p``.
    teacher_activation : str, sequence or SymPy expression, optional
        The teacher's ``σ*`` (the same choices); default: the student's
        `activation`.
    readout : number or sequence of p numbers, optional
        The student's output weights ``a`` (``a(0)`` when trained); default
        all ``1/p``.  A number means the same weight for every unit.
    teacher_readout : number or sequence of p* numbers, optional
        The teacher's output weights ``b``; default all ``1/p*``.
    lr_readout : float, optional
        ``η_a >= 0``; 0 (default) keeps the readout fixed, ``> 0`` trains it.
    weight_decay : float, optional
        ``λ >= 0`` (L2 penalty ``λ|w_k|²/(2N)`` per unit, per step).
    batch_size : int, optional
        ``b >= 1`` fresh samples per step (the gradient is their mean).
    constraint : {"none", "sphere"}, optional
        ``"sphere"``: every student row is renormalised to ``|w_k|² = N``
        after each step (``Q_kk = 1``).
    loss : {"square", "correlation"}, optional
        The per-sample loss of the SGD step (:data:`LOSSES`): ``½(ŷ − y)²``
        or the correlation loss ``−y ŷ`` (error signal ``−y``).  The risk is
        the square-loss error ``½E[(ŷ − y*)²]`` for both.
    lr_schedule : str or tuple, optional
        Learning-rate schedule, ``η(t) = η s(t)`` (:mod:`symquad.schedule`):
        ``"constant"`` (default), ``"inverse:τ"`` / ``("inverse", τ)``,
        ``"power:t0:β"``, ``"step:t1=f1:…"`` / ``("step", ((t1, f1), …))``, or
        a table of ``(t, factor)`` points (linearly interpolated).  Stored as
        the canonical text.
    spectrum : sequence of (fraction, eigenvalue) pairs or str, optional
        Inputs ``x ~ N(0, Σ)``, ``Σ = Σ_b s_b P_b`` with ``B`` blocks of ``f_b N``
        directions (:mod:`symquad.spectrum`): ``((f_1, s_1), …)`` or the text
        ``"f1:s1,f2:s2,…"``; fractions exact rationals summing to 1, eigenvalues
        positive.  Default ``((1, 1),)``: isotropic inputs.  Stored as a tuple of
        Fraction pairs.

    Examples
    --------
    >>> Model(p=3, p_star=2, lr=0.2)
    Model(p=3, p_star=2, lr=0.2, noise=0.0, activation='z**2', lr_scaling='fixed')
    >>> Model(p=3, p_star=2, lr=0.2, weight_decay=0.1, batch_size=4)
    Model(p=3, p_star=2, lr=0.2, noise=0.0, activation='z**2', lr_scaling='fixed', weight_decay=0.1, batch_size=4)
    """

    p: int = field(metadata=_meta("int", "student width", f"1..{MAX_WIDTH}", "--p",
                                  upper=MAX_WIDTH, role="structure"))
    p_star: int = field(metadata=_meta("int", "teacher width", f"1..{MAX_WIDTH}", "--p-star",
                                       upper=MAX_WIDTH, role="structure"))
    lr: float = field(metadata=_meta("positive", "learning rate (eta = lr, or lr*p with "
                                     "--lr-scaling width)", "(0, inf)", "--lr", role="param"))
    noise: float = field(default=0.0, metadata=_meta(
        "nonnegative", "label-noise variance Delta", "[0, inf)", "--noise", role="param",
        what="label-noise variance", param="Delta", latex=r"\Delta"))
    activation: tuple = field(default=(0, 0, 1), metadata=_meta(
        "activation", "student activation: a polynomial in z, or erf (meaning erf(z/sqrt(2)))"
        " or relu (max(0, z))", f"degree 1..{MAX_DEGREE}, or erf, relu", "--activation",
        role="structure"))
    lr_scaling: str = field(default="fixed", metadata=_meta(
        "choice", "learning-rate convention: fixed (eta = lr) or width (eta = lr*p)",
        "fixed, width", "--lr-scaling", role="param", choices=LR_SCALINGS))
    teacher_activation: tuple = field(default=None, metadata=_meta(
        "activation", "teacher activation sigma*: a polynomial in z, or erf (erf(z/sqrt(2)))"
        " or relu", f"degree 1..{MAX_DEGREE}, or erf, relu", "--teacher-activation",
        role="structure"))
    readout: tuple = field(default=None, metadata=_meta(
        "readout", "student output weights a: one number (every unit) or p numbers "
        "separated by commas", "finite numbers", "--readout", role="param", width="p"))
    teacher_readout: tuple = field(default=None, metadata=_meta(
        "readout", "teacher output weights b: one number or p* numbers separated by commas",
        "finite numbers", "--teacher-readout", role="param", width="p_star"))
    lr_readout: float = field(default=0.0, metadata=_meta(
        "nonnegative", "learning rate eta_a of the student readout (0: fixed readout)",
        "[0, 1e12]", "--lr-readout", upper=MAX_RATE, role="param",
        what="readout learning rate", param="lr_readout", latex=r"\eta_{a}", switch=1.0))
    weight_decay: float = field(default=0.0, metadata=_meta(
        "nonnegative", "L2 weight decay lambda of the student weights", "[0, 1e12]",
        "--weight-decay", upper=MAX_RATE, role="param", what="L2 weight decay",
        param="weight_decay",
        latex=r"\lambda_{\mathrm{wd}}", off=0))
    batch_size: int = field(default=1, metadata=_meta(
        "int", "samples per SGD step (the gradient is their mean)",
        f"1..{MAX_BATCH_SIZE}", "--batch-size", role="param", upper=MAX_BATCH_SIZE,
        param="batch_size",
        latex="B", off=1))
    constraint: str = field(default="none", metadata=_meta(
        "choice", "constraint on the student rows: none, or sphere (|w_k|^2 = N)",
        "none, sphere", "--constraint", role="structure", choices=CONSTRAINTS))
    loss: str = field(default="square", metadata=_meta(
        "choice", "per-sample loss: square (l = (yhat - y)^2/2) or correlation (l = -y yhat);"
        " the risk reported is the square-loss error either way", "square, correlation",
        "--loss", role="structure", choices=tuple(LOSSES)))
    lr_schedule: str = field(default="constant", metadata=_meta(
        "schedule", "learning-rate schedule eta(t) = lr*s(t): constant, inverse:TAU, "
        "power:T0:BETA, step:T1=F1:T2=F2:... or table:T0=F0:T1=F1:... (symquad/schedule.py)",
        "constant, inverse:TAU, power:T0:BETA, step:T=F:..., table:T=F:...",
        "--lr-schedule", role="time"))
    spectrum: tuple = field(default=ISOTROPIC, metadata=_meta(
        "spectrum", "input covariance Sigma = sum_b s_b P_b with B blocks of fraction f_b "
        "(rank P_b = f_b N) and eigenvalue s_b, written f1:s1,f2:s2,... (default 1:1, "
        "isotropic inputs)", f"fractions in (0, 1] summing to 1 exactly, eigenvalues in "
        f"[1e-100, 1e100], 1..{MAX_BLOCKS} blocks", "--spectrum", role="param",
        switch=stand_in_spectrum, keyed=blocks_key))

    def __post_init__(self):
        for f in fields(self):
            object.__setattr__(self, f.name, self._checked(f, getattr(self, f.name)))

    def _checked(self, f, value):
        """The validated, normalised value of field `f` (a ``dataclasses.Field``)."""
        kind, name = f.metadata["kind"], f.name
        if kind == "int":
            return _check_integer(name, value, 1, f.metadata.get("upper"))
        if kind in ("positive", "nonnegative"):
            return _check_float(name, value, kind == "positive", f.metadata.get("what"),
                                f.metadata.get("upper"))
        if kind == "choice":
            if not isinstance(value, str) or value not in f.metadata["choices"]:
                raise ValueError(f"{name} must be one of {f.metadata['choices']}, got {value!r}")
            return value
        if kind == "activation":
            if value is None and name == "teacher_activation":     # the student's
                return self.activation
            return _parse_activation(value, name)
        if kind == "schedule":
            return parse_schedule(value).text
        if kind == "spectrum":
            return parse_spectrum(value)
        if kind == "readout":
            width_name = f.metadata["width"]
            width = getattr(self, width_name)
            if value is None:
                return default_readout(width)
            return _check_readout(name, value, width, width_name)
        raise AssertionError(kind)  # pragma: no cover

    # ---- derived quantities -------------------------------------------------
    @property
    def eta(self) -> float:
        """The SGD step size ``η`` (``lr`` or ``lr·p``, see `lr_scaling`)."""
        return self.lr * self.p if self.lr_scaling == "width" else self.lr

    @property
    def schedule(self):
        """The :class:`symquad.schedule.Schedule` of `lr_schedule`: ``η(t) = η · s(t)``."""
        return parse_schedule(self.lr_schedule)

    def eta_at(self, t) -> float:
        """The step size ``η(t) = η s(t)`` at time ``t`` (``η`` for a constant schedule)."""
        return self.eta * self.schedule.factor(float(t))

    @property
    def activation_kind(self) -> str:
        """``"polynomial"``, ``"erf"`` or ``"relu"``: the kind of the student's ``σ``."""
        return activation_kind(self.activation)

    @property
    def teacher_activation_kind(self) -> str:
        """``"polynomial"``, ``"erf"`` or ``"relu"``: the kind of the teacher's ``σ*``."""
        return activation_kind(self.teacher_activation)

    @property
    def is_polynomial(self) -> bool:
        """True when ``σ`` and ``σ*`` are both polynomials (every polynomial route applies)."""
        return isinstance(self.activation, tuple) and isinstance(self.teacher_activation, tuple)

    def _polynomial_degree(self, name: str) -> int:
        value = getattr(self, name)
        if isinstance(value, str):
            raise ValueError(f"{name}={value!r} ({activation_label(value)}) is not a polynomial: "
                             f"it has no degree")
        return len(value) - 1

    @property
    def degree(self) -> int:
        """Degree of the student's activation polynomial (ValueError for erf/relu)."""
        return self._polynomial_degree("activation")

    @property
    def teacher_degree(self) -> int:
        """Degree of the teacher's activation polynomial (ValueError for erf/relu)."""
        return self._polynomial_degree("teacher_activation")

    @property
    def is_quadratic(self) -> bool:
        """True when ``σ = c z² + c0`` and ``σ* = c* z² + c0*``: the matrix-form route applies.

        False for erf and ReLU.  (With the default readouts the constants
        cancel in ``ŷ − y``; in general they add the constant ``c0 Σa − c0* Σb``
        to the error.)
        """
        return self.is_polynomial and all(len(c) == 3 and c[1] == 0
                                          for c in (self.activation, self.teacher_activation))

    @property
    def n_blocks(self) -> int:
        """``B``, the number of blocks of the input spectrum (1 for isotropic inputs)."""
        return len(self.spectrum)

    @property
    def readout_trained(self) -> bool:
        """True when the student readout is trained (``lr_readout > 0``)."""
        return self.lr_readout > 0

    @property
    def activation_str(self) -> str:
        """The student activation as :class:`Model` reads it back: a string in ``z``
        (SymPy-parsable) or the name ``"erf"`` / ``"relu"``."""
        return _activation_text(self.activation)

    @property
    def teacher_activation_str(self) -> str:
        """The teacher activation as :class:`Model` reads it back (see :attr:`activation_str`)."""
        return _activation_text(self.teacher_activation)

    def is_default(self, name: str) -> bool:
        """True when field `name` has its default value (for this model's widths)."""
        value = getattr(self, name)
        if name == "teacher_activation":
            return value == self.activation
        if name == "readout":
            return value == default_readout(self.p)
        if name == "teacher_readout":
            return value == default_readout(self.p_star)
        f = self.__dataclass_fields__[name]    # this class's fields (a subclass may add some)
        return value == f.default

    def changed_fields(self) -> tuple:
        """Names of the model-specification fields that differ from their defaults.

        Only the fields beyond :data:`CLASSIC_FIELDS` are reported: they are what
        an analysis derived for the classic model must either handle or refuse
        (:func:`require`).
        """
        # memoised on the instance (it is frozen): every stage asks, some per call
        cached = self.__dict__.get("_changed_fields")
        if cached is None:
            cached = tuple(f.name for f in fields(self)
                           if f.name not in CLASSIC_FIELDS and not self.is_default(f.name))
            object.__setattr__(self, "_changed_fields", cached)
        return cached

    def kernel_params(self) -> dict:
        """Numerical values of the kernels' scalar parameters, by name (:data:`KERNEL_PARAMS`).

        ``eta`` (the step size, from ``lr`` and ``lr_scaling``) and every field
        whose metadata names a kernel parameter (``Delta``, ``weight_decay``,
        ``batch_size``, ``lr_readout``): the order of every generated kernel's
        ``PARAMS``.
        """
        values = {"eta": self.eta}
        for f in fields(self):
            if "param" in f.metadata:
                values[f.metadata["param"]] = float(getattr(self, f.name))
        return values

    def structure_text(self, exclude=()) -> str:
        """What generated code depends on, as text, read off the fields' ``role`` metadata.

        Every ``"structure"`` field by value (the classic ones always, the others
        when not at their default), and ``name=on`` for each ``"time"`` field and
        each ``"param"`` field with a ``switch`` that is on; ``"param"`` fields
        are kernel arguments and do not enter.  Nothing lists fields by hand: a
        field added to the specification enters through its role.  `exclude`
        names fields a cache is known not to depend on (e.g. the widths, for the
        width-independent tensor modules).
        """
        parts, keyed = [], set(self.keyed_changes())
        for f in fields(self):
            role, name = f.metadata["role"], f.name
            if name in exclude:
                continue
            if role == "structure" and (name in CLASSIC_FIELDS or not self.is_default(name)):
                parts.append(f"{name}={self._field_text(name)}")
            elif name in keyed:
                part = f.metadata.get("keyed")
                parts.append(f"{name}={part(getattr(self, name)) if part else 'on'}")
        return ";".join(parts)

    def keyed_changes(self, exclude=()) -> tuple:
        """Names of the fields away from their default that enter :meth:`structure_text`.

        Every non-default field whose role is not ``"param"`` (or is a switched
        ``"param"``), except those in `exclude`: what a module generated without
        knowing these fields would get wrong.
        """
        return tuple(f.name for f in fields(self)
                     if f.name not in exclude and not self.is_default(f.name)
                     and (f.metadata["role"] != "param" or "switch" in f.metadata))

    @property
    def structure_key(self) -> str:
        """Stable hash of :meth:`structure_text`: the key of every kernel cache.

        Models that differ only in ``"param"`` fields (learning rates, noise,
        weight decay, batch size, the readouts) share kernels: those values are
        arguments.  Unlike ``hash()`` this does not change between processes.
        """
        return hashlib.sha256(self.structure_text().encode()).hexdigest()[:16]

    def stand_in(self, p: int = 2, p_star: int = 1, activations: bool = False) -> "Model":
        """The model the width- and activation-independent symbolic derivations see.

        Widths `p`, `p_star`, the default activations (this model's with
        `activations`) and readouts, ``lr = 1`` and
        every ``"param"`` field at its default (a switched one at its ``switch``
        value when on); every other field (``"structure"``, ``"time"``, and any
        role added later) keeps its value.  The symbolic caches are keyed by it, so
        models that differ in anything the derivation sees never share an entry.
        """
        values = {"p": p, "p_star": p_star, "lr": 1.0}
        for f in fields(self):
            name, meta = f.name, f.metadata
            if name in values or self.is_default(name) or (
                    not activations and name in ("activation", "teacher_activation")):
                continue
            if meta["role"] != "param":
                values[name] = getattr(self, name)
            elif "switch" in meta:
                switch = meta["switch"]
                values[name] = switch(getattr(self, name)) if callable(switch) else switch
        return type(self)(**values)

    def replace(self, **changes) -> "Model":
        """A copy with some fields changed (validated like a new model).

        Fields that hold their default keep following it: a default readout is
        ``1/p`` of the *new* ``p``, a default teacher activation is the *new*
        student activation.  A uniform non-default readout keeps its value for
        a new width (``readout=1`` stays un-normalised); any other readout must
        be given again when its width changes.
        """
        names = [f.name for f in fields(self)]      # this class's (a subclass may add some)
        unknown = set(changes) - set(names)
        if unknown:
            raise TypeError(f"Model has no field(s) {sorted(unknown)}; fields: {names}")
        values = {f: getattr(self, f) for f in names}
        for name, width in (("teacher_activation", None), ("readout", "p"),
                            ("teacher_readout", "p_star")):
            if name in changes:
                continue
            if self.is_default(name):
                values[name] = None
            elif width and changes.get(width, getattr(self, width)) != getattr(self, width) \
                    and len(set(values[name])) == 1:
                values[name] = values[name][0]
        values.update(changes)
        return type(self)(**values)

    def describe(self) -> str:
        """Short human-readable description, e.g. ``p = 4, p* = 2, η = 0.1, σ = z²``.

        Built from the fields (:func:`symquad._describe.describe_model`): fields at
        their defaults are left out; figure titles and report headers use it.
        """
        return describe_model(self)

    def _field_text(self, name: str) -> str:
        value = getattr(self, name)
        if name in ("activation", "teacher_activation"):
            return _activation_text(value)
        if name in ("readout", "teacher_readout"):
            return _format_readout(value).replace("'", "")
        if name == "spectrum":
            return spectrum_text(value)
        return f"{value:g}" if isinstance(value, float) else str(value)

    def __repr__(self) -> str:
        text = (f"Model(p={self.p}, p_star={self.p_star}, lr={self.lr!r}, "
                f"noise={self.noise!r}, activation={self.activation_str!r}, "
                f"lr_scaling={self.lr_scaling!r}")
        for name in self.changed_fields():
            value = getattr(self, name)
            if name == "teacher_activation":
                text += f", teacher_activation={self.teacher_activation_str!r}"
            elif name in ("readout", "teacher_readout"):
                text += f", {name}={_format_readout(value)}"
            elif name == "spectrum":
                text += f", spectrum={spectrum_text(value)!r}"
            else:
                text += f", {name}={value!r}"
        return text + ")"


#: The generated kernels' scalar parameters, in the order of their ``PARAMS``: the step
#: size ``eta`` and every field whose metadata names a kernel parameter.  A field added
#: to the specification with ``param=...`` becomes a kernel argument (and a SymPy
#: symbol, :data:`symquad.symbolic.symbols.PARAMS`) with no other edit.
KERNEL_PARAMS = ("eta",) + tuple(f.metadata["param"] for f in fields(Model)
                                 if "param" in f.metadata)

#: ``name -> dataclasses.Field`` of every Model field, in order.
_FIELDS = {f.name: f for f in fields(Model)}


def model_fields():
    """The ``dataclasses.Field`` objects of :class:`Model`, in order (with metadata).

    Each field's ``metadata`` holds ``kind``, ``help``, ``range`` and the CLI
    ``flag``: the CLI, the sweep tasks and persistence are built from it.
    """
    return tuple(_FIELDS.values())


def require(model: Model, routine: str, supports=(), why: str = "") -> Model:
    """Refuse a model whose changed specification fields `routine` does not handle.

    Parameters
    ----------
    model : Model
    routine : str
        Name used in the error, e.g. ``"plateau"``.
    supports : iterable of str
        Specification fields (beyond :data:`CLASSIC_FIELDS`) the routine
        handles.  Every other changed field is refused by name, so a field
        added to the specification later is refused until the routine is
        extended, never silently ignored.
    why : str, optional
        Appended to the message (what the result was derived for).

    Raises
    ------
    ValueError
        Naming each unsupported field and its value.
    """
    check_model(model)
    bad = [name for name in model.changed_fields() if name not in set(supports)]
    if bad:
        listed = ", ".join(f"{name}={model._field_text(name)}" for name in bad)
        raise ValueError(
            f"{routine} does not support the model field(s) {listed}"
            + (f" ({why})" if why else "")
            + (f"; it supports changes of {', '.join(sorted(supports))} only" if supports
               else "; it is derived for the classic model (default values of "
                    f"{', '.join(n for n in _FIELDS if n not in CLASSIC_FIELDS)})"))
    return model


def check_model(model, name: str = "model") -> Model:
    """Return ``model`` if it is a :class:`Model`, else raise a TypeError naming ``name``."""
    if not isinstance(model, Model):
        raise TypeError(f"{name} must be a symquad.Model, got {type(model).__name__}")
    return model


#: The built-in default model (plateau and escape within t ≈ 100 from a random
#: start at N ~ 10^3-10^4).  Used by ``symquad validate`` and the examples.
DEFAULT_MODEL = Model(p=4, p_star=2, lr=0.1)

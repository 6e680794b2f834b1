"""Short human-readable descriptions of a model, built from its fields.

``describe_model(Model(p=4, p_star=2, lr=0.1))`` is ``"p = 4, p* = 2, η = 0.1,
σ = z²"`` (and ``σ = erf(z/√2)`` for ``activation="erf"``: the named activations
always print with their convention): figure titles, report headers and LaTeX documents use it instead of
the model's ``repr``.  It walks the dataclass fields of the model, so a field
added to :class:`symquad.Model` later shows up without a change here: the
fields below get a symbol, any other field prints as ``name = value``.  A
field at its default value is left out, except the widths, the step size and
the activation, which every description names.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from numbers import Real

__all__ = ["describe_model", "ACTIVATION_LABELS"]

#: Text and LaTeX of each named activation, as every description prints it.
ACTIVATION_LABELS = {
    "erf": ("erf(z/√2)", r"\operatorname{erf}(z/\sqrt{2})"),
    "relu": ("max(0, z)", r"\max(0, z)"),
}

_SUPERSCRIPTS = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")

#: field -> (text symbol, LaTeX symbol); fields in this order come first.
_SYMBOLS = {
    "p": ("p", "p"),
    "p_star": ("p*", "p^*"),
    "lr": ("η", r"\eta"),
    "activation": ("σ", r"\sigma(z)"),
    "teacher_activation": ("σ*", r"\sigma^*(z)"),
    "noise": ("Δ", r"\Delta"),
    "readout": ("a", "a"),
    "teacher_readout": ("b", "b"),
    "lr_readout": ("η_a", r"\eta_a"),
    "weight_decay": ("λ", r"\lambda"),
    "batch_size": ("batch", r"\text{batch}"),
    "constraint": ("constraint", r"\text{constraint}"),
    "spectrum": ("Σ", r"\Sigma"),
}
#: Always named, even at their default values.
_ALWAYS = ("p", "p_star", "lr", "activation")
#: Folded into another field's text (``lr_scaling`` into ``η = lr·p``).
_FOLDED = ("lr_scaling",)


def _number(x) -> str:
    if isinstance(x, Fraction):
        return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"
    if isinstance(x, Real) and not isinstance(x, bool):
        return f"{float(x):g}" if not float(x).is_integer() or abs(x) >= 1e6 \
            else str(int(x))
    return str(x)


def _polynomial(coeffs, tex: bool) -> str:
    """``(c0, c1, ...)`` as ``z³ − 3z`` (text) or ``z^{3} - 3 z`` (LaTeX), highest power first."""
    terms = []
    for power in range(len(coeffs) - 1, -1, -1):
        c = Fraction(coeffs[power])
        if c == 0:
            continue
        mag = abs(c)
        if power == 0:
            body = _number(mag)
        else:
            z = "z" if power == 1 else (f"z^{{{power}}}" if tex else
                                        "z" + str(power).translate(_SUPERSCRIPTS))
            coef = "" if mag == 1 else _number(mag)
            if coef and "/" in coef:
                coef = (rf"\tfrac{{{mag.numerator}}}{{{mag.denominator}}}" if tex
                        else f"({coef})")
            body = coef + (" " if tex and coef else "") + z
        sign = "-" if c < 0 else "+"
        terms.append((sign, body))
    if not terms:
        return "0"
    minus = "-" if tex else "−"
    text = (minus if terms[0][0] == "-" else "") + terms[0][1]
    for sign, body in terms[1:]:
        text += f" {minus if sign == '-' else '+'} {body}"
    return text


def _value(name, value, tex: bool) -> str:
    if name == "spectrum":            # blocks fraction:eigenvalue, as the CLI writes them
        sep = "{:}" if tex else ":"
        return ("(" if tex else "") + (r",\ " if tex else ", ").join(
            f"{_number(f)}{sep}{_number(s)}" for f, s in value) + (")" if tex else "")
    if name.endswith("activation"):
        if isinstance(value, str):
            # a named activation always prints with its convention (erf means erf(z/√2))
            if value in ACTIVATION_LABELS:
                return ACTIVATION_LABELS[value][1 if tex else 0]
            return rf"\mathrm{{{value}}}" if tex else value
        return _polynomial(value, tex)
    if isinstance(value, (tuple, list)):
        values = list(value)
        if values and all(v == values[0] for v in values):
            return f"{_number(values[0])} (all)"
        shown = ", ".join(_number(v) for v in values[:4])
        more = ", …" if len(values) > 4 else ""
        if more and tex:
            more = r", \dots"
        return f"({shown}{more})"
    return _number(value)


def _default_of(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()                      # type: ignore[misc]
    return dataclasses.MISSING


def _is_implicit_default(model, name, value) -> bool:
    """Fields whose default depends on other fields (the student's σ, uniform readouts)."""
    if value is None:
        return True
    if name == "teacher_activation":
        return value == getattr(model, "activation", None)
    width = {"readout": "p", "teacher_readout": "p_star"}.get(name)
    if width is not None and isinstance(value, (tuple, list)):
        n = getattr(model, width, None)
        return bool(n) and len(value) == n and all(
            abs(float(v) - 1.0 / n) <= 1e-15 for v in value)
    return False


def _items(values: dict, defaults: dict, model=None):
    """``[(name, value)]`` to describe, in a fixed order (known fields first)."""
    order = [n for n in _SYMBOLS if n in values] + sorted(
        n for n in values if n not in _SYMBOLS and n not in _FOLDED)
    out = []
    for name in order:
        value = values[name]
        if name not in _ALWAYS:
            default = defaults.get(name, dataclasses.MISSING)
            if default is not dataclasses.MISSING and value == default:
                continue
            if model is not None and _is_implicit_default(model, name, value):
                continue
            if model is None and value is None:
                continue
        out.append((name, value))
    return out


def _render(items, values, tex: bool, exclude=()) -> str:
    parts = []
    for name, value in items:
        if name in exclude:
            continue
        text_sym, tex_sym = _SYMBOLS.get(name, (name, rf"\mathrm{{{name}}}".replace("_", r"\_")))
        sym = tex_sym if tex else text_sym
        if name == "loss":               # the training loss, by its per-sample definition
            parts.append(rf"\text{{{value} loss}}\ \ell=-y\hat y" if tex and value == "correlation"
                         else rf"\text{{{value} loss}}" if tex else f"{value} loss")
            continue
        if name == "constraint":
            parts.append(rf"\text{{{value} constraint}}" if tex else f"{value} constraint")
            continue
        shown = _value(name, value, tex)
        if name == "lr" and values.get("lr_scaling") == "width":
            shown += r"\,p" if tex else "·p"
        parts.append(f"{sym}={shown}" if tex else f"{sym} = {shown}")
    return ",\\ ".join(parts) if tex else ", ".join(parts)


def describe_model(model, tex: bool = False, exclude=()) -> str:
    """A short description of `model` from its fields: ``"p = 4, p* = 2, η = 0.1, σ = z²"``.

    Parameters
    ----------
    model : symquad.Model
    tex : bool
        LaTeX math (``p=4,\\ p^*=2,\\ \\eta=0.1,\\ \\sigma=z^{2}``, to be placed
        inside ``$...$``) instead of plain text.
    exclude : iterable of str
        Field names to leave out (e.g. ``("lr", "noise")`` where they stay symbolic).
    """
    fields = dataclasses.fields(model)
    values = {f.name: getattr(model, f.name) for f in fields}
    defaults = {f.name: _default_of(f) for f in fields}
    return _render(_items(values, defaults, model), values, tex, tuple(exclude))

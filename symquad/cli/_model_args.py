"""Command-line flags of the model, built from the fields of :class:`symquad.Model`.

Every command that takes a model calls :func:`add_model_arguments` and
:func:`model_from_args`: the flags, their help texts and their allowed ranges
come from the field metadata (:func:`symquad.spec.model_fields`), so a field
added to the specification is a flag of every command at once.  Values are
validated by :class:`~symquad.Model` itself; readouts are read as numbers
separated by commas or colons (``--readout 1,1/2,1/4`` or ``--readout
1:1/2:1/4``) or one number for every unit.

``symquad sweep`` reads grid values of model fields with :func:`field_value`:
there commas separate grid values, so a readout's components are separated by
colons (``--grid readout=1/2:1/4,1`` is two points: ``(1/2, 1/4)`` and ``1``).
"""

from __future__ import annotations

import argparse

from ..spec import DEFAULT_MODEL, Model, _to_fraction, model_fields
from ..spectrum import spectrum_text
from ..studies.tasks import parse_activation

__all__ = ["add_model_arguments", "model_from_args", "model_flags", "field_value",
           "fields_help"]


def _readout(text: str):
    parts = [part.strip() for part in text.replace(":", ",").split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}")
    return parts[0] if len(parts) == 1 else tuple(parts)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _spectrum(text: str) -> str:
    # checked by the Model (symquad.spectrum.parse_spectrum: one-line errors naming spectrum)
    return text.strip()


_TYPES = {"int": _int, "positive": _float, "nonnegative": _float, "readout": _readout,
          "spectrum": _spectrum}


def model_flags(exclude=()) -> dict:
    """``{field name: flag}`` of the model fields a command exposes."""
    return {f.name: f.metadata["flag"] for f in model_fields() if f.name not in exclude}


def add_model_arguments(parser, defaults: Model | None = DEFAULT_MODEL, exclude=(),
                        fixed: dict | None = None, suppress_defaults: bool = False) -> None:
    """Add one flag per field of :class:`~symquad.Model` to `parser`.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    defaults : Model, optional
        Its values are the flags' defaults (shown in ``--help``).
    exclude : iterable of str
        Fields the command does not take (e.g. ``lr`` for a command that
        prints width-independent equations).
    fixed : dict, optional
        Defaults overriding those of `defaults` (e.g. ``{"p": 3}``).
    suppress_defaults : bool
        Give the flags no argparse default (``argparse.SUPPRESS``), so that the
        command can tell which fields were given and apply them over another
        base model (``symquad validate --data run.npz`` uses the saved run's
        model); the help still states the defaults.
    """
    group = parser.add_argument_group("model (see docs/model.md)")
    fixed = fixed or {}
    for f in model_fields():
        if f.name in exclude:
            continue
        meta = f.metadata
        default = fixed.get(f.name, getattr(defaults, f.name) if defaults is not None else None)
        if meta["kind"] == "activation":
            default = fixed.get(f.name, None if f.name == "teacher_activation"
                                else defaults.activation_str)
        if meta["kind"] == "readout":
            default = fixed.get(f.name, None)
        if meta["kind"] == "spectrum" and not isinstance(default, str):
            default = spectrum_text(default)
        shown = "the student's" if f.name == "teacher_activation" else (
            "1/p each" if f.name == "readout" else "1/p* each" if f.name == "teacher_readout"
            else default)
        kwargs = dict(dest=f.name, default=argparse.SUPPRESS if suppress_defaults else default,
                      help=f"{meta['help']}; allowed {meta['range']} (default {shown})")
        if meta["kind"] == "choice":
            kwargs["choices"] = meta["choices"]
        elif meta["kind"] in _TYPES:
            kwargs["type"] = _TYPES[meta["kind"]]
            kwargs["metavar"] = f.name.upper()
        group.add_argument(meta["flag"], **kwargs)


def model_from_args(args, **overrides) -> Model:
    """The :class:`~symquad.Model` of parsed arguments (validated by Model; errors name the field)."""
    values = {f.name: getattr(args, f.name) for f in model_fields() if hasattr(args, f.name)}
    values.update(overrides)
    values = {k: v for k, v in values.items() if v is not None or k in ("p", "p_star", "lr")}
    return Model(**values)


def field_value(name: str, text: str):
    """The value of Model field `name` written as `text` (a grid value of ``symquad sweep``).

    Integers, numbers and choices are converted and range-checked as the
    Model checks them (``ValueError`` naming the field and its allowed range);
    an activation stays text (a polynomial in ``z`` or coefficients, read by
    the task); a readout is one number or numbers separated by ``:``, each
    checked to be a rational number (its length is checked per point, where
    ``p`` is known).  ``none`` means the field's default where it has one
    that depends on other fields (teacher activation, readouts).
    """

    fields = {f.name: f for f in model_fields()}
    f = fields[name]
    meta, raw = f.metadata, text.strip()
    if raw.lower() == "none" and f.default is None:
        return None
    converter = _TYPES.get(meta["kind"])
    try:
        if meta["kind"] == "readout":
            parts = [part.strip() for part in raw.split(":")]
            if not all(parts):
                raise ValueError(f"expected a number or numbers separated by ':', got {raw!r}")
            return ":".join(str(_to_fraction(part, name)) for part in parts)
        value = converter(raw) if converter is not None else raw
        # the Model's own checks (ranges, choices, activation syntax) on a probe model
        probe = {"p": 1, "p_star": 1, "lr": 1.0}
        if meta["kind"] == "activation":
            probe[name] = parse_activation(value)       # as the task will read it
        else:
            probe[name] = value
        Model(**probe)
        return value
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        raise ValueError(f"{name} (allowed {meta['range']}): {exc}") from None


def fields_help() -> str:
    """One line per Model field: name, allowed range and help (for a command's epilog)."""
    lines = []
    for f in model_fields():
        meta = f.metadata
        lines.append(f"  {f.name:18s} {meta['help']}; allowed {meta['range']}")
    return "\n".join(lines)

"""The description of a stored report's model from its configuration dict.

Above both :mod:`symquad.spec` (it parses the stored activation into a
:class:`~symquad.Model` field) and :mod:`symquad._describe` (which the model's own
``describe()`` uses, so ``_describe`` cannot import ``spec``).
"""

from __future__ import annotations

import dataclasses

from ._describe import _default_of, _items, _render
from .spec import Model, _parse_activation

__all__ = ["describe_config"]


def describe_config(config: dict, tex: bool = False) -> str:
    """The description of a report's model from its configuration dict.

    Uses the stored ``"description"`` when the report has one (reports written
    by this version), else the model keys of the configuration (``p``,
    ``p_star``, ``lr``, ``noise``, ``activation``, ``lr_scaling``).
    """
    if not tex and isinstance(config.get("description"), str):
        return config["description"]
    values = {k: config[k] for k in ("p", "p_star", "lr", "noise", "activation", "lr_scaling")
              if k in config}
    if "activation" in values:
        values["activation"] = _parse_activation(values["activation"])
    defaults = {f.name: _default_of(f) for f in dataclasses.fields(Model)}
    return _render(_items(values, defaults), values, tex)

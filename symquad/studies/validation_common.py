"""Small helpers shared by the validation modules (model configuration, argument checks).

Split out of :mod:`symquad.studies.validation` (which re-exports its names).
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

from .._describe import describe_model
from ..numeric.persist import model_to_dict



STARTS = ("random", "informed")


def _describe(x):
    """Mean, standard error, median and 5/95 % quantiles of a sample (NaN-aware)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"n": 0, "mean": None, "se": None, "median": None, "q05": None, "q95": None}
    return {"n": int(x.size), "mean": float(x.mean()),
            "se": float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else None,
            "median": float(np.median(x)), "q05": float(np.quantile(x, 0.05)),
            "q95": float(np.quantile(x, 0.95)), "std": float(x.std(ddof=1)) if x.size > 1
            else None}


def _finite_float(x):
    x = float(x)
    return x if math.isfinite(x) else None


def _check_common(band, escape_fraction, alpha):
    if not (isinstance(band, (tuple, list)) and len(band) == 2
            and all(isinstance(x, Real) and not isinstance(x, bool) for x in band)
            and 0 <= band[0] < band[1] <= 100):
        raise ValueError(f"band must be two percentiles 0 <= lo < hi <= 100, got {band!r}")
    if isinstance(escape_fraction, bool) or not isinstance(escape_fraction, Real) \
            or not 0 < escape_fraction < 1:
        raise ValueError(f"escape_fraction must be in (0, 1), got {escape_fraction!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")


def _model_config(model):
    """The model in a report's configuration: its repr, a description, the classic fields
    and every field.

    ``model_spec`` holds every field as :func:`symquad.numeric.persist.model_to_dict`
    writes it (``ValidationReport.model`` reads it back); ``changed_fields``
    names the specification fields that differ from their defaults.
    """

    return {"model": repr(model), "description": describe_model(model), "p": model.p,
            "p_star": model.p_star, "lr": model.lr,
            "eta": model.eta, "noise": model.noise, "activation": model.activation_str,
            "lr_scaling": model.lr_scaling, "model_spec": model_to_dict(model),
            "changed_fields": list(model.changed_fields())}

"""The band criterion: exchangeable coverage of the ODE curve by the replicas' band.

Split out of :mod:`symquad.studies.validation` (which re-exports its names).
"""

from __future__ import annotations





_BAND_TOL = 1e-9


def _exchangeable_coverage(R, band):
    """Chance that a curve distributed like the R replicas lies in their percentile band.

    With ``R`` exchangeable values and a band between the empirical percentiles
    ``lo, hi`` (linear interpolation, so between order statistics of rank
    ``1 + (R − 1) lo/100`` and ``1 + (R − 1) hi/100``), a new value falls inside
    with probability ``(R − 1)(hi − lo)/100 / (R + 1)`` — exactly for uniform
    values (the interpolation is then linear in the CDF), and slightly less
    than the truth for bell-shaped ones (0.014 at R = 8, Gaussian), which makes
    the band criterion lenient by that much.
    """
    return float((R - 1) * (band[1] - band[0]) / 100.0 / (R + 1)) if R > 1 else 0.0

r"""Per-block statistics of the mean-deviation criterion for inputs with a spectrum.

With ``x ~ N(0, Σ)``, ``Σ = Σ_c s_c P_c`` (docs/model.md §1a) the state is per block,
``Q^c = W P_c Wᵀ/N``, ``ρ^c = W P_c W*ᵀ/N``, and the risk is ``ε(Ω)`` of the fields'
covariance ``Ω = Σ_c s_c [[Q^c, ρ^c], [ρ^cᵀ, T^c]]``: one scalar that weighs the blocks
by their eigenvalues.  A theory whose blocks move wrongly can keep ``ε(Ω)`` close to the
data for a while (the isotropic ODE started from ``Ω`` has the data's risk at ``t = 0``,
docs/derivation.md §1a), so the mean-deviation criterion of
:mod:`symquad.studies.validation` tests, besides the risk, ``2B`` statistics of the
block state:

.. math::  m^c_Q = \operatorname{tr} Q^c, \qquad m^c_ρ = \lVert ρ^c \rVert_F^2,
           \qquad c = 1, …, B,

the student's squared norm in block ``c`` (``|W P_c|²_F/N``) and its squared overlap
with the teacher there.  Both are invariant under the symmetries of the problem that
move the overlaps' entries without changing the law of what is measured: rotations of
the input directions within a block (they leave every ``Q^c``, ``ρ^c`` unchanged) and
rotations of the student units, ``W → OW`` with ``O ∈ O(p)`` (``Q^c → O Q^c Oᵀ``,
``ρ^c → O ρ^c``), under which the risk of ``σ = c z²`` with a uniform readout is
invariant: SGD and the ODE can then reach points that differ by such a rotation, where
entries differ by O(1) and these statistics agree (docs/model.md §9).

For each statistic ``m`` and replica ``r`` the deviation is ``m_SGD − m_ODE`` against
that replica's own ODE, and ``z(t) = |mean_r| / s.e.`` as for the risk; the criterion
takes the largest ``z`` over the risk and the ``2B`` statistics at every time of its
window, against Student's ``t`` at level ``α / (2 |W| (1 + 2B))`` (Bonferroni over the
times and the statistics: valid under any dependence between them).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["block_statistics", "block_statistic_names", "block_deviation_z"]


def block_statistics(Q, rho) -> np.ndarray:
    r"""``(tr Q^1, …, tr Q^B, ‖ρ^1‖²_F, …, ‖ρ^B‖²_F)`` along a last axis of length ``2B``.

    Parameters
    ----------
    Q : array (..., B, p, p)
    rho : array (..., B, p, p*)

    Returns
    -------
    ndarray (..., 2B)
    """
    Q, rho = np.asarray(Q, float), np.asarray(rho, float)
    traces = np.trace(Q, axis1=-2, axis2=-1)
    norms = np.sum(rho ** 2, axis=(-2, -1))
    return np.concatenate([traces, norms], axis=-1)


def block_statistic_names(B: int) -> list:
    """The names of :func:`block_statistics`' entries: ``"tr Q^1"``, …, ``"|rho^B|_F^2"``."""
    return [f"tr Q^{c + 1}" for c in range(B)] + [f"|rho^{c + 1}|_F^2" for c in range(B)]


def block_deviation_z(sgd_Q, sgd_rho, ode_Q, ode_rho, tol):
    r"""Mean deviation of the block statistics over replicas, its standard error and ``z``.

    Parameters
    ----------
    sgd_Q, ode_Q : arrays (R, n, B, p, p)
    sgd_rho, ode_rho : arrays (R, n, B, p, p*)
        The replicas used (finite), each with its own ODE.
    tol : float
        Where the standard error is 0 (a statistic the model fixes, e.g. ``tr Q^1 = p``
        on the sphere with ``B = 1``), ``z`` is 0 if ``|mean| <= tol · max(1, |m|)`` (the
        two routes' round-off) and ``inf`` otherwise, as for the risk.

    Returns
    -------
    (mean, se, z) : arrays (n, 2B)
    """
    d = block_statistics(sgd_Q, sgd_rho) - block_statistics(ode_Q, ode_rho)
    R = d.shape[0]
    mean = d.mean(0)
    se = d.std(0, ddof=1) / math.sqrt(R) if R > 1 else np.full(mean.shape, np.nan)
    scale = np.maximum(1.0, np.abs(block_statistics(sgd_Q, sgd_rho)).max(0))
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(se > 0, np.abs(mean) / se,
                     np.where(np.abs(mean) <= tol * scale, 0.0, np.inf))
    return mean, se, z

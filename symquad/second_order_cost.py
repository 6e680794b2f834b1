"""Cost law of the O(1/N) mean correction's one-time *symbolic* derivation (standard library only).

The entry route (``form='entries'``, :mod:`symquad.symbolic.second_order`) derives ``f₁``
and the drift's Hessian once per structure; the kernel route of the matrix and tensor
forms (:mod:`symquad.numeric.drift_derivatives`) needs no derivation and has its own law
per right-hand side (:func:`symquad.numeric.fluctuations.mean_correction_seconds`).
Kept out of :mod:`symquad.symbolic.second_order` so that the numeric runtime and the
studies can decide whether to derive it without importing SymPy.
"""

from __future__ import annotations

from .spec import Model

__all__ = ["SECOND_ORDER_AUTO_SECONDS", "SECOND_ORDER_REFUSE_SECONDS", "second_order_estimate"]

#: :func:`symquad.fluctuations` computes the correction by default when its derivation is
#: estimated below this (seconds), warns above it when asked explicitly ...
SECOND_ORDER_AUTO_SECONDS = 120.0
#: ... and refuses above this.
SECOND_ORDER_REFUSE_SECONDS = 3600.0


def second_order_estimate(model: Model) -> float:
    """Rough derivation time (s, shared 2-core machine) of :func:`second_order_polynomials`.

    Measured (one-time, cached per structure afterwards): ``σ = z²`` 6.9 s at
    ``(p, p*) = (2, 2)`` (``dim = 7``), 12 s at ``(3, 2)`` with a trained readout
    (``dim = 15``), 53 s at ``(4, 2)`` (``dim = 18``, busy machine); a ``z³ − 3z``
    teacher at ``(3, 2)``, trained, 20 s; a ``z³ − 3z`` student at ``(2, 1)`` 15 s.
    The ``dim³`` second derivatives dominate: ``t ≈ 7 s · (dim/7)^2.2 · 2^{deg − 2}``
    (``deg`` the larger activation degree), an upper bound on these points.

    On the sphere the renormalisation ``√N w/|w|`` is expanded to second order in every
    entry, and the cost grows much faster: ``σ = z²`` took 14.8 s at ``(2, 1)``
    (``dim = 5``), 46.5 s at ``(2, 2)`` (``dim = 7``) and about 450 s at ``(3, 2)``
    (``dim = 12``) on an idle 2-core machine, bounded by ``62 s · (dim/7)^4.2 · 2^{deg − 2}``.
    """
    p, k = model.p, model.p_star
    dim = p * (p + 1) // 2 + p * k + (p if model.readout_trained else 0)
    deg = max(model.degree, model.teacher_degree, 2)
    if model.constraint == "sphere":
        return 62.0 * (dim / 7.0) ** 4.2 * 2.0 ** (deg - 2)
    return 7.0 * (dim / 7.0) ** 2.2 * 2.0 ** (deg - 2)

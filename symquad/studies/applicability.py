"""Which of the paper's analyses the studies layer and the CLI run for a model.

The plateau and escape law, the conservation of ``S``, the Hessian spectra and
the zero-risk manifold were derived for the classic model (docs/model.md §8).
:func:`symquad.validate`, the sweep tasks and the commands ``landscape`` and
``invariants`` ask :func:`refusal` (or :func:`require_analysis`) before they
use one of them on a :class:`~symquad.Model`: each analysis lists the
specification fields it handles (:data:`ANALYSES`), and every other changed
field is refused by name (:func:`symquad.spec.require`), so a changed model
gets a stated skip or an error naming the field, never the classic model's
answer.  The analyses' own functions may refuse as well (their errors are
turned into the same skips); this table is the one place where the studies
layer opts a field in once an analysis has been extended to it.
"""

from __future__ import annotations

from ..applicability import check
from ..spec import require
from ..stages import FIELDS_0_2

__all__ = ["ANALYSES", "refusal", "require_analysis"]

# Fields validate's own statistics handle for any variant: nothing in the
# finite-size exponent (fluctuations of N t steps of size 1/N) or in the
# informed start (Q(0) = I, rho(0) = alpha P, a valid start on the sphere too)
# depends on the classic model.  The fields of symquad 0.2: a field added later is
# refused until someone has checked it and named it here.
_GENERIC = FIELDS_0_2 + ("loss",)   # the loss: neither depends on the error signal

#: analysis -> (routine name used in messages, the rules of :data:`symquad.applicability.RULES`
#: that decide it, or the fields it handles when it rests on no derived result)
ANALYSES = {
    "plateau": ("the plateau fixed point", "plateau"),
    "escape": ("the plateau/escape analysis", "escape_time"),
    "invariant_drift": ("the drift study of S", "conservation"),
    "hessian": ("the Hessian-spectrum analysis", "hessian"),
    "manifold": ("the zero-risk manifold", "manifold"),
    "conservation": ("the conservation proof of S", "conservation"),
    # an input spectrum: the deviation sums the blocks' (docs/model.md §1a), the start is
    # split over the blocks like the teacher (validation_starts.informed_start)
    "finite_size_scaling": ("the finite-size scaling", _GENERIC + ("spectrum",)),
    # Q(0) = I, rho(0) = alpha P does not depend on the step size: a schedule keeps it valid
    "informed_start": ("the informed start", _GENERIC + ("lr_schedule", "spectrum")),
}


def require_analysis(model, analysis: str):
    """Raise ValueError naming every changed field of `model` that `analysis` does not handle.

    The analyses derived for the classic model are decided by their own rules
    (:data:`symquad.applicability.RULES`, the same the analyses' functions
    apply), so a field an analysis has been extended to is run, and every other
    changed field is refused by name.
    """
    routine, rules = ANALYSES[analysis]
    if isinstance(rules, str):
        return check(model, routine, rules)
    return require(model, routine, rules)


def refusal(model, analysis: str):
    """The reason `analysis` does not apply to `model` (names the fields), or None."""
    try:
        require_analysis(model, analysis)
    except ValueError as exc:
        return str(exc)
    return None

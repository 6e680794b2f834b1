"""Which model fields each stage implements: the one table of default-deny.

Every stage of the pipeline — each derivation form, each kernel form and its
diffusion matrix and Jacobian, the solvers, the three simulators, the LNA, the
LaTeX, validate/compare, the sweep tasks, the saved files, the time
conventions — calls :func:`declare` with its name before any work.  The stage
implements exactly the fields :data:`STAGES` lists for it (beyond
:data:`symquad.spec.CLASSIC_FIELDS`, which every stage implements); a model
with any other field away from its default is refused by
:func:`symquad.spec.require`, naming the field and its value.  The analyses
derived for the classic model (plateau, escape law, Hessians, the zero-risk
manifold, conservation) have finer, conditional rules:
:data:`symquad.applicability.RULES`, which default-deny the same way.

A field added to :class:`symquad.Model` is in no entry of this table, so every
stage refuses it until the stage is extended and its entry names the field
(docs/extending.md: the recipe, and which stage needs what for each kind of
field).  Nothing here depends on the field's role: the role decides how the
field keys the caches (:meth:`symquad.Model.structure_text`), this table
decides who computes with it.

Standard library only (the numeric runtime imports this module).
"""

from __future__ import annotations

from .spec import Model, check_model, require

__all__ = ["FIELDS_0_2", "SPECTRUM", "STAGES", "declare", "stage_fields", "require_known_structure"]

#: The specification fields of symquad 0.2 beyond the classic ones.  Every stage below
#: implements them (a stage that does not handle one of them in some case refuses it itself,
#: with its own reason, as before this table existed).  Frozen: a field added later is
#: never appended here but to the entries of the stages that implement it.
FIELDS_0_2 = ("teacher_activation", "readout", "teacher_readout", "lr_readout",
              "weight_decay", "batch_size", "constraint")

#: The loss (spec.LOSSES), opted in stage by stage where the error signal is read from
#: spec.error_signal_weight and checked (tests/test_correlation_loss.py).
_LOSS = FIELDS_0_2 + ("loss",)

#: The learning-rate schedule (a ``"time"`` field): the stages below that name it evaluate
#: every ``η`` of the theory at ``η(t)`` (docs/model.md §2).
SCHEDULE = ("lr_schedule",)

#: The input spectrum (docs/model.md §1a, issue 24): opted in stage by stage as each stage
#: is derived and checked for per-block order parameters.
SPECTRUM = ("spectrum",)

#: stage name (as errors print it) -> the fields beyond CLASSIC_FIELDS it implements.
STAGES = {
    # symbolic/: the three routes, each form of derive(); the LaTeX printed from them
    "derive(form='entries')": _LOSS + SCHEDULE,
    "derive(form='matrix')": _LOSS + SCHEDULE + SPECTRUM,
    "derive(form='tensor')": _LOSS + SCHEDULE + SPECTRUM,
    "the LaTeX equations": _LOSS + SCHEDULE + SPECTRUM,
    # numeric/kernels.py: the generated kernels (rhs, risk, moments) of each form, and the
    # diffusion matrix (each form) and exact Jacobian / risk derivatives built beside them
    "kernels(form='matrix')": _LOSS + SCHEDULE + SPECTRUM,
    "kernels(form='tensor')": _LOSS + SCHEDULE + SPECTRUM,
    "kernels(form='entries')": _LOSS + SCHEDULE,
    "the diffusion matrix (form='matrix')": _LOSS + SCHEDULE + SPECTRUM,
    "the diffusion matrix (form='tensor')": _LOSS + SCHEDULE + SPECTRUM,
    "the diffusion matrix (form='entries')": _LOSS + SCHEDULE,
    "the exact Jacobian": _LOSS + SCHEDULE + SPECTRUM,
    "the state layout": _LOSS + SCHEDULE + SPECTRUM,
    # numeric/: the solvers, simulators, SDE and LNA
    "integrate": _LOSS + SCHEDULE + SPECTRUM,
    "integrate_batch": _LOSS + SCHEDULE + SPECTRUM,
    "simulate(method='full')": _LOSS + SCHEDULE + SPECTRUM,
    "simulate(method='reduced')": _LOSS + SCHEDULE + SPECTRUM,
    "simulate(method='sde')": _LOSS + SCHEDULE + SPECTRUM,
    "fluctuations": _LOSS + SCHEDULE + SPECTRUM,
    # the schedule: every term at η(t), −½ ∂f/∂t in dc/dt and a step's shift of c
    # (tests/test_second_order_sim.py, docs/derivation.md §8.3a)
    "the O(1/N) correction of the mean": _LOSS + SCHEDULE,
    "the forward sensitivities": _LOSS + SCHEDULE,
    # conventions.py: t <-> tau = eta t (a constant step size)
    "the time conventions": _LOSS,
    # studies/: validation, the sweep tasks (one entry per built-in model task)
    "validate": _LOSS + SCHEDULE + SPECTRUM,
    "compare": _LOSS + SCHEDULE + SPECTRUM,
    "sweep task 'plateau'": FIELDS_0_2,
    "sweep task 'escape'": FIELDS_0_2,
    "sweep task 'validate'": _LOSS + SCHEDULE + SPECTRUM,
    "sweep task 'ode'": _LOSS + SCHEDULE + SPECTRUM,
    "sweep task 'hessian'": FIELDS_0_2,
    # numeric/optimal.py: the optimal schedule (its model's schedule must be constant)
    "optimal_schedule": FIELDS_0_2 + SCHEDULE,
    # saved files (numeric/persist.py: runs, solutions, reports; the sweep store's points)
    "saved files": _LOSS + SCHEDULE + SPECTRUM,
}


def stage_fields(stage: str) -> tuple:
    """The fields beyond the classic ones that `stage` implements (KeyError for no stage)."""
    try:
        return STAGES[stage]
    except KeyError:
        raise KeyError(f"no stage {stage!r} in symquad.stages.STAGES (every stage declares "
                       f"the fields it implements there)") from None


def declare(model: Model, stage: str, why: str = "") -> Model:
    """Refuse `model` unless `stage` implements every field it changes; return it.

    Called by each stage before any work.  Raises ValueError naming each field
    of `model` that is away from its default and not in ``STAGES[stage]``
    (:func:`symquad.spec.require`), TypeError for a non-Model.
    """
    check_model(model)
    return require(model, stage, stage_fields(stage),
                   why or "symquad.stages.STAGES lists the fields each stage implements")


def require_known_structure(model: Model, what: str, known, remedy: str = "") -> Model:
    """Refuse fields that key the structure but that code built from `known` fields drops.

    A cache or generated module built from a fixed set of fields (a module generated
    for each constraint, a cache keyed by the activations and readouts) would compute
    the old model for any other field that changes the generated code
    (:meth:`symquad.Model.keyed_changes`: every non-default field whose role is not a
    plain kernel parameter).  Raises ValueError naming those fields.
    """
    extra = model.keyed_changes(exclude=tuple(known))
    if extra:
        listed = ", ".join(f"{name}={model._field_text(name)}" for name in extra)
        raise ValueError(f"{what} is built without the field(s) {listed} (it knows "
                         f"{', '.join(known)})" + (f"; {remedy}" if remedy else ""))
    return model

r"""Which of the paper's analyses hold for which change of the model, and the refusals.

The analyses of docs/model.md §8 (plateau and escape, Hessian spectra, the
zero-risk manifold, the conservation of ``S`` and the closest solution) were
derived for the classic model: ``σ = σ* = c z²``, readouts ``1/p`` and ``1/p*``,
no weight decay, batch size 1, a fixed readout and no constraint.  Every routine
that computes one of them calls :func:`check` with its :data:`RULES` entry
before any work.  A rule says, per specification field:

* ``None``: the routine handles the field (re-derived, or the field does not
  enter the result, e.g. the batch size does not enter the risk);
* a string: the field is refused, with this reason;
* a callable ``rule(model) -> reason | None``: handled only under a condition
  (e.g. a *uniform* readout, a *quadratic* teacher activation).

Fields without a rule are refused by :func:`symquad.spec.require` with the
routine's general reason, so a field added to the specification later is
refused until someone extends the routine.  The reasons are the derivations'
conclusions in one sentence; docs/model.md §8 gives them in full.

Standard library only (the numeric runtime imports this module).
"""

from __future__ import annotations

from fractions import Fraction

from .spec import Model, check_model, require
from .spec import activation_label

__all__ = ["RULES", "check", "is_uniform", "quadratic_coefficients", "output_constant",
           "zero_risk_scale", "readout_sign_reason", "zero_risk_reason",
           "uniform_readout_value", "plateau_is_isotropic"]


# --------------------------------------------------------------------------- predicates
def is_uniform(values) -> bool:
    """True when every unit has the same weight."""
    return len(set(values)) == 1


def quadratic_coefficients(coeffs):
    """``(c, c0)`` of ``c z² + c0``, or None when the polynomial is not of that form
    (or the activation is a name: erf, relu)."""
    if isinstance(coeffs, tuple) and len(coeffs) == 3 and coeffs[1] == 0:
        return Fraction(coeffs[2]), Fraction(coeffs[0])
    return None


def output_constant(model: Model) -> Fraction:
    r"""``κ = c0 Σ_k a_k − c0* Σ_m b_m``: the constant part of ``ŷ − y`` (quadratic model).

    Zero for the classic model (``σ* = σ``, both readouts summing to one).  When
    ``κ ≠ 0`` the error has a constant offset that no weights remove, so there
    is no zero-risk point.
    """
    (_, c0), (_, c0s) = (quadratic_coefficients(model.activation),
                         quadratic_coefficients(model.teacher_activation))
    return c0 * sum(model.readout, Fraction(0)) - c0s * sum(model.teacher_readout, Fraction(0))


def uniform_readout_value(values) -> Fraction | None:
    """The common weight of a uniform readout, else None."""
    return values[0] if is_uniform(values) else None


def readout_sign_reason(model: Model) -> str | None:
    r"""Why ``c a_k`` and ``c* b_m`` do not all share one sign (None when they do).

    The error's quadratic part is ``xᵀMx/N`` with
    ``M = (c WᵀD_aW − c* W*ᵀD_bW*)``; ``M = 0`` with ``W*`` of full rank needs
    ``c RᵀD_aR = c* D_b`` for ``W = RW*``.  When every ``c a_k`` and every
    ``c* b_m`` has the same sign ``s`` this has the solutions
    ``R = |cD_a|^{-1/2} O |c*D_b|^{1/2}``, ``OᵀO = I``; with opposite signs it has
    none, and with a readout of mixed signs units can cancel each other outside
    the teacher span, so the zero-risk set is no longer one Stiefel orbit.
    """
    c, _ = quadratic_coefficients(model.activation)
    cs, _ = quadratic_coefficients(model.teacher_activation)
    student = {(c * a > 0) - (c * a < 0) for a in model.readout}
    teacher = {(cs * b > 0) - (cs * b < 0) for b in model.teacher_readout}
    if 0 in student or 0 in teacher:
        return "a readout weight (or c, c*) is zero: some unit does not reach the output"
    if len(student) > 1:
        return ("the student's c*a_k have mixed signs: units can cancel outside the teacher "
                "span, so the zero-risk set is not one Stiefel orbit (not derived)")
    if len(teacher) > 1:
        return ("the teacher's c* b_m have mixed signs: the zero-risk condition "
                "c R^T D_a R = c* D_b has no solution of that form (not derived)")
    if student != teacher:
        return ("c a_k and c* b_m have opposite signs: c W^T D_a W = c* W*^T D_b W* has no "
                "solution, so there is no zero-risk point")
    return None


def zero_risk_reason(model: Model) -> str | None:
    """Why the quadratic model has no zero-risk manifold of the classic kind (None if it has)."""
    if quadratic_coefficients(model.teacher_activation) is None:
        return ("the teacher activation is not c* z^2 + c0*: y has components in x that the "
                "student's quadratic output cannot match, so there is no zero-risk point")
    if quadratic_coefficients(model.activation) is None:
        return "the student activation is not c z^2 + c0"
    kappa = output_constant(model)
    if kappa != 0:
        return (f"the outputs differ by the constant kappa = c0 sum(a) - c0* sum(b) = {kappa}, "
                "so there is no zero-risk point")
    return readout_sign_reason(model)


def zero_risk_scale(model: Model) -> Fraction:
    r"""``s² = c* β / (c α)`` of the zero-risk weights ``W = s O W*`` (uniform readouts α, β).

    Classic: ``s² = p/p*``.  Needs uniform readouts and no reason from
    :func:`zero_risk_reason`.
    """
    alpha, beta = uniform_readout_value(model.readout), uniform_readout_value(
        model.teacher_readout)
    if alpha is None or beta is None:
        raise ValueError("zero_risk_scale needs uniform readouts (one weight per side)")
    c, _ = quadratic_coefficients(model.activation)
    cs, _ = quadratic_coefficients(model.teacher_activation)
    return cs * beta / (c * alpha)


def plateau_is_isotropic(model: Model) -> bool:
    """True when ``Q = qI, ρ = 0`` is consistent: quadratic σ, σ*, uniform student readout."""
    return (model.is_quadratic and is_uniform(model.readout))


# --------------------------------------------------------------------------- rules
def _quadratic_teacher(model: Model):
    if quadratic_coefficients(model.teacher_activation) is None:
        return (f"it needs a quadratic teacher activation c* z^2 + c0*, got "
                f"{model.teacher_activation_str!r}")
    return None


def _uniform(name, consequence):
    def rule(model: Model):
        if is_uniform(getattr(model, name)):
            return None
        return f"a non-uniform {name.replace('_', ' ')} {consequence}"
    return rule


def _both(*rules):
    def rule(model: Model):
        for r in rules:
            reason = r(model) if callable(r) else r
            if reason:
                return reason
        return None
    return rule


def _zero_risk(model: Model):
    if quadratic_coefficients(model.teacher_activation) is None:
        return _quadratic_teacher(model)
    return zero_risk_reason(model)


_PLATEAU_READOUT = _uniform(
    "readout", "makes the plateau Q = diag(q_k) with unit-dependent norms and rates, not "
               "Q = q I (not derived)")
_TRAINED_PLATEAU = (
    "a trained readout adds the state a, and the plateau of the joint (Q, rho, a) dynamics is "
    "not derived: at rho = 0, Q = q I, for sigma = c z^2 without weight decay da = 0 forces "
    "dQ_kk = eta^2 a^2 E[sigma'(lambda_k)^2 delta^2]/b > 0, so there is no fixed point")
_TRAINED_LANDSCAPE = ("a trained readout makes a a coordinate of the landscape; the Hessian "
                      "in (W, a) is not derived")
_SPHERE_LANDSCAPE = ("on the sphere the landscape is a Riemannian Hessian on the product of "
                     "spheres |w_k|^2 = N (not derived)")
_NOT_CONSERVED = ("S is not conserved for this change (symquad invariants gives an exact "
                  "counterexample at the typical start)")

#: Per analysis: ``{field: None | reason | rule}`` (see the module docstring).
RULES = {
    # numeric plateau fixed point: rho = 0, Q = q I (or Q = I on the sphere); rate from
    # the generated kernels' Jacobian
    "plateau": {
        # any sigma*: with sigma = c z^2 + c0, E[sigma'] = 0 keeps rho = 0 fixed, and the
        # reflections lambda_k -> -lambda_k keep Q = q I (the kernels are the tensor ones)
        "teacher_activation": None,
        "readout": _PLATEAU_READOUT,
        "teacher_readout": None,          # Q = qI still; rho's rates differ per teacher unit
        "lr_readout": _TRAINED_PLATEAU,
        "weight_decay": None,
        "batch_size": None,
        "constraint": None,               # the sphere fixes q = 1
    },
    # closed forms in p, p*, eta, Delta (matrix form reduced at Q = qI)
    "plateau_solution": {
        "teacher_activation": _quadratic_teacher,
        "readout": _PLATEAU_READOUT,
        "teacher_readout": _uniform("teacher_readout",
                                    "gives rho's teacher directions different rates (the "
                                    "closed forms are for one rate)"),
        "lr_readout": _TRAINED_PLATEAU,
        "weight_decay": None,
        "batch_size": None,
        "constraint": None,
    },
    # linearised escape law from the isotropic plateau
    "escape_time": {
        "teacher_activation": _quadratic_teacher,
        "readout": _PLATEAU_READOUT,
        "teacher_readout": _uniform("teacher_readout",
                                    "gives rho's teacher directions different growth rates, "
                                    "so the isotropic linear-growth law does not hold (not "
                                    "derived)"),
        "lr_readout": _TRAINED_PLATEAU,
        "weight_decay": None,
        "batch_size": None,
        "constraint": None,               # q0 = 1; the noise seed from the derived D
    },
    # SGD-noise variance of rho at the isotropic plateau (closed form)
    "rho_diffusion": {
        "teacher_activation": _quadratic_teacher,
        "readout": _uniform("readout", "makes the plateau anisotropic"),
        "teacher_readout": _uniform("teacher_readout",
                                    "makes the noise of rho differ per teacher unit"),
        "weight_decay": None,             # deterministic: adds no noise
        "batch_size": None,               # the mean of b independent increments: D/b
        "constraint": ("the closed form leaves out the sphere's renormalisation; "
                       "plateau_rho_diffusion (from the derived diffusion matrix) covers it"),
        "lr_readout": _TRAINED_PLATEAU,
    },
    # Hessian of the objective eps + (lambda/2) tr Q at its critical points
    "hessian": {
        "teacher_activation": _quadratic_teacher,
        "readout": _uniform("readout", "moves the critical points off the symmetric rays "
                                       "(diagonal plateau, weighted minimum; not derived)"),
        "teacher_readout": _uniform("teacher_readout",
                                    "moves the minimum off the symmetric ray (not derived)"),
        "weight_decay": None,             # objective eps + (lambda/2) tr Q
        "batch_size": None,               # does not enter the objective
        "lr_readout": _TRAINED_LANDSCAPE,
        "constraint": _SPHERE_LANDSCAPE,
    },
    # the zero-risk manifold: a property of the risk
    "manifold": {
        "teacher_activation": _zero_risk,
        "readout": _zero_risk,
        "teacher_readout": _zero_risk,
        "lr_readout": None,               # the readout is a coordinate: dimension + p
        "weight_decay": None,             # does not enter the risk
        "batch_size": None,               # does not enter the risk
        "constraint": ("on the sphere the zero-risk manifold is cut by Q_kk = 1 (its "
                       "dimension is not derived)"),
    },
    # the closest zero-risk point as the end point of the ODE (needs S conserved, zero risk
    # reached)
    "closest_solution": {
        "teacher_activation": _zero_risk,
        "readout": _both(_uniform("readout", "breaks the conservation of S and makes the "
                                             "closest point a weighted Procrustes problem"),
                         _zero_risk),
        "teacher_readout": _both(_uniform("teacher_readout", "breaks the conservation of S"),
                                 _zero_risk),
        "batch_size": None,               # zero-risk points stay fixed points (Delta = 0)
        "weight_decay": ("with weight decay the ODE does not reach zero risk: S is conserved "
                         "but the end point is the weight-decay fixed point along S(0) (not "
                         "derived)"),
        "lr_readout": _NOT_CONSERVED,
        "constraint": _NOT_CONSERVED,
    },
    # the minimum of the risk (axis-aligned) and its value
    "minimum": {
        "teacher_activation": _quadratic_teacher,
        "readout": _uniform("readout", "moves the minimum off the axis-aligned ray (not "
                                       "derived)"),
        "teacher_readout": _uniform("teacher_readout", "moves the minimum off the "
                                                       "axis-aligned ray (not derived)"),
        "weight_decay": None,             # the risk, not the regularised objective
        "batch_size": None,
        "lr_readout": None,               # the minimum over W at the readout a(0)
        "constraint": "the axis-aligned minimum is not on the sphere",
    },
    # where the ODE goes from a zero-risk point when the labels are noisy
    "noisy_floor": {
        "teacher_activation": _zero_risk,
        "readout": _both(_uniform("readout", "has no axis-aligned minimum"), _zero_risk),
        "teacher_readout": _both(_uniform("teacher_readout", "has no axis-aligned minimum"),
                                 _zero_risk),
        "batch_size": None,
        "weight_decay": ("with weight decay zero-risk points are not fixed points even "
                         "without label noise; the end point is not a noise floor"),
        "lr_readout": "the noise floor with a trained readout is not derived",
        "constraint": "the axis-aligned zero-risk point is not on the sphere",
    },
    # the zero-risk points as fixed points of the ODE and their Jacobian
    "zero_risk_fixed_points": {
        "teacher_activation": _zero_risk,
        "readout": _both(_uniform("readout", "has no axis-aligned zero-risk point"),
                         _zero_risk),
        "teacher_readout": _both(_uniform("teacher_readout",
                                          "has no axis-aligned zero-risk point"), _zero_risk),
        "batch_size": None,               # the eta^2 term vanishes with the error
        "weight_decay": "with weight decay the zero-risk points are not fixed points",
        "lr_readout": "the Jacobian with the readout as state is not derived",
        "constraint": "the axis-aligned zero-risk point is not on the sphere",
    },
    # the theorem on S (symbolic proof) and the invariant set I_T
    "conservation": {
        "teacher_activation": _quadratic_teacher,
        "readout": _uniform("readout", "breaks the O(p) symmetry of the student"),
        "teacher_readout": _uniform("teacher_readout",
                                    "breaks the O(p*) symmetry of the teacher"),
        "weight_decay": None,
        "batch_size": None,
        "lr_readout": _NOT_CONSERVED,
        "constraint": _NOT_CONSERVED,
    },
}

# The correlation loss l = -y yhat (spec.LOSSES): every analysis here is derived from the
# square loss's error signal yhat - y; with e = -y the student's own output drops out of
# the drift, so none of them carries over (fixed refusals, each with its reason).
_SQUARE_ONLY = "it is derived for the square loss's error signal yhat - y (e = -y here)"
_LOSS_REASONS = {
    "plateau": ("the plateau Q = qI, rho = 0 balances the error signal yhat - y; with e = -y "
                "the -Q restoring term is gone and the norm grows unless constrained "
                "(not re-derived)"),
    "manifold": ("zero risk is no fixed point: the error signal e = -y does not vanish where "
                 "yhat = y*"),
    "zero_risk_fixed_points": ("zero risk is no fixed point: the error signal e = -y does "
                               "not vanish where yhat = y*"),
    "conservation": "the proof of dS/dt = 0 uses the error signal yhat - y (not re-derived)",
}
for _name in RULES:
    RULES[_name]["loss"] = _LOSS_REASONS.get(_name, _SQUARE_ONLY)

# An input spectrum x ~ N(0, sum_b s_b P_b) (docs/model.md §1a): the state is per block
# (Q^b, rho^b), and every analysis here was derived for isotropic inputs and the state
# (Q, rho); none is re-derived for blocks (fixed refusals, each with its reason).
_ISOTROPIC_ONLY = ("it is derived for isotropic inputs x ~ N(0, I); with a spectrum the state "
                   "is per block (Q^b, rho^b) and this result is not re-derived for it")
_SPECTRUM_REASONS = {
    "plateau": ("the plateau rho = 0, Q = qI is derived for isotropic inputs; with a spectrum "
                "each block has its own Q^b and growth rate of rho^b (not re-derived)"),
    "escape_time": ("the escape law is derived from the isotropic plateau; with a spectrum "
                    "the blocks' rho^b grow at different rates (not re-derived)"),
    "hessian": ("the Hessian is derived in the weights with isotropic inputs; a spectrum "
                "weights the input directions by s_b (not re-derived)"),
    "manifold": ("the zero-risk manifold W^T W / p = W*^T W* / p* is derived for x ~ N(0, I); "
                 "with a spectrum it is a condition on Sigma^(1/2) W^T W Sigma^(1/2) per block "
                 "(not re-derived)"),
    "conservation": ("the proof of dS/dt = 0 uses the isotropic drift; with a spectrum the "
                     "state is per block (not re-derived)"),
}
for _name in RULES:
    RULES[_name]["spectrum"] = _SPECTRUM_REASONS.get(_name, _ISOTROPIC_ONLY)

#: General reasons, appended for fields that have no rule.
_GENERAL = {name: "it is derived for the classic model" for name in RULES}

#: Why an analysis does not take a non-polynomial *student* (erf(z/√2), ReLU): each was
#: derived for σ = c z² (+ c0) and none is re-derived for these activations.  (A named
#: *teacher* with a quadratic student is decided by the teacher_activation rule.)
_NAMED_STUDENT = {
    "plateau": ("the plateau Q = qI, rho = 0 rests on sigma' being odd (E[sigma'(lambda) nu] "
                "= 0 keeps rho = 0 fixed); for erf(z/sqrt 2) and relu rho = 0 is not a fixed "
                "point (their plateau is Saad & Solla's symmetric rho_km = r state, not derived)"),
    "plateau_solution": "its closed forms are for sigma = c z^2",
    "escape_time": ("the linearised escape law from the isotropic plateau rho = 0 is derived "
                    "for sigma = c z^2; the plateau of erf(z/sqrt 2) or relu is another fixed "
                    "point (not derived)"),
    "rho_diffusion": "the SGD noise of rho at the isotropic plateau is derived for sigma = c z^2",
}
_NAMED_DEFAULT = "it is derived for sigma = c z^2 (the risk and drift as quadratic forms)"


def _named_student_reason(model: Model, analysis: str) -> str | None:
    if not isinstance(model.activation, str):
        return None
    return (f"activation={model.activation!r} ({activation_label(model.activation)}): "
            + _NAMED_STUDENT.get(analysis, _NAMED_DEFAULT))


def check(model: Model, routine: str, analysis: str | None = None, why: str = "") -> Model:
    """Refuse `model` unless the rules of `analysis` handle every changed field.

    Parameters
    ----------
    model : Model
    routine : str
        Name used in the error (e.g. ``"plateau"``).
    analysis : str, optional
        Key of :data:`RULES` (default: `routine`).
    why : str, optional
        General reason, added to the per-field ones.

    Returns
    -------
    Model
        `model`, when every changed field is handled.

    Raises
    ------
    ValueError
        For a non-polynomial student activation (erf, relu), naming it and why;
        else from :func:`symquad.spec.require`, naming each refused field with its
        reason.
    """
    check_model(model)
    rules = RULES[analysis or routine]
    named = _named_student_reason(model, analysis or routine)
    if named:
        raise ValueError(f"{routine} does not support {named}")
    refused = {}
    for name in model.changed_fields():
        if name in rules:
            rule = rules[name]
            reason = rule if isinstance(rule, str) else (rule(model) if rule else None)
            if reason:
                refused[name] = reason
    # conditional rules count as supported unless they refused this model; fixed
    # refusals (strings) never do
    supports = tuple(name for name, rule in rules.items()
                     if name not in refused and not isinstance(rule, str))
    reasons = "; ".join(f"{name}: {reason}" for name, reason in refused.items())
    unknown = [n for n in model.changed_fields() if n not in rules]
    general = why or (_GENERAL[analysis or routine] if unknown else "")
    return require(model, routine, supports=supports,
                   why="; ".join(x for x in (reasons, general) if x))

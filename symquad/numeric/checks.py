"""Input validation shared by the numeric runtime (clear errors naming the parameter).

Every check raises ``TypeError`` for a value of the wrong kind (a string, a
bool where a number is expected, a complex number, an object array) and
``ValueError`` for a value of the right kind outside the allowed range, and
names the parameter and the range in the message.  Nothing is silently
converted: a complex input is refused even when its imaginary part is zero,
because it almost always means an upstream mistake.
"""

from __future__ import annotations

from fractions import Fraction
from numbers import Integral, Real

import numpy as np

from ..spectrum import block_axis

__all__ = ["as_overlaps", "as_real_array", "check_positive", "check_int", "check_real",
           "check_seed", "check_choice", "check_float_activation", "FLOAT_COEFFICIENT_RANGE",
           "MAX_CONSTANT_RATIO", "check_record_bytes", "MAX_TIMES", "MAX_RECORD_BYTES",
           "check_times"]

#: Most recorded times a study accepts (``n_times``, ``n_eval``, ``n_save``): the
#: time grid alone is 80 MB at this size, and every trajectory multiplies it.
MAX_TIMES = 10**7
#: Most bytes of recorded trajectories one call may allocate.
MAX_RECORD_BYTES = 8 * 2**30


def check_record_bytes(n_bytes: int, what: str, hint: str = "") -> None:
    """ValueError, before allocating, when `what` would need more than MAX_RECORD_BYTES."""
    if n_bytes > MAX_RECORD_BYTES:
        raise ValueError(f"{what} needs {n_bytes / 2**30:.3g} GiB (limit "
                         f"{MAX_RECORD_BYTES / 2**30:g} GiB){': ' + hint if hint else ''}")


#: Latest time any study accepts (``t = steps/N``; as :data:`symquad.numeric.integrate.MAX_T`).
MAX_TIME = 1e9


def check_times(t_eval, name: str = "t_eval", bytes_per_time: int = 0,
                what: str = "the recorded times") -> np.ndarray:
    """`t_eval` as a float array if it is a usable grid of output times; checked before work.

    A non-empty 1-d array of finite, strictly increasing times in
    ``[0, MAX_TIME]`` with at most :data:`MAX_TIMES` entries, whose
    recorded results (``bytes_per_time`` each) fit in :data:`MAX_RECORD_BYTES`.
    """
    t = as_real_array(t_eval, name)
    if t.ndim != 1 or t.size == 0 or np.any(t < 0) or np.any(np.diff(t) <= 0):
        raise ValueError(f"{name} must be a non-empty 1-d array of increasing times >= 0")
    if t.size > MAX_TIMES:
        raise ValueError(f"{name} has {t.size} times, more than {MAX_TIMES} "
                         f"(symquad.numeric.checks.MAX_TIMES)")
    if t[-1] > MAX_TIME:
        raise ValueError(f"{name} must end by t = {MAX_TIME:g} (steps/N), got {t[-1]:.4g}")
    check_record_bytes(int(bytes_per_time) * t.size, what, f"use fewer times in {name}")
    return t


def _is_real_scalar(value) -> bool:
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, Real)


def check_real(name: str, value, low=None, high=None, low_open=False, high_open=False) -> float:
    """Return ``value`` as a float if it is a finite real number within the given bounds."""
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    lo = "(-inf" if low is None else ("(" if low_open else "[") + f"{low:g}"
    hi = "inf)" if high is None else f"{high:g}" + (")" if high_open else "]")
    bad = not np.isfinite(value)
    if low is not None:
        bad |= value < low or (low_open and value == low)
    if high is not None:
        bad |= value > high or (high_open and value == high)
    if bad:
        raise ValueError(f"{name} must be a finite number (allowed range: {lo}, {hi}), "
                         f"got {value!r}")
    return value


def check_positive(name: str, value, integer: bool = False, allow_zero: bool = False):
    """Return ``value`` if it is a finite number > 0 (>= 0 with ``allow_zero``)."""
    if integer:
        return check_int(value, name, 0 if allow_zero else 1)
    if not _is_real_scalar(value):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not np.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound, allowed = (">= 0", "[0, inf)") if allow_zero else ("> 0", "(0, inf)")
        raise ValueError(f"{name} must be a finite number {bound} (allowed range: {allowed}), "
                         f"got {value!r}")
    return value


def check_int(value, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    """Return ``value`` as an int if it is an integer in ``[minimum, maximum]``.

    TypeError for a non-integer (a float such as ``2.0``, a bool, a string),
    ValueError for an integer out of range.
    """
    want = (f"an integer >= {minimum} (allowed range: [{minimum}, inf))" if maximum is None
            else f"an integer in [{minimum}, {maximum}]")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be {want}, got {value!r} ({type(value).__name__})")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {want}, got {value!r}")
    return int(value)


def check_seed(seed, name: str = "seed"):
    """Return ``seed`` if it is None or an integer >= 0 (what SeedSequence accepts)."""
    if seed is None:
        return None
    return check_int(seed, name, 0)


def check_choice(name: str, value, choices):
    """Return ``value`` if it is one of ``choices`` (compared as strings only)."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def as_real_array(value, name: str, *, finite: bool = True, copy: bool = True) -> np.ndarray:
    """``value`` as a float array, refusing complex, bool, string and object input.

    The one check every public function applies to the arrays it is given
    (overlaps, times, trajectories, weights): a complex array is a
    ``TypeError`` even when its imaginary part is zero, never silently
    truncated to its real part as ``np.asarray(x, dtype=float)`` would.

    Parameters
    ----------
    value : array_like
    name : str
        The parameter's name, used in the error message.
    finite : bool
        Also refuse NaN and inf (``ValueError``).  ``False`` where non-finite
        entries are meaningful (states after a divergence, kernels evaluated
        inside a solver).
    copy : bool
        ``False``: return `value` itself when it already is a float64 array
        (hot paths that do not modify it).

    Returns
    -------
    ndarray of float64
    """
    if not copy and isinstance(value, np.ndarray) and value.dtype == np.float64:
        arr = value
    else:
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{name} must be an array of real numbers, got a string")
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as exc:  # ragged nested lists
            raise TypeError(f"{name} must be an array of real numbers ({exc})") from None
        if arr.dtype.kind not in "iuf":
            kind = {"c": "complex", "b": "bool", "U": "string", "S": "bytes",
                    "O": "object"}.get(arr.dtype.kind, str(arr.dtype))
            raise TypeError(f"{name} must be an array of real numbers, got {kind} entries"
                            + (" (complex arrays are refused, not truncated to their real "
                               "part)" if kind == "complex" else ""))
        arr = arr.astype(float)
    if finite and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite (it contains NaN or inf)")
    return arr


def as_overlaps(model, Q, rho, T, names=("Q0", "rho0", "T"), tol: float = 1e-9):
    """Validate overlap matrices for ``model``; return float arrays ``(Q, rho, T)``.

    Checks shapes ``(p, p)``, ``(p, p*)``, ``(p*, p*)``, finiteness, symmetry of
    ``Q`` and ``T``, and that the joint covariance ``[[Q, ρ], [ρᵀ, T]]`` is
    positive semi-definite (it is the Gram matrix of the weights / N).
    """
    p, k = model.p, model.p_star
    lead = block_axis(model)
    arrays = []
    for name, value, shape in zip(names, (Q, rho, T), ((p, p), (p, k), (k, k))):
        arr = as_real_array(value, name)
        if arr.shape != lead + shape:
            per = (f" (one matrix per input block of spectrum={model._field_text('spectrum')}"
                   f"; the isotropic teacher's split of a total T is "
                   f"symquad.numeric.layout.block_teacher)" if lead else "")
            raise ValueError(f"{name} must have shape {lead + shape} for p={p}, p_star={k}"
                             f"{per}; got {arr.shape}")
        arrays.append(arr)
    Q, rho, T = arrays
    for name, arr in ((names[0], Q), (names[2], T)):
        scale = max(1.0, float(np.max(np.abs(arr))))
        if np.max(np.abs(arr - np.swapaxes(arr, -1, -2))) > tol * scale:
            raise ValueError(f"{name} must be symmetric")
    # each block's [[Q^c, ρ^c], [ρ^cᵀ, T^c]] is the Gram matrix of the rows through P_c
    C = np.block([[Q, rho], [np.swapaxes(rho, -1, -2), T]])
    C = 0.5 * (C + np.swapaxes(C, -1, -2))
    low = float(np.min(np.linalg.eigvalsh(C)))
    scale = max(1.0, float(np.max(np.abs(C))))
    if low < -tol * scale * C.shape[-1]:
        which = " of every input block" if lead else ""
        raise ValueError(
            f"({names[0]}, {names[1]}, {names[2]}) is not a Gram matrix of weights / N: the joint "
            f"covariance [[{names[0]}, {names[1]}], [{names[1]}^T, {names[2]}]]{which} must be "
            f"positive semi-definite; smallest eigenvalue {low:.3g}")
    return Q, rho, T


#: Range of ``max_{j>=1} |c_j|`` (the scale of the activation) that the float64
#: kernels and simulators accept.  They multiply up to four coefficients (the
#: ``η²`` term ``E[σ'σ'σσ]``) with Gaussian moments up to ``(4d−1)!! ≈ 10^17``
#: at degree 8; keeping ``c⁴`` within ``10^±200`` leaves ``10^100`` of float64's
#: ``10^±308`` for the overlaps, so nothing overflows to inf or underflows to 0.
FLOAT_COEFFICIENT_RANGE = (1e-50, 1e50)

#: Largest ``|c_0| / max_{j>=1} |c_j|`` the float64 routes accept.  The
#: constant cancels in ``ŷ − y``, but the tensor kernels and the moment-based
#: risk of the simulators carry it through sums that cancel, losing about
#: ``(c_0/scale)²·10^-16`` relative precision; measured on the tensor kernels
#: (σ = c0 + z³, c0 + z³ − 3z, c0 + z⁴ at p = 3, p* = 2, a random point):
#: relative error of the ODE right-hand side 3e-12, 5e-12, 2e-14 at
#: ``c_0 = 10^3`` and 1e-4, 6e-4, 2e-6 at ``c_0 = 10^7``.
MAX_CONSTANT_RATIO = 1e3


def check_float_activation(activation, name: str = "activation"):
    """Refuse activation coefficients that float64 arithmetic would get silently wrong.

    The symbolic routes (``derive``, LaTeX, ``hessian_spectrum``) are exact
    for any rational coefficients; the numeric ones (kernels, integration,
    simulation, validation, landscape) convert the coefficients to float64.
    This is the one check they all make first: the scale
    ``s = max_{j>=1} |c_j|`` must lie in :data:`FLOAT_COEFFICIENT_RANGE` and
    ``|c_0| <= MAX_CONSTANT_RATIO · s``, otherwise a ``ValueError`` says why and
    what to do (rescale: ``σ → σ/c`` with ``lr → lr·c²`` and ``noise → noise/c²``
    gives the same dynamics of the overlaps, and the risk is divided by ``c²``).
    A coefficient far below the scale only loses what float64 cannot resolve
    anyway (below ``10^-16`` of the result).  Comparisons are exact (rationals),
    so no conversion can overflow here.  A non-polynomial activation (a name)
    passes unchecked.

    Returns
    -------
    The activation, unchanged.
    """
    if not isinstance(activation, tuple) or len(activation) < 2:
        return activation
    scale = max(abs(c) for c in activation[1:])
    constant = abs(activation[0])
    lo, hi = FLOAT_COEFFICIENT_RANGE
    # exact comparisons (the decimal bounds as rationals): nothing is converted to float
    if not Fraction(str(lo)) <= scale <= Fraction(str(hi)):
        raise ValueError(
            f"{name}: the largest non-constant coefficient has magnitude {_magnitude(scale)}"
            f", outside [{lo:g}, {hi:g}] (symquad.numeric.checks.FLOAT_COEFFICIENT_RANGE): "
            f"float64 kernels and simulators would overflow or underflow. Rescale the "
            f"activation (σ/c with lr·c² and noise/c² gives the same overlap dynamics; the "
            f"risk scales by c²); the symbolic routes (derive, equations) are exact")
    if constant > Fraction(MAX_CONSTANT_RATIO) * scale:
        raise ValueError(
            f"{name}: the constant term {_magnitude(constant)} exceeds {MAX_CONSTANT_RATIO:g}"
            f" times the largest other coefficient ({_magnitude(scale)}); it cancels in "
            f"ŷ − y, but float64 sums would lose precision (about (c0/scale)^2 * 1e-16 "
            f"relative). Drop or shrink the constant (it does not change the "
            f"dynamics)")
    return activation


def _magnitude(x) -> str:
    """``x`` (an exact rational) for a message, without overflowing float()."""
    try:
        return f"{float(x):.3g}"
    except OverflowError:
        x = Fraction(x)
        return f"about 1e{len(str(abs(x.numerator))) - len(str(x.denominator))}"

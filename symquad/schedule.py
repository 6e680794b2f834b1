r"""Learning-rate schedules ``η(t) = η · s(t)``: the one definition every stage reads.

A schedule is the field ``Model.lr_schedule``; its value is a canonical text
(what the CLI, the sweep grids and the saved files hold) and this module turns
it into a :class:`Schedule`, the factor ``s(t)`` with ``s`` the same for every
stage:

==============================  ===========================================  ==========
text                            factor ``s(t)``                              kinks
==============================  ===========================================  ==========
``constant``                    ``1``                                        none
``inverse:τ``                   ``1/(1 + t/τ)``                              none
``power:t0:β``                  ``min(1, (t/t0)^(−β))``                      ``t0``
``step:t1=f1:t2=f2:…``          ``1`` before ``t1``, ``f_i`` on ``[t_i,      every
                                t_{i+1})``                                   ``t_i``
``table:t0=f0:t1=f1:…``         linear interpolation of the points,          every
                                constant beyond the first and last           ``t_i``
==============================  ===========================================  ==========

Python callers may also give the tuples ``("inverse", τ)``, ``("power", t0,
β)``, ``("step", ((t1, f1), …))`` and ``("table", ((t0, f0), …))``.  The SGD
step size at time ``t = k/N`` (step ``k``) is ``η s(k/N)``: the drift and the
diffusion of the order parameters are those of the constant-η model evaluated
at the instantaneous ``η(t)`` (every ``η`` of the theory: the gradient's ``η``
and ``η²`` terms, weight decay's ``ηλ``, the diffusion's powers of ``η``).  The
readout's rate ``η_a`` is a separate constant and is not scheduled.

Standard library only (``spec.py`` imports it).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from numbers import Real

__all__ = ["Schedule", "parse_schedule", "SCHEDULE_FAMILIES"]

#: The families, in the order of the table above.
SCHEDULE_FAMILIES = ("constant", "inverse", "power", "step", "table")

#: Most points of a step or table schedule (the integrators stop at each).
MAX_POINTS = 10_000

_HINT = ("lr_schedule must be 'constant', 'inverse:TAU', 'power:T0:BETA', "
         "'step:T1=F1:T2=F2:...' or 'table:T0=F0:T1=F1:...' (or the tuples ('inverse', tau), "
         "('power', t0, beta), ('step', ((t1, f1), ...)), ('table', ((t0, f0), ...)))")


def _number(value, what: str, positive: bool = True, zero_ok: bool = False) -> float:
    """A finite float from a number or a numeric string, checked to be > 0 (or >= 0)."""
    if isinstance(value, bool):
        raise TypeError(f"lr_schedule: {what} must be a number, got a bool")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"lr_schedule: {what} must be a number, got {value!r}; "
                             f"{_HINT}") from None
    if not isinstance(value, Real):
        raise TypeError(f"lr_schedule: {what} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"lr_schedule: {what} must be finite, got {value}")
    if positive and (value < 0 or (value == 0 and not zero_ok)):
        rng = "[0, inf)" if zero_ok else "(0, inf)"
        raise ValueError(f"lr_schedule: {what} must be in {rng}, got {value:g}")
    return value


def _text(x: float) -> str:
    # the shortest text that reads back as the same float (0.2, not 0.20000000000000001)
    return str(int(x)) if x.is_integer() and abs(x) < 1e16 else repr(float(x))


class Schedule:
    """The factor ``s(t)`` of a learning-rate schedule (``η(t) = η s(t)``).

    Built by :func:`parse_schedule`; immutable.  ``s(0) = 1`` for every family
    but a table, whose first point may say otherwise.

    Attributes
    ----------
    family : str
        One of :data:`SCHEDULE_FAMILIES`.
    args : tuple
        ``()``, ``(τ,)``, ``(t0, β)`` or the points ``((t_i, f_i), …)``.
    text : str
        The canonical text (``Model.lr_schedule`` holds it).
    """

    __slots__ = ("family", "args", "text", "_ts", "_fs")

    def __init__(self, family: str, args: tuple):
        self.family, self.args = family, args
        if family in ("step", "table"):
            self._ts = tuple(t for t, _ in args)
            self._fs = tuple(f for _, f in args)
            body = ":".join(f"{_text(t)}={_text(f)}" for t, f in args)
        else:
            self._ts = self._fs = ()
            body = ":".join(_text(a) for a in args)
        self.text = family + (":" + body if body else "")

    @property
    def is_constant(self) -> bool:
        return self.family == "constant"

    def __repr__(self):
        return f"Schedule({self.text!r})"

    def __eq__(self, other):
        return isinstance(other, Schedule) and other.text == self.text

    def __hash__(self):
        return hash(self.text)

    def factor(self, t: float) -> float:
        """``s(t)`` at one time ``t >= 0`` (a float)."""
        fam = self.family
        if fam == "constant":
            return 1.0
        if fam == "inverse":
            return 1.0 / (1.0 + t / self.args[0])
        if fam == "power":
            t0, beta = self.args
            return 1.0 if t <= t0 else (t / t0) ** (-beta)
        if fam == "step":
            i = bisect_right(self._ts, t)
            return 1.0 if i == 0 else self._fs[i - 1]
        ts, fs = self._ts, self._fs                      # table
        if t <= ts[0]:
            return fs[0]
        if t >= ts[-1]:
            return fs[-1]
        i = bisect_right(ts, t)
        w = (t - ts[i - 1]) / (ts[i] - ts[i - 1])
        return fs[i - 1] + w * (fs[i] - fs[i - 1])

    def factors(self, t):
        """``s(t)`` at every time of the array `t` (numpy array of the same shape)."""
        import numpy as np
        t = np.asarray(t, dtype=float)
        fam = self.family
        if fam == "constant":
            return np.ones_like(t)
        if fam == "inverse":
            return 1.0 / (1.0 + t / self.args[0])
        if fam == "power":
            t0, beta = self.args
            return np.where(t <= t0, 1.0, (np.maximum(t, t0) / t0) ** (-beta))
        if fam == "step":
            i = np.searchsorted(np.array(self._ts), t, side="right")
            return np.concatenate([[1.0], self._fs])[i]
        return np.interp(t, self._ts, self._fs)

    def rate(self, t: float) -> float:
        """``s'(t)``, the right derivative at one time ``t >= 0`` (0 on a step's pieces).

        ``inverse``: ``−1/(τ (1 + t/τ)²)``; ``power``: 0 before ``t0``,
        ``−(β/t0)(t/t0)^(−β−1)`` from it; ``table``: the slope of the piece to the right.
        The O(1/N) mean's modified-equation term reads it (``∂f/∂t = ∂f/∂η · η s'(t)``).
        """
        fam = self.family
        if fam in ("constant", "step"):
            return 0.0
        if fam == "inverse":
            tau = self.args[0]
            return -1.0 / (tau * (1.0 + t / tau) ** 2)
        if fam == "power":
            t0, beta = self.args
            return 0.0 if t < t0 else -(beta / t0) * (t / t0) ** (-beta - 1.0)
        ts, fs = self._ts, self._fs                      # table
        if t < ts[0] or t >= ts[-1]:
            return 0.0
        i = bisect_right(ts, t)
        return (fs[i] - fs[i - 1]) / (ts[i] - ts[i - 1])

    def jumps(self, t0: float = 0.0, t1: float = math.inf) -> tuple:
        """``((t_j, s(t_j⁻), s(t_j)), …)``: the discontinuities of ``s`` strictly inside ``(t0, t1)``.

        Only a step schedule jumps (its factor is right-continuous); the others are
        continuous (a table's and a power law's breakpoints are kinks).
        """
        if self.family != "step":
            return ()
        out, before = [], 1.0
        for t, f in self.args:
            if t0 < t < t1 and f != before:
                out.append((t, before, f))
            before = f
        return tuple(out)

    def breakpoints(self, t0: float = 0.0, t1: float = math.inf) -> tuple:
        """The kinks and jumps of ``s`` strictly inside ``(t0, t1)``, increasing.

        The integrators stop there (a step across a kink loses the order of the method).
        """
        if self.family == "power":
            pts = (self.args[0],)
        else:
            pts = self._ts
        return tuple(t for t in pts if t0 < t < t1)

    def integral(self, t: float) -> float:
        """``∫_0^t s(u) du`` (the time conventions' ``τ = η ∫ s dt / p``)."""
        fam = self.family
        if fam == "constant":
            return t
        if fam == "inverse":
            tau = self.args[0]
            return tau * math.log1p(t / tau)
        if fam == "power":
            t0, beta = self.args
            if t <= t0:
                return t
            rest = (math.log(t / t0) * t0 if beta == 1 else
                    t0 * ((t / t0) ** (1 - beta) - 1) / (1 - beta))
            return t0 + rest
        # step and table: exact sums of the pieces
        knots = [0.0] + [u for u in self._ts if 0.0 < u < t] + [t]
        total = 0.0
        for a, b in zip(knots[:-1], knots[1:]):
            if self.family == "step":
                total += (b - a) * self.factor(a)
            else:
                total += (b - a) * 0.5 * (self.factor(a) + self.factor(b))
        return total

    def latex(self, eta: str = r"\eta") -> str:
        r"""``η(t)`` as LaTeX, e.g. ``\eta(t) = \eta/(1 + t/100)``."""
        fam, a = self.family, self.args
        if fam == "constant":
            return eta
        if fam == "inverse":
            return rf"\eta(t) = \frac{{{eta}}}{{1 + t/{_text(a[0])}}}"
        if fam == "power":
            return rf"\eta(t) = {eta}\,\min\!\left(1, (t/{_text(a[0])})^{{-{_text(a[1])}}}\right)"
        what = "piecewise constant" if fam == "step" else "interpolated"
        pts = ", ".join(f"({_text(t)}, {_text(f)})" for t, f in a)
        return rf"\eta(t) = {eta}\,s(t),\ s\ \text{{{what} through }} {pts}"


def _points(raw, family: str):
    """Validated ((t, f), ...) of a step or table schedule."""
    if isinstance(raw, str):
        raw = [part for part in raw.split(":") if part.strip()]
        pairs = []
        for part in raw:
            if part.count("=") != 1:
                raise ValueError(f"lr_schedule: a {family} point must be written T=F, got "
                                 f"{part!r}; {_HINT}")
            pairs.append(tuple(part.split("=")))
        raw = pairs
    try:
        raw = list(raw)
    except TypeError:
        raise TypeError(f"lr_schedule: the {family} points must be a sequence of (t, factor) "
                        f"pairs, got {raw!r}") from None
    need = 1 if family == "step" else 2
    if not need <= len(raw) <= MAX_POINTS:
        raise ValueError(f"lr_schedule: a {family} schedule needs {need} to {MAX_POINTS} "
                         f"(t, factor) points, got {len(raw)}")
    out = []
    for i, pair in enumerate(raw):
        try:
            t, f = pair
        except (TypeError, ValueError):
            raise ValueError(f"lr_schedule: {family} point {i} must be a (t, factor) pair, "
                             f"got {pair!r}") from None
        t = _number(t, f"{family} time t[{i}]", zero_ok=(family == "table"))
        f = _number(f, f"{family} factor f[{i}] (a positive finite factor)")
        if out and t <= out[-1][0]:
            raise ValueError(f"lr_schedule: the {family} times must increase strictly, got "
                             f"t[{i - 1}] = {out[-1][0]:g} then t[{i}] = {t:g}")
        out.append((t, f))
    return tuple(out)


def parse_schedule(value) -> Schedule:
    """The :class:`Schedule` of a text, a tuple, a Schedule or None (constant).

    Raises
    ------
    ValueError, TypeError
        Naming ``lr_schedule``, the part at fault and the allowed forms.
    """
    if value is None:
        return Schedule("constant", ())
    if isinstance(value, Schedule):
        return value
    if isinstance(value, str):
        text = value.strip()
        family, _, rest = text.partition(":")
        family = family.strip().lower()
        if family not in SCHEDULE_FAMILIES:
            raise ValueError(f"lr_schedule: unknown family {family!r} in {value!r}; {_HINT}")
        if family in ("step", "table"):
            return Schedule(family, _points(rest, family))
        parts = [part for part in rest.split(":")] if rest else []
    elif isinstance(value, (tuple, list)) and value and isinstance(value[0], str):
        family = value[0].strip().lower()
        if family not in SCHEDULE_FAMILIES:
            raise ValueError(f"lr_schedule: unknown family {family!r}; {_HINT}")
        if family in ("step", "table"):
            if len(value) != 2:
                raise ValueError(f"lr_schedule: ({family!r}, ((t1, f1), ...)) takes one "
                                 f"sequence of points, got {value!r}")
            return Schedule(family, _points(value[1], family))
        parts = list(value[1:])
    elif isinstance(value, (tuple, list)):
        # a bare table of (t, factor) points
        return Schedule("table", _points(value, "table"))
    else:
        raise TypeError(f"lr_schedule: expected a text or a tuple, got "
                        f"{type(value).__name__}; {_HINT}")
    count = {"constant": 0, "inverse": 1, "power": 2}[family]
    if len(parts) != count:
        raise ValueError(f"lr_schedule: {family!r} takes {count} number(s), got "
                         f"{len(parts)} in {value!r}; {_HINT}")
    if family == "inverse":
        return Schedule(family, (_number(parts[0], "inverse time scale tau"),))
    if family == "power":
        return Schedule(family, (_number(parts[0], "power start t0"),
                                 _number(parts[1], "power exponent beta")))
    return Schedule("constant", ())

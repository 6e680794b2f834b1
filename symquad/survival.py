r"""Which of the paper's results survive which change of the model: a table computed by the checks.

For each model (the classic one and one change of each specification field,
with the readouts changed both uniformly and non-uniformly) every cell runs the
analysis that docs/model.md §8 describes — nothing in the table is typed by
hand:

* **plateau** (§8.1, three phases): :func:`symquad.plateau` — the fixed point
  ``ρ = 0, Q = qI`` of the full ODE and the growth rate ``κ`` of ρ; for a
  trained readout, the numeric check that ``da = 0`` forces ``dQ > 0`` at
  ``ρ = 0`` (no fixed point);
* **escape law** (§8.2): :func:`symquad.escape_time` — ``κ`` and the
  prefactor ``c`` of ``t_esc = log(N)/(2κ) + c/κ`` (with the SGD-noise seed
  where it is derived);
* **zero-risk manifold** (§8.3): :func:`symquad.manifold_dimension`, checked
  against the numerical kernel dimension of ``dΦ_T``
  (:func:`symquad.numeric.invariants.manifold_rank_deficiency`), and whether
  its points are fixed points of the model's ODE (``Δ = 0``);
* **S conserved / closest solution** (§8.4):
  :func:`symquad.symbolic.invariants.conservation_verdict` (a proof, or an
  exact counterexample at the typical start) and :func:`symquad.closest_solution`;
* **Hessian** (§8.5): :func:`symquad.hessian_spectrum` at the origin, the
  plateau and the minimum, the paper's three claims (origin a maximum, the
  plateau a saddle with ``p·p*`` descent directions, the minimum marginal) and
  whether the counts are the classic ones.

A cell says ``yes`` (the result holds as in the paper, possibly with changed
numbers), ``changed`` (it holds in a modified form), ``no`` (it fails, shown by
the check) or ``not derived`` (the routine refuses the field; the reason is in
the notes).  ``symquad survival`` prints the table.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from .applicability import zero_risk_reason
from .numeric.invariants import (closest_solution, manifold_dimension, manifold_rank_deficiency,
                                 random_manifold_points)
from .numeric.kernels import kernels
from .spec import Model, check_model

__all__ = ["RESULTS", "Cell", "SurvivalTable", "survival_models", "survival_row",
           "survival_table"]

#: Columns of the table: key -> heading.
RESULTS = {
    "plateau": "plateau (three phases)",
    "escape": "escape law",
    "manifold": "zero-risk manifold",
    "conservation": "S conserved / closest solution",
    "hessian": "Hessian at critical points",
}


@dataclass(frozen=True)
class Cell:
    """One result for one model: ``status`` (yes, changed, no, not derived), short text, note."""

    status: str
    text: str
    note: str = ""

    def __str__(self) -> str:
        return f"{self.status}: {self.text}" if self.text else self.status


def survival_models(base: Model | None = None) -> list:
    """``[(label, model)]``: the classic `base` and one change of each specification field.

    The readouts are changed once uniformly (the same weight for every unit)
    and once non-uniformly; the teacher activation once to ``2 z²`` (quadratic,
    ``c* ≠ c``) and once to ``z² + z`` (not quadratic).  Default base:
    ``Model(p=3, p_star=2, lr=0.1)`` (``p > p* >= 2``, so every condition of the
    theorems is exercised).
    """
    base = Model(p=3, p_star=2, lr=0.1) if base is None else check_model(base, "base")
    if base.changed_fields():
        raise ValueError(f"base must be a classic model (no changed fields), got {base!r}")
    p, k = base.p, base.p_star
    uniform_a = Fraction(1, 2 * p) if p > 1 else Fraction(1, 2)
    weights_a = tuple(Fraction(2 * (p - i), p * (p + 1)) for i in range(p))   # sum 1
    weights_b = tuple(Fraction(2 * (k - i), k * (k + 1)) for i in range(k))
    changes = [
        ("classic", {}),
        ("teacher_activation = 2 z^2", {"teacher_activation": "2*z**2"}),
        ("teacher_activation = z^2 + z", {"teacher_activation": "z**2 + z"}),
        (f"readout = {uniform_a} (uniform)", {"readout": uniform_a}),
        ("readout non-uniform", {"readout": weights_a}),
        (f"teacher_readout = {Fraction(1, 2 * k)} (uniform)",
         {"teacher_readout": Fraction(1, 2 * k)}),
        ("teacher_readout non-uniform", {"teacher_readout": weights_b} if k > 1 else
         {"teacher_readout": Fraction(1, 2)}),
        ("lr_readout = 0.1 (trained)", {"lr_readout": 0.1}),
        ("weight_decay = 0.1", {"weight_decay": 0.1}),
        ("batch_size = 4", {"batch_size": 4}),
        ("constraint = sphere", {"constraint": "sphere"}),
        ("loss = correlation", {"loss": "correlation"}),
        ("spectrum = 1/4:2,3/4:1/2", {"spectrum": "1/4:2,3/4:1/2"}),
    ]
    return [(label, base.replace(**kw)) for label, kw in changes]


# --------------------------------------------------------------------------- helpers
def _refusal(exc: Exception) -> bool:
    return "does not support the model field" in str(exc)


def _reason(exc: Exception) -> str:
    """The field's reason from a refusal message (the text in the first parentheses)."""
    text = str(exc)
    start = text.find(" (", text.find("field(s) ") + 9)
    if start >= 0 and _refusal(exc):
        inner = text[start + 2:]
        depth, out = 1, []
        for ch in inner:
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
            out.append(ch)
        return "".join(out)
    return text


def _not_derived(exc: Exception) -> Cell:
    return Cell("not derived", "", _reason(exc))


def _trained_plateau_drift(m: Model) -> tuple:
    """At ``ρ = 0``, ``Q = qI``, ``a = a(0)``: the ``q`` where ``da = 0`` and ``dQ_11`` there."""
    from scipy.optimize import brentq
    k = kernels(m)
    zero, T, a = np.zeros((m.p, m.p_star)), np.eye(m.p_star), np.array(
        [float(x) for x in m.readout])

    def rhs(q):
        return k.rhs(q * np.eye(m.p), zero, T, a)
    q = brentq(lambda q: rhs(q)[2][0], 1e-3, 1e3, xtol=1e-14)
    return q, float(rhs(q)[0][0, 0])


# --------------------------------------------------------------------------- cells
def _plateau_cell(m: Model) -> Cell:
    # lazy: scipy
    from .numeric.landscape import plateau
    try:
        fp = plateau(m)
    except ValueError as exc:
        if m.readout_trained and _refusal(exc):
            q, dq = _trained_plateau_drift(m)
            status = "no" if dq > 0 else "not derived"
            return Cell(status, f"da = 0 at q = {q:.3g} gives dQ_kk = {dq:.2g} > 0: no fixed "
                                "point", _reason(exc))
        return _not_derived(exc) if _refusal(exc) else Cell("no", str(exc))
    rates = "" if len(fp.rho_rates) == 1 else f", {len(fp.rho_rates)} rates"
    if fp.rate <= 0:
        return Cell("no", f"q = {fp.q:.4g}, kappa = {fp.rate:.3g} <= 0: no escape")
    return Cell("changed" if len(fp.rho_rates) > 1 else "yes",
                f"q = {fp.q:.4g}, kappa = {fp.rate:.4g}{rates}")


def _escape_cell(m: Model, N: int, n_samples: int) -> Cell:
    # lazy: scipy
    from .numeric.landscape import escape_time
    note = ""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                pred = escape_time(m, N, n_samples=n_samples, seed=0)
                seed_text = "SGD"
            except ValueError as exc:
                if not (_refusal(exc) and "sgd_noise" in str(exc)):
                    raise
                note = _reason(exc)
                pred = escape_time(m, N, n_samples=n_samples, seed=0, sgd_noise=False)
                seed_text = "ODE only"
    except ValueError as exc:
        return _not_derived(exc) if _refusal(exc) else Cell("no", str(exc))
    status = "yes" if not note else "changed"
    return Cell(status, f"{seed_text}: kappa = {pred.rate:.4g}, c = {pred.log_prefactor:.3g}",
                note)


def _manifold_cell(m: Model) -> Cell:
    try:
        dim = manifold_dimension(model=m)
    except ValueError as exc:
        if _refusal(exc):
            reason = _reason(exc)
            if "no zero-risk point" in reason:
                return Cell("no", "no zero-risk point", reason)
            return Cell("not derived", "", reason)
        return Cell("no", str(exc))
    measured = manifold_rank_deficiency(m.p, m.p_star, model=m, seed=1)["constraint"]
    if zero_risk_reason(m) is None:
        pt = random_manifold_points(m.p, m.p_star, None, np.random.default_rng(2), model=m)
        clean = m.replace(noise=0.0)
        out = kernels(clean).rhs(pt.Q, pt.rho, np.eye(m.p_star))
        fixed = max(float(np.max(np.abs(x))) for x in out) < 1e-12
    else:  # pragma: no cover - manifold_dimension refuses these
        fixed = False
    classic = m.p * m.p_star - m.p_star * (m.p_star + 1) // 2
    status = "yes" if dim == classic and fixed else "changed"
    extra = f" (+{dim - classic} readout)" if dim != classic else ""
    return Cell(status, f"dim {dim}{extra}, measured {measured}; "
                        f"{'fixed points' if fixed else 'not fixed points of the ODE'}")


def _conservation_cell(m: Model) -> Cell:
    # lazy: sympy
    from .symbolic.invariants import conservation_verdict, typical_start
    try:
        verdict = conservation_verdict(m)
    except ValueError as exc:
        if _refusal(exc):
            return _not_derived(exc)
        raise
    if verdict.conserved is None:
        return Cell("not derived", "", verdict.reason)
    if not verdict.conserved:
        n = verdict.counterexample["order"]
        what = "dS/dt" if n == 1 else f"d^{n}S/dt^{n}"
        return Cell("no", f"{what} != 0 at the typical start (exact)")
    st = typical_start(m)
    Q0, rho0 = (np.array(st[x], dtype=float) for x in ("Q", "rho"))
    try:
        closest_solution(m, Q0, rho0)
        closest = "closest solution"
        status = "yes"
        note = ""
    except ValueError as exc:
        closest = "closest solution not derived"
        status = "changed"
        note = _reason(exc)
    return Cell(status, f"S conserved (proof); {closest}", note)


def _hessian_cell(m: Model, N: int) -> Cell:
    # lazy: sympy
    from .symbolic.hessian import count_formulas, hessian_spectrum
    counts = {}
    try:
        for point in ("origin", "plateau", "minimum"):
            counts[point] = hessian_spectrum(m, point, N).counts
    except ValueError as exc:
        if _refusal(exc):
            return _not_derived(exc)
        return Cell("no", f"{point}: {exc}")
    except RuntimeError as exc:
        return Cell("no", f"{point}: {exc}")
    p, k = m.p, m.p_star
    claims = {"origin": counts["origin"][0] == p * N,
              "plateau": counts["plateau"][0] == p * k,
              "minimum": counts["minimum"][0] == 0 and counts["minimum"][1] > 0}
    regime = "over" if p >= k else "under"
    classic = {}
    # lazy: sympy
    from .symbolic.hessian import N_SYM, P_STAR_SYM, P_SYM
    for point in counts:
        f = count_formulas(point, regime if point == "minimum" else None)
        classic[point] = tuple(int(f[key].subs({P_SYM: p, P_STAR_SYM: k, N_SYM: N}))
                               for key in ("negative", "zero", "positive"))
    text = " / ".join(f"{counts[x]}" for x in counts)
    failed = [x for x, ok in claims.items() if not ok]
    if failed:
        return Cell("no", f"{text}; fails at {', '.join(failed)}")
    differ = [x for x in counts if counts[x] != classic[x]]
    if differ:
        return Cell("changed", f"{text}; counts differ at {', '.join(differ)}")
    return Cell("yes", text)


def survival_row(m: Model, N_hessian: int | None = None, N_escape: int = 10_000,
                 n_samples: int = 16) -> dict:
    """``{result: Cell}`` for one model (the columns of :data:`RESULTS`)."""
    check_model(m)
    N_hessian = N_hessian or (m.p + m.p_star + 1)
    return {"plateau": _plateau_cell(m), "escape": _escape_cell(m, N_escape, n_samples),
            "manifold": _manifold_cell(m), "conservation": _conservation_cell(m),
            "hessian": _hessian_cell(m, N_hessian)}


@dataclass(frozen=True)
class SurvivalTable:
    """Rows ``[(label, model, {result: Cell})]``; ``str()`` is a Markdown table with notes."""

    rows: list = field(repr=False)
    N_hessian: int = 0
    N_escape: int = 0

    def markdown(self, notes: bool = True) -> str:
        head = "| model | " + " | ".join(RESULTS.values()) + " |"
        lines = [head, "|" + "---|" * (len(RESULTS) + 1)]
        footnotes = []            # one number per distinct note
        for label, _, cells in self.rows:
            parts = []
            for key in RESULTS:
                cell = cells[key]
                text = str(cell)
                if cell.note and notes:
                    if cell.note not in footnotes:
                        footnotes.append(cell.note)
                    text += f" [{footnotes.index(cell.note) + 1}]"
                parts.append(text.replace("|", "/"))
            lines.append(f"| {label} | " + " | ".join(parts) + " |")
        out = "\n".join(lines)
        if notes and footnotes:
            out += "\n\n" + "\n".join(f"- [{i}] {note}" for i, note in enumerate(footnotes, 1))
        return out + "\n"

    def __str__(self) -> str:
        base = self.rows[0][1]
        return (f"Survival of the paper's results (docs/model.md §8) under each change of "
                f"the model; base {base!r}, Hessian counts (neg, zero, pos) at origin / "
                f"plateau / minimum for N = {self.N_hessian}, escape law at N = "
                f"{self.N_escape}.\n\n" + self.markdown())

    def __repr__(self) -> str:
        return f"SurvivalTable({len(self.rows)} models x {len(RESULTS)} results)"


def survival_table(base: Model | None = None, models=None, N_hessian: int | None = None,
                   N_escape: int = 10_000, n_samples: int = 16) -> SurvivalTable:
    """Run every check for every model (default :func:`survival_models`) and tabulate.

    Parameters
    ----------
    base : Model, optional
        Classic model whose one-field changes are the rows.
    models : list of (label, Model), optional
        Instead of the default rows.
    N_hessian : int, optional
        Input dimension of the Hessian counts (default ``p + p* + 1``).
    N_escape, n_samples : int
        Input dimension and sampled directions of the escape law.
    """
    models = survival_models(base) if models is None else list(models)
    if not models:
        raise ValueError("models must not be empty")
    first = models[0][1]
    N_hessian = N_hessian or (first.p + first.p_star + 1)
    if isinstance(N_escape, bool) or not isinstance(N_escape, int) or N_escape < 1:
        raise ValueError(f"N_escape must be a positive integer, got {N_escape!r}")
    rows = [(label, m, survival_row(m, N_hessian, N_escape, n_samples)) for label, m in models]
    return SurvivalTable(rows, N_hessian, N_escape)

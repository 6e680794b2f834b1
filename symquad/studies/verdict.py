"""The PASS/FAIL verdict of a validation report, from its numbers.

Each criterion returns ``{"name", "status", "text", ...values}`` with status
``"pass"``, ``"fail"`` or ``"not tested"``; :func:`decide` combines them.  The
criteria, their statistics and their calibration are described in the module
docstring of :mod:`symquad.studies.validation` (section *Verdict*); the
constants below are the tolerances named there.
"""

from __future__ import annotations

import math

__all__ = ["ALPHA", "ESCAPE_TOL", "CRITERIA", "decide", "tested_criteria", "verdict_headline"]

#: Every criterion of the verdict, in the order it is printed.  Each report lists all of
#: them: tested (``"pass"``/``"fail"``, with its numbers) or ``"not tested"`` with the reason.
CRITERIA = ("divergence", "mean_deviation", "band", "finite_size_exponent", "escape_time",
            "whole_run_law", "lna_spread")

#: Family-wise level of the verdict's tests.
ALPHA = 0.01
#: Mean-deviation test: largest resolution, as a fraction of the ODE risk range.
_RESOLUTION = 0.10
#: Band criterion: allowed shortfall below the coverage of an exchangeable curve.
_BAND_MARGIN = 0.10
#: Finite-size criterion: tolerance on |b + 1/2| and the largest usable s.e.(b).
_FSS_TOL = 0.1
#: Escape criterion: tolerance on the mean shift, in units of 1/κ.
ESCAPE_TOL = 0.1
#: Escape and divergence criteria: largest fraction of replicas that may disagree.
_DISAGREE = 0.10


def _check(name, status, text, **values):
    return {"name": name, "status": status, "text": text, **values}


def _check_mean_deviation(md, replicas, alpha):
    from scipy.stats import t as student

    name = "mean_deviation"
    if replicas < 2:
        return _check(name, "not tested", "mean risk deviation: needs >= 2 replicas "
                      "(standard errors)")
    if not md["times"]:
        return _check(name, "not tested", "mean risk deviation: no recorded time in the window")
    # Bonferroni over the window's times and the statistics tested at each: the risk, and
    # with an input spectrum the 2B per-block statistics (studies/validation_blocks.py)
    k = md.get("statistics", 1)
    crit = float(student.ppf(1 - alpha / (2 * md["times"] * k), replicas - 1))
    resolution = crit * (md["max_se"] or 0.0)
    rng = md["ode_risk_range"]
    window = f"t in [{md['t_start']:.4g}, {md['t_end']:.4g}], {md['times']} times"
    if k > 1:
        window += (f"; the risk and the {k - 1} per-block statistics tr Q^c, |rho^c|_F^2, "
                   f"largest: {md.get('worst_statistic')}")
    if not rng > 0 or resolution > _RESOLUTION * rng:
        return _check(name, "not tested",
                      f"mean risk deviation ({window}): too few replicas - the test resolves "
                      f"{resolution:.3g}, more than {100 * _RESOLUTION:g}% of the ODE risk "
                      f"range {rng:.3g}", critical=crit, resolution=resolution)
    zmax = md["max_z"] if md["max_z"] is not None else math.inf
    ok = zmax <= crit
    return _check(name, "pass" if ok else "fail",
                  f"mean risk deviation ({window}): max |mean SGD - "
                  f"{'(ODE + c/N)' if md.get('reference') == 'ODE + c/N' else 'ODE'}| = "
                  f"{zmax:.2f} s.e. "
                  f"{'<=' if ok else '>'} {crit:.2f} ({_test_name(md)}, Bonferroni, "
                  f"alpha={alpha:g}; "
                  f"resolves {resolution:.2g})", critical=crit, value=zmax,
                  resolution=resolution)


def _test_name(md):
    """The mean-deviation test as applied: Student's t, and where the O(1/N) expansion holds
    also the predicted law of the replica mean (studies/validation.py, _with_predicted_law)."""
    k = md.get("law_times") or 0
    if not k:
        return "t-test"
    return (f"t-test and the predicted second-order law at {k} of {md['times']} times, "
            "both must reject")


def _check_band(b, replicas):
    need = b["expected_inside_fraction"] - _BAND_MARGIN
    name = "band"
    if replicas < 2:
        return _check(name, "not tested", "band coverage: needs >= 2 replicas")
    frac = b["ode_inside_fraction"]
    ok = frac >= need
    return _check(name, "pass" if ok else "fail",
                  f"band coverage: ODE inside the SGD {b['percentiles'][0]:g}-"
                  f"{b['percentiles'][1]:g}% band at {100 * frac:.1f}% of (replica, time) "
                  f"pairs {'>=' if ok else '<'} {100 * need:.1f}% (expected "
                  f"{100 * b['expected_inside_fraction']:.1f}% minus {100 * _BAND_MARGIN:g})",
                  value=frac, threshold=need)


def _check_fss(f, alpha):
    from scipy.stats import norm

    name = "finite_size_exponent"
    b, se = f["exponent"], f["exponent_se"]
    if not (math.isfinite(b) and math.isfinite(se)) or se > _FSS_TOL:
        return _check(name, "not tested", f"finite-size exponent {b:.3f} ± {se:.3f}: standard "
                      f"error above {_FSS_TOL:g} (more replicas or a wider N range)")
    bound = float(norm.ppf(1 - alpha / 2)) * se + _FSS_TOL
    ok = abs(b + 0.5) <= bound
    return _check(name, "pass" if ok else "fail",
                  f"finite-size exponent {b:.3f} ± {se:.3f}: |b + 1/2| = {abs(b + 0.5):.3f} "
                  f"{'<=' if ok else '>'} {bound:.3f} (z-test at alpha={alpha:g} + "
                  f"{_FSS_TOL:g})", value=b, threshold=bound)


def _check_escape(e, alpha):
    from scipy.stats import t as student

    name = "escape_time"
    d = e["difference"]
    n, R = d["n"], e["replicas"]
    if n < max(2, (R + 1) // 2):
        return _check(name, "not tested", f"escape time: only {n} of {R} replicas escaped in "
                      f"both SGD and the ODE (longer t_max)")
    one = e["escaped_in_one_only"]
    if one > _DISAGREE * R:
        return _check(name, "fail", f"escape time: {one} of {R} replicas escaped in only one "
                      f"of SGD and the ODE more than {e.get('censoring_margin', 0):.3g} "
                      f"before t_max (> {100 * _DISAGREE:g}%)", value=one)
    kappa = e["plateau_rate"]
    bound = float(student.ppf(1 - alpha / 2, n - 1)) * d["se"] + ESCAPE_TOL / kappa
    gap = abs(d["mean"] - e["predicted_difference"])
    ok = gap <= bound
    return _check(name, "pass" if ok else "fail",
                  f"escape-time shift: mean t_esc(SGD) - t_esc(ODE) = {d['mean']:.3g} ± "
                  f"{d['se']:.2g}, predicted {e['predicted_difference']:.3g} (SGD noise seeding "
                  f"rho, J = {e['seed_noise_J']:.3g}); |difference| {gap:.3g} "
                  f"{'<=' if ok else '>'} {bound:.3g} (t-test at alpha={alpha:g} + "
                  f"{ESCAPE_TOL:g}/kappa)", value=gap, threshold=bound)


def _check_divergence(numbers, replicas):
    k = numbers["divergence_disagreements"]
    ok = k <= _DISAGREE * replicas
    return _check("divergence", "pass" if ok else "fail",
                  f"divergence: SGD and the ODE disagree in {k} of {replicas} replicas "
                  f"({'<=' if ok else '>'} {100 * _DISAGREE:g}%; SGD diverged in "
                  f"{numbers['diverged_replicas']}, the ODE in "
                  f"{numbers['ode_diverged_replicas']})", value=k)


def decide(numbers, replicas, alpha=ALPHA) -> dict:
    """PASS/FAIL/INCONCLUSIVE from the report numbers (criteria in the module docstring)."""
    used = numbers["replicas_used"]
    checks = [_check_divergence(numbers, replicas),
              _check_mean_deviation(numbers["mean_deviation"], used, alpha),
              _check_band(numbers["band"], used)]
    if numbers.get("finite_size_scaling"):
        checks.append(_check_fss(numbers["finite_size_scaling"], alpha))
    else:
        checks.append(_check("finite_size_exponent", "not tested",
                             "finite-size exponent: not run ("
                             + numbers.get("finite_size_scaling_skipped", "no finite-size "
                                           "scaling in this run") + ")"))
    if numbers["escape"].get("defined"):
        checks.append(_check_escape(numbers["escape"], alpha))
    else:
        checks.append(_check("escape_time", "not tested", "escape time: not analysed ("
                             + (numbers["escape"].get("reason") or "no plateau") + ")"))
    status = {c["name"]: c["status"] for c in checks}
    if "fail" in status.values():
        outcome = "FAIL"
    elif status["mean_deviation"] == "pass" and status["band"] == "pass":
        outcome = "PASS"
    else:
        outcome = "INCONCLUSIVE"
    return {"verdict": outcome, "passed": outcome == "PASS", "alpha": alpha, "checks": checks}


def tested_criteria(verdict) -> tuple:
    """``(tested, total)``: criteria with a pass/fail outcome, and all criteria listed."""
    checks = verdict["checks"]
    return sum(c["status"] in ("pass", "fail") for c in checks), len(checks)


def verdict_headline(verdict) -> str:
    """``"VERDICT: PASS (all 7 criteria tested)"`` or ``"VERDICT: PASS on 3 of 7 criteria
    (4 not tested: …)"``: a verdict on fewer criteria reads differently from a full one."""
    tested, total = tested_criteria(verdict)
    if tested == total:
        return f"VERDICT: {verdict['verdict']} (all {total} criteria tested)"
    missing = [c["name"] for c in verdict["checks"] if c["status"] not in ("pass", "fail")]
    return (f"VERDICT: {verdict['verdict']} on {tested} of {total} criteria "
            f"({len(missing)} not tested: {', '.join(missing)}; reasons below)")

r"""Validation of the ODE theory against Monte Carlo SGD: numbers, a verdict, figures.

:func:`validate` runs SGD for a model (by default with the exact reduced
simulator, whose law is that of full SGD and whose cost per step does not grow
with ``N``), integrates the ODE (:func:`symquad.integrate`) from the *realised*
initial overlaps of every replica, measures how far SGD is from the theory and
decides PASS/FAIL from the statistical criteria below.  :func:`compare` does
the same for trajectories the user supplies (another code, a GPU run, an
experiment): the same report, the same verdict.

What is compared
----------------
For replica ``r`` and recorded time ``t_i``:

* the risk deviation ``ε_SGD(t_i) − ε_ODE(t_i)`` (the SGD risk is computed from
  the overlaps by Isserlis' theorem, :func:`symquad.numeric.simulate.population_risk`,
  a route independent of the generated kernels);
* the overlap deviation ``D_r(t_i) = (‖Q_SGD − Q_ODE‖²_F + ‖ρ_SGD − ρ_ODE‖²_F)^{1/2}``
  (plus ``‖a_SGD − a_ODE‖²`` under the root when the readout is trained, whose
  deviation is also reported alone as ``readout_rms``).

Each replica's ODE starts from that replica's own ``(Q(0), ρ(0))`` (and
``a(0)`` for a trained readout).  From a
random start this is necessary: ``ρ(0)`` has random entries of size ``N^{-1/2}``
whose replica mean is ``≈ 0``, and the ODE from the mean would never leave
the plateau.  From an informed start all replicas share the same initial
overlaps (the simulator realises them exactly), so one ODE serves all.

Model specification
-------------------
SGD and the ODE are those of the model with every field of
:class:`symquad.Model` (teacher activation, readouts, trained readout, weight
decay, mini-batch, spherical constraint); the SGD risk uses the readouts (the
recorded ``a(t)`` when trained).  The statistics below (mean deviation, band,
finite-size exponent, divergence) hold for every field; the analyses derived
for the classic model — the plateau/escape analysis and the drift study of
``S`` — are skipped with a reason that names each changed field they do not
handle (:mod:`symquad.studies.applicability`; a refusal of
:func:`symquad.plateau` or of the escape law is turned into the same stated
skip), and then the default start is the informed one (from a random start
the comparison would be dominated by the unanalysed escape-time jitter).

Escape
------
For a quadratic activation with ``T = I`` the plateau is the fixed point
``ρ = 0, Q = q I`` of the full ODE (:func:`symquad.plateau`).  A trajectory has
escaped at the first time its risk falls below
``ε_pl − f (ε_pl − ε_min)`` with ``f = escape_fraction`` (default ½) —
:func:`symquad.numeric.landscape.escape_threshold`, linear interpolation
between records.  "Before escape" of replica ``r`` means ``t < t_esc^ODE(r)``,
"after" means ``t >= t_esc^ODE(r)``.  At any fixed time before the escape SGD
and the ODE agree to ``O(N^{-1/2})`` (the finite-size scaling can be run from
the random start on such a window, ``fss_start="random"``).  But the SGD noise
that enters ρ on the plateau is of the same order ``N^{-1/2}`` as ``ρ(0)``
itself and is amplified with ρ at the plateau rate ``κ``, so the escape-time
difference ``t_esc^SGD − t_esc^ODE`` is ``O(1)`` and does not shrink with
``N``.  In the linearised plateau dynamics (:func:`symquad.escape_time`) SGD
escapes as if it had started from ``ρ̃ = ρ(0) + ξ`` with ``ξ`` isotropic of
variance ``J/N`` per entry (``J`` the integrated SGD noise of ρ on the
plateau), while ``ρ(0)`` has variance ``q0/N``: ``|ρ̃|²`` has the law of
``|ρ(0)|²·(1 + J/q0)``, so the mean paired difference is predicted to be

.. math::  \langle t_{esc}^{SGD} − t_{esc}^{ODE} \rangle = −\frac{\log(1 + J/q_0)}{2κ}

(SGD earlier), with an O(1/κ) spread.  For the default model this is
``−0.81`` against a spread of ``≈ 3`` (measured ``−1.07 ± 0.36``).  The
same seeding makes the mean SGD ``‖ρ‖²`` larger than the ODE's by the factor
``1 + J/q0`` once ρ has grown, a systematic deviation of the mean risk of
order ``e^{2κt}/N`` that the replicas resolve (at 64 replicas about 4
standard errors); it is a finite-``N`` effect of the escape, not a failure of
the theory, and the verdict tests it through the escape-time shift rather
than through the mean risk.

After the escape the two differ mostly by that shift in time, and for
``p > p*`` they end at *different points of the zero-risk manifold*: the
manifold ``{WᵀW/p = W*ᵀW*/p*}`` has dimension ``p·p* − p*(p*+1)/2 > 0``, the
noise on the plateau has turned the direction of ρ, and SGD and the ODE
converge to two different zero-risk points (same risk, overlaps that differ
by O(1)).  The overlap deviation after the escape is therefore O(1) at any N
(≈ 1 for the default model) while the risk deviation vanishes; it is reported,
not tested.

Finite-size scaling
-------------------
For several ``N`` (default: 5 values over two decades), the mean over replicas
of the root-mean-square in time of ``D_r(t)`` on ``[0, t_fss]`` is measured
from an *informed* start (no plateau, so no escape-time jitter; see above),
and ``log D = a + b log N`` is fitted by weighted least squares
(:func:`scipy.optimize.curve_fit`, weights from the replica standard errors).
The theory predicts ``b = −1/2`` (fluctuations of a sum of ``N t`` steps of
size ``1/N``); the report gives ``b`` with its standard error.

Bands
-----
``band`` (default the central 95 % of the replicas, percentiles 2.5 and 97.5)
is where a single SGD run lies; the ODE is "inside the band" at a time if it
is within it up to ``1e-9`` (the two risks are computed by different routes, so
they agree at ``t = 0`` only to round-off).  The mean of the replicas carries
its own confidence interval ``± 3`` standard errors.

Verdict
-------
Each criterion is a test at family level ``alpha`` (default 0.01) that the
report states with its numbers; ``report.passed`` is True when every criterion
that could be tested passed and the mean-deviation and band criteria were
tested (``report.verdict`` is ``"PASS"``, ``"FAIL"`` or ``"INCONCLUSIVE"``;
``report.reasons`` lists one line per criterion).

1. **Mean deviation on the approach to the plateau** (``mean_deviation``).
   ``z(t) = |mean_r(ε_SGD − ε_ODE)| / s.e.`` at every recorded time after the
   start in the window ``W``, against Student's ``t`` with ``R − 1`` degrees
   of freedom at level ``alpha/(2|W|)`` (Bonferroni over the times of the
   window).  ``W`` is the whole run when there is no escape analysis, and
   otherwise the times before the median ODE ``‖ρ‖²_F`` has grown to twice its
   start (``_RHO_GROWTH``): the relaxation onto the plateau, before the
   ``N^{-1}e^{2κt}`` seeding effect above.  With ``N`` given the reference is
   ``ε_ODE + c_ε/N`` (the O(1/N) mean), and where that expansion holds the test rejects
   at a time only when the predicted second-order law of the replica mean (a generalised
   χ², saddlepoint; docs/derivation.md §8.3a) rejects too: at a risk floor each replica's
   deviation is χ²-like and Student's t alone rejects a correct theory far above its
   level (``z`` is then the Student-equivalent of the larger p-value, and the s.e. the
   larger of the replicas' and the predicted one).  Precision first: the test is
   *not tested* when its resolution ``t_crit · max s.e.`` exceeds 10 %
   (``verdict._RESOLUTION``) of the range of the mean ODE risk over ``W`` (too few
   replicas to see a wrong theory; the default run resolves about 1 %).
2. **Band coverage** (``band``): the fraction of (replica, time) pairs at which
   each replica's ODE risk lies inside the SGD band must be at least the
   coverage expected for a curve distributed like the replicas,
   ``(R − 1)(hi − lo)/100/(R + 1)``, minus ``0.10`` (``verdict._BAND_MARGIN``: the
   ODE curves are shifted by the O(1/κ) escape-time difference above).
3. **Finite-size exponent** (``finite_size_exponent``, :func:`validate` only):
   ``|b + ½| <= z_{1−alpha/2} s.e.(b) + 0.1`` (``verdict._FSS_TOL``: the O(N^{-1})
   bias of the deviation bends the log–log line over two decades); not tested
   when ``s.e.(b) > 0.1``.
4. **Escape-time shift** (``escape_time``, with an escape analysis): the mean
   paired difference ``d = t_esc^SGD − t_esc^ODE`` over the replicas where
   both escaped must agree with the prediction above:
   ``|d̄ − d_pred| <= t_{1−alpha/2, n−1} s.e.(d̄) + 0.1/κ`` (``verdict.ESCAPE_TOL``:
   a tenth of an e-folding time of ρ for the neglected nonlinear and
   anisotropic corrections of the linearised noise model; in every run we
   measured the gap was within the statistical part alone), and
   at most 10 % of the replicas may escape in one and not in the other.
   Not tested when fewer than half of the replicas escaped in both.
5. **Divergence** (``divergence``): SGD and the ODE diverge in the same
   replicas, up to 10 % of them.
6. **Whole run** (``whole_run_law``, ``lna_spread``; ``whole_run=True``, and
   :func:`compare` given ``N``): the replicas against the order-parameter SDE
   from the same starts, and their spread against the linear-noise
   prediction — see :mod:`symquad.studies.whole_run`, which also says how they
   enter the verdict.

Calibration (tests/test_validation_verdict.py): the default model passes;
the same SGD data compared with the ODE of a model whose learning rate is
30 % off fails, and so does the data with ρ scaled by 1.25.  Power at the
default statistics (``symquad validate``: N = 2000, 64 replicas, seed 0),
measured by comparing its SGD trajectories with the ODE of a perturbed
model: learning rate 0.105 or 0.095 instead of 0.1 fails the mean-deviation
criterion (7.1 and 4.7 s.e. against a critical 3.4), 0.11 and 0.09 fail the
mean-deviation, band and escape criteria; the true model passes all four
(1.7 s.e.; band 93.8 % against 82.1 %; escape shift −1.07 ± 0.36 against the
predicted −0.81).
"""

from __future__ import annotations

import math
import time
import warnings
from numbers import Real

import numpy as np

from .._signals import terminate_cleanly
# the module, not simulate: looked up when validate runs, so a replacement at the source
# (the tests' forbid of the work a refusal must come before) takes effect
from ..numeric import simulate as _sim
from ..numeric.checks import MAX_TIMES, as_overlaps, check_int as _check_int
from ..numeric.errors import DivergenceError
from ..numeric.kernels import check_kernels
from ..numeric.simulate import block_population_risk, population_risk
from ..progress import note
from ..spec import DEFAULT_MODEL
from ..spectrum import block_dimension, has_spectrum
from ..stages import declare
from .applicability import refusal, require_analysis
from .invariant_drift import invariant_drift_study, summarize_drift_study
from .resolution import resolution_numbers
from .validation_blocks import block_deviation_z, block_statistic_names, block_statistics
from .verdict import ALPHA, ESCAPE_TOL, decide as _decide
from .whole_run import add_whole_run, whole_run_not_run
# the criteria, the report and the input checks live in sibling modules (one per
# criterion); their names are re-exported here so that imports keep working
from .validation_band import _BAND_TOL, _exchangeable_coverage  # noqa: F401
from .validation_common import (  # noqa: F401
    STARTS, _check_common, _describe, _finite_float, _model_config)
from .validation_escape import (  # noqa: F401
    _SMALL_RHO, _escape_applies, _escape_setup, _escape_unsupported, _seeding_shift)
from .validation_fss import _check_fss_args, finite_size_scaling  # noqa: F401
from .validation_inputs import (  # noqa: F401
    COMPARE_WARN_SECONDS, default_teacher, _as_readout, _as_trajectories,
    _check_ode_horizon, _check_start,
    _check_teacher, _check_times, _check_whole_run)
from .validation_mean import (  # noqa: F401
    _RHO_GROWTH, _check_finite_n, _finite_n_correction, _finite_n_fluctuations,
    _finite_n_numbers, _mean_deviation_window, _predicted_law_test)
from .validation_report import (  # noqa: F401
    ValidationReport, _ARRAYS, _FORMAT_VERSION, _READOUT_ARRAYS, _activation_list,
    _finite_or_none, _report_format)
from .validation_runs import (  # noqa: F401
    VALIDATE_WARN_SECONDS, _STUDY_LABELS, _StudyRunner, _plan_runs, _resolve_workers,
    _timed_call)
from .validation_starts import (  # noqa: F401
    _aligned_signs, _integrate_starts, _ode_per_replica, _overlap_deviation, _rms_over,
    informed_start)

__all__ = ["validate", "compare", "ValidationReport", "finite_size_scaling", "informed_start",
           "STARTS"]


def _analyse(model, t, sgd_Q, sgd_rho, sgd_risk, sgd_ok, T, *, band, escape_fraction, escape,
             progress, sgd_readout=None, N=None, finite_n=None):
    """ODE from every replica's start and all summary numbers (no verdict).

    `sgd_readout` (replicas, n, p): the recorded readouts of a trained readout
    (the ODE starts from each replica's ``a(0)``); None for a fixed one.  `N`: the input
    dimension, for the O(1/N) correction of the mean (None: against the ODE alone).
    """
    tick = time.perf_counter()
    oQ, orho, orisk, ostatus, shared, oa = _ode_per_replica(
        model, sgd_Q[:, 0], sgd_rho[:, 0], T, t,
        None if sgd_readout is None else sgd_readout[:, 0], progress)
    t_ode = time.perf_counter() - tick
    good = sgd_ok & (ostatus == "ok")
    n_good = int(good.sum())
    numbers = {"diverged_replicas": int(np.sum(~sgd_ok)),
               "ode_diverged_replicas": int(np.sum(ostatus != "ok")),
               "divergence_disagreements": int(np.sum(sgd_ok != (ostatus == "ok"))),
               "replicas_used": n_good}
    if n_good < 1:
        raise ValueError("no replica where both SGD and the ODE stayed finite: nothing to "
                         "compare (reduce lr)")
    d_risk = sgd_risk - orisk
    blocks = has_spectrum(model)
    d_ov = _overlap_deviation(sgd_Q, sgd_rho, oQ, orho, sgd_readout, oa, blocks=blocks)

    fp, threshold, reason = _escape_applies(model, T, sgd_rho[:, 0], sgd_risk[:, 0], escape,
                                            escape_fraction)
    if threshold is not None:
        q0 = float(np.mean(np.trace(sgd_Q[good, 0], axis1=-2, axis2=-1)) / model.p)
        try:
            shift, J = _seeding_shift(model, q0, fp)
        except ValueError as exc:       # the escape law refuses this model
            threshold, reason = None, str(exc)
    esc = {"defined": threshold is not None, "reason": reason}
    if threshold is not None:
        # lazy: scipy
        from ..numeric.landscape import escape_times
        ts = escape_times(t, sgd_risk[good], threshold)
        to = escape_times(t, orisk[good], threshold)
        # A replica that escaped in only one of SGD and the ODE, close to the end
        # of the record, is censored, not a disagreement: the other would be
        # expected to escape within the escape-time jitter, after t_max.
        both = np.isfinite(ts) & np.isfinite(to)
        jitter = float(np.std(ts[both] - to[both])) if both.sum() >= 2 else 0.0
        margin = abs(shift) + 3.0 * jitter + ESCAPE_TOL / float(fp.rate)
        one_only = np.isfinite(ts) != np.isfinite(to)
        first = np.fmin(ts, to)
        censored = np.isfinite(first) & (first > float(t[-1]) - margin)
        esc.update({
            "plateau_risk": float(fp.risk), "plateau_q": float(fp.q),
            "plateau_rate": float(fp.rate), "threshold": threshold,
            "fraction": escape_fraction, "replicas": n_good,
            "sgd_escaped": int(np.isfinite(ts).sum()), "ode_escaped": int(np.isfinite(to).sum()),
            "escaped_in_one_only": int(np.sum(one_only & ~censored)),
            "escaped_in_one_only_censored": int(np.sum(one_only & censored)),
            "censoring_margin": margin,
            "sgd": _describe(ts), "ode": _describe(to), "difference": _describe(ts - to),
            "predicted_difference": shift, "seed_noise_J": J, "q0": q0,
            "sgd_times": _finite_or_none(ts), "ode_times": _finite_or_none(to),
            "definition": "first time the risk falls below plateau_risk - fraction * "
                          "(plateau_risk - minimum_risk), linear interpolation between records",
        })
        t_split = np.where(np.isfinite(to), to, np.inf)[:, None]
    else:
        t_split = np.full((n_good, 1), np.inf)
    numbers["escape"] = esc

    # deviations by phase
    tt = np.broadcast_to(t, (n_good, len(t)))
    phases = {"whole_run": np.ones_like(tt, bool)}
    if threshold is not None:
        phases.update(before_escape=tt < t_split, after_escape=tt >= t_split)
    dev = {}
    for name, mask in phases.items():
        dev[name] = {"risk_rms": _describe(_rms_over(mask, d_risk[good])),
                     "overlap_rms": _describe(_rms_over(mask, d_ov[good])),
                     "risk_max_abs": _describe(np.where(mask, np.abs(d_risk[good]), 0).max(-1))}
        if sgd_readout is not None:
            d_a = np.sqrt(np.sum((sgd_readout[good] - oa[good]) ** 2, axis=-1))
            dev[name]["readout_rms"] = _describe(_rms_over(mask, d_a))
    numbers["deviation"] = dev

    # the O(1/N) correction of the mean: SGD is compared with ODE + c/N where it holds, with
    # the O(N^-2) remainder bounded by |c|/N^(3/2) (conservative) in the standard error
    # (integrated over the mean-deviation window only: beyond it a plateau's escape ends
    # the expansion's validity, and the band criterion there tests against the ODE)
    first = int(np.nonzero(good)[0][0])
    window, t_end = _mean_deviation_window(t, orho[good], threshold is not None)
    upto = int(np.nonzero(window)[0][-1]) + 1 if window.any() else 1
    c, c_valid, c_reason, fl = _finite_n_fluctuations(
        model, t[:upto], sgd_Q[first, 0], sgd_rho[first, 0], T,
        None if sgd_readout is None else sgd_readout[first, 0], N, finite_n)
    if c is not None:
        c = np.concatenate([c, np.zeros(len(t) - upto)])
        c_valid = np.concatenate([c_valid, np.zeros(len(t) - upto, bool)])
    shift = np.zeros(len(t)) if c is None else c / N
    remainder = np.zeros(len(t)) if c is None else np.abs(c) / N ** 1.5

    # bands and the mean deviation
    sr = sgd_risk[good]
    lo, hi = np.percentile(sr, band[0], axis=0), np.percentile(sr, band[1], axis=0)
    scale = np.maximum(1.0, np.abs(sr).max(0))
    oc = orisk[good] + shift
    inside = (oc >= lo - _BAND_TOL * scale) & (oc <= hi + _BAND_TOL * scale)
    inside_t = inside[0] if shared else inside.mean(0)
    plain_dev = d_risk[good].mean(0)
    mean_dev = plain_dev - shift
    se_sgd = d_risk[good].std(0, ddof=1) / math.sqrt(n_good) if n_good > 1 \
        else np.full(len(t), np.nan)
    se = np.sqrt(se_sgd ** 2 + remainder ** 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(se > 0, np.abs(mean_dev) / se,
                     np.where(np.abs(mean_dev) <= _BAND_TOL * scale, 0.0, np.inf))
        z_plain = np.where(se_sgd > 0, np.abs(plain_dev) / se_sgd,
                           np.where(np.abs(plain_dev) <= _BAND_TOL * scale, 0.0, np.inf))
    z_student = z.copy()
    z, se, law_use = _with_predicted_law(z, se, fl, window & (c_valid if c is not None
                                                                 else False),
                                         upto, N, n_good, mean_dev, remainder)
    statistics, z_all, which = 1, z, np.zeros(len(t), int)
    if blocks:
        # the per-block statistics tr Q^c, |rho^c|_F^2 join the risk in the mean-deviation
        # criterion (validation_blocks: Bonferroni over the times and the 1 + 2B statistics)
        b_mean, b_se, b_z = block_deviation_z(sgd_Q[good], sgd_rho[good], oQ[good], orho[good],
                                              _BAND_TOL)
        statistics = 1 + b_z.shape[1]
        stacked = np.concatenate([z[:, None], b_z], axis=1)
        which = np.argmax(np.nan_to_num(stacked, nan=np.inf), axis=1)
        z_all = stacked[np.arange(len(t)), which]
    pre = t < np.min(t_split)
    numbers["band_before_escape"] = {
        "t_end": float(t[pre][-1]) if pre.any() else None,
        "max_mean_z": _finite_float(np.max(z[pre])) if pre.any() else None,
        "max_abs_mean_risk_deviation": float(np.max(np.abs(mean_dev[pre]))) if pre.any()
        else None,
        "max_se": _finite_float(np.max(se[pre])) if pre.any() else None,
        "description": "mean over replicas of risk_SGD - risk_ODE(own start) at times before "
                       "the earliest ODE escape, in standard errors",
    }
    after = t > t[0]
    numbers["band"] = {
        "percentiles": [float(band[0]), float(band[1])],
        "ode_inside_fraction": float(np.mean(inside_t[after])) if after.any() else 1.0,
        "expected_inside_fraction": _exchangeable_coverage(n_good, band),
        "ode_outside_times": [float(x) for x in t[np.asarray(inside_t) < 1]][:50],
        "max_mean_z": _finite_float(np.max(z)),
        "max_se": _finite_float(np.max(se)),
        "mean_inside_3se_fraction": float(np.mean(z <= 3)),
        "description": ("replica band of the SGD risk; for a random start each replica's "
                        "own ODE is tested against the band" if not shared else
                        "replica band of the SGD risk vs the (common) ODE risk"),
    }
    omean = oc.mean(0)
    numbers["mean_deviation"] = {
        "t_start": float(t[window][0]) if window.any() else None, "t_end": t_end,
        "times": int(window.sum()),
        "max_z": _finite_float(np.max(z_all[window])) if window.any() else None,
        "t_at_max_z": float(t[window][np.argmax(z_all[window])]) if window.any() else None,
        "max_se": _finite_float(np.max(se[window])) if window.any() else None,
        "max_abs_mean_deviation": float(np.max(np.abs(mean_dev[window]))) if window.any()
        else None,
        "ode_risk_range": float(np.ptp(omean[window | (t == t[0])])),
        "window": ("relaxation onto the plateau: times before the median ODE |rho|^2 has "
                   f"grown {_RHO_GROWTH:g}-fold" if threshold is not None else "whole run"),
        "reference": "ODE + c/N" if c is not None else "ODE",
        "law_times": int(np.sum(law_use & window)),
        "max_z_student": _finite_float(np.max(z_student[window])) if window.any() else None,
        "test": ("at each time the larger p-value of Student's t on the replicas' s.e. and "
                 "of the predicted second-order law of the replica mean (generalised chi^2, "
                 "saddlepoint) where the O(1/N) expansion holds, as a t-equivalent z; "
                 "Student's t alone elsewhere"),
    }
    if blocks:
        names = ["risk"] + block_statistic_names(model.n_blocks)
        md = numbers["mean_deviation"]
        md.update(statistics=statistics, risk_max_z=_finite_float(np.max(z[window]))
                  if window.any() else None,
                  worst_statistic=names[int(which[window][np.argmax(z_all[window])])]
                  if window.any() else None)
        numbers["block_statistics"] = {
            "names": names[1:],
            "max_z": [_finite_float(v) for v in np.max(b_z[window], axis=0)]
            if window.any() else None,
            "max_abs_mean_deviation": [float(v) for v in np.max(np.abs(b_mean[window]), 0)]
            if window.any() else None,
            "max_se": [_finite_float(v) for v in np.max(b_se[window], axis=0)]
            if window.any() else None,
            "final": {"sgd": [float(v) for v in block_statistics(
                sgd_Q[good, -1], sgd_rho[good, -1]).mean(0)],
                      "ode": [float(v) for v in block_statistics(
                          oQ[good, -1], orho[good, -1]).mean(0)]},
            "description": "per input block c: tr Q^c and |rho^c|_F^2, mean over replicas of "
                           "SGD minus each replica's ODE, in standard errors (max over the "
                           "mean-deviation window); tested with the risk in mean_deviation",
        }
    numbers["finite_n_bias"] = _finite_n_numbers(t, N, window, plain_dev, se_sgd, c, c_valid,
                                                 c_reason, z_plain)
    numbers["final_risk"] = {"sgd": _describe(sr[:, -1]), "ode": _describe(oc[:, -1])}
    arrays = dict(ode_Q=oQ, ode_rho=orho, ode_risk=orisk, ode_readout=oa, criterion_se=se)
    return numbers, arrays, shared, t_ode


def _with_predicted_law(z, se, fl, use, upto, N, R, mean_dev, remainder):
    """``(z, se, use)`` of the mean-deviation test with the predicted second-order law.

    Where `use` (the window, the expansion valid) the test rejects only when both Student's
    t on the replicas' s.e. and the predicted law of the replica mean
    (:func:`validation_mean._predicted_law_test`) reject: its p-value is the larger of the
    two, returned as the Student-t-equivalent ``z`` (so the critical value is unchanged),
    and its s.e. is the larger of the two s.e. (what decides its resolution).  Why: a
    replica's ``N(ε − ε_ODE)`` is χ²-like at a risk floor (skewness 0.7–2.3 measured), and a
    sample of ``R`` that misses the right tail has a low mean *and* a low s.e. together,
    so Student's t alone rejects a correct theory far above its level; the predicted law
    knows the spread and the skew.  Requiring Student's t too keeps the level wherever
    either law is right (the predicted one misses O(N^-1/2) skew where ∇ε ≠ 0).
    """
    from scipy.stats import t as student            # lazy: scipy
    use = np.zeros(len(z), bool) if fl is None or R < 2 else \
        np.concatenate([np.asarray(use[:upto], bool), np.zeros(len(z) - upto, bool)])
    if not use.any():
        return z, se, use
    p_law, se_law = _predicted_law_test(fl, use[:upto], N, R, mean_dev[:upto],
                                        remainder[:upto])
    p_law = np.concatenate([p_law, np.full(len(z) - upto, np.nan)])
    se_law = np.concatenate([se_law, np.full(len(z) - upto, np.nan)])
    p = np.fmax(2.0 * student.sf(z, R - 1), p_law)
    z = np.where(use, student.isf(np.minimum(p, 1.0) / 2.0, R - 1), z)
    se = np.where(use, np.fmax(se, se_law), se)
    return z, se, use


def _add_resolution(numbers, model, t, sgd_risk, ode, sgd_Q, sgd_rho, T, sgd_readout, shared,
                    criterion_se=None):
    """``numbers["resolution"]``: the smallest parameter changes the run detects
    (:mod:`symquad.studies.resolution`), from the mean-deviation test's window, critical
    value and the standard errors it applies (`criterion_se`, (n,): the larger of the
    replicas' and the predicted one, with the O(N⁻²) remainder; None: the replicas')."""
    orisk = ode["ode_risk"]
    good = np.all(np.isfinite(sgd_risk), axis=1) & np.all(np.isfinite(orisk), axis=1)
    md = next(c for c in numbers["verdict"]["checks"] if c["name"] == "mean_deviation")
    window, _ = _mean_deviation_window(t, ode["ode_rho"][good],
                                       bool(numbers["escape"].get("defined")))
    a0 = None if sgd_readout is None else sgd_readout[good, 0]
    numbers["resolution"] = resolution_numbers(
        model, t, sgd_risk[good] - orisk[good], sgd_Q[good, 0], sgd_rho[good, 0], T, a0,
        window, md.get("critical") if md["status"] != "not tested" else None, shared=shared,
        se=criterion_se)


def validate(model=None, N=2000, t_max=None, replicas=64, start=None, seed=0, *,
             T=None, Q0=None, rho0=None, method="reduced", n_times=201, band=(2.5, 97.5),
             escape_fraction=0.5, overlap=0.5, alpha=ALPHA, fss=True, fss_N=None,
             fss_t_max=None, fss_replicas=None, fss_start="informed", invariant=True,
             invariant_N=(250, 500, 1000, 2000), invariant_replicas=16, workers=1,
             progress=False, whole_run=True, resolution=True, finite_n=None):
    r"""Compare SGD with the ODE theory for `model`; return a :class:`ValidationReport`.

    The report carries a PASS/FAIL verdict (``report.passed``,
    ``report.reasons``; criteria in the module docstring).

    Parameters
    ----------
    model : symquad.Model, optional
        Default :data:`symquad.spec.DEFAULT_MODEL`.  Every field is honoured:
        SGD (:func:`symquad.simulate`) and the ODE (from each replica's
        realised ``Q(0), ρ(0)`` and, for a trained readout, ``a(0)``) are the
        variant's; see "Model specification" in the module docstring for what
        is skipped.
    N : int
        Input dimension of the SGD runs (``>= 1``).
    t_max : float, optional
        Final time.  Default: for a random start with an escape,
        ``2.5 · log(N) / (2κ)`` (κ the plateau growth rate of ρ, so the
        escape, predicted at ``≈ log(N)/(2κ)`` plus a relaxation, is inside the
        window); otherwise ``10/η``.
    replicas : int
        Independent SGD runs (``>= 2``).
    start : {"random", "informed"}, optional
        ``"random"``: ``w_k ~ N(0, I)`` (plateau and escape);
        ``"informed"``: ``Q(0) = I``, ``ρ(0) = α P`` with ``α`` = `overlap` and
        ``P`` a fixed p×p* matrix with orthonormal columns (no plateau).
        Default: ``"random"`` for ``σ = c z²``; ``"informed"`` for other
        activations, whose plateau from a random start lasts far longer (the
        escape analysis is for ``σ = c z²``), and for models with a changed
        specification field the escape analysis does not handle (the reason,
        naming the field, is ``config["start_reason"]``).  Not with `Q0`/`rho0`.
    seed : int
        Seed of the simulations (the same seed gives the same report numbers).
    T : array (p*, p*), optional
        Teacher overlaps (symmetric PSD); default ``I``.
    Q0, rho0 : arrays, optional
        Initial overlaps, ``(p, p)``/``(p, p*)`` or with a leading replicas
        axis (checked: shapes, finiteness, symmetry, PSD Gram matrix with `T`).
        The escape analysis is then done when it applies (σ = c z², T = I,
        small ρ(0), start above the escape threshold).
    method : {"reduced", "full"}
        Simulator (see :func:`symquad.simulate`).
    n_times : int
        Number of recorded times.
    band : (float, float)
        Percentiles of the replica band.
    escape_fraction : float
        ``f`` in the escape threshold ``ε_pl − f(ε_pl − ε_min)``.
    overlap : float
        ``α`` of the informed start.
    alpha : float
        Family-wise level of the verdict's tests, in ``(0, 0.5)``.
    fss : bool
        Run the finite-size scaling.
    fss_N, fss_t_max, fss_replicas, fss_start
        Finite-size scaling: N values (default 100, 300, 1000, 3000, 10000),
        time window (default ``min(t_max, max(5, 2/η))``), replicas (default
        `replicas`) and start (default ``"informed"``, see the module docstring).
    invariant : bool
        Measure the drift of the implicit-bias invariant ``S = ρ(ρᵀρ)^(-1/2)``
        along SGD as a function of N (random start from a time after the early
        re-randomisation, and an informed start), with a fitted exponent; see
        :func:`symquad.invariant_drift_study`.  Needs
        ``p >= p*``, ``σ = c z²`` and no specification field the
        conservation of ``S`` is not proved for (skipped otherwise, with the
        reason, naming the field, in ``numbers["invariant_drift_skipped"]``).
        Reported, not part of the verdict.
    invariant_N, invariant_replicas
        The N values and replicas per N of that study (t_max as the main run).
    workers : int
        Processes (``>= 1``, default 1): with ``workers > 1`` the finite-size
        scaling and the drift study run in spawned worker processes (up to
        ``workers − 1`` of them) while this one runs the main comparison.
        The numbers do not depend on it (every study has its own seeds).  It
        pays only on idle cores: each worker costs an interpreter start
        (about 2 s of CPU), and on our shared 2-core machine (load ≈ 3) the
        default run took 28.3 s with 3 workers against 26.0 s serially
        (``benchmarks/bench_validate.py --workers 1``).  Inside a daemonic
        process (e.g. a pool worker) the studies always run serially.
    progress : bool
        Progress on stderr (:mod:`symquad.progress`): a line per stage and the
        progress of the simulations and ODE solves, as tqdm bars on a terminal
        and plain lines (every 10 % or 10 s, with the time left) otherwise
        (main comparison only when the side studies run in workers).
    whole_run : bool
        Add the whole-run criteria (:mod:`symquad.studies.whole_run`): SGD
        against the order-parameter SDE from the same starts, and the replica
        spread against the linear-noise prediction.
    resolution : bool
        Add ``report.resolution``: the smallest change of each parameter (lr, label
        noise, weight decay, batch size, a trained readout's rate, each activation
        coefficient) this run's mean-deviation test detects
        (:mod:`symquad.studies.resolution`).
    finite_n : bool or None
        Compare SGD with ``ODE + c/N``, the derived O(1/N) correction of the mean
        (:func:`symquad.fluctuations`), in the mean-deviation and band criteria.  None:
        when one trajectory of the LNA with the correction is estimated at most
        ``LNA_VERDICT_SECONDS`` (300 s; :func:`symquad.studies.whole_run.finite_n_cost`);
        True: always (every activation pair with a diffusion matrix); False: never.

    Returns
    -------
    ValidationReport
    """
    t_start = time.perf_counter()
    model = DEFAULT_MODEL if model is None else model
    declare(model, "validate")
    N = _check_int(N, "N", 1)
    replicas = _check_int(replicas, "replicas", 2)
    n_times = _check_int(n_times, "n_times", 3, MAX_TIMES)
    _check_common(band, escape_fraction, alpha)
    _check_finite_n(finite_n)
    given = Q0 is not None or rho0 is not None
    if given and (Q0 is None or rho0 is None):
        raise ValueError("Q0 and rho0 must be given together")
    if start is None:
        # a random start has a plateau: without the escape analysis the comparison
        # would be dominated by the O(1) escape-time jitter (module docstring)
        refused = None if given else refusal(model, "escape")
        if given:
            start, start_reason = "given", "Q0, rho0 given"
        elif refused:
            start, start_reason = "informed", f"default: {refused}"
        else:
            start = "random" if model.is_quadratic else "informed"
            start_reason = "default for this activation"
    else:
        if start not in STARTS:
            raise ValueError(f"start must be one of {STARTS}, got {start!r}")
        if given:
            raise ValueError(f"give either start={start!r} or Q0/rho0, not both")
        start_reason = "requested"
    T = default_teacher(model) if T is None else _check_teacher(model, T)
    if given:
        _check_start(model, Q0, rho0, T)
    if fss and fss_start not in STARTS:
        raise ValueError(f"fss_start must be one of {STARTS}, got {fss_start!r}")
    if (start == "informed" or (fss and fss_start == "informed")):
        require_analysis(model, "informed_start")
        as_overlaps(model, *informed_start(model, overlap), T,
                    names=("informed Q0", "informed rho0 (overlap)", "T"))

    escape = {"random": None, "informed": False, "given": None}[start]
    fp, threshold = None, None
    if start != "informed":
        fp, threshold, _ = _escape_setup(model, T, escape_fraction)
    if t_max is None:
        if threshold is not None:
            t_max = float(np.ceil(2.5 * math.log(max(N, 2)) / (2 * fp.rate)))
        else:
            t_max = float(np.ceil(10.0 / model.eta))
    if isinstance(t_max, bool) or not isinstance(t_max, Real) or not math.isfinite(t_max) \
            or t_max <= 0:
        raise ValueError(f"t_max must be a finite number > 0, got {t_max!r}")
    t_max = float(t_max)
    if fss:
        require_analysis(model, "finite_size_scaling")
        fss_N_default = fss_N is None
        fss_N = list(fss_N) if fss_N is not None else [100, 300, 1000, 3000, 10000]
        if has_spectrum(model) and fss_N_default:
            # every block needs f_b N whole coordinates, at least p + p* + b of them
            fss_N = [block_dimension(model, n) for n in fss_N]
        fss_t = float(fss_t_max) if fss_t_max is not None \
            else float(min(t_max, max(5.0, 2.0 / model.eta)))
        _check_fss_args(fss_N, fss_t, fss_replicas)

    jobs = {}
    if fss:
        jobs["finite_size_scaling"] = (finite_size_scaling, dict(
            model=model, Ns=fss_N, t_max=fss_t, replicas=fss_replicas or replicas, seed=seed,
            start=fss_start, overlap=overlap, method=method, T=T))
    skipped = None
    if invariant:
        skipped = refusal(model, "invariant_drift")
    if invariant and not skipped and not (model.p >= model.p_star and model.is_quadratic):
        skipped = ("the conservation of S is a result for sigma = c z^2" if not model.is_quadratic
                   else "S = rho (rho^T rho)^(-1/2) needs p >= p_star")
    elif invariant and not skipped:
        # docs/model.md §8.4 at finite N: drift of S = rho (rho^T rho)^(-1/2) vs N
        jobs["invariant_drift"] = (invariant_drift_study, dict(
            model=model, Ns=list(invariant_N), t_max=t_max, replicas=invariant_replicas,
            seed=seed, method=method, T=T))
    check_kernels(model)        # the ODE's kernels exist for this pair: checked before SGD runs
    _plan_runs(model, method, [("main run", N, t_max, replicas, n_times)]
               + [(f"finite-size scaling at N={n}", n, fss_t, fss_replicas or replicas, 51)
                  for n in (fss_N if fss else ())]
               + [(f"drift study of S ({start} start) at N={n}", n, t_max,
                   invariant_replicas, 101)
                  for n in (list(invariant_N) if "invariant_drift" in jobs else ())
                  for start in ("random", "informed")])
    workers = _resolve_workers(workers, len(jobs))

    phases = {}
    with terminate_cleanly(), warnings.catch_warnings(), \
            _StudyRunner(jobs, workers, progress) as studies:
        # the plan above already gave the estimate of every run
        warnings.filterwarnings("ignore", r"simulate: .* estimated to take", RuntimeWarning)
        tick = time.perf_counter()
        kwargs = {"T": T}
        if start == "informed":
            kwargs["Q0"], kwargs["rho0"] = informed_start(model, overlap)
        elif given:
            kwargs["Q0"], kwargs["rho0"] = Q0, rho0
        t_eval = np.linspace(0.0, t_max, n_times)
        note(progress, f"validate: SGD, N = {N}, {replicas} replicas, t <= {t_max:g} ({method} "
                       f"simulator), then the ODE from each replica's start")
        run = _sim.simulate(model, N=N, t_max=t_max, replicas=replicas, seed=seed,
                            method=method, t_eval=t_eval, on_divergence="stop",
                            progress=progress, **kwargs)
        phases["sgd"] = time.perf_counter() - tick
        ok = run.status == "ok"
        if ok.sum() < 2:
            raise DivergenceError(
                f"validate: SGD diverged in {run.n_diverged}/{replicas} replicas (first at "
                f"t = {np.nanmin(run.t_diverged):.4g}); reduce lr", np.nanmin(run.t_diverged),
                {k: v[0] for k, v in run.last_finite.items()}, partial=run)
        tick = time.perf_counter()
        numbers, ode, shared, phases["ode"] = _analyse(
            model, run.t, run.Q, run.rho, run.risk, ok, run.T, band=band,
            escape_fraction=escape_fraction, escape=escape, progress=progress,
            sgd_readout=run.readout, N=N, finite_n=finite_n)
        criterion_se = ode.pop("criterion_se")
        phases["analysis"] = time.perf_counter() - tick - phases["ode"]
        results, study_times = studies.results()
    phases.update(study_times)
    if fss:
        numbers["finite_size_scaling"] = results["finite_size_scaling"]
    else:
        numbers["finite_size_scaling_skipped"] = "fss=False, symquad validate --no-fss"
    study = results.get("invariant_drift")
    if study is not None:
        numbers["invariant_drift"] = summarize_drift_study(study)
    if skipped:
        numbers["invariant_drift_skipped"] = skipped
    numbers["verdict"] = _decide(numbers, replicas, alpha)
    if resolution:
        tick = time.perf_counter()
        _add_resolution(numbers, model, run.t, run.risk, ode, run.Q, run.rho, run.T,
                        run.readout, shared, criterion_se)
        phases["resolution"] = time.perf_counter() - tick
    if whole_run:
        tick = time.perf_counter()
        numbers["verdict"] = add_whole_run(numbers, model, run.t, run.Q[ok], run.rho[ok],
                                           run.risk[ok], run.T, N, alpha, seed=seed,
                                           shared=shared)
        phases["whole_run"] = time.perf_counter() - tick
    else:
        numbers["verdict"] = whole_run_not_run(
            numbers["verdict"], "whole_run=False, symquad validate --no-whole-run")
    numbers["runtime_s"] = time.perf_counter() - t_start
    numbers["runtime_phases_s"] = phases

    config = {**_model_config(model), "source": "simulation", "N": N, "t_max": t_max,
              "replicas": replicas, "start": start, "start_reason": start_reason, "seed": seed,
              "workers": workers,
              "method": method, "n_times": n_times,
              "overlap": overlap if start == "informed" else None,
              "T_is_identity": bool(np.array_equal(T, np.eye(model.p_star))),
              "replicas_share_ode": bool(shared), "alpha": alpha,
              "ode_start": ("common initial overlaps (realised exactly by the simulator)"
                            if shared else "each replica's realised initial overlaps")}
    return ValidationReport(config=config, numbers=numbers, t=run.t, sgd_risk=run.risk,
                            sgd_Q=run.Q, sgd_rho=run.rho, T=np.asarray(run.T, float),
                            invariant_study=study, sgd_readout=run.readout, **ode)


def compare(model, t, Q, rho, T=None, readout=None, *, band=(2.5, 97.5), escape_fraction=0.5,
            escape=None, alpha=ALPHA, progress=False, N=None, whole_run=None,
            seed=0, resolution=True, finite_n=None) -> ValidationReport:
    r"""Compare trajectories you supply with the ODE theory of `model`: report and verdict.

    For each replica the ODE is integrated from that replica's own first
    state ``(Q[r, 0], ρ[r, 0])`` over the times ``t`` (it starts at ``t[0]``);
    the SGD risk is computed from the overlaps by Isserlis' theorem.  The
    numbers and the verdict are those of :func:`validate` (module docstring),
    without the finite-size scaling, which needs runs at several ``N``.

    Parameters
    ----------
    model : symquad.Model
        The model whose ODE is the theory (every field — ``lr``,
        ``lr_scaling``, ``noise``, the activations, readouts, ``lr_readout``,
        ``weight_decay``, ``batch_size``, ``constraint`` — must be that of the
        data).
    t : array (n,)
        Times ``steps/N`` (``>= 0``, strictly increasing, ``n >= 3``).
    Q : array (replicas, n, p, p) or (n, p, p)
        Student overlaps ``W Wᵀ/N`` (finite, symmetric).
    rho : array (replicas, n, p, p*) or (n, p, p*)
        Student–teacher overlaps ``W W*ᵀ/N`` (finite).
    T : array (p*, p*), optional
        Teacher overlaps (default ``I``).  ``[[Q, ρ], [ρᵀ, T]]`` must be
        positive semi-definite at the first time.  With
        ``constraint="sphere"`` the first ``Q`` of every replica must have
        unit diagonal (to 1e-6; the ODE starts from the rows normalised).
    readout : array (replicas, n, p) or (n, p), optional
        The student readouts ``a(t)``: required when `model` trains its
        readout (``lr_readout > 0``; the ODE starts from each replica's
        ``a(t[0])`` and the risk uses ``a(t)``), refused otherwise (the fixed
        readout is ``model.readout``).  Checked with the other arrays, before
        any integration.
    band : (float, float)
        Percentiles of the replica band.
    escape_fraction : float
        ``f`` in the escape threshold.
    escape : bool, optional
        Do the plateau/escape analysis; default (None): when it applies
        (σ = c z², ``T = I``, RMS entry of ``ρ(0)`` below 0.2, start above
        the escape threshold, and no specification field the analysis does
        not handle: :mod:`symquad.studies.applicability`; ``True`` cannot
        force it onto such a model, the reason is reported instead).
    alpha : float
        Family-wise level of the verdict's tests.
    progress : bool
        Progress of the ODE solve on stderr, as in :func:`validate`.
    N : int, optional
        The input dimension of the data: needed by the whole-run criteria.
    whole_run : bool, optional
        Add the whole-run criteria (:mod:`symquad.studies.whole_run`; default:
        when `N` is given).
    seed : int
        Seed of the SDE ensemble of the whole-run criteria.
    resolution : bool
        Add ``report.resolution`` (as in :func:`validate`).
    finite_n : bool or None
        The O(1/N) correction of the mean, as in :func:`validate` (needs `N`).

    Returns
    -------
    ValidationReport
        ``report.passed``, ``report.verdict``, ``report.reasons``; with one
        replica the verdict is ``"INCONCLUSIVE"`` (no standard errors).

    Examples
    --------
    >>> import symquad as sq
    >>> m = sq.Model(p=2, p_star=1, lr=0.3)
    >>> run = sq.simulate(m, N=500, t_max=3.0, replicas=8, seed=1)
    >>> rep = sq.compare(m, run.t, run.Q, run.rho)
    >>> rep.verdict in ("PASS", "FAIL", "INCONCLUSIVE")
    True
    """

    t_start = time.perf_counter()
    declare(model, "compare")
    _check_common(band, escape_fraction, alpha)
    _check_finite_n(finite_n)
    if escape not in (None, True, False):
        raise ValueError(f"escape must be None, True or False, got {escape!r}")
    t, Q, rho, T = _as_trajectories(model, t, Q, rho, T)
    if not model.schedule.is_constant and t[0] != 0:
        # the ODE starts at t[0] on its own clock; a schedule's eta(t) needs the true time
        raise ValueError(f"t must start at 0 for a model with lr_schedule="
                         f"{model.lr_schedule!r} (eta(t) is evaluated at the data's times), "
                         f"got t[0] = {t[0]:g}")
    _check_ode_horizon(model, t, Q, rho, T)
    R = Q.shape[0]
    a = _as_readout(model, readout, t, R)
    whole_run, N = _check_whole_run(model, whole_run, N, a)
    if model.constraint == "sphere":
        # lazy: scipy
        from ..numeric.integrate import check_sphere
        check_sphere(model, Q[:, 0], name="Q[:, 0]", tol=1e-6)
    risk = (block_population_risk if has_spectrum(model) else population_risk)(
        model, Q, rho, T, a)
    numbers, ode, shared, t_ode = _analyse(
        model, t, Q, rho, risk, np.ones(R, bool), T, band=band,
        escape_fraction=escape_fraction, escape=escape, progress=progress, sgd_readout=a, N=N,
        finite_n=finite_n)
    criterion_se = ode.pop("criterion_se")
    numbers["finite_size_scaling_skipped"] = ("user data at one N: the finite-size scaling "
                                              "needs simulations at several N (validate)")
    numbers["verdict"] = _decide(numbers, R, alpha)
    if resolution:
        _add_resolution(numbers, model, t, risk, ode, Q, rho, T, a, shared, criterion_se)
    if whole_run:
        numbers["verdict"] = add_whole_run(numbers, model, t, Q, rho, risk, T, N, alpha,
                                           seed=seed, shared=shared)
    else:
        numbers["verdict"] = whole_run_not_run(
            numbers["verdict"], "whole_run=False" if N is not None else
            "the data's input dimension N is not given: compare(..., N=) or "
            "symquad validate --data FILE --N N")
    total = time.perf_counter() - t_start
    numbers["runtime_s"] = total
    numbers["runtime_phases_s"] = {"ode": t_ode, "analysis": total - t_ode}
    config = {**_model_config(model), "source": "user data", "N": N,
              "t_max": float(t[-1]), "replicas": R, "n_times": int(t.size),
              "T_is_identity": bool(np.array_equal(T, np.eye(model.p_star))),
              "replicas_share_ode": bool(shared), "alpha": alpha,
              "ode_start": "each replica's first state"}
    return ValidationReport(config=config, numbers=numbers, t=t, sgd_risk=risk, sgd_Q=Q,
                            sgd_rho=rho, T=T, sgd_readout=a, **ode)

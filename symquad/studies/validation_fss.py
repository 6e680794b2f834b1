"""The finite-size-scaling criterion: :func:`finite_size_scaling` fits the exponent of
the SGD-ODE deviation against N.

Split out of :mod:`symquad.studies.validation` (which re-exports its names).
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

# the module, not simulate: looked up when called, so a replacement at the source
# (the tests' forbid / monkeypatch of symquad.numeric.simulate.simulate) takes effect
from ..numeric import simulate as _sim
from ..numeric.checks import MAX_TIMES, check_int as _check_int
from ..progress import note
from ..spectrum import has_spectrum
from .applicability import require_analysis
from .validation_common import STARTS
from .validation_starts import _ode_per_replica, _overlap_deviation, _rms_over, informed_start



# ---------------------------------------------------------------------------
# finite-size scaling
# ---------------------------------------------------------------------------
def finite_size_scaling(model, Ns=(100, 300, 1000, 3000, 10000), t_max=10.0, replicas=64,
                        seed=0, start="informed", overlap=0.5, method="reduced",
                        n_times=51, T=None, progress=False):
    r"""Deviation SGD − ODE versus ``N`` and the fitted exponent.

    For each ``N``: ``D_r = [mean_{t ∈ (0, t_max]} D_r(t)²]^{1/2}`` (overlap
    deviation, module docstring) for every replica; ``D(N)`` is its replica
    mean with standard error ``s(N)``.  The fit ``log D = a + b log N`` uses
    the standard errors of ``log D`` (``s/D``) as absolute uncertainties.
    ``T`` (default ``I``) is the teacher overlap of the runs.  With an input spectrum
    (docs/model.md §1a) the deviation sums the squares over the blocks
    (``Σ_c ‖Q^c_SGD − Q^c_ODE‖²_F + …``), the informed start is split over the blocks
    (:func:`informed_start`) and every ``N`` must give each block room
    (:func:`symquad.numeric.simulate.check_block_room`).

    Returns
    -------
    dict
        ``N``, ``deviation``, ``deviation_se``, ``exponent``, ``exponent_se``,
        ``intercept``, ``chi2_per_dof``, ``start``, ``t_max``, ``replicas``.
    """
    from scipy.optimize import curve_fit

    require_analysis(model, "finite_size_scaling")
    Ns = [_check_int(n, "fss N", 1) for n in Ns]
    n_times = _check_int(n_times, "n_times", 2, MAX_TIMES)
    if len(Ns) < 3:
        raise ValueError(f"finite-size scaling needs >= 3 values of N, got {Ns}")
    if max(Ns) / min(Ns) < 10:
        raise ValueError("finite-size scaling: the N values should span at least a decade")
    if start not in STARTS:
        raise ValueError(f"start must be one of {STARTS}, got {start!r}")
    kwargs = {}
    if start == "informed":
        kwargs["Q0"], kwargs["rho0"] = informed_start(model, overlap)
    t = np.linspace(0.0, t_max, n_times)
    dev, se = [], []
    for i, N in enumerate(Ns):
        note(progress, f"finite-size scaling: N = {N} ({i + 1} of {len(Ns)}), {replicas} "
                       f"replicas, t <= {t_max:g}")
        run = _sim.simulate(model, N=N, t_max=t_max, replicas=replicas,
                            seed=seed + 7919 * (i + 1), method=method, t_eval=t,
                            on_divergence="stop", progress=progress, T=T, **kwargs)
        ok = run.status == "ok"
        if ok.sum() < 2:
            raise ValueError(f"finite-size scaling: SGD diverged at N={N} "
                             f"({run.n_diverged}/{replicas} replicas); reduce lr")
        sgd_a = None if run.readout is None else run.readout[ok]
        Q, rho, _, _, _, a = _ode_per_replica(model, run.Q[ok, 0], run.rho[ok, 0], run.T,
                                              run.t, None if sgd_a is None else sgd_a[:, 0],
                                              progress)
        d = _overlap_deviation(run.Q[ok], run.rho[ok], Q, rho, sgd_a, a,
                               blocks=has_spectrum(model))
        per = _rms_over(np.broadcast_to(run.t > 0, d.shape), d)
        dev.append(float(per.mean()))
        se.append(float(per.std(ddof=1) / math.sqrt(per.size)))
    dev, se = np.array(dev), np.array(se)
    x, y, sy = np.log(Ns), np.log(dev), se / dev
    (b, a), cov = curve_fit(lambda x, b, a: a + b * x, x, y, p0=(-0.5, float(y[0] + 0.5 * x[0])),
                            sigma=sy, absolute_sigma=True)
    resid = (y - (a + b * x)) / sy
    return {"N": [int(n) for n in Ns], "deviation": dev.tolist(), "deviation_se": se.tolist(),
            "exponent": float(b), "exponent_se": float(math.sqrt(cov[0, 0])),
            "intercept": float(a), "chi2_per_dof": float(np.sum(resid ** 2) / (len(Ns) - 2)),
            "start": start, "t_max": float(t_max), "replicas": int(replicas),
            "measure": "replica mean of the RMS over t in (0, t_max] of "
                       + ("sum over the input blocks of " if has_spectrum(model) else "")
                       + "(||Q_SGD-Q_ODE||_F^2 + ||rho_SGD-rho_ODE||_F^2"
                       + (" + ||a_SGD-a_ODE||^2" if model.readout_trained else "") + ")^(1/2)"}


def _check_fss_args(Ns, t_max, replicas):
    for n in Ns:
        _check_int(n, "fss_N entries", 1)
    if len(Ns) < 3:
        raise ValueError(f"finite-size scaling needs >= 3 values of N (fss_N), got {Ns}")
    if max(Ns) / min(Ns) < 10:
        raise ValueError("finite-size scaling: the N values (fss_N) should span at least a "
                         "decade")
    if not (isinstance(t_max, Real) and math.isfinite(t_max) and t_max > 0):
        raise ValueError(f"fss_t_max must be a finite number > 0, got {t_max!r}")
    if replicas is not None:
        _check_int(replicas, "fss_replicas", 2)

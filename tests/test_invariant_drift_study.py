"""Finite-N SGD drift of the invariant S (symquad.studies.invariant_drift) and its figures.

The statistical checks assert their precision (standard errors) before comparing
with the diffusive prediction drift ~ N^-1/2.
"""

import json
import math

import numpy as np
import pytest

import symquad as sq
from symquad.studies import invariant_drift as drift


# --------------------------------------------------------------------------
# finite N: SGD drift of S (cheap version; the full study is slow)
# --------------------------------------------------------------------------
def test_drift_study_informed_start_shrinks_with_N():
    m = sq.Model(p=3, p_star=2, lr=0.1)
    study = drift.invariant_drift_study(m, Ns=[100, 1600], t_max=8.0, replicas=24, seed=7,
                                       protocols=("informed",))
    inf = study["informed"]
    mean, sem = inf["mean"], inf["sem"]
    # precision first: each mean known to better than 15 %
    assert np.all(sem < 0.15 * mean), (mean, sem)
    # the drift shrinks: 16x N must reduce it by far more than the combined error
    assert mean[0] - mean[1] > 4 * math.hypot(sem[0], sem[1])
    # diffusive scaling N^-1/2 predicts a ratio of 4; accept the exponent within 3 SE of -1/2
    fit = inf["fit"]
    assert abs(fit["exponent"] + 0.5) < 3 * fit["exponent_se"] + 0.05, fit
    assert "random" not in study
    summary = drift.summarize_drift_study(study)
    assert json.loads(json.dumps(summary))["informed"]["mean"] == [float(x) for x in mean]
    assert "fitted exponent" in summary["text"]


def test_drift_study_input_errors():
    m = sq.Model(p=3, p_star=2, lr=0.1)
    with pytest.raises(ValueError, match="Ns"):
        drift.invariant_drift_study(m, Ns=[100], t_max=1.0, replicas=4, seed=0)
    with pytest.raises(ValueError, match="replicas"):
        drift.invariant_drift_study(m, Ns=[100, 200], t_max=1.0, replicas=1, seed=0)
    with pytest.raises(ValueError, match="protocols"):
        drift.invariant_drift_study(m, Ns=[100, 200], t_max=1.0, replicas=4, seed=0,
                                   protocols=("bogus",))
    with pytest.raises(ValueError, match="p >= p_star"):
        drift.invariant_drift_study(sq.Model(p=1, p_star=2, lr=0.1), Ns=[100, 200],
                                   t_max=1.0, replicas=4, seed=0)


@pytest.mark.slow
def test_drift_study_both_protocols_scaling():
    study = drift.invariant_drift_study(sq.DEFAULT_MODEL, Ns=[500, 2000, 8000], t_max=250,
                                       replicas=32, seed=4)
    for key in ("random", "informed"):
        res = study[key]
        assert np.all(res["sem"] < 0.2 * res["mean"])
        assert res["fit"]["exponent"] < -0.25
        assert abs(res["fit"]["exponent"] + 0.5) < 3 * res["fit"]["exponent_se"] + 0.1
    assert np.all(study["random"]["n_valid"] == 32)

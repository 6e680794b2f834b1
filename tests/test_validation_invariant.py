"""The validation report carries the finite-N drift study of the invariant S."""

import json

import numpy as np

import symquad as sq


def test_report_includes_invariant_drift(tmp_path):
    m = sq.Model(p=3, p_star=2, lr=0.3)
    report = sq.validate(m, N=200, t_max=60.0, replicas=4, seed=1, fss=False,
                         invariant_N=(100, 400), invariant_replicas=4, n_times=41)
    inv = report.numbers["invariant_drift"]
    assert inv["Ns"] == [100, 400]
    for key in ("random", "informed"):
        assert len(inv[key]["mean"]) == 2 and np.all(np.isfinite(inv["informed"]["mean"]))
    # S drifts less at larger N for the informed start (a point of the invariant set)
    assert inv["informed"]["mean"][1] < inv["informed"]["mean"][0]
    assert "drift of S" in report.summary()
    paths = report.save(tmp_path / "rep")
    assert (tmp_path / "rep" / "invariant_drift.png").stat().st_size > 0
    assert json.loads(open(paths["json"]).read())["numbers"]["invariant_drift"]["Ns"] == [100, 400]


def test_invariant_study_skipped_when_p_below_p_star():
    m = sq.Model(p=1, p_star=2, lr=0.05)
    report = sq.validate(m, N=100, t_max=5.0, replicas=3, seed=0, fss=False, n_times=11)
    assert "invariant_drift" not in report.numbers and report.invariant_study is None

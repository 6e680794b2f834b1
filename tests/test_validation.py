"""Tests of the validation study (symquad.studies.validation) and ``symquad validate``.

The statistical checks first assert their own precision (standard errors small
enough), then that the theory lies within a few standard errors / inside the
replica band.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import symquad as sq
from symquad.studies.validation import finite_size_scaling, informed_start, validate

M = sq.Model(p=4, p_star=2, lr=0.3)     # p > p*, plateau and escape by t ~ 30


def _informed_check(N, t_max, replicas, seed):
    # (the band is what is read: the whole-run law, the resolution and the O(1/N) mean
    # are tested in tests/test_whole_run.py, test_resolution.py, test_verdict_finite_n.py)
    rep = validate(M, N=N, t_max=t_max, replicas=replicas, start="informed", seed=seed,
                   fss=False, invariant=False, n_times=41, whole_run=False,
                   resolution=False, finite_n=False)
    b = rep.numbers["band"]
    # precision first: the standard error of the mean risk is far below the
    # O(N^-1/2) fluctuation scale the band measures
    assert b["max_se"] < 0.2 / math.sqrt(N)
    assert rep.config["replicas_share_ode"]
    assert rep.numbers["diverged_replicas"] == 0
    assert b["ode_inside_fraction"] == 1.0, f"ODE leaves the band at t = {b['ode_outside_times']}"
    assert b["max_mean_z"] < 4.0
    return rep


def test_informed_start_ode_inside_band_N1e4():
    """p > p*, informed start, N = 1e4: the ODE stays inside the SGD replica band."""
    rep = _informed_check(N=10_000, t_max=12.0, replicas=32, seed=3)
    # the run covers most of the decay of the risk (no plateau from this start)
    assert rep.ode_risk[0, -1] < 0.3 * rep.ode_risk[0, 0]


@pytest.mark.slow
def test_informed_start_ode_inside_band_N1e4_whole_run():
    rep = _informed_check(N=10_000, t_max=30.0, replicas=64, seed=4)
    assert rep.ode_risk[0, -1] < 0.05 * rep.ode_risk[0, 0]


def test_random_start_tracks_until_plateau_and_reports_escape_spread():
    rep = validate(M, N=1000, replicas=24, start="random", seed=5, fss=False, invariant=False,
                   n_times=131, whole_run=False, resolution=False, finite_n=False)
    e = rep.numbers["escape"]
    assert e["defined"]
    assert e["sgd_escaped"] == e["ode_escaped"] == 24, "the run must contain every escape"
    # escape-time spread is reported: SGD escape times vary between replicas, and
    # differ from the same replica's ODE by O(1)
    assert e["sgd"]["std"] > 0 and e["difference"]["std"] > 0
    assert e["sgd"]["q05"] < e["sgd"]["median"] < e["sgd"]["q95"]
    # each replica's ODE starts from that replica's realised overlaps
    np.testing.assert_allclose(rep.ode_Q[:, 0], rep.sgd_Q[:, 0], atol=1e-12)
    np.testing.assert_allclose(rep.ode_rho[:, 0], rep.sgd_rho[:, 0], atol=1e-12)
    text = rep.summary()
    assert "escape time SGD" in text and "t_esc(SGD) - t_esc(ODE)" in text


def test_random_start_tracks_sgd_until_the_plateau_with_N_minus_half():
    """From the realised random start the ODE tracks SGD on the way to the plateau and on
    it: at fixed times before the escape the deviation shrinks like N^-1/2."""
    f = finite_size_scaling(M, Ns=[100, 400, 1600, 6400], t_max=8.0, replicas=24, seed=6,
                            start="random", n_times=17)
    assert f["exponent_se"] < 0.05
    assert abs(f["exponent"] + 0.5) < 4 * f["exponent_se"], f


def test_replica_mean_start_would_not_escape():
    """Why the ODE starts per replica: from the replica-mean ρ(0) (≈ 0) it stays on the
    plateau far longer than any SGD replica."""
    # (only the escape analysis is read: the whole-run law, the resolution and the O(1/N)
    # mean would cost 70 s here and are tested elsewhere)
    rep = validate(M, N=1000, t_max=40.0, replicas=24, seed=5, fss=False, invariant=False,
                   n_times=41, whole_run=False, resolution=False, finite_n=False)
    rho_mean = rep.sgd_rho[:, 0].mean(0)
    Q_mean = rep.sgd_Q[:, 0].mean(0)
    sol = sq.integrate(M, Q_mean, rho_mean, np.eye(2), 40.0, t_eval=rep.t)
    thr = rep.numbers["escape"]["threshold"]
    assert np.all(np.isfinite(rep.numbers["escape"]["sgd_times"]))
    from symquad.numeric.landscape import escape_times
    t_mean_start = escape_times(sol.t, sol.risk, thr)
    assert not np.isfinite(t_mean_start) or t_mean_start > max(rep.numbers["escape"]["sgd_times"])


def test_finite_size_exponent_is_minus_one_half():
    f = finite_size_scaling(M, Ns=[100, 300, 1000, 3000, 10000], t_max=3.0, replicas=24,
                            seed=2)
    assert f["exponent_se"] < 0.05
    assert abs(f["exponent"] + 0.5) < 4 * f["exponent_se"], f
    assert np.all(np.diff(f["deviation"]) < 0)


@pytest.mark.slow
def test_finite_size_exponent_three_decades():
    f = finite_size_scaling(M, Ns=[100, 316, 1000, 3162, 10000, 31623, 100000], t_max=3.0,
                            replicas=64, seed=3)
    assert f["exponent_se"] < 0.02
    assert abs(f["exponent"] + 0.5) < 4 * f["exponent_se"], f


def test_report_json_save_and_reproducible(tmp_path):
    kw = dict(N=200, t_max=30.0, replicas=6, seed=11, fss_N=[50, 200, 800], fss_t_max=2.0,
              fss_replicas=6, n_times=31, invariant_N=(100, 200), invariant_replicas=3)
    a = validate(M, **kw)
    b = validate(M, **kw)
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        d["numbers"].pop("runtime_s")
        d["numbers"].pop("runtime_phases_s")
    assert json.dumps(da, sort_keys=True) == json.dumps(db, sort_keys=True)
    parsed = json.loads(a.to_json())
    assert parsed["config"]["N"] == 200 and "finite_size_scaling" in parsed["numbers"]
    paths = a.save(str(tmp_path / "rep"))
    for key in ("json", "summary", "trajectories", "risk", "overlaps", "fss", "escape"):
        assert os.path.getsize(paths[key]) > 0, key
    with open(paths["risk"], "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "finite-size scaling" in str(a)


@pytest.mark.parametrize("kwargs, match", [
    (dict(N=0), "N must be an integer >= 1"),
    (dict(replicas=1), "replicas must be an integer >= 2"),
    (dict(t_max=-2.0), "t_max must be a finite number > 0"),
    (dict(start="warm"), "start must be one of"),
    (dict(band=(90, 10)), "band must be two percentiles"),
    (dict(escape_fraction=1.5), "escape_fraction must be in"),
    (dict(overlap=1.5, start="informed"), "overlap must be in"),
    (dict(fss_N=[100, 200, 300]), "span at least a decade"),
])
def test_validate_bad_inputs(kwargs, match):
    args = dict(N=50, t_max=1.0, replicas=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        validate(M, **args)


def test_informed_start_is_positive_definite_and_seed_independent():
    for p, ps in ((4, 2), (2, 3), (1, 1)):
        m = sq.Model(p=p, p_star=ps, lr=0.1)
        Q0, rho0 = informed_start(m)
        C = np.block([[Q0, rho0], [rho0.T, np.eye(ps)]])
        assert np.linalg.eigvalsh(C).min() > 0.4
        assert np.all(np.abs(rho0).sum(1) > 0)


def _cli_quick(out, *flags):
    """``symquad validate --quick --lr 0.3`` (and `flags`) into `out`: exit status, report."""
    from symquad.cli import main
    rc = main(["validate", "--quick", "--out", str(out), "--lr", "0.3", *flags])
    data = json.loads((out / "report.json").read_text())
    # exit status 0 exactly when the verdict is PASS; the quick run has the statistics
    # to test its criteria and passes
    assert data["numbers"]["verdict"]["verdict"] == "PASS", data["numbers"]["verdict"]
    assert rc == 0
    assert data["config"]["lr"] == 0.3
    assert (out / "fss.png").stat().st_size > 0
    return data


@pytest.mark.slow
def test_cli_quick(tmp_path):
    """The quick run as shipped, every stage (6.8 s of CPU, 3.2 s of it the whole-run SDE)."""
    _cli_quick(tmp_path / "rep")


def test_cli_quick_without_the_whole_run(tmp_path):
    """Default twin of :func:`test_cli_quick`: every stage of the quick run but the whole-run
    criteria (an SDE of the 32 replicas; those of the default model pass in
    tests/test_validation_verdict.py::test_default_model_passes_validate)."""
    data = _cli_quick(tmp_path / "rep", "--no-whole-run")
    status = {c["name"]: c["status"] for c in data["numbers"]["verdict"]["checks"]}
    assert status["whole_run_law"] == "not tested"
    assert status["mean_deviation"] == status["band"] == status["escape_time"] == \
        status["finite_size_exponent"] == "pass", status


def test_cli_rejects_bad_arguments(capsys):
    from symquad.cli import main
    assert main(["validate", "--replicas", "0"]) == 2      # argparse's exit, as a status
    assert "replicas" in capsys.readouterr().err
    assert main(["validate", "--quick", "--noise", "-1", "--out", "/nonexistent/x"]) == 2


def test_numeric_runtime_never_imports_sympy(tmp_path):
    # (the O(1/N) correction is a symbolic derivation on its first use, like the
    # Jacobian of the linear-noise criterion: finite_n=False keeps to the numeric runtime;
    # deciding whether to derive it imports no SymPy, symquad.second_order_cost)
    code = ("import sys, symquad as sq\n"
            "r = sq.validate(sq.Model(p=2, p_star=1, lr=0.3), N=50, t_max=2.0, replicas=3,"
            " fss=False, finite_n=False)\n"
            "sq.simulate(sq.Model(p=2, p_star=1, lr=0.3), N=20, t_max=1.0, replicas=2,"
            " method='full')\n"
            "print('sympy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("False")


def test_studies_in_worker_processes_give_the_same_numbers():
    """The finite-size scaling and the drift study in spawned workers: identical numbers."""
    kw = dict(N=200, t_max=20.0, replicas=4, seed=3, fss_N=[50, 200, 800], fss_t_max=1.0,
              fss_replicas=4, n_times=21, invariant_N=(100, 200), invariant_replicas=3)
    serial = validate(M, workers=1, **kw).to_dict()
    parallel = validate(M, workers=3, **kw).to_dict()
    assert serial["config"].pop("workers") == 1 and parallel["config"].pop("workers") == 3
    for d in (serial, parallel):
        d["numbers"].pop("runtime_s")
        d["numbers"].pop("runtime_phases_s")
    assert json.dumps(serial, sort_keys=True) == json.dumps(parallel, sort_keys=True)

"""Result objects: save/load round trips, atomic writes, short reprs, rich escape/Hessian results."""

import json
import os
import zipfile

import numpy as np
import pytest

import symquad as sq
from symquad.numeric import persist

MODEL = sq.Model(p=3, p_star=2, lr=0.15, noise=0.01, activation="z**2 + z/3",
                 lr_scaling="width")


def _arrays_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


def test_simulation_run_round_trip(tmp_path):
    m = sq.Model(p=2, p_star=1, lr=3.0)   # diverges: NaN entries and a diverged status
    run = sq.simulate(m, N=50, t_max=2.0, replicas=3, seed=4, on_divergence="stop")
    assert run.n_diverged > 0
    path = run.save(tmp_path / "run.npz")
    back = sq.SimulationRun.load(path)
    assert back.model == run.model and back.N == run.N and back.seed == run.seed
    assert back.method == run.method and back.check_every == run.check_every
    for name in ("t", "Q", "rho", "risk", "T", "t_diverged"):
        assert _arrays_equal(getattr(back, name), getattr(run, name)), name
    assert list(back.status) == list(run.status)
    for key in run.last_finite:
        assert _arrays_equal(back.last_finite[key], run.last_finite[key]), key
    # the archive is plain npz + JSON: readable without symquad
    assert np.array_equal(np.load(path, allow_pickle=False)["Q"], run.Q, equal_nan=True)
    meta = json.loads(zipfile.ZipFile(path).read("meta.json"))
    assert meta["kind"] == "SimulationRun" and meta["N"] == 50


def test_simulation_run_round_trip_general_model(tmp_path):
    # seed=None draws fresh entropy: at N=30 a replica can diverge, which must not fail the
    # round trip (CI once drew such a run), so the run stops instead of raising
    run = sq.simulate(MODEL, N=30, t_max=0.5, replicas=2, seed=None, on_divergence="stop")
    back = sq.SimulationRun.load(run.save(tmp_path / "sub" / "r.npz"))
    assert back.model == MODEL and back.seed is None
    assert _arrays_equal(back.rho, run.rho) and list(back.status) == list(run.status)


def test_ode_solution_round_trip(tmp_path):
    m = MODEL.replace(activation="z**2")     # committed kernels (no code generation here)
    sol = sq.integrate(m, np.eye(3), 0.1 * np.ones((3, 2)), np.eye(2), t_max=5.0)
    back = sq.ODESolution.load(sol.save(tmp_path / "sol.npz"))
    assert back.model == m and back.status == sol.status and back.t_diverged is None
    assert back.message == sol.message and back.nfev == sol.nfev
    for name in ("t", "Q", "rho", "risk", "T"):
        assert _arrays_equal(getattr(back, name), getattr(sol, name)), name
    diverged = sq.integrate(sq.Model(p=1, p_star=1, lr=2.0), [[4.0]], [[0.5]], [[1.0]],
                            t_max=50.0, on_divergence="stop")
    assert diverged.status == "diverged"
    back = sq.ODESolution.load(diverged.save(tmp_path / "div.npz"))
    assert back.t_diverged == diverged.t_diverged and back.status == "diverged"


def test_load_errors(tmp_path):
    sol = sq.integrate(sq.Model(p=1, p_star=1, lr=0.1), [[1.0]], [[0.1]], [[1.0]], t_max=1.0)
    path = sol.save(tmp_path / "sol.npz")
    with pytest.raises(ValueError, match="holds a 'ODESolution', not a 'SimulationRun'"):
        sq.SimulationRun.load(path)
    with pytest.raises(FileNotFoundError):
        sq.ODESolution.load(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a saved symquad result"):
        sq.ODESolution.load(tmp_path / "junk.npz")
    with pytest.raises(ValueError, match="folder"):
        sol.save(tmp_path)


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / "x.npz"
    persist.save_npz(path, "Thing", {"a": 1}, {"v": np.arange(3)})
    before = path.read_bytes()
    with pytest.raises(TypeError, match="dtype object"):
        persist.save_npz(path, "Thing", {"a": 2}, {"v": np.array([object()])})
    assert path.read_bytes() == before                 # old file intact
    assert os.listdir(tmp_path) == ["x.npz"]           # no temporary left behind


def test_model_dict_round_trip_is_exact():
    d = persist.model_to_dict(MODEL)
    assert persist.model_from_dict(json.loads(json.dumps(d))) == MODEL
    with pytest.raises(ValueError, match="keys"):
        persist.model_from_dict({"p": 1})


def test_reprs_are_short():
    run = sq.simulate(sq.DEFAULT_MODEL, N=100, t_max=1.0, replicas=8, seed=0)
    sol = sq.integrate(sq.DEFAULT_MODEL, np.eye(4), 0.01 * np.ones((4, 2)), np.eye(2), 2.0)
    spec = sq.hessian_spectrum(sq.Model(p=3, p_star=2, lr=0.1), "minimum", 10)
    point = sq.closest_solution(sq.Model(p=3, p_star=2, lr=0.1), np.eye(3), 0.3 * np.eye(3, 2))
    for obj in (run, sol, spec, point, sq.plateau(sq.DEFAULT_MODEL), sq.kernels(sq.DEFAULT_MODEL),
                sq.derive(sq.Model(p=2, p_star=1, lr=0.1))):
        text = repr(obj)
        assert len(text) < 300 and text.count("\n") <= 1, text
    assert "8 replicas" in repr(run) and "N=100" in repr(run)


def test_escape_time_is_a_rich_result():
    m = sq.Model(p=2, p_star=1, lr=0.2)
    pred = sq.escape_time(m, 1000, n_samples=32, seed=1)
    assert isinstance(pred, sq.EscapePrediction)
    assert float(pred) == pred.median == pytest.approx(np.median(pred.samples))
    lo, med, hi = pred.quartiles
    assert lo < med < hi and med == pytest.approx(pred.median)
    assert pred.samples.shape == (32,) and pred.n_samples == 32
    # the law t = log(N)/(2κ) + c/κ: ten times N moves the median by log(10)/(2κ)
    pred10 = sq.escape_time(m, 10000, n_samples=32, seed=1)
    assert float(pred10) - float(pred) == pytest.approx(np.log(10) / (2 * pred.rate), rel=1e-9)
    assert len(repr(pred)) < 300 and "median" in repr(pred)


def test_hessian_spectrum_is_a_rich_result():
    """Counts and zero modes of the object against the numeric N-dimensional Hessian."""
    from symquad.numeric import landscape as L
    m = sq.Model(p=3, p_star=2, lr=0.1)
    N = 7
    spec = sq.hessian_spectrum(m, "minimum", N)
    assert isinstance(spec, sq.HessianSpectrum) and spec.eigenvalues.shape == (3 * N,)
    W, Ws = L.critical_weights(m, "minimum", N, seed=2)
    ev = np.linalg.eigvalsh(L.weight_hessian(m, W, Ws))
    assert np.max(np.abs(ev - np.asarray(spec))) < 1e-8 * np.max(np.abs(ev))
    assert spec.counts == L.sign_counts(ev) == (0, spec.zero, 3 * N - spec.zero)
    # zero modes: p p* - p*(p*+1)/2 = 3 tangent (manifold dimension), the rest extra
    assert spec.zero_modes == {"tangent": sq.manifold_dimension(3, 2),
                               "extra": spec.zero - sq.manifold_dimension(3, 2)}
    assert spec.count_formulas["negative"] == "0"
    assert "tangent" in str(spec) and len(spec) == 3 * N


def test_landscape_cli_prints_the_result_objects(capsys):
    from symquad.cli import main
    assert main(["landscape", "--p", "2", "--p-star", "1", "--N", "10", "--samples", "8"]) == 0
    out = capsys.readouterr().out
    spec = sq.hessian_spectrum(sq.Model(p=2, p_star=1, lr=0.1), "minimum", 10)
    assert spec.summary() in out                      # the CLI prints the object itself
    pred = sq.escape_time(sq.Model(p=2, p_star=1, lr=0.1), 10, n_samples=8)
    lo, med, hi = pred.quartiles
    assert f"SGD: t_esc = {med:.4f}   (quartiles {lo:.4f}, {hi:.4f}" in out

"""symquad validate reads the package's own saved runs and takes --T/--Q0/--rho0 from files.

Every file is checked from its headers (shape, dtype, declared sizes) against the
model before any data is read or any simulation starts, and nothing is unpickled.
"""

from __future__ import annotations

import io
import json
import os
import zipfile

import numpy as np
import pytest

import symquad as sq
from symquad.cli import main

M = sq.Model(p=3, p_star=2, lr=0.3)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "run.npz"
    run = sq.simulate(M, N=300, t_max=3.0, replicas=6, seed=4)
    run.save(path)
    return path, run


def _report(folder):
    return json.loads((folder / "report.json").read_text())


def _numbers_without_runtime(numbers):
    return {k: v for k, v in numbers.items() if not k.startswith("runtime")}


def test_data_reads_a_saved_run_with_its_model(saved_run, tmp_path, capsys):
    path, run = saved_run
    assert main(["validate", "--data", str(path), "--out", str(tmp_path / "r"),
                 "--no-progress"]) in (0, 1, 4)
    got = _report(tmp_path / "r")
    assert got["config"]["p"] == 3 and got["config"]["lr"] == 0.3     # the file's model
    ref = sq.compare(M, run.t, run.Q, run.rho, run.T)                  # the Python route
    assert _numbers_without_runtime(got["numbers"]) == json.loads(json.dumps(
        _numbers_without_runtime(ref.numbers), default=float))


def test_model_flags_replace_the_saved_models_fields(saved_run, tmp_path, capsys):
    path, run = saved_run
    assert main(["validate", "--data", str(path), "--lr", "0.36", "--out", str(tmp_path / "r"),
                 "--no-progress"]) in (0, 1, 4)
    got = _report(tmp_path / "r")
    assert got["config"]["lr"] == 0.36 and got["config"]["p"] == 3
    ref = sq.compare(M.replace(lr=0.36), run.t, run.Q, run.rho, run.T)
    assert got["numbers"]["verdict"] == json.loads(json.dumps(ref.numbers["verdict"]))


def _forbid_the_computation(forbid):
    """validate/compare/simulate raise if called: a refusal must come before them."""
    from symquad.numeric import simulate as S
    from symquad.studies import validation
    forbid(validation, "compare", "validate")
    return forbid(S, "simulate")


def test_saved_run_that_does_not_fit_the_model_is_refused_at_once(saved_run, tmp_path, capsys,
                                                                   forbid):
    path, _ = saved_run
    started = _forbid_the_computation(forbid)
    assert main(["validate", "--data", str(path), "--p", "4", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "[Q] must have shape (any, 101, 4, 4) for this model, got (6, 101, 3, 3)" in err
    assert started == [] and not (tmp_path / "r").exists()
    assert main(["validate", "--data", str(path), "--T", str(path),
                 "--out", str(tmp_path / "r")]) == 2
    assert "holds its own teacher overlaps" in capsys.readouterr().err


def test_overlap_files_equal_the_python_arguments(tmp_path, capsys):
    T = np.array([[1.0, 0.2], [0.2, 0.8]])
    Q0, rho0 = 0.9 * np.eye(3), 0.3 * np.eye(3, 2) + 0.05
    np.save(tmp_path / "T.npy", T)
    np.savez(tmp_path / "start.npz", Q0=Q0, rho0=rho0)          # several arrays: by name
    np.save(tmp_path / "rho0.npy", rho0)
    flags = ["--p", "3", "--p-star", "2", "--lr", "0.3", "--N", "200", "--replicas", "6",
             "--t-max", "4", "--no-fss", "--no-invariant", "--no-progress"]
    assert main(["validate", *flags, "--T", str(tmp_path / "T.npy"),
                 "--Q0", str(tmp_path / "start.npz"), "--rho0", str(tmp_path / "rho0.npy"),
                 "--out", str(tmp_path / "r")]) in (0, 1, 4)
    got = _report(tmp_path / "r")
    ref = sq.validate(M, N=200, replicas=6, t_max=4.0, seed=0, T=T, Q0=Q0, rho0=rho0,
                      fss=False, invariant=False)
    assert _numbers_without_runtime(got["numbers"]) == json.loads(json.dumps(
        _numbers_without_runtime(ref.numbers), default=float))
    assert got["config"]["start"] == "given" and not got["config"]["T_is_identity"]


def _npy_bytes(arr, **kw):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(arr), **kw)
    return buf.getvalue()


def _forged_header(shape, dtype="<f8"):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def _savez(path, **arrays):
    with open(path, "wb") as fh:                     # keeps the name (no .npz appended)
        np.savez(fh, **arrays)


BAD_FILES = {
    "pickled objects": (lambda p: p.write_bytes(_npy_bytes(np.array([{"a": 1}], dtype=object),
                                                           allow_pickle=True)),
                        ValueError, "Python objects"),
    "complex": (lambda p: np.save(p, np.eye(2) + 0j), TypeError, "complex"),
    "wrong shape": (lambda p: np.save(p, np.eye(3)), ValueError, r"shape \(2, 2\)"),
    "huge declared shape": (lambda p: p.write_bytes(_forged_header((10**6, 10**6))),
                            ValueError, r"shape \(2, 2\)"),
    "header lies about the size": (lambda p: p.write_bytes(_forged_header((2, 2)) + b"\0" * 8),
                                   ValueError, "not what its header declares"),
    "text": (lambda p: p.write_text("1 0\n0 1\n"), ValueError, "neither a .npy nor an .npz"),
    "npz with other names": (lambda p: _savez(p, a=np.eye(2), b=np.eye(2)), ValueError,
                             "holds 2 arrays"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_bad_overlap_files_are_refused_before_any_work(kind, tmp_path, capsys, forbid):
    make, error, match = BAD_FILES[kind]
    path = tmp_path / "T.npy"
    make(path)
    from symquad.array_files import read_array
    with pytest.raises(error, match=match):
        read_array(path, "--T", [(2, 2)])
    started = _forbid_the_computation(forbid)
    assert main(["validate", "--T", str(path), "--out", str(tmp_path / "r")]) == 2
    assert started == [] and "Traceback" not in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_a_fifo_is_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "T.npy"
    os.mkfifo(fifo)
    assert main(["validate", "--T", str(fifo), "--out", str(tmp_path / "r")]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_forged_zip_member_sizes_are_refused(saved_run, tmp_path):
    # a saved run whose Q header declares a million replicas: refused from the headers
    path, _ = saved_run
    forged = tmp_path / "forged.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(forged, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "Q.npy":
                data = _forged_header((10**6, 101, 3, 3)) + data[128:]
            dst.writestr(info.filename, data)
    from symquad.array_files import read_saved_run
    with pytest.raises(ValueError, match=r"array 'Q' declares shape \(1000000, 101, 3, 3\) "
                                         r"of float64 .* but its member holds"):
        read_saved_run(forged, "--data", lambda m, n: {"Q": [(None, n, 3, 3)],
                                                       "rho": [(None, n, 3, 2)],
                                                       "T": [(2, 2)]})

"""Loading generated kernels: memoised, checksum-verified, versioned, robust to bad caches."""

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

import symquad as sq
import symquad.numeric.kernels as K
from symquad.kernel_files import (KernelFileError, cached_path, checksum_line,
                                  generator_version)

ACT = "z**3/3 + z**2 - 1"          # not committed: generated into the cache
POINT = (np.eye(2), 0.1 * np.ones((2, 1)), np.eye(1))


@pytest.fixture(autouse=True)
def fresh_memo():
    K.clear_kernel_memo()
    yield
    K.clear_kernel_memo()


def _count_loads(monkeypatch):
    calls = []
    real = K.load_module_file

    def counting(path, name, *args, **kwargs):
        calls.append(str(path))
        return real(path, name, *args, **kwargs)
    monkeypatch.setattr(K, "load_module_file", counting)
    return calls


def test_loaded_modules_are_kept_per_structure(isolated_cache, monkeypatch):
    model = sq.Model(p=2, p_star=1, lr=0.1, activation=ACT)
    first = sq.kernels(model).risk(*POINT)          # generates and loads once
    calls = _count_loads(monkeypatch)
    for lr in (0.1, 0.2, 0.3):                      # same activation, other lr / width
        assert sq.kernels(model.replace(lr=lr)).risk(*POINT) == first
    sq.kernels(model.replace(p=5, p_star=2))
    sq.kernels(sq.Model(p=2, p_star=1, lr=0.1, activation="z**3"))   # committed
    sq.kernels(sq.Model(p=3, p_star=1, lr=0.1, activation="z**3"))
    assert len(calls) == 1 and "tensor_cubic" in calls[0]


def test_hand_edit_of_committed_module_is_refused(tmp_path, monkeypatch):
    copy = tmp_path / "_generated"
    shutil.copytree(K.GENERATED_DIR, copy)
    target = copy / "tensor_cubic.py"
    target.write_text(target.read_text().replace("DEGREE = 3", "DEGREE = 2", 1))
    monkeypatch.setattr(K, "GENERATED_DIR", copy)
    with pytest.raises(KernelFileError, match="symquad regenerate"):
        sq.kernels(sq.Model(p=2, p_star=1, lr=0.1, activation="z**3"))
    for name, model in (("quadratic_matrix_uniform.py", sq.Model(p=2, p_star=1, lr=0.1)),
                        ("quadratic_matrix.py", sq.Model(p=2, p_star=1, lr=0.1, readout=(1, 2)))):
        target2 = copy / name
        target2.write_text(target2.read_text() + "# tweak\n")
        with pytest.raises(ValueError, match="checksum"):
            sq.kernels(model)
    # the untouched copy of another module still loads
    assert sq.kernels(sq.Model(p=2, p_star=1, lr=0.1, activation="z**4")).form == "tensor"


def test_cached_kernels_carry_the_generator_version(isolated_cache, monkeypatch):
    model = sq.Model(p=2, p_star=1, lr=0.1, activation=ACT)
    kern = sq.kernels(model)
    path = cached_path("tensor", K.activation_key(model))
    assert kern.source == str(path) and generator_version() in path.name
    assert f"GENERATOR = {generator_version()!r}" in path.read_text()
    # a module from another generator version sits beside it: never used
    monkeypatch.setattr("symquad.kernel_files.generator_version", lambda: "0" * 12)
    K.clear_kernel_memo()
    newer = sq.kernels(model)
    assert newer.source != kern.source and "000000000000" in newer.source
    # and rendered by that version (the renderer looks generator_version up when it runs)
    assert "GENERATOR = '000000000000'" in Path(newer.source).read_text()
    assert len(list(isolated_cache.glob("tensor_*.py"))) == 2


@pytest.mark.parametrize("kind", ["file", "below_file"])
def test_unusable_cache_dir_falls_back_to_memory_with_a_warning(tmp_path, monkeypatch, kind):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    target = blocker if kind == "file" else blocker / "sub"
    monkeypatch.setenv("SYMQUAD_CACHE_DIR", str(target))
    model = sq.Model(p=2, p_star=1, lr=0.1, activation=ACT)
    with pytest.warns(RuntimeWarning, match="in-memory kernels"):
        kern = sq.kernels(model)
    assert kern.source == "<memory>"
    with warnings.catch_warnings():
        warnings.simplefilter("error")             # memoised: no second warning
        assert sq.kernels(model).risk(*POINT) == kern.risk(*POINT)


@pytest.mark.parametrize("body", [
    "raise RuntimeError('broken at import')\n",     # fails at import
    "def risk(Q, rho, T):\n    return 0.0\n",        # lacks rhs
    "def rhs(:\n",                                   # syntax error
])
def test_broken_cache_module_is_regenerated(isolated_cache, body):
    model = sq.Model(p=2, p_star=1, lr=0.1, activation=ACT)
    path = cached_path("tensor", K.activation_key(model))
    good_risk = sq.kernels(model).risk(*POINT)
    good = path.read_text()
    path.write_text(body + checksum_line(body))    # checksum valid, content unusable
    K.clear_kernel_memo()
    assert sq.kernels(model).risk(*POINT) == good_risk
    assert path.read_text() == good


def test_load_module_text_reports_what_is_wrong():
    body = "x = 1\n"
    with pytest.raises(KernelFileError, match="lacks rhs, risk"):
        K.load_module_text(body + checksum_line(body), "m")
    with pytest.raises(KernelFileError, match="checksum"):
        K.load_module_text(body, "m")

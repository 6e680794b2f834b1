"""Trust of the kernel cache: an entry others could have written is never executed.

Cached kernels are Python modules that symquad executes, so a checksum is not
enough (whoever can edit the file can write a matching checksum).  Each test
plants a module with a *valid* checksum whose import would create a marker
file, in a place that must not be trusted, and checks that the marker never
appears, that a warning says why, and that correct kernels are used anyway.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import symquad as sq
import symquad.kernel_files as KF
import symquad.numeric.kernels as K
from symquad.kernel_files import UntrustedCacheError, cached_path, checksum_line

ACT = "z**3/3 + z**2 - 1"          # not committed: lives in the cache
MODEL = sq.Model(p=2, p_star=1, lr=0.1, activation=ACT)
POINT = (np.eye(2), 0.1 * np.ones((2, 1)), np.eye(1))
NOBODY = 65534
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
posix_only = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")


@pytest.fixture(autouse=True)
def fresh_memo():
    K.clear_kernel_memo()
    yield
    K.clear_kernel_memo()


@pytest.fixture(scope="module")
def good_text(tmp_path_factory):
    """The correct generated module, produced once in a private cache."""
    folder = tmp_path_factory.mktemp("good-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("SYMQUAD_CACHE_DIR", str(folder))
    K.clear_kernel_memo()
    try:
        sq.kernels(MODEL)
        return cached_path("tensor", K.activation_key(MODEL)).read_text()
    finally:
        mp.undo()
        K.clear_kernel_memo()


@pytest.fixture
def expected_risk(good_text):
    module = K.load_module_text(good_text, "reference", required=("moments", "risk"))
    a = np.full(MODEL.p, 1.0 / MODEL.p)
    b = np.full(MODEL.p_star, 1.0 / MODEL.p_star)
    return float(module.risk(*POINT, a, b))


def malicious_module(marker) -> str:
    body = (f"open({str(marker)!r}, 'w').write('executed')\n"
            "def rhs(Q, rho, T, eta, Delta):\n    return Q, rho\n"
            "def risk(Q, rho, T):\n    return 123.0\n")
    return body + checksum_line(body)


def cache_folder(tmp_path, monkeypatch, mode=0o700):
    folder = tmp_path / "cache"
    folder.mkdir(mode=mode)
    os.chmod(folder, mode)
    monkeypatch.setenv("SYMQUAD_CACHE_DIR", str(folder))
    return folder, cached_path("tensor", K.activation_key(MODEL))


def assert_trusted_regular_file(path, good_text):
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and not st.st_mode & 0o022
    assert path.read_text() == good_text


# --------------------------------------------------------------------------- files
@posix_only
def test_group_writable_file_is_not_executed_and_is_regenerated(tmp_path, monkeypatch,
                                                                good_text, expected_risk):
    folder, path = cache_folder(tmp_path, monkeypatch)
    marker = tmp_path / "marker"
    path.write_text(malicious_module(marker))
    os.chmod(path, 0o664)
    with pytest.warns(RuntimeWarning, match="writable by group or others.*not executed"):
        kern = sq.kernels(MODEL)
    assert not marker.exists()
    assert kern.risk(*POINT) == pytest.approx(expected_risk, rel=1e-14)
    assert kern.source == str(path)
    assert_trusted_regular_file(path, good_text)
    K.clear_kernel_memo()                       # a new process trusts what we wrote
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sq.kernels(MODEL).source == str(path)


@posix_only
@pytest.mark.skipif(not IS_ROOT, reason="giving a file to another user needs root")
def test_file_owned_by_another_user_is_not_executed(tmp_path, monkeypatch, good_text):
    folder, path = cache_folder(tmp_path, monkeypatch)
    marker = tmp_path / "marker"
    path.write_text(malicious_module(marker))
    os.chmod(path, 0o644)
    os.chown(path, NOBODY, NOBODY)
    with pytest.warns(RuntimeWarning, match=f"owned by user id {NOBODY}, not by you"):
        sq.kernels(MODEL)
    assert not marker.exists()
    assert_trusted_regular_file(path, good_text)
    assert os.lstat(path).st_uid == os.geteuid()


@posix_only
def test_foreign_owner_check_uses_the_descriptor(tmp_path, monkeypatch, good_text):
    # without root: make every real owner look foreign; nothing of the cache is executed
    folder, path = cache_folder(tmp_path, monkeypatch)
    marker = tmp_path / "marker"
    path.write_text(malicious_module(marker))
    os.chmod(path, 0o644)
    monkeypatch.setattr(KF, "_trusted_owners", lambda: (-1,))
    with pytest.warns(RuntimeWarning, match="is owned by user id .* not by you.*in-memory"):
        kern = sq.kernels(MODEL)
    assert not marker.exists() and kern.source == "<memory>"


def test_symlinked_file_is_not_followed(tmp_path, monkeypatch, good_text):
    folder, path = cache_folder(tmp_path, monkeypatch)
    marker = tmp_path / "marker"
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text(malicious_module(marker))
    os.chmod(elsewhere, 0o644)
    path.symlink_to(elsewhere)
    with pytest.warns(RuntimeWarning, match="symbolic link"):
        sq.kernels(MODEL)
    assert not marker.exists()
    assert_trusted_regular_file(path, good_text)
    assert elsewhere.read_text() == malicious_module(marker)   # the link target is untouched


def test_folder_in_place_of_a_cache_file_is_refused(tmp_path, monkeypatch, good_text):
    folder, path = cache_folder(tmp_path, monkeypatch)
    path.mkdir()
    with pytest.raises(UntrustedCacheError, match="a folder, not a regular file"):
        KF.read_cache_file(path)


@posix_only
def test_fifo_in_place_of_a_cache_file_does_not_block(tmp_path, good_text):
    # in a fresh interpreter with a deadline: opening a FIFO for reading would block
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    code = textwrap.dedent(f"""
        import os, warnings
        import symquad as sq
        from symquad.numeric.kernels import activation_key
        from symquad.kernel_files import cached_path
        m = sq.Model(p=2, p_star=1, lr=0.1, activation={ACT!r})
        path = cached_path("tensor", activation_key(m))
        os.mkfifo(path)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            k = sq.kernels(m)
        print("source", k.source == str(path), os.path.isfile(path) and not os.path.islink(path))
        print("warning", [str(x.message) for x in w])
    """)
    env = {**os.environ, "SYMQUAD_CACHE_DIR": str(folder)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "source True True" in out.stdout
    assert "is a FIFO, not a regular file" in out.stdout


# --------------------------------------------------------------------------- folders
@posix_only
def test_group_writable_folder_is_not_used(tmp_path, monkeypatch, expected_risk):
    folder, path = cache_folder(tmp_path, monkeypatch, mode=0o775)
    marker = tmp_path / "marker"
    path.write_text(malicious_module(marker))
    os.chmod(path, 0o644)
    with pytest.warns(RuntimeWarning, match=r"folder .* is writable by group or others "
                                            r"\(mode 0775\).*in-memory kernels"):
        kern = sq.kernels(MODEL)
    assert not marker.exists() and kern.source == "<memory>"
    assert kern.risk(*POINT) == pytest.approx(expected_risk, rel=1e-14)
    assert path.read_text() == malicious_module(marker)     # nothing written there


def test_symlinked_cache_folder_is_not_followed(tmp_path, monkeypatch, expected_risk):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    monkeypatch.setenv("SYMQUAD_CACHE_DIR", str(link))
    marker = tmp_path / "marker"
    path = cached_path("tensor", K.activation_key(MODEL))
    (real / path.name).write_text(malicious_module(marker))
    with pytest.warns(RuntimeWarning, match="is a symbolic link.*in-memory kernels"):
        kern = sq.kernels(MODEL)
    assert not marker.exists() and kern.source == "<memory>"
    assert kern.risk(*POINT) == pytest.approx(expected_risk, rel=1e-14)


@posix_only
def test_what_symquad_writes_is_trusted_even_with_a_permissive_umask(tmp_path):
    # umask 002 (common on shared machines) would give group-writable files and folders
    folder = tmp_path / "new" / "cache"
    code = textwrap.dedent(f"""
        import os
        os.umask(0o002)
        import symquad as sq
        k = sq.kernels(sq.Model(p=2, p_star=1, lr=0.1, activation={ACT!r}))
        print(k.source)
    """)
    env = {**os.environ, "SYMQUAD_CACHE_DIR": str(folder)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    written = out.stdout.strip()
    assert written.startswith(str(folder))
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert not os.stat(written).st_mode & 0o022
    KF.read_cache_file(written)                  # trusted by the reader


def test_regenerate_entries_refuses_untrusted_files(tmp_path, monkeypatch):
    from symquad.codegen.regenerate import ensure_cached_entries
    model = sq.Model(p=1, p_star=1, lr=0.1, activation="z**3")
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("SYMQUAD_CACHE_DIR", str(folder))
    path = cached_path("entries", model.structure_key)
    marker = tmp_path / "marker"
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text(malicious_module(marker))
    path.symlink_to(elsewhere)
    assert ensure_cached_entries(model) == path
    assert not marker.exists() and not path.is_symlink()
    KF.read_cache_file(path)

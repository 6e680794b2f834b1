"""Generated code: agreement with a live lambdify, drift check, determinism, cache, no SymPy."""

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sympy as sp

import symquad as sq
from conftest import random_overlaps
from symquad.codegen.regenerate import GENERATED_DIR, ensure_cached_entries, regenerate
from symquad.codegen.render import CANONICAL_ENTRY_MODELS
from symquad.kernel_files import cache_dir, verify_checksum


def _lambdified(model, form):
    """A fresh derivation, lambdified live: the route the generated code must match."""
    eq = sq.derive(model, form=form)
    risk, dQ, drho = eq.explicit()
    Qs, Rs, Ts = eq.entry_symbols
    args = sorted(set(Qs) | set(Rs) | set(Ts), key=lambda s: s.name) + [eq.eta, eq.noise]
    f = sp.lambdify(args, [risk, dQ, drho], "numpy")

    def call(Q, rho, T):
        values = {}
        for M, A in ((Qs, Q), (Rs, rho), (Ts, T)):
            for i in range(M.rows):
                for j in range(M.cols):
                    values[M[i, j]] = A[i, j]
        r, a, b = f(*[values[s] for s in args[:-2]], model.eta, model.noise)
        return float(r), np.array(a, dtype=float), np.array(b, dtype=float)
    return call


@pytest.mark.parametrize("p, p_star, form", [(1, 1, "matrix"), (3, 2, "matrix"), (4, 2, "matrix"),
                                             (2, 2, "entries"), (3, 2, "entries")])
def test_generated_kernels_match_live_lambdify(p, p_star, form):
    model = sq.Model(p=p, p_star=p_star, lr=0.37, noise=0.2)
    live = _lambdified(model, form)
    kern = sq.kernels(model, form=form)
    rng = np.random.default_rng(p * 10 + p_star)
    for _ in range(3):
        Q, rho, T = random_overlaps(p, p_star, rng)
        r_live, dQ_live, drho_live = live(Q, rho, T)
        dQ, drho = kern.rhs(Q, rho, T)
        scale = max(1.0, np.max(np.abs(dQ_live)))
        assert np.max(np.abs(dQ - dQ_live)) <= 1e-12 * scale
        assert np.max(np.abs(drho - drho_live)) <= 1e-12 * scale
        assert abs(kern.risk(Q, rho, T) - r_live) <= 1e-12 * max(1.0, abs(r_live))


def test_kernels_accept_batches():
    model = sq.Model(p=3, p_star=2, lr=0.2)
    rng = np.random.default_rng(0)
    pts = [random_overlaps(3, 2, rng) for _ in range(4)]
    Q, rho, T = (np.stack(x) for x in zip(*pts))
    for form in ("matrix", "entries"):
        kern = sq.kernels(model, form=form)
        dQ, drho = kern.rhs(Q, rho, T)
        risk = kern.risk(Q, rho, T)
        assert dQ.shape == (4, 3, 3) and drho.shape == (4, 3, 2) and risk.shape == (4,)
        for b in range(4):
            a, c = kern.rhs(Q[b], rho[b], T[b])
            np.testing.assert_allclose(dQ[b], a, rtol=1e-13, atol=1e-13)
            np.testing.assert_allclose(risk[b], kern.risk(Q[b], rho[b], T[b]), rtol=1e-13)


#: Another process renders every generated file once, prints the digest of the rendering,
#: then runs ``symquad regenerate --check`` (the CLI's entry) on that same rendering and
#: prints its exit status: one rendering (about 10 s of CPU) for both checks.
_OTHER_PROCESS = textwrap.dedent("""
    import hashlib
    from symquad.cli import main
    from symquad.codegen import regenerate
    files = regenerate.render_all()
    print(hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest())
    regenerate.render_all = lambda: dict(files)
    print("exit", main(["regenerate", "--check"]))
""")


def _digest(files):
    return hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest() + "\n"


@pytest.fixture(scope="module")
def rendered():
    """render_all() once for this module (seconds of SymPy each time; it is deterministic:
    test_rendering_is_independent_of_hash_seed, and the CLI check renders afresh)."""
    from symquad.codegen.regenerate import render_all
    return render_all()


@pytest.fixture(scope="module")
def other_process():
    """:data:`_OTHER_PROCESS` under another hash seed than this process's."""
    mine = os.environ.get("PYTHONHASHSEED")
    other = "12345" if mine == "0" else "0"
    assert sys.flags.hash_randomization or mine not in (None, "random"), "no hash seed to vary"
    return subprocess.run([sys.executable, "-c", _OTHER_PROCESS], capture_output=True,
                          text=True, env={**os.environ, "PYTHONHASHSEED": other})


@pytest.fixture
def render_once(rendered, monkeypatch):
    """regenerate() on the module's rendering (a fresh copy per call)."""
    monkeypatch.setattr("symquad.codegen.regenerate.render_all", lambda: dict(rendered))
    return rendered


def test_regenerate_check_passes_on_committed_files(render_once):
    assert regenerate(check=True) == []


def test_regenerate_check_fails_after_edit_and_regeneration_repairs(tmp_path, render_once):
    copy = tmp_path / "_generated"
    shutil.copytree(GENERATED_DIR, copy)
    target = copy / "quadratic_matrix.py"
    target.write_text(target.read_text().replace("s0 = ", "s0 =  ", 1))
    (copy / "stale_kernel.py").write_text("# left over\n")
    diffs = regenerate(check=True, directory=copy)
    assert len(diffs) == 2 and any("quadratic_matrix.py" in d for d in diffs)
    assert regenerate(check=False, directory=copy) != []
    assert regenerate(check=True, directory=copy) == []
    for f in GENERATED_DIR.iterdir():
        if f.is_file():
            assert (copy / f.name).read_bytes() == f.read_bytes()


def test_cli_check_exit_codes(other_process):
    ok = other_process
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines()[-1] == "exit 0", ok.stdout
    assert "all generated files in" in ok.stdout and "are up to date" in ok.stdout


def test_rendering_is_independent_of_hash_seed(rendered, other_process):
    # this process's rendering against one in a process with another hash seed
    assert other_process.returncode == 0, other_process.stderr
    theirs = other_process.stdout.splitlines()[0] + "\n"
    assert theirs == _digest(rendered)


def test_generated_files_have_banner_checksum_and_numpy_only_imports():
    for f in GENERATED_DIR.glob("*.py"):
        text = f.read_text()
        assert text.startswith("# This file is generated by symquad")
        imports = [l for l in text.splitlines() if l.startswith(("import ", "from "))]
        # numpy, and the hand-written runtime the tensor and matrix modules import
        assert set(imports) <= {"import numpy",
                                "from symquad.runtime import tensor_engine as _engine",
                                "from symquad.runtime import diffusion_engine as _engine",
                                "from symquad.runtime.diffusion_engine import WordGather "
                                "as _WordGather",
                                "from symquad.runtime.diffusion_engine import gather as _g"}, \
            (f.name, imports)
        if f.name != "__init__.py":
            assert verify_checksum(text), f.name
    assert {m.p for m in CANONICAL_ENTRY_MODELS} >= {1, 2, 3}


def test_cache_generates_detects_corruption_and_regenerates(isolated_cache):
    from symquad.kernel_files import cached_path
    from symquad.numeric.kernels import clear_kernel_memo
    model = sq.Model(p=2, p_star=2, lr=0.1, activation="z**3")
    path = cached_path("entries", model.structure_key)
    assert path.parent == cache_dir() and not path.exists()
    kern = sq.kernels(model, form="entries")
    assert kern.source == str(path) and path.exists()
    good = path.read_bytes()
    Q, rho, T = np.eye(2), 0.1 * np.ones((2, 2)), np.eye(2)
    expected = kern.risk(Q, rho, T)
    path.write_bytes(good[: len(good) // 2])          # a torn write
    clear_kernel_memo()                               # as in a new process
    assert sq.kernels(model, form="entries").risk(Q, rho, T) == expected
    assert path.read_bytes() == good                  # regenerated byte-identically
    path.write_bytes(good.replace(b"def risk", b"def risk_", 1))   # a hand edit
    assert ensure_cached_entries(model) == path and path.read_bytes() == good
    assert not list(isolated_cache.glob("*.tmp"))


def test_numeric_runtime_works_without_sympy():
    code = textwrap.dedent("""
        import sys
        sys.modules["sympy"] = None          # any import of sympy now fails
        import numpy as np
        import symquad as sq
        m = sq.Model(p=3, p_star=2, lr=0.2, noise=0.1)
        k = sq.kernels(m)
        dQ, drho = k.rhs(np.eye(3), np.zeros((3, 2)), np.eye(2))
        sol = sq.integrate(m, np.eye(3), 0.01 * np.ones((3, 2)), np.eye(2), 5.0)
        k2 = sq.kernels(m, form="entries")
        assert np.allclose(k2.rhs(np.eye(3), np.zeros((3, 2)), np.eye(2))[0], dQ)
        assert not any(name.startswith("sympy") and sys.modules[name] is not None
                       for name in sys.modules)
        print("ok", sol.status)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("ok ok"), out.stderr

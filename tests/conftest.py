import os
import shutil
import tempfile

import pytest

# The test session never touches the user's kernel cache (~/.cache/symquad or a
# SYMQUAD_CACHE_DIR of their own): every test, and every subprocess a test
# starts (they inherit the environment), uses a fresh folder that is removed at
# the end.  SYMQUAD_TEST_CACHE_DIR names a folder to reuse across sessions
# instead (it is kept).  Under pytest-xdist every worker uses the controller's folder
# (handed over in ``workerinput``; cache files are written atomically), so a kernel is
# generated once per session rather than once per worker.
_SESSION_CACHE = {}


def pytest_configure(config):
    chosen = os.environ.get("SYMQUAD_TEST_CACHE_DIR")
    handed = getattr(config, "workerinput", {}).get("symquad_cache_dir")
    if handed:
        path, owned = handed, False          # an xdist worker: the controller removes it
    elif chosen:
        path, owned = chosen, False
    else:
        path, owned = tempfile.mkdtemp(prefix="symquad-test-cache-"), True
    _SESSION_CACHE.update(path=path, owned=owned, before=os.environ.get("SYMQUAD_CACHE_DIR"))
    os.environ["SYMQUAD_CACHE_DIR"] = path


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: hand this session's cache folder to each worker it starts."""
    node.workerinput["symquad_cache_dir"] = _SESSION_CACHE["path"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Keep the tests that share a module-scoped fixture on one pytest-xdist worker.

    Such fixtures (a validation report, a set of simulations) cost seconds to a minute
    and are built once per process; ``--dist loadgroup`` honours an ``xdist_group``, so
    each module's shared fixtures are built once per session instead of once per worker.
    Runs before xdist's own hook, which reads the groups (a no-op without xdist).
    """
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.nodeid.split("::")[0]
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        if any(getattr(fd[-1], "scope", "function") == "module" and
               getattr(fd[-1], "baseid", "").startswith(module)
               for fd in defs.values() if fd):
            item.add_marker(pytest.mark.xdist_group(f"module-fixtures:{module}"))
    if hasattr(config, "workerinput"):
        # an xdist worker (every worker collects the same order): the groups first, since
        # they are the long units of work; started last, they left one worker running alone
        # for minutes at the end.  A run without xdist keeps the file order.
        items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)


def pytest_unconfigure(config):
    if not _SESSION_CACHE:
        return
    before = _SESSION_CACHE["before"]
    if before is None:
        os.environ.pop("SYMQUAD_CACHE_DIR", None)
    else:
        os.environ["SYMQUAD_CACHE_DIR"] = before
    if _SESSION_CACHE["owned"]:
        shutil.rmtree(_SESSION_CACHE["path"], ignore_errors=True)


def session_cache_dir() -> str:
    """The kernel cache folder of this test session (see the module comment)."""
    return _SESSION_CACHE["path"]


def random_overlaps(p, p_star, rng, scale=1.0):
    """A random positive-definite point (Q, rho, T): the Gram matrix of random weights / N."""
    n = p + p_star
    G = rng.standard_normal((n, n + 3))
    C = scale * G @ G.T / (n + 3)
    return C[:p, :p].copy(), C[:p, p:].copy(), C[p:, p:].copy()


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """Point the kernel cache at a fresh directory."""
    monkeypatch.setenv("SYMQUAD_CACHE_DIR", str(tmp_path / "kernel-cache"))
    return tmp_path / "kernel-cache"

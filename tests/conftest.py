import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

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


def pytest_sessionstart(session):
    """The controller of a pytest-xdist run: compile numba's kernels once, before the workers.

    numba's cache lives next to symquad's sources (``cache=True``), so in a fresh checkout
    it is empty and every worker compiled the same kernels when its first test needed
    them (about 30 s of CPU per worker on the 2-core machine).  One process per group of
    kernels (tests/numba_warm.py: the simulators, the quadrature, the diffusion engine's
    interpreter) fills the cache at once; the workers, started
    after this hook (xdist's own ``pytest_sessionstart`` is ``trylast``), only load it.
    With a warm cache the processes load it and end (about 1.3 s each).  A failure
    here only costs the compilation it would have saved; it is reported, not raised.
    ``SYMQUAD_TEST_NUMBA_WARM=0`` leaves it out: a session that imports no symquad
    (tests/test_xdist_groups.py's probe of the scheduling) has nothing to warm.
    """
    config = session.config
    if hasattr(config, "workerinput") or config.pluginmanager.getplugin("dsession") is None \
            or int(getattr(config.option, "numprocesses", 0) or 0) < 2 \
            or os.environ.get("SYMQUAD_TEST_NUMBA_WARM") == "0":
        return
    spec = importlib.util.find_spec("symquad")
    if spec is None or not spec.origin:
        return
    # the workers' symquad, whatever the subprocess's sys.path would find first
    root = os.path.dirname(os.path.dirname(spec.origin))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    script = os.path.join(os.path.dirname(__file__), "numba_warm.py")
    # its groups read from the script (it imports only numpy at the top), so they cannot drift
    warm = importlib.util.spec_from_file_location("numba_warm", script)
    module = importlib.util.module_from_spec(warm)
    warm.loader.exec_module(module)
    groups = tuple(module.GROUPS)
    procs = [subprocess.Popen([sys.executable, script, group], env=env, cwd=root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for group in groups]
    for group, proc in zip(groups, procs):
        try:
            _, err = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode != 0:
            tail = (err or "").strip().splitlines()[-1:] or ["no output"]
            print(f"\nnumba warm-up ({group}) failed (exit {proc.returncode}: {tail[0]}); "
                  f"the workers compile for themselves", file=sys.stderr)


def pytest_collection_finish(session):
    """In a pytest-xdist worker (one per core already): BLAS and numba on one thread.

    With the library's default (a thread per core) in every worker, the workers'
    threads outnumber the cores and OpenBLAS's waiting threads spin: measured on the
    loaded 2-core machine, ``eigvalsh`` of a 2208 x 2208 matrix took 7.0 s of CPU on
    two threads and 0.8 s on one, and tests/test_diffusion.py 33 s against 22 s
    (``-n 0``, OPENBLAS_NUM_THREADS=1).  After collection the test modules have loaded
    NumPy and SciPy (one OpenBLAS here), which threadpoolctl limits; a test may still
    raise it (``threadpoolctl.threadpool_limits``, ``Kernels(threads=)``) up to the
    library's own count.  A run without xdist keeps the user's setting.
    """
    workerinput = getattr(session.config, "workerinput", None)
    if not workerinput or int(workerinput.get("workercount", 1)) < 2:
        return
    if importlib.util.find_spec("numba") is not None:
        # the ReLU quadrature's threaded loops (numba's OpenMP layer) would start one
        # thread per core in every worker, as BLAS would; its results do not depend on
        # the thread count, and a test may raise it (numba.set_num_threads)
        import numba
        numba.set_num_threads(1)
    if "numpy" not in sys.modules:
        return
    try:
        import threadpoolctl
    except ImportError:
        return
    threadpoolctl.threadpool_limits(limits=1, user_api="blas")


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
        if item.get_closest_marker("xdist_group") is None:
            module = item.nodeid.split("::")[0]
            defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
            if any(getattr(fd[-1], "scope", "function") == "module" and
                   getattr(fd[-1], "baseid", "").startswith(module)
                   for fd in defs.values() if fd):
                item.add_marker(pytest.mark.xdist_group(f"module-fixtures:{module}"))
        if getattr(config.option, "loadgroup", False):      # an xdist worker, --dist loadgroup
            _name_the_group(item)
    if hasattr(config, "workerinput"):
        # an xdist worker (every worker collects the same order): the groups first, since
        # they are the long units of work; started last, they left one worker running alone
        # for minutes at the end.  A run without xdist keeps the file order.
        items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)


def _name_the_group(item):
    """Append ``@group`` to the nodeid of an item of an ``xdist_group`` (an xdist worker).

    ``--dist loadgroup`` schedules by that suffix of the nodeid, which pytest-xdist's own
    hook sets by assigning ``item._nodeid``.  Since pytest 9 the nodeid is ``str(item._id)``
    and that assignment is lost: every group was silently split across the workers, so each
    shared report or module fixture was built once per worker (measured with pytest 9.2,
    xdist 3.8: the tests of tests/test_cli_interop.py's module fixture ran on both workers).
    Where ``_nodeid`` still exists (older pytest) xdist's hook does it and this does nothing.
    """
    if hasattr(item, "_nodeid") or not hasattr(item, "_id"):
        return
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    if names:
        from _pytest.nodeid import NodeId     # pytest >= 9 (where `_id` exists)
        item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


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


class HangGuard:
    """An upper bound on a wait that only a hang can exceed (never a busy machine).

    Tests of deadlines (a point's ``timeout=``, a scheduler that never answers, a
    signal that must stop a process) have to bound how long the wait took, or a
    deadline that is ignored passes.  The bound is set far above any time the wait
    can take on a loaded machine (the deadline under test plus interpreter starts at
    load 10 on 2 cores are well under it), and below the time the hang would take:
    the task that should be stopped runs for longer than the bound (e.g. sleeps
    600 s), so a missed deadline fails here with a message, not by a shorter margin.
    Uses ``time.monotonic`` (not changed by clock adjustments).
    """

    def __init__(self, limit: float, what: str):
        self.limit, self.what = float(limit), what
        self.start = time.monotonic()

    def check(self):
        elapsed = time.monotonic() - self.start
        assert elapsed < self.limit, (
            f"{self.what} took {elapsed:.0f} s, beyond the {self.limit:g} s that only a hang "
            f"reaches (a busy machine needs far less): the deadline was not honoured")
        return elapsed


@pytest.fixture
def forbid(monkeypatch):
    """Make work that a refusal must come before fail the test if it starts.

    ``forbid(module_or_class, "name", ...)`` replaces each named function by one that
    records the call and raises ``AssertionError``; the returned list holds the calls
    (so a test whose code under test swallows the error still sees them).  This is how
    "refused at once, before any work" is checked without a clock: a refusal that a
    busy machine delays is still a refusal, and work that started is caught however
    fast the machine is.
    """
    calls = []

    def _forbid(owner, *names):
        for name in names:
            getattr(owner, name)                     # a typo'd name fails here, not silently
            label = f"{getattr(owner, '__name__', owner)}.{name}"

            def refused(*args, _label=label, **kwargs):
                calls.append(_label)
                raise AssertionError(f"{_label} ran before the refusal (work started)")
            monkeypatch.setattr(owner, name, refused)
        return calls
    return _forbid


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """Point the kernel cache at a fresh directory."""
    monkeypatch.setenv("SYMQUAD_CACHE_DIR", str(tmp_path / "kernel-cache"))
    return tmp_path / "kernel-cache"

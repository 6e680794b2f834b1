"""Under pytest-xdist the tests of one ``xdist_group`` run on one worker (tests/conftest.py).

A module-scoped fixture (and an explicit ``xdist_group``, e.g. one validation report read
by several tests) is built once per process: split across workers it is built once per
worker.  With pytest 9 the group suffix pytest-xdist sets was lost and every group was
split; this runs a probe session on two workers and asks where each test ran.
"""

import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

PROBE = textwrap.dedent("""
    import os
    import pytest

    def _log(name):
        with open(os.environ["PROBE_LOG"], "a") as fh:
            fh.write(f"{name} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")

    @pytest.fixture(scope="module")
    def shared():
        _log("fixture")
        return 1

    @pytest.mark.parametrize("i", range(6))
    def test_reads_the_module_fixture(shared, i):
        _log("module")

    @pytest.mark.xdist_group("report")
    @pytest.mark.parametrize("i", range(6))
    def test_reads_one_report(i):
        _log("report")

    @pytest.mark.parametrize("i", range(6))
    def test_free(i):
        _log("free")
""")


def test_a_group_runs_on_one_worker_and_its_module_fixture_is_built_once(tmp_path):
    pytest.importorskip("xdist")
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "test_probe.py").write_text(PROBE)
    log = tmp_path / "where.txt"
    # the probe imports no symquad: conftest's numba warm-up (two processes) is left out
    env = {**os.environ, "PROBE_LOG": str(log), "SYMQUAD_TEST_NUMBA_WARM": "0",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest",
                          "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                          str(tmp_path / "probe")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    workers = defaultdict(list)
    for line in log.read_text().splitlines():
        name, worker = line.split()
        workers[name].append(worker)
    assert len(workers["module"]) == len(workers["report"]) == len(workers["free"]) == 6
    # both workers ran (the probe is big enough to be split) ...
    assert set(workers["module"] + workers["report"] + workers["free"]) == {"gw0", "gw1"}
    # ... but each group on one of them, and the module fixture was built once
    assert len(set(workers["module"])) == 1 and len(set(workers["report"])) == 1, workers
    assert workers["fixture"] == workers["module"][:1], workers

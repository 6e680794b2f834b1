"""The test session never writes into the user's kernel cache (tests/conftest.py)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import session_cache_dir

TESTS = Path(__file__).resolve().parent

PROBE = textwrap.dedent("""
    import os
    import symquad as sq
    from symquad.kernel_files import cache_dir

    def test_probe():
        k = sq.kernels(sq.Model(p=2, p_star=1, lr=0.1, activation="z**3/3 + z**2 - 1"))
        assert k.source.startswith(str(cache_dir()))
        print("CACHE", cache_dir())
""")


def test_this_session_uses_a_temporary_cache():
    here = os.environ["SYMQUAD_CACHE_DIR"]
    assert here == session_cache_dir()
    home_cache = Path(os.path.expanduser("~")) / ".cache" / "symquad"
    assert not Path(here).resolve().is_relative_to(home_cache.resolve())


def test_a_test_session_leaves_the_users_cache_alone(tmp_path):
    # a whole pytest session with this conftest, as a user would start it: HOME is a
    # scratch folder, and the user's own SYMQUAD_CACHE_DIR points inside it
    home = tmp_path / "home"
    users_cache = home / "my-cache"
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME",
                                                            "SYMQUAD_TEST_CACHE_DIR")}
    env.update(HOME=str(home), SYMQUAD_CACHE_DIR=str(users_cache),
               PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "conftest",
                          "-p", "no:cacheprovider", str(tmp_path / "probe")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    used = Path(next(line.split(None, 1)[1] for line in out.stdout.splitlines()
                     if line.startswith("CACHE ")))
    assert not users_cache.exists() and not (home / ".cache").exists()
    assert not used.is_relative_to(home)
    assert not used.exists()                  # the session's folder is removed at the end

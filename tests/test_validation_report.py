"""ValidationReport persistence and integrity, and the ``symquad validate`` CLI around it.

save/load round trip (numbers, config, arrays, verdict, drift study), a compact
repr, atomic folder replacement (an interrupted save leaves the old folder),
destinations refused before any computation, ``--quick`` never overriding
explicit flags, ``--data`` for user trajectories.
"""

import json
import os
import shutil

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest

import symquad as sq
from symquad.cli import main
from symquad.studies import report_io
from symquad.studies.validation import ValidationReport

M = sq.Model(p=3, p_star=2, lr=0.3)


@pytest.fixture(scope="module")
def report():
    """A small report with every part: escape, finite-size scaling, drift study."""
    return sq.validate(M, N=200, t_max=40.0, replicas=6, seed=11, fss_N=[50, 200, 800],
                       fss_t_max=2.0, fss_replicas=6, n_times=41, invariant_N=(100, 200),
                       invariant_replicas=3)


@pytest.fixture(scope="module")
def saved(report, tmp_path_factory):
    """The report saved once with its figures (a save draws five figures: ~3 s of CPU),
    with ``matplotlib.use`` forbidden and pyplot's figures and backend recorded around it.

    Returns ``(paths, state)``: the paths :meth:`save` returned, and pyplot's open
    figures and the backend before and after.
    """
    def forbidden(*args, **kwargs):
        raise AssertionError("matplotlib.use must not be called")
    plt.close("all")
    backend = matplotlib.get_backend()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib, "use", forbidden)
        paths = report.save(tmp_path_factory.mktemp("saved") / "rep")
    state = {"fignums_after": plt.get_fignums(), "backend_before": backend,
             "backend_after": matplotlib.get_backend()}
    return paths, state


def _same_tree(a, b):
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _same_tree(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same_tree(x, y)
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b


def test_save_load_round_trip(report, saved):
    paths, _ = saved
    back = ValidationReport.load(os.path.dirname(paths["json"]))
    assert back.config == report.config
    assert back.numbers == json.loads(json.dumps(report.numbers))
    assert back.verdict == report.verdict and back.passed == report.passed
    assert back.reasons == report.reasons
    for name in ("t", "sgd_risk", "ode_risk", "sgd_Q", "ode_Q", "sgd_rho", "ode_rho", "T"):
        np.testing.assert_array_equal(getattr(back, name), getattr(report, name))
    _same_tree(report.invariant_study, back.invariant_study)
    assert back.summary() == report.summary()
    # the figures can be redrawn from the loaded report
    assert set(back.figures()) == {"risk", "overlaps", "fss", "escape"}
    for key in ("json", "summary", "trajectories", "risk", "invariant_drift"):
        assert os.path.getsize(paths[key]) > 0
    # files are readable by others like any file the user writes (not mkstemp-private)
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(paths["risk"]).st_mode & 0o777 == 0o666 & ~umask


def test_repr_is_short(report):
    text = repr(report)
    assert len(text) < 300 and text.count("\n") == 0
    assert text.startswith(f"ValidationReport({report.verdict}")
    assert "replicas=6" in text and "times=41" in text


def test_load_refuses_what_is_not_a_report(tmp_path):
    with pytest.raises(ValueError, match="no report.json"):
        ValidationReport.load(tmp_path)
    (tmp_path / "report.json").write_text('{"something": "else"}')
    with pytest.raises(ValueError, match="not a symquad ValidationReport"):
        ValidationReport.load(tmp_path)


def test_save_replaces_the_folder_whole(report, saved, tmp_path):
    dest = tmp_path / "rep"
    shutil.copytree(os.path.dirname(saved[0]["json"]), dest)   # a save with figures
    assert (dest / "risk.png").exists()
    report.save(dest, figures=False)
    assert not (dest / "risk.png").exists()       # figures=False: none of the old ones kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]   # no temporary folder left
    assert report_io.is_report_folder(dest)


def test_interrupted_save_leaves_the_old_folder(report, tmp_path, monkeypatch):
    dest = tmp_path / "rep"
    report.save(dest, figures=False)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    calls = []

    def interrupted(fig, path, dpi=120):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(fig, path, dpi)

    from symquad import plotting
    original = plotting.save_figure
    monkeypatch.setattr(plotting, "save_figure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.save(dest)
    assert len(calls) == 2
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]
    # and into a new folder: nothing at all is left behind
    with pytest.raises(KeyboardInterrupt):
        calls.clear()
        report.save(tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_save_touches_no_global_matplotlib_state(saved):
    # the shared save ran with matplotlib.use forbidden (it raises inside the fixture)
    paths, state = saved
    assert os.path.getsize(paths["risk"]) > 0
    assert state["fignums_after"] == []
    assert state["backend_after"] == state["backend_before"]


def _a_file(tmp):
    (tmp / "f.txt").write_text("x")
    return tmp / "f.txt"


def _a_foreign_folder(tmp):
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("x")
    return tmp / "mine"


@pytest.mark.parametrize("make, match", [
    (lambda tmp: "", "non-empty folder path"),
    (lambda tmp: "   ", "non-empty folder path"),
    (_a_file, "is not a folder"),
    (_a_foreign_folder, "not a symquad report"),
    (lambda tmp: "/proc/symquad_report", "cannot create files"),
    (lambda tmp: _a_file(tmp) / "sub", "not a folder"),
    (lambda tmp: (tmp / "link").symlink_to(tmp) or tmp / "link", "symbolic link"),
])
def test_bad_destinations_refused(make, match, tmp_path, report):
    dest = make(tmp_path)
    with pytest.raises(ValueError, match=match):
        report_io.check_destination(dest)
    with pytest.raises(ValueError, match=match):
        report.save(dest)
    with pytest.raises(TypeError, match="folder path"):
        report_io.check_destination(3)


def test_unwritable_folder_refused(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root can write into read-only folders")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="cannot create files"):
            report_io.check_destination(ro / "rep")
    finally:
        ro.chmod(0o700)


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------
@pytest.fixture
def no_computation(monkeypatch):
    """Make any computation fail loudly: the CLI must refuse before it.

    Replaced in symquad.studies.validation, where the command looks them up when it runs
    (symquad.cli.validate imports the module and calls ``_validation.validate``: this
    test's seam)."""
    from symquad.cli import validate as command
    from symquad.studies import validation
    # a module-level import in the command would bypass the replacement below
    assert not hasattr(command, "validate") and not hasattr(command, "compare")

    def boom(*args, **kwargs):
        raise AssertionError("computation started")
    monkeypatch.setattr(validation, "validate", boom)
    monkeypatch.setattr(validation, "compare", boom)


@pytest.mark.parametrize("out", ["FILE", "", "/proc/symquad_report"])
def test_cli_bad_out_refused_before_computing(out, tmp_path, capsys, no_computation):
    if out == "FILE":
        out = str(tmp_path / "f.txt")
        (tmp_path / "f.txt").write_text("x")
    assert main(["validate", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("symquad validate: error: --out") and "Traceback" not in err


def test_cli_quick_does_not_override_explicit_flags(monkeypatch, tmp_path):
    # replaced where the command looks it up when it runs (see no_computation)
    from symquad.studies import validation
    seen = {}

    class Stop(Exception):
        pass

    def capture(model, **kwargs):
        seen.update(kwargs)
        raise Stop
    monkeypatch.setattr(validation, "validate", capture)
    # main() ends every exception as a status (5: not a known error kind)
    assert main(["validate", "--quick", "--N", "777", "--out", str(tmp_path / "r")]) == 5
    assert seen["N"] == 777 and seen["replicas"] == 32      # explicit N, quick replicas
    seen.clear()
    assert main(["validate", "--quick", "--replicas", "5", "--out", str(tmp_path / "r")]) == 5
    assert seen["replicas"] == 5 and seen["N"] == 400
    seen.clear()
    assert main(["validate", "--out", str(tmp_path / "r")]) == 5
    assert seen["N"] == 2000 and seen["replicas"] == 64 and seen["fss"] and seen["invariant"]


def _write_npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def test_cli_data(tmp_path, capsys):
    m = sq.Model(p=2, p_star=1, lr=0.3)
    run = sq.simulate(m, N=500, t_max=4.0, replicas=8, seed=1, t_eval=np.linspace(0, 4, 9))
    data = _write_npz(tmp_path / "run.npz", t=run.t, Q=run.Q, rho=run.rho)
    out = tmp_path / "rep"
    rc = main(["validate", "--data", data, "--p", "2", "--p-star", "1", "--lr", "0.3",
               "--out", str(out)])
    rep = ValidationReport.load(out)
    assert rc == {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 4}[rep.verdict]
    assert rep.config["source"] == "user data" and rep.config["replicas"] == 8
    np.testing.assert_array_equal(rep.sgd_Q, run.Q)
    assert "VERDICT:" in capsys.readouterr().out


def test_cli_data_with_N_runs_the_whole_run_criteria(tmp_path, capsys):
    """``--data FILE --N N``: the user's data get the whole-run criteria; without --N they
    are listed as not tested, with the flag that turns them on."""
    m = sq.Model(p=2, p_star=1, lr=0.1)
    from symquad.studies.validation import informed_start
    Q0, rho0 = informed_start(m)
    run = sq.simulate(m, N=500, t_max=3.0, replicas=48, seed=3, Q0=Q0, rho0=rho0,
                      t_eval=np.linspace(0, 3, 31))
    data = _write_npz(tmp_path / "run.npz", t=run.t, Q=run.Q, rho=run.rho)
    rc = main(["validate", "--data", data, "--p", "2", "--p-star", "1", "--lr", "0.1",
               "--N", "500", "--out", str(tmp_path / "with")])
    out = capsys.readouterr().out
    rep = ValidationReport.load(tmp_path / "with")
    status = {c["name"]: c["status"] for c in rep.numbers["verdict"]["checks"]}
    assert rep.config["N"] == 500
    assert status["whole_run_law"] in ("pass", "fail") and status["lna_spread"] in (
        "pass", "fail"), rep.reasons
    assert "whole-run law vs the SDE (same starts, 48 runs each)" in out
    assert rc == {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 4}[rep.verdict]
    rc = main(["validate", "--data", data, "--p", "2", "--p-star", "1", "--lr", "0.1",
               "--out", str(tmp_path / "without")])
    out = capsys.readouterr().out
    assert "not tested: whole-run law vs the SDE: not run" in out and "--N N" in out
    assert "of 7 criteria" in out


@pytest.mark.parametrize("arrays, extra_args, match", [
    (dict(t=np.arange(3.0), Q=np.zeros((3, 4, 4)), rho=np.zeros((3, 4, 2)), code=np.ones(2)),
     [], r"unexpected array\(s\) \['code'\]"),
    (dict(t=np.arange(3.0), Q=np.zeros((3, 4, 4))), [], r"lacks the array\(s\) \['rho'\]"),
    (dict(t=np.arange(3.0), Q=np.zeros((3, 4, 4)), rho=np.array([{"a": 1}] * 3)), [],
     "Python objects"),
    (dict(t=np.arange(3.0), Q=np.zeros((3, 4, 4)), rho=np.zeros((3, 4, 2))),
     ["--replicas", "100"], "--replicas describe a simulation"),
    (dict(t=np.arange(3.0), Q=np.zeros((3, 3, 3)), rho=np.zeros((3, 3, 2))), [],
     "Q must have shape"),
])
def test_cli_data_refused(arrays, extra_args, match, tmp_path, capsys):
    data = _write_npz(tmp_path / "d.npz", **arrays)
    rc = main(["validate", "--data", data, "--out", str(tmp_path / "r"), *extra_args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    import re
    assert re.search(match, err), err
    assert not (tmp_path / "r").exists()


def test_cli_data_missing_file(tmp_path, capsys):
    assert main(["validate", "--data", str(tmp_path / "nope.npz"), "--out",
                 str(tmp_path / "r")]) == 2
    assert "no such file" in capsys.readouterr().err

"""Every model field is a grid axis of every sweep task, and every command takes every field.

* the built-in tasks' parameters are the fields of :class:`symquad.Model` (from the
  field metadata) followed by the task's own;
* readouts are grid values (a number, a tuple or ``"1/2:1/4"``), stored canonically;
* a task computes the variant (equal to a direct call of the routine on that Model)
  or refuses a field it was not derived for by name (an error row);
* the CLI: ``validate``, ``landscape``, ``invariants``, ``sweep`` read the model flags
  of :mod:`symquad.cli._model_args`; ``--help`` lists each field once with its
  range, and a bad value exits 2 naming the field, without a traceback.
"""

import json
import re

import numpy as np
import pytest

import symquad as sq
from symquad.cli import main
from symquad.spec import model_fields
from symquad.studies.store import point_key
from symquad.studies.tasks import get_task

FIELDS = [f.name for f in model_fields()]
BUILTIN = ("plateau", "escape", "validate", "ode", "hessian")


@pytest.mark.parametrize("name", BUILTIN)
def test_every_model_field_is_a_parameter_of_every_task(name):
    task = get_task(name)
    assert list(task.defaults)[:len(FIELDS)] == FIELDS
    # defaults: the fields' own (None: follows p, p* or the student activation)
    d = task.defaults
    assert (d["weight_decay"], d["batch_size"], d["constraint"], d["lr_readout"]) == \
        (0.0, 1, "none", 0.0)
    assert d["readout"] is d["teacher_readout"] is d["teacher_activation"] is None
    assert d["activation"] == "z**2"
    assert f"{name}(" in task.signature() and "batch_size=1" in task.signature()


def test_readout_grid_values_are_stored_canonically():
    task = get_task("ode")
    base = dict(p=2, p_star=1)
    keys = {point_key(task.name, task.version, task.bind(dict(base, readout=r)))
            for r in (0.5, "1/2", "0.5")}
    assert len(keys) == 1
    tup = [task.bind(dict(base, readout=r))["readout"] for r in ((0.5, 0.25), "1/2:1/4",
                                                                 [0.5, "1/4"])]
    assert tup == ["1/2:1/4"] * 3
    with pytest.raises(ValueError, match="readout"):
        task.bind(dict(base, readout="a:b"))


def test_ode_task_follows_each_field_like_a_direct_integrate(tmp_path):
    grid = {"p": [3], "p_star": [2], "lr": [0.3], "start": ["informed"], "t_max": [10.0],
            "n_times": [21]}
    variants = [dict(), dict(batch_size=4), dict(weight_decay=0.1), dict(constraint="sphere"),
                dict(lr_readout=0.3), dict(readout=(0.7, 0.2, 0.4)),
                dict(teacher_readout=(0.8, 0.3)), dict(teacher_activation="z**3 - 3*z")]
    from symquad.studies.validation import informed_start
    finals = []
    for i, v in enumerate(variants):
        df = sq.sweep("ode", {**grid, **{k: [val] for k, val in v.items()}},
                      tmp_path / f"s{i}", workers=1)
        row = df.iloc[0]
        assert row.status == "ok", row.error
        m = sq.Model(p=3, p_star=2, lr=0.3, **v)
        sol = sq.integrate(m, *informed_start(m), np.eye(2), 10.0,
                           t_eval=np.linspace(0, 10.0, 21), on_divergence="stop")
        assert row.final_risk == sol.risk[-1], v
        arrays = sq.load_sweep_arrays(tmp_path / f"s{i}", row.key)
        np.testing.assert_array_equal(arrays["risk"], sol.risk)
        if m.readout_trained:
            np.testing.assert_array_equal(arrays["readout_trajectory"], sol.readout)
        # the escape time needs the escape law's plateau: NaN where it was not derived
        from symquad.studies.applicability import refusal
        undefined = not m.is_quadratic or refusal(m, "escape") is not None
        assert np.isnan(row.escape_time) == undefined, (v, row.escape_time)
        finals.append(row.final_risk)
    # each field changes the trajectory (the task did not run the classic model)
    assert all(abs(f / finals[0] - 1) > 1e-3 for f in finals[1:]), finals


def test_one_grid_over_batch_size_and_readouts(tmp_path):
    """Fields as grid axes: 2 x 2 points, each its own model, one table."""
    df = sq.sweep("ode", {"p": [2], "p_star": [1], "lr": [0.3], "start": ["informed"],
                          "t_max": [5.0], "n_times": [11], "batch_size": [1, 4],
                          "readout": [None, (0.7, 0.2)]}, tmp_path, workers=1)
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert list(df["batch_size"]) == [1, 1, 4, 4]
    assert [None if x is None or x != x else x for x in df["readout"]] == \
        [None, "7/10:1/5", None, "7/10:1/5"]
    assert df["final_risk"].nunique() == 4
    again = sq.sweep("ode", {"p": [2], "p_star": [1], "lr": [0.3], "start": ["informed"],
                             "t_max": [5.0], "n_times": [11], "batch_size": [4],
                             "readout": ["0.7:0.2"]}, tmp_path, workers=1)
    assert again.attrs["sweep"].skipped == 1          # the same point, written differently
    assert again.iloc[0].final_risk == df.iloc[3].final_risk


def test_validate_task_runs_the_variant(tmp_path):
    kw = dict(N=300, t_max=6.0, replicas=4, seed=5)
    df = sq.sweep("validate", {"p": [3], "p_star": [2], "lr": [0.3], "lr_readout": [0.2],
                               **{k: [v] for k, v in kw.items()}}, tmp_path, workers=1)
    row = df.iloc[0]
    assert row.status == "ok", row.error
    rep = sq.validate(sq.Model(p=3, p_star=2, lr=0.3, lr_readout=0.2), fss=False,
                      invariant=False, **kw)
    assert row.band_inside_fraction == rep.numbers["band"]["ode_inside_fraction"]
    assert row.risk_rms_whole_run == rep.numbers["deviation"]["whole_run"]["risk_rms"]["mean"]
    assert row.start_used == "informed" and "lr_readout=0.2" in row.escape_reason


@pytest.mark.parametrize("task, grid", [
    ("plateau", {"p": [2], "p_star": [1]}),
    ("escape", {"p": [2], "p_star": [1], "N": [200], "replicas": [2], "sgd": [False]}),
    ("hessian", {"p": [2], "p_star": [1], "N": [6]}),
])
def test_tasks_refuse_fields_they_were_not_derived_for(task, grid, tmp_path):
    """A trained or non-uniform readout is refused by name (error rows); a mini-batch, which
    the analyses were re-derived for (symquad survival), is computed."""
    df = sq.sweep(task, {**grid, "lr_readout": [0.0, 0.2], "readout": ["1/2", "1/3:2/3"],
                         "batch_size": [1, 4]}, tmp_path, workers=1)
    by = {(r.lr_readout, r.readout, r.batch_size): r for r in df.itertuples()}
    assert by[0.0, "1/2", 1].status == "ok", by[0.0, "1/2", 1].error
    assert by[0.0, "1/2", 4].status == "ok", by[0.0, "1/2", 4].error
    for key, named in (((0.2, "1/2", 1), ["lr_readout=0.2"]),
                       ((0.0, "1/3:2/3", 1), ["readout=(1/3, 2/3)"]),
                       ((0.2, "1/3:2/3", 4), ["lr_readout=0.2", "readout=(1/3, 2/3)"])):
        assert by[key].status == "error"
        assert by[key].error.startswith("ValueError:") and "does not support" in by[key].error
        for text in named:
            assert text in by[key].error


def test_a_default_valued_field_given_explicitly_is_not_refused(tmp_path):
    df = sq.sweep("plateau", {"p": [2], "p_star": [1], "readout": [0.5, "1/4:3/4"]},
                  tmp_path, workers=1)
    assert list(df["status"]) == ["ok", "error"]        # 1/2 is the default for p = 2
    assert "readout=(1/4, 3/4)" in df.iloc[1].error
    fp = sq.plateau(sq.Model(p=2, p_star=1, lr=0.1))
    assert df.iloc[0].q == fp.q


def test_escape_summary_refuses_a_table_mixing_specification_fields():
    import pandas as pd
    from symquad.studies.escape_grid import records_from_sweep

    df = pd.DataFrame({"status": ["ok", "ok"], "lr_scaling": ["fixed"] * 2, "p_star": [1, 1],
                       "p": [2, 2], "batch_size": [1, 4], "N": [100, 100]})
    with pytest.raises(ValueError, match="batch_size takes several values"):
        records_from_sweep(df)


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------
FLAGS = [f.metadata["flag"] for f in model_fields()]


@pytest.mark.parametrize("command, absent", [
    ("validate", ()), ("landscape", ()), ("equations", ("--lr", "--noise", "--lr-scaling")),
    ("invariants", ("--lr", "--noise", "--lr-scaling")),
])
def test_help_lists_each_model_field_once_with_its_range(command, absent, capsys):
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    options = text.split("\nmodel (see docs/model.md):\n")
    assert len(options) == 2, text
    group = options[1]
    for f in model_fields():
        flag = f.metadata["flag"]
        if flag in absent:
            assert not re.search(rf"^\s+{re.escape(flag)}(?=\s)", text, re.M)
            continue
        lines = re.findall(rf"^\s+{re.escape(flag)}(?=\s).*$", text, re.M)
        assert len(lines) == 1, (flag, lines)         # one option line per field
        entry = group[group.index(lines[0]):].split("\n  --")[0]
        assert f"allowed {f.metadata['range']}" in " ".join(entry.split()), (flag, entry)


def test_sweep_help_lists_the_model_fields(capsys):
    assert main(["sweep", "--help"]) == 0
    text = capsys.readouterr().out
    for f in model_fields():
        assert re.search(rf"^\s+{f.name}\s+.*allowed {re.escape(f.metadata['range'])}", text,
                         re.M), f.name
    assert "readout=1/2:1/4,1" in text


@pytest.mark.parametrize("argv, named", [
    (["validate", "--weight-decay", "-1"], "weight_decay"),
    (["validate", "--batch-size", "0"], "batch_size"),
    (["validate", "--readout", "1,2"], "readout"),
    (["validate", "--teacher-activation", "exp(z)"], "teacher_activation"),
    (["validate", "--lr-readout", "-0.5"], "lr_readout"),
    (["landscape", "--teacher-readout", "1,2,3"], "teacher_readout"),
    (["landscape", "--lr-readout", "0.1"], "lr_readout"),
    (["landscape", "--readout", "1,2,3,4"], "readout"),
    (["equations", "--batch-size", "-3"], "batch_size"),
])
def test_bad_or_unsupported_model_values_exit_2_naming_the_field(argv, named, tmp_path,
                                                                 capsys):
    if argv[0] == "validate":
        argv = argv + ["--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err, err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv, named", [
    (["--batch-size", "x"], "--batch-size"),
    (["--constraint", "ball"], "--constraint"),
    (["--readout", "1,,2"], "--readout"),
])
def test_malformed_flag_values_exit_2_naming_the_flag(argv, named, capsys):
    assert main(["validate", *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_sweep_cli_grid_of_readouts_and_a_bad_field_value(tmp_path, capsys):
    store = str(tmp_path / "s")
    args = ["sweep", "ode", "--grid", "p=2", "--grid", "p_star=1", "--grid",
            "readout=1/2:1/4,1", "--grid", "start=informed", "--grid", "t_max=2.0",
            "--store", store, "--workers", "1", "--no-progress"]
    assert main(args) == 0
    assert "2 points" in capsys.readouterr().out
    df = sq.load_sweep(store)
    assert sorted(df["readout"]) == ["1", "1/2:1/4"]
    for bad, named in (("batch_size=0", "--grid batch_size"), ("readout=1:x", "--grid readout"),
                       ("constraint=ball", "--grid constraint"),
                       ("teacher_activation=z**99", "--grid teacher_activation")):
        assert main(["sweep", "ode", "--grid", "p=2", "--grid", "p_star=1", "--grid", bad,
                     "--store", str(tmp_path / "t"), "--workers", "1"]) == 2
        err = capsys.readouterr().err
        assert named in err and "Traceback" not in err, err
    assert not (tmp_path / "t").exists()


def test_cli_validate_runs_a_variant_and_reports_its_fields(tmp_path, capsys):
    out = tmp_path / "rep"
    rc = main(["validate", "--p", "3", "--p-star", "2", "--lr", "0.3", "--weight-decay", "0.1",
               "--batch-size", "2", "--N", "300", "--replicas", "8", "--t-max", "6",
               "--no-fss", "--no-invariant", "--out", str(out)])
    text = capsys.readouterr().out
    data = json.loads((out / "report.json").read_text())
    assert rc == {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 4}[data["numbers"]["verdict"]["verdict"]]
    spec = data["config"]["model_spec"]
    assert spec["weight_decay"] == 0.1 and spec["batch_size"] == 2
    assert data["config"]["changed_fields"] == ["weight_decay", "batch_size"]
    assert "weight_decay=0.1, batch_size=2" in text.splitlines()[0]
    # the escape law was re-derived for weight decay and mini-batches (symquad survival):
    # no field is refused, and the run was too short for an escape
    assert data["numbers"]["escape"]["reason"] == "" or "weight_decay" not in \
        data["numbers"]["escape"]["reason"]


def test_cli_validate_data_with_a_trained_readout(tmp_path, capsys):
    m = sq.Model(p=2, p_star=1, lr=0.3, lr_readout=0.3)
    from symquad.studies.validation import informed_start
    Q0, rho0 = informed_start(m)
    run = sq.simulate(m, N=500, t_max=4.0, replicas=8, seed=1, t_eval=np.linspace(0, 4, 9),
                      Q0=Q0, rho0=rho0)
    flags = ["--p", "2", "--p-star", "1", "--lr", "0.3", "--lr-readout", "0.3"]
    path = tmp_path / "run.npz"
    np.savez(path, t=run.t, Q=run.Q, rho=run.rho)
    assert main(["validate", "--data", str(path), *flags, "--out", str(tmp_path / "r")]) == 2
    assert "readout is required" in capsys.readouterr().err
    np.savez(path, t=run.t, Q=run.Q, rho=run.rho, readout=run.readout)
    rc = main(["validate", "--data", str(path), *flags, "--out", str(tmp_path / "r")])
    rep = sq.ValidationReport.load(tmp_path / "r")
    assert rc == {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 4}[rep.verdict]
    np.testing.assert_array_equal(rep.sgd_readout, run.readout)
    assert rep.model == m
    capsys.readouterr()
    # the same file against a fixed-readout model: the readout is refused
    assert main(["validate", "--data", str(path), "--p", "2", "--p-star", "1", "--lr", "0.3",
                 "--out", str(tmp_path / "r2")]) == 2
    assert "readout is accepted only" in capsys.readouterr().err


def test_invariants_prints_the_verdict_of_a_change_that_breaks_conservation(capsys):
    """For the sphere and a trained readout S is not conserved: an exact counterexample.

    At p = 3, p* = 2 (1.4 s of CPU for both proofs; 3.5 s at the command's default width,
    which adds nothing here; at p* = 1 the trained readout has no counterexample)."""
    for flag in (["--constraint", "sphere"], ["--lr-readout", "0.1"]):
        assert main(["invariants", "--only", "conservation", "--p", "3", "--p-star", "2",
                     *flag]) == 0
        text = capsys.readouterr().out
        assert "\\neq0" in text.replace(" ", ""), text[-500:]

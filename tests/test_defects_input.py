"""Defects of classes "silent wrong" and "internal errors on bad input" (issue 25).

Silent wrong: a shortened flag read as another flag (argparse prefix matching),
record times merged without a word, decimal literals of an activation string
rounded through float, ``dt`` given as text or a bool.  Internal errors: bad
input that ended in exit 5 (an OverflowError, ZeroDivisionError,
AttributeError or KeyError deep inside) instead of one line and exit 2 (or 3
for a divergence).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

import symquad as sq
from symquad.cli import build_parser, main

TESTS = os.path.dirname(os.path.abspath(__file__))


def _parsers(parser):
    """`parser` and every sub-command parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


# ---------------------------------------------------------------------------
# silent wrong: argparse abbreviations
# ---------------------------------------------------------------------------
def test_no_parser_accepts_abbreviations():
    parsers = list(_parsers(build_parser()))
    assert len(parsers) >= 8                       # symquad and its seven commands
    assert all(p.allow_abbrev is False for p in parsers)
    assert all(isinstance(p, sq.ArgumentParser) for p in parsers)


@pytest.mark.parametrize("argv", [
    ["equations", "--lr", "0.1"],            # equations has no --lr: was read as --lr-readout
    ["invariants", "--lr", "0.1"],
    ["equations", "--lr-r", "0.1"],          # a prefix of --lr-readout
    ["validate", "--rep", "4"],              # a prefix of --replicas
    ["sweep", "plateau", "--st", "x"],       # a prefix of --store
])
def test_shortened_or_unknown_flags_are_refused_in_one_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "usage:" not in err


def test_full_flag_still_works():
    args = build_parser().parse_args(["equations", "--lr-readout", "0.1"])
    assert args.lr_readout == 0.1


def test_a_bad_value_is_one_line_too(capsys):
    assert main(["validate", "--replicas", "many"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--replicas" in err


def test_examples_parse_without_abbreviations():
    root = os.path.dirname(TESTS)
    env = dict(os.environ, PYTHONPATH=f"{root}:{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run([sys.executable, os.path.join(root, "examples", "phases.py"),
                          "--ou", "x"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


# ---------------------------------------------------------------------------
# silent wrong: merged record times, decimal literals, dt
# ---------------------------------------------------------------------------
M = sq.Model(p=2, p_star=1, lr=0.3)


def test_record_times_on_one_step_are_reported():
    with pytest.warns(RuntimeWarning, match=r"1 of the 3 requested times round to the same"):
        run = sq.simulate(M, N=10, t_max=1.0, replicas=1, seed=0, t_eval=[0.0, 0.31, 0.34])
    assert run.t.tolist() == [0.0, 0.3]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # distinct steps: no warning
        run = sq.simulate(M, N=10, t_max=1.0, replicas=1, seed=0, t_eval=[0.0, 0.3, 0.4])
    assert run.t.tolist() == [0.0, 0.3, 0.4]


@pytest.mark.parametrize("text, coeffs", [
    ("0.1000000000000000055511151231257827*z**2",
     (0, 0, Fraction(1000000000000000055511151231257827, 10**34))),
    ("z**2 + 0.3*z", (0, Fraction(3, 10), 1)),
    ("1e-3 + z", (Fraction(1, 1000), 1)),
    ("2.5e2*z", (0, 250)),
])
def test_decimal_literals_are_exact(text, coeffs):
    assert sq.Model(p=1, p_star=1, lr=1, activation=text).activation == tuple(map(Fraction, coeffs))


def test_decimal_literal_agrees_with_its_rational_elsewhere():
    decimal = sq.Model(p=1, p_star=1, lr=1, activation="0.1000000000000000055511151231257827*z")
    as_tuple = sq.Model(p=1, p_star=1, lr=1,
                        activation=("0", "0.1000000000000000055511151231257827"))
    assert decimal.activation == as_tuple.activation
    assert decimal.activation[1] != Fraction(1, 10)       # float would have given 1/10


@pytest.mark.parametrize("dt, exc", [("0.1", TypeError), (True, TypeError), (0.0, ValueError),
                                     (float("nan"), ValueError), (-1.0, ValueError)])
def test_dt_must_be_a_positive_number(dt, exc):
    with pytest.raises(exc, match="dt"):
        sq.simulate(M, N=100, t_max=1.0, replicas=2, method="sde", dt=dt)
    with pytest.raises(exc, match="dt"):
        sq.escape_time(sq.Model(p=2, p_star=1, lr=0.3), 100, method="sde", dt=dt, t_max=10.0)


# ---------------------------------------------------------------------------
# internal errors on bad input -> exit 2 (one line), divergences -> DivergenceError
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv, match", [
    (["equations", "--readout", "1e400"], r"readout must be a number in \[-1e100, 1e100\]"),
    (["equations", "--readout", "1/0"], "non-zero denominator"),
    (["equations", "--readout", "1/2,1/0,1"], "non-zero denominator"),
    (["equations", "--teacher-readout=-1e101"], "teacher_readout"),
    (["equations", "--activation", "1/0*z"], "division by zero"),
    (["equations", "--p", "10000000"], r"p must be an integer in \[1, 4096\]"),
    (["equations", "--weight-decay", "1e100"], r"weight_decay .* must be in \[0, 1e\+12\]"),
    (["sweep", "plateau", "--grid", "readout=1/0", "--store", "S"], "non-zero denominator"),
    (["sweep", "plateau", "--grid", "p=99999999999999999999", "--store", "S"], "p"),
    (["sweep", "plateau", "--grid", "x=1", "--store", "S", "--timeout", "1e300"],
     r"timeout must be a number of seconds in \(0, 1e\+07\]"),
])
def test_bad_input_is_exit_2_in_one_line(argv, match, capsys, tmp_path, monkeypatch):
    import re
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and re.search(match, err), err


def test_sweep_api_refuses_huge_p_and_timeouts(tmp_path):
    with pytest.raises(ValueError, match=r"2\*\*63"):
        sq.sweep("plateau", {"p": [2**70]}, tmp_path / "s", workers=1)
    with pytest.raises(ValueError, match="timeout"):
        sq.sweep("plateau", {"p": [2]}, tmp_path / "s", workers=1, timeout=1e300)
    with pytest.raises(ValueError, match="worker_timeout"):
        sq.sweep("plateau", {"p": [2]}, tmp_path / "s", worker_timeout=float("inf"))


def test_coefficient_string_with_zero_denominator():
    from symquad.studies.tasks import parse_activation
    with pytest.raises(ValueError, match="rational coefficients"):
        parse_activation("0 1/0 1")
    with pytest.raises(ValueError, match="rational coefficients"):
        parse_activation("0 1e-99999999")          # refused at once, not minutes of Fraction


_QUADRATIC_BLOW_UP = sq.Model(p=2, p_star=1, lr=1e12)


@pytest.mark.parametrize("model, method", [
    *[(_QUADRATIC_BLOW_UP, m) for m in ("auto", "LSODA", "BDF", "RK45")],
    (sq.Model(p=2, p_star=1, lr=1e12, activation="z**3"), "LSODA"),    # scipy's brentq error
    (sq.Model(p=2, p_star=1, lr=1e200), "auto"),                       # scipy's list outputs
    (sq.Model(p=2, p_star=1, lr=1e200), "RK45"),
])
def test_a_first_step_blow_up_is_a_divergence(model, method):
    with np.errstate(all="ignore"):
        with pytest.raises(sq.DivergenceError):
            sq.integrate(model, np.eye(2), np.full((2, 1), 0.5), np.eye(1), t_max=10.0,
                         method=method)


@pytest.mark.parametrize("field", ["weight_decay", "lr_readout"])
def test_stiff_rates_are_solved_or_refused_before_work(field):
    model = sq.Model(p=2, p_star=1, lr=0.1, **{field: 1e12})
    start = (np.eye(2), np.full((2, 1), 0.5), np.eye(1))
    with pytest.raises(ValueError, match="explicit and this system is stiff"):
        sq.integrate(model, *start, t_max=10.0, method="RK45")
    sol = sq.integrate(model, *start, t_max=10.0, method="LSODA")
    assert sol.status == "ok"
    with pytest.raises(ValueError, match=r"must be in \[0, 1e\+12\]"):
        sq.Model(p=2, p_star=1, lr=0.1, **{field: 1e100})


def test_hostile_report_and_store_files_are_value_errors(tmp_path):
    import json
    folder = tmp_path / "rep"
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps({"format": "symquad.ValidationReport"}))
    np.savez(folder / "trajectories.npz", t=np.zeros(2))
    with pytest.raises(ValueError):
        sq.ValidationReport.load(folder)


@pytest.mark.parametrize("cls", ["ODESolution", "SimulationRun"])
@pytest.mark.parametrize("meta_extra", [{}, {"model": {"p": 2}}, {"t_diverged": None, "N": 3}])
def test_hostile_result_files_are_value_errors(tmp_path, cls, meta_extra):
    import json
    import zipfile

    from symquad.numeric.persist import FORMAT_VERSION
    path = tmp_path / "forged.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("meta.json", json.dumps({"kind": cls, "format_version": FORMAT_VERSION,
                                             **meta_extra}))
    loader = getattr(sq, cls).load
    with pytest.raises(ValueError, match="not a complete saved|saved model"):
        loader(path)


def test_saved_model_with_zero_denominator_is_a_value_error():
    from symquad.numeric.persist import model_from_dict, model_to_dict
    data = model_to_dict(sq.Model(p=2, p_star=1, lr=0.1))
    data["activation"] = ["0", "1/0"]
    with pytest.raises(ValueError, match="non-zero denominator"):
        model_from_dict(data)


def test_a_decimal_literal_beyond_float_is_exact_and_refused_by_float_routes():
    m = sq.Model(p=2, p_star=1, lr=0.1, activation="1e400*z")
    assert m.activation == (0, Fraction(10) ** 400)         # exact, like ("0", "1e400")
    with pytest.raises(ValueError, match="largest non-constant coefficient"):
        sq.kernels(m)

"""erf(z/√2) and ReLU through the model, derive, LaTeX and the command line (issue 17, phase 2).

* The model takes the names (student and teacher independently), prints their
  conventions everywhere (describe, LaTeX, repr) and round-trips through
  persistence, the task parameters and the CLI; the parser refuses other names
  and calls with a hint, evaluating nothing.
* ``sq.derive`` gives the tensor form: the closed forms as definitions, printed
  once, and the ODE as index sums; the printed definitions are what the kernels
  compute (second route: the displayed SymPy expressions lambdified against the
  generated functions), and the entry route refuses by name.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import sympy as sp

import symquad as sq
from symquad._describe import describe_model
from symquad.numeric import persist
from symquad.numeric.special import special_kernels
from symquad.studies.tasks import parse_activation
from symquad.symbolic import special as S
from symquad.symbolic import tensor as TT


# ---- the model -------------------------------------------------------------------------

def test_named_activations_and_their_conventions():
    m = sq.Model(p=3, p_star=2, lr=0.1, activation="ERF ", teacher_activation="relu")
    assert m.activation == "erf" and m.teacher_activation == "relu"
    assert (m.activation_kind, m.teacher_activation_kind) == ("erf", "relu")
    assert not m.is_polynomial and not m.is_quadratic
    assert m.describe() == "p = 3, p* = 2, η = 0.1, σ = erf(z/√2), σ* = max(0, z)"
    assert r"\operatorname{erf}(z/\sqrt{2})" in describe_model(m, tex=True)
    assert eval(repr(m), {"Model": sq.Model}) == m              # repr reads back
    assert sq.Model(p=3, p_star=2, lr=0.1, activation="erf").teacher_activation == "erf"
    with pytest.raises(ValueError, match="is not a polynomial"):
        m.degree
    assert m.structure_key != m.replace(activation="relu").structure_key


@pytest.mark.parametrize("text, what", [("tanh", "name 'tanh'"), ("erf(z)", "the call"),
                                        ("__import__('os')", "the call"),
                                        ("relu + z", "name 'relu'")])
def test_parser_refuses_other_names_and_calls(text, what):
    with pytest.raises(ValueError, match=what) as err:
        sq.Model(p=2, p_star=1, lr=0.1, activation=text)
    assert "'erf' or 'relu'" in str(err.value)


def test_persistence_tasks_and_cli_round_trip(tmp_path):
    m = sq.Model(p=3, p_star=2, lr=0.1, activation="relu", teacher_activation="erf",
                 weight_decay=0.1)
    d = persist.model_to_dict(m)
    assert d["activation"] == "relu" and d["teacher_activation"] == "erf"
    assert persist.model_from_dict(json.loads(json.dumps(d))) == m
    with pytest.raises(ValueError, match="names"):
        persist.model_from_dict({**d, "activation": "tanh"})
    assert parse_activation("erf") == "erf" and parse_activation("ReLU") == "relu"
    from symquad.cli._model_args import add_model_arguments, model_from_args
    import argparse
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args(["--p", "3", "--p-star", "2", "--activation", "erf",
                              "--teacher-activation", "relu"])
    assert model_from_args(args).activation == "erf"


# ---- derive and LaTeX -----------------------------------------------------------------

def test_derive_gives_the_tensor_form_with_closed_definitions():
    eq = sq.derive(sq.Model(p=5, p_star=2, lr=0.1, activation="erf", noise=0.1))
    assert eq.form == "tensor"
    names = {str(k.func) for k in eq.definitions}
    assert names == {"I_2", "J_2", "I_3", "I_4", "Lambda", "N"}
    tex = eq.latex()
    for fn in (r"I_{2}(a,b) &=", r"J_{2}(k,l) &=", r"I_{3}(k,j,a) &=", r"I_{4}(k,l,a,b) &="):
        assert tex.count(fn) == 1                                   # printed once
    assert r"\sum_{a,b=1}^{n} I_{4}(k,l,a,b)" in tex                # the ODE as index sums
    assert r"\operatorname{erf}(z/\sqrt{2})" in tex                 # the convention
    assert "C_{12}" not in tex and "Q_{12}" not in tex              # width independent
    with pytest.raises(ValueError, match="needs polynomial activations"):
        eq.explicit()
    for form in ("entries", "matrix"):
        with pytest.raises(ValueError):
            sq.derive(eq.model, form=form)


def _lambdified(expr):
    """Numeric function of a displayed definition (Λ, N replaced by their definitions)."""
    lam_def, n_def = S.fold_definitions()[0], S.fold_definitions()[2]
    def C(v, w):
        return TT.COV[TT.IDX[v], TT.IDX[w]]
    back = {}
    for sym in sp.Add(lam_def, n_def).free_symbols:
        back[sym] = C(sym.name[2], sym.name[3])
    lam, nab = lam_def.xreplace(back), n_def.xreplace(back)
    n_of = lambda x, y: nab.xreplace({C("a", "b"): C(x, y), C("k", "a"): C("k", x),   # noqa: E731
                                     C("l", "a"): C("l", x), C("k", "b"): C("k", y),
                                     C("l", "b"): C("l", y), C("a", "a"): C(x, x),
                                     C("b", "b"): C(y, y)}, )
    expr = expr.replace(lambda e: e.func == TT.LAMBDA_F, lambda e: lam)
    expr = expr.replace(lambda e: e.func == TT.N_F,
                        lambda e: n_of(str(e.args[2]), str(e.args[3])))
    entries = sorted((s for s in expr.free_symbols if isinstance(s, sp.Indexed)), key=str)
    fn = sp.lambdify(entries, expr, "numpy")
    return fn, [(str(s.indices[0]), str(s.indices[1])) for s in entries]


@pytest.mark.parametrize("student,teacher", [("erf", "erf"), ("erf", "relu"), ("relu", "erf"),
                                             ("z**2", "relu"), ("erf", "z**3 - 3*z")])
def test_printed_definitions_are_what_the_kernels_compute(student, teacher):
    m = sq.Model(p=3, p_star=2, lr=0.1, activation=student, teacher_activation=teacher)
    defs = sq.derive(m).definitions
    kern = special_kernels(m.activation, m.teacher_activation)
    rng = np.random.default_rng(1)
    G = rng.standard_normal((5, 7))
    C4 = G @ G.T / 7
    idx = dict(zip("kljab", range(5)))
    same = m.activation == m.teacher_activation
    generated = {"I_2": ("I2", ("aa", "ab", "bb")), "J_2": ("J2", ("kk", "kl", "ll")),
                 "I_3": ("I3", ("kk", "kj", "ka", "ja", "aa")),
                 "I_4": ("I4", ("kk", "kl", "ll", "ka", "kb", "la", "lb", "aa", "ab", "bb"))}
    checked = 0
    for key, value in defs.items():
        base, _, role = str(key.func).partition("^")
        role = role.strip("{}") or ("s" if base == "I_3" else "ss")
        if base not in generated or value in (TT.NO_CLOSED_FORM, TT.NOT_IMPLEMENTED_FORM):
            continue
        if len(set(map(str, key.args))) < len(key.args):
            continue                                       # the merged a = b form
        stem, args = generated[base]
        name = stem if base == "J_2" else f"{stem}_{role}"
        fn, entries = _lambdified(value)
        printed = fn(*[C4[idx[v], idx[w]] for v, w in entries])
        computed = getattr(kern, name)(*[C4[idx[x[0]], idx[x[1]]] for x in args])
        assert abs(printed - computed) < 1e-12 * max(1, abs(computed)), (key, name)
        checked += 1
    assert checked >= (4 if same else 6)


def test_fold_display_expands_to_the_fold():
    lam, nab = TT.fold_display()
    lam_def, _, n_def, _ = S.fold_definitions()
    assert sp.expand(lam - lam_def) == 0
    assert sp.expand(nab.xreplace({S.FOLD_SYMBOLS[0]: lam_def}) - n_def) == 0


def test_cli_equations_with_named_activations(capsys):
    # in this process (the command's exit status and streams; the process boundary of
    # `python -m symquad` is tested in tests/test_entry_points.py): saves three interpreter
    # starts with SymPy imports
    from symquad.cli import main

    def run(*a):
        status = main(["equations", *a])
        return status, capsys.readouterr()
    status, out = run("--activation", "erf", "--p", "64")
    assert status == 0 and r"\operatorname{erf}(z/\sqrt{2})" in out.out
    status, out = run("--activation", "erf", "--form", "entries")
    assert status == 2 and "needs polynomial activations" in out.err
    status, out = run("--activation", "tanh")
    assert status == 2 and "'erf' or 'relu'" in out.err


def test_sweep_grid_takes_the_names(tmp_path):
    """erf and relu as grid values: each point integrates its own model (equal to a direct
    integration), and an analysis derived for σ = c z² gives an error row naming it."""
    from symquad.studies.validation import informed_start
    df = sq.sweep("ode", {"p": [2], "p_star": [1], "lr": [0.5], "start": ["informed"],
                          "t_max": [4.0], "n_times": [9],
                          "activation": ["erf", "relu"],
                          "teacher_activation": [None, "erf"]}, tmp_path / "ode", workers=1)
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert set(df["activation"]) == {"erf", "relu"}
    for _, row in df.iterrows():
        teacher = None if row.teacher_activation != row.teacher_activation else \
            row.teacher_activation
        m = sq.Model(p=2, p_star=1, lr=0.5, activation=row.activation,
                     teacher_activation=teacher)
        sol = sq.integrate(m, *informed_start(m), np.eye(1), 4.0, t_eval=np.linspace(0, 4, 9))
        assert row.final_risk == sol.risk[-1], (row.activation, teacher)
    assert df["final_risk"].nunique() == 3       # (erf, None) is (erf, erf): three models
    plateau = sq.sweep("plateau", {"p": [2], "p_star": [1], "activation": ["erf"]},
                       tmp_path / "plateau", workers=1)
    assert plateau.iloc[0].status == "error" and "activation='erf'" in plateau.iloc[0].error

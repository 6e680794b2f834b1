"""The input spectrum (issue 24, docs/model.md §1a): the field, its state and its refusals.

``Model(spectrum=((f_1, s_1), …))``: inputs ``x ~ N(0, Σ_b s_b P_b)`` with blocks of
``f_b N`` directions.  Checked here: the field's validation (exact rational fractions
summing to 1, positive eigenvalues, ``B <= MAX_BLOCKS``; errors name ``spectrum``), its
text form and the caches it keys (``B`` only), the per-block state layout, and that every
stage which does not list ``spectrum`` in ``symquad.stages.STAGES`` refuses it by name.
"""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest

import symquad as sq
from symquad import stages
from symquad.numeric.layout import StateLayout, block_teacher, state_layout
from symquad.spectrum import MAX_BLOCKS, block_sizes, parse_spectrum, spectrum_text

TWO = ((Fraction(1, 4), Fraction(2)), (Fraction(3, 4), Fraction(3, 5)))


# --------------------------------------------------------------------------- the field
def test_default_is_isotropic_and_one_block_of_eigenvalue_one_is_the_default():
    m = sq.Model(2, 1, 0.1)
    assert m.spectrum == ((1, 1),) and m.n_blocks == 1
    assert sq.Model(2, 1, 0.1, spectrum="1:1") == m
    assert sq.Model(2, 1, 0.1, spectrum=((1.0, 1),)).changed_fields() == ()
    # one block with another eigenvalue is a different model (x ~ N(0, s I))
    assert sq.Model(2, 1, 0.1, spectrum="1:2").changed_fields() == ("spectrum",)


@pytest.mark.parametrize("value", [
    "0.25:2,0.75:0.6", "1/4:2,3/4:3/5", "1/4:2;3/4:3/5", ((0.25, 2), (0.75, 0.6)),
    [("1/4", "2"), (Fraction(3, 4), Fraction(3, 5))], ((Fraction(1, 4), 2), (0.75, "0.6"))])
def test_every_form_gives_the_same_exact_spectrum(value):
    m = sq.Model(3, 2, 0.1, spectrum=value)
    assert m.spectrum == TWO
    assert all(isinstance(x, Fraction) for pair in m.spectrum for x in pair)
    assert spectrum_text(m.spectrum) == "1/4:2,3/4:3/5"
    assert eval(repr(m), {"Model": sq.Model}) == m                 # repr reads back


@pytest.mark.parametrize("value, message", [
    ("0.3:1,0.3:1", r"sum to 1 exactly .*got 3/5"),
    # thirds as floats: the shortest decimals sum to 0.9999999999999999, not 1
    (((1 / 3, 1), (1 / 3, 2), (1 / 3, 3)), r"sum to 1 exactly.*as fractions"),
    ("1:0", r"eigenvalue s_1 must be in \[1e-100, 1e100\]"),
    ("1/2:1,1/2:-2", r"eigenvalue s_2 must be in"),
    ("1/2:1,1/2:1e101", r"eigenvalue s_2 must be in"),
    ("0:1,1:1", r"fraction f_1 must be in \(0, 1\]"),
    ("3/2:1,-1/2:1", r"fraction f_1 must be in \(0, 1\]"),
    ("1:nan", r"eigenvalue s_1 must be a finite rational"),
    ("1:inf", r"eigenvalue s_1 must be a finite rational"),
    ("a:1", r"fraction f_1 must be a finite rational"),
    ("1:2:3", r"block 1 must be 'fraction:eigenvalue'"),
    ("1/2:1,", r"block 2 must be 'fraction:eigenvalue'"),
    ("", r"must not be empty"),
    ((), r"at least one block"),
    (((1, 2, 3),), r"block 1 must be a pair"),
    (",".join(["1/300:1"] * 300), rf"B must be in \[1, {MAX_BLOCKS}\]"),
])
def test_bad_spectra_are_refused_naming_the_field(value, message):
    with pytest.raises(ValueError, match=message) as info:
        sq.Model(2, 1, 0.1, spectrum=value)
    assert str(info.value).startswith("spectrum")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value", [0.5, None, b"1:1", {"1": 1}, ((1, True),)])
def test_spectra_of_the_wrong_type_are_type_errors_naming_the_field(value):
    with pytest.raises(TypeError, match="spectrum"):
        sq.Model(2, 1, 0.1, spectrum=value)


def test_the_largest_number_of_blocks_is_accepted():
    text = ",".join([f"1/{MAX_BLOCKS}:{b + 1}" for b in range(MAX_BLOCKS)])
    assert sq.Model(1, 1, 0.1, spectrum=text).n_blocks == MAX_BLOCKS


def test_block_sizes_need_n_a_multiple_of_the_common_denominator():
    assert block_sizes(TWO, 1000) == (250, 750)
    assert block_sizes(parse_spectrum("1/3:1,1/6:2,1/2:3"), 12) == (4, 2, 6)
    with pytest.raises(ValueError, match=r"N must be a multiple of 4 .*got N = 1002"):
        block_sizes(TWO, 1002)


# --------------------------------------------------------------------------- the caches
def test_the_structure_key_holds_the_number_of_blocks_not_the_values():
    """Kernels are generated once per B (and structure): fractions and eigenvalues are
    call-time values; an isotropic model keys nothing new."""
    base = sq.Model(3, 2, 0.1)
    a = base.replace(spectrum="1/4:2,3/4:3/5")
    b = base.replace(spectrum="1/2:7,1/2:1/9")
    c = base.replace(spectrum="1/4:2,1/4:1,1/2:3")
    assert a.structure_key == b.structure_key
    assert len({base.structure_key, a.structure_key, c.structure_key}) == 3
    assert "spectrum=B=2" in a.structure_text() and "spectrum" not in base.structure_text()
    assert a.stand_in() == b.stand_in() != c.stand_in()
    assert a.stand_in().n_blocks == 2 and "spectrum" in a.stand_in().changed_fields()
    one = base.replace(spectrum="1:3")
    assert one.stand_in().changed_fields() == ("spectrum",)          # not the isotropic model


# --------------------------------------------------------------------------- the state
def test_the_state_layout_has_a_block_axis_for_a_spectrum():
    lay = state_layout(sq.Model(2, 1, 0.1, spectrum="1/4:2,3/4:3/5", lr_readout=0.1))
    assert (lay.spectrum_blocks, lay.dim) == (2, 2 * 3 + 2 * 2 + 2)
    assert lay.names == ("Qb1_1_1", "Qb1_1_2", "Qb1_2_2", "Qb2_1_1", "Qb2_1_2", "Qb2_2_2",
                         "rhob1_1_1", "rhob1_2_1", "rhob2_1_1", "rhob2_2_1", "a_1", "a_2")
    rng = np.random.default_rng(0)
    Q = rng.standard_normal((5, 2, 2, 2))
    Q = Q + np.swapaxes(Q, -1, -2)
    rho, a = rng.standard_normal((5, 2, 2, 1)), rng.standard_normal((5, 2))
    x = lay.pack(Q, rho, a)
    assert x.shape == (5, lay.dim)
    assert x[3, lay.index("Qb2_1_2")] == Q[3, 1, 0, 1]
    assert x[3, lay.index("rhob2_2_1")] == rho[3, 1, 1, 0]
    Q2, rho2, a2 = lay.unpack(x)
    np.testing.assert_array_equal(Q2, Q)
    np.testing.assert_array_equal(rho2, rho)
    np.testing.assert_array_equal(a2, a)
    with pytest.raises(ValueError, match=r"end in shapes \(2, 2, 2\) and \(2, 2, 1\)"):
        lay.pack(Q[:, 0], rho[:, 0], a)
    # one block with an eigenvalue other than 1 keeps the block axis; isotropic has none
    assert state_layout(sq.Model(2, 1, 0.1, spectrum="1:2")).spectrum_blocks == 1
    assert state_layout(sq.Model(2, 1, 0.1)) == StateLayout(2, 1, False)


def test_the_default_teacher_is_spread_over_the_blocks_by_their_fractions():
    m = sq.Model(2, 2, 0.1, spectrum="1/4:2,3/4:3/5")
    T = np.array([[1.0, 0.3], [0.3, 2.0]])
    Tb = block_teacher(m, T)
    assert Tb.shape == (2, 2, 2)
    np.testing.assert_array_equal(Tb[0], 0.25 * T)
    np.testing.assert_allclose(Tb.sum(0), T, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match=r"T must end in shape \(2, 2\)"):
        block_teacher(m, np.eye(3))


def test_a_finite_n_teacher_split_concentrates_on_the_fractions():
    """Second route for T^b = f_b T: rows of a Gaussian teacher cut into coordinate blocks."""
    m = sq.Model(1, 2, 0.1, spectrum="1/4:2,3/4:3/5")
    N = 40_000
    W = np.random.default_rng(3).standard_normal((2, N))
    sizes = block_sizes(m.spectrum, N)
    cuts = np.cumsum((0,) + sizes)
    Tb = np.stack([W[:, cuts[b]:cuts[b + 1]] @ W[:, cuts[b]:cuts[b + 1]].T / N
                   for b in range(2)])
    # entries fluctuate by ~ sqrt(2 f_b / N) <= 0.0062: 6 sigma
    np.testing.assert_allclose(Tb, block_teacher(m, W @ W.T / N), rtol=0, atol=0.04)


# --------------------------------------------------------------------------- default-deny
def _stage_calls():
    import test_default_deny
    return test_default_deny.STAGE_CALLS


@pytest.mark.parametrize("stage", sorted(stages.STAGES))
def test_every_stage_that_does_not_list_it_refuses_the_spectrum(stage, monkeypatch):
    from symquad.studies import tasks
    model = sq.Model(2, 1, 0.1, spectrum="1/4:2,3/4:3/5")
    monkeypatch.setattr(tasks, "task_model", lambda **values: model)
    if "spectrum" in stages.STAGES[stage]:
        pytest.skip(f"{stage} implements the spectrum (its own tests)")
    with pytest.raises(ValueError) as info:
        _stage_calls()[stage](model)
    assert re.search(r"\bspectrum=1/4:2,3/4:3/5\b", str(info.value)), str(info.value)


def test_the_cli_reads_the_flag_and_refuses_a_malformed_one_in_one_line(capsys):
    from symquad.cli import main
    assert main(["equations", "--spectrum", "0.25:2,0.75"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "spectrum: block 2 must be 'fraction:eigenvalue'" in err[0], err
    assert main(["equations", "--spectrum", "0.5:2,0.6:1"]) == 2
    assert "spectrum: the fractions must sum to 1 exactly" in capsys.readouterr().err


def test_saved_files_keep_the_text_and_read_it_back():
    from symquad.numeric.persist import model_from_dict, model_to_dict
    d = model_to_dict(sq.Model(2, 1, 0.1))
    assert d["spectrum"] == "1:1"
    assert model_from_dict({**d, "spectrum": "1/4:2,3/4:3/5"}).spectrum == TWO
    old = {k: v for k, v in d.items() if k != "spectrum"}      # a file from before the field
    assert model_from_dict(old).spectrum == ((1, 1),)
    with pytest.raises(ValueError, match="spectrum"):
        model_from_dict({**d, "spectrum": [["1", "1"]]})


# --------------------------------------------------------------------------- step 5
#: public entry points that implement the spectrum (their own tests: test_spectrum_*.py)
IMPLEMENTED = {"derive", "kernels", "integrate", "simulate", "validate", "compare"}


@pytest.mark.parametrize("entry", sorted(__import__("test_default_deny").CALLS))
def test_every_other_public_entry_point_refuses_the_spectrum_by_name(entry):
    import test_default_deny
    if entry in IMPLEMENTED:
        pytest.skip(f"{entry} implements the spectrum")
    model = sq.Model(2, 1, 0.1, spectrum="1/4:2,3/4:3/5")
    with pytest.raises((ValueError, NotImplementedError)) as info:
        test_default_deny.CALLS[entry](model)
    assert re.search(r"\bspectrum\b", str(info.value)), str(info.value)


def test_saved_runs_and_solutions_keep_the_blocks(tmp_path):
    m = sq.Model(2, 1, 0.2, spectrum="1/4:2,3/4:1/2", lr_readout=0.1)
    run = sq.simulate(m, N=40, t_max=0.5, replicas=3, seed=1)
    back = sq.SimulationRun.load(run.save(tmp_path / "run.npz"))
    assert back.model == m and back.Q.shape == (3, len(run.t), 2, 2, 2)
    np.testing.assert_array_equal(back.Q, run.Q)
    np.testing.assert_array_equal(back.T, run.T)
    np.testing.assert_array_equal(back.readout, run.readout)
    sol = sq.integrate(m, run.Q[0, 0], run.rho[0, 0], run.T, 1.0)
    again = sq.ODESolution.load(sol.save(tmp_path / "sol.npz"))
    assert again.model == m
    np.testing.assert_array_equal(again.Q, sol.Q)
    np.testing.assert_array_equal(again.risk, sol.risk)


def test_the_spectrum_is_a_grid_axis_of_the_ode_task(tmp_path):
    from symquad.studies.store import point_key
    from symquad.studies.tasks import get_task
    task = get_task("ode")
    keys = {point_key(task.name, task.version, task.bind(dict(p=2, p_star=1, spectrum=s)))
            for s in ("0.25:2;0.75:0.6", "1/4:2,3/4:3/5", ((0.25, 2), (0.75, 0.6)))}
    assert len(keys) == 1
    grid = {"p": [3], "p_star": [2], "lr": [0.2], "start": ["informed"], "t_max": [10.0],
            "n_times": [6], "spectrum": ["1:1", "1/4:2;3/4:3/5"]}
    df = sq.sweep("ode", grid, tmp_path / "s", workers=1).sort_values("spectrum")
    assert list(df.status) == ["ok", "ok"]
    # the task's informed start, split like the isotropic teacher, integrated directly
    from symquad.numeric.layout import block_teacher
    from symquad.studies.validation import informed_start
    m = sq.Model(3, 2, 0.2, spectrum="1/4:2,3/4:3/5")
    f = np.array([0.25, 0.75])[:, None, None]
    Q0, rho0 = (f * x for x in informed_start(m.replace(spectrum="1:1"), 0.5))
    sol = sq.integrate(m, Q0, rho0, block_teacher(m, np.eye(2)), 10.0,
                       t_eval=np.linspace(0, 10, 6), on_divergence="stop")
    row = df[df.spectrum == "1/4:2,3/4:3/5"].iloc[0]
    assert row.final_risk == sol.risk[-1]
    assert row.final_risk != df[df.spectrum == "1:1"].iloc[0].final_risk


def test_survival_has_the_spectrum_row_refused_with_its_reasons():
    from symquad.survival import survival_models, survival_table
    labels = dict(survival_models())
    assert labels["spectrum = 1/4:2,3/4:1/2"].spectrum == parse_spectrum("1/4:2,3/4:1/2")
    table = survival_table(models=[("spectrum", sq.Model(3, 2, 0.1, spectrum="1/4:2,3/4:1/2"))])
    (_, _, cells), = table.rows
    for key, cell in cells.items():
        assert cell.status == "not derived", (key, cell)
        assert cell.note.startswith("spectrum: ") and "not re-derived" in cell.note, (key, cell.note)


# --------------------------------------------------------------------------- power laws
def test_power_law_spectrum_is_the_normalised_truncation():
    spectrum, teacher = sq.power_law_spectrum(1.5, 8, teacher_exponent=0.5)
    f = np.array([float(x) for x, _ in spectrum])
    s = np.array([float(x) for _, x in spectrum])
    j = np.arange(1, 9)
    np.testing.assert_allclose(f, 1 / 8, rtol=0, atol=0)
    np.testing.assert_allclose(s, j ** -1.5 / np.mean(j ** -1.5), rtol=1e-15)
    assert sum(a * b for a, b in spectrum) == 1                 # tr Σ/N = 1 exactly
    np.testing.assert_allclose(teacher, j ** -0.5 / np.sum(j ** -0.5), rtol=1e-15)
    assert sum(teacher) == pytest.approx(1.0, abs=1e-15)
    assert sq.Model(2, 1, 0.1, spectrum=spectrum).n_blocks == 8
    flat, iso = sq.power_law_spectrum(0.0, 4)
    assert all(s == 1 for _, s in flat) and iso == (0.25,) * 4
    assert sq.power_law_spectrum(3.0, 1)[0] == ((1, 1),)
    for bad, message in (((-1, 3), "alpha must be in"), ((1, 0), "L must be an integer"),
                         ((1, 3, 21), "teacher_exponent must be in"),
                         ((float("nan"), 3), "alpha must be finite")):
        with pytest.raises(ValueError, match=message):
            sq.power_law_spectrum(*bad)
    with pytest.raises(TypeError, match="alpha"):
        sq.power_law_spectrum("1", 3)

"""The model specification: fields, validation, defaults, persistence, refusal, CLI flags.

The heavy checks of the fields (routes agree, Monte Carlo of one N-dimensional step,
reduced vs full simulator) are in tests/test_model_fields_*.py.
"""

from fractions import Fraction

import numpy as np
import pytest
import sympy as sp

import symquad as sq
from symquad.numeric.persist import model_from_dict, model_to_dict
from symquad.spec import (CLASSIC_FIELDS, KERNEL_PARAMS, default_readout, model_fields,
                          require)

FULL = dict(teacher_activation="z**3 - 3*z", readout=(1, "1/2", -2), teacher_readout="1/3",
            lr_readout=0.2, weight_decay=0.1, batch_size=4, constraint="sphere")


def test_defaults_are_the_classic_model():
    m = sq.Model(3, 2, 0.2)
    assert m.changed_fields() == ()
    assert m.readout == default_readout(3) and m.teacher_readout == (Fraction(1, 2),) * 2
    assert m.teacher_activation == m.activation and not m.readout_trained
    assert repr(m) == ("Model(p=3, p_star=2, lr=0.2, noise=0.0, activation='z**2', "
                       "lr_scaling='fixed')")
    # the kernels of symquad 0.2 were keyed by the same text
    assert m.structure_key == sq.Model(3, 2, 0.7, weight_decay=0.3, batch_size=5,
                                       readout=1).structure_key


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(weight_decay=-0.1), ValueError, r"weight_decay \(L2 weight decay\) must be >= 0"),
    (dict(weight_decay="x"), TypeError, "weight_decay must be a real number"),
    (dict(lr_readout=float("inf")), ValueError, "lr_readout must be finite"),
    (dict(batch_size=0), ValueError, r"batch_size must be an integer in \[1, "),
    (dict(batch_size=2.5), TypeError, "batch_size must be an integer"),
    (dict(batch_size=True), TypeError, "batch_size must be an integer"),
    (dict(constraint="ball"), ValueError, "constraint must be one of"),
    (dict(readout=(1, 2)), ValueError, "readout must have length p = 3"),
    (dict(teacher_readout=(1, 2, 3)), ValueError, "teacher_readout must have length p_star = 2"),
    (dict(readout=(1, "x", 2)), ValueError, r"readout\[1\] must be a rational number"),
    (dict(readout=object()), TypeError, "readout must be a number or a sequence"),
    (dict(teacher_activation="exp(z)"), ValueError, "teacher_activation: "),
    (dict(teacher_activation="3"), ValueError, "teacher_activation: .*non-constant"),
])
def test_bad_field_values_name_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        sq.Model(3, 2, 0.1, **kwargs)


def test_repr_round_trips_and_describe_names_every_change():
    m = sq.Model(3, 2, 0.1, **FULL)
    assert eval(repr(m), {"Model": sq.Model}) == m
    text = m.describe()
    for piece in ("σ* = z³ − 3z", "a = (1, 1/2, -2)", "b = 1/3", "η_a = 0.2", "λ = 0.1",
                  "batch = 4", "sphere"):
        assert piece in text, (piece, text)
    assert set(m.changed_fields()) == set(FULL)


def test_replace_keeps_defaults_following_the_widths():
    m = sq.Model(3, 2, 0.1)
    assert m.replace(p=5).readout == default_readout(5)
    assert m.replace(activation="z**3").teacher_activation == sq.Model(1, 1, 1.0,
                                                                       activation="z**3").activation
    ones = sq.Model(3, 2, 0.1, readout=1)
    assert ones.replace(p=6).readout == (1,) * 6           # a uniform readout keeps its value
    vector = sq.Model(3, 2, 0.1, readout=(1, 2, 3))
    with pytest.raises(ValueError, match="readout must have length p = 4"):
        vector.replace(p=4)
    teacher = sq.Model(3, 2, 0.1, teacher_activation="z**4")
    assert teacher.replace(activation="z**3").teacher_activation == teacher.teacher_activation
    with pytest.raises(TypeError, match="no field"):
        m.replace(width=3)


def test_persistence_round_trips_every_field_and_reads_old_files():
    m = sq.Model(3, 2, 0.1, **FULL)
    d = model_to_dict(m)
    assert set(d) == {f.name for f in model_fields()}
    assert model_from_dict(d) == m
    old = {key: d[key] for key in CLASSIC_FIELDS}          # a file of symquad 0.2
    old["activation"] = ["0", "0", "1"]
    assert model_from_dict(old) == sq.Model(3, 2, 0.1)
    with pytest.raises(ValueError, match="keys"):
        model_from_dict({**d, "momentum": 0.9})


def test_require_refuses_unsupported_fields_by_name():
    m = sq.Model(3, 2, 0.1, weight_decay=0.1, batch_size=2)
    assert require(sq.Model(3, 2, 0.1), "plateau") is not None
    assert require(m, "plateau", supports=("weight_decay", "batch_size")) is m
    with pytest.raises(ValueError, match=r"plateau does not support .*batch_size=2"):
        require(m, "plateau", supports=("weight_decay",))
    with pytest.raises(ValueError, match="weight_decay=0.1.*batch_size=2"):
        require(m, "escape_time")


def test_kernel_parameters_come_from_the_field_metadata():
    from symquad.symbolic.symbols import PARAMS
    m = sq.Model(3, 2, 0.1, lr_scaling="width", noise=0.3, weight_decay=0.2, batch_size=3)
    params = m.kernel_params()
    assert tuple(params) == KERNEL_PARAMS == tuple(s.name for s in PARAMS)
    assert params == {"eta": pytest.approx(0.3), "Delta": 0.3, "lr_readout": 0.0,
                      "weight_decay": 0.2, "batch_size": 3.0}


def test_drift_of_each_feature_from_the_update_rule():
    """The symbolic drift shows each feature's term (an independent reading of model.md §2)."""
    from symquad.symbolic.moments import MB, MG, MR, moment_drift
    from symquad.symbolic.symbols import BATCH, ETA, ETA_READOUT, WEIGHT_DECAY
    from symquad.symbolic.update import UNITS, Af, Qf
    k, l, _ = UNITS
    plain = moment_drift(sq.Model(2, 1, 0.1))
    expected = (-2 * ETA * WEIGHT_DECAY * Qf(k, l) - ETA * (Af(k) * MG(k, l) + Af(l) * MG(l, k))
                + ETA**2 / BATCH * Af(k) * Af(l) * MB(k, l))
    assert sp.expand(plain.dQ - expected) == 0
    assert plain.da is None
    trained = moment_drift(sq.Model(2, 1, 0.1, lr_readout=0.3))
    assert sp.expand(trained.da + ETA_READOUT * MR(k)) == 0
    sphere = moment_drift(sq.Model(2, 1, 0.1, constraint="sphere"))
    assert not sphere.dQ.has(WEIGHT_DECAY) and not sphere.drho.has(WEIGHT_DECAY)
    # on the sphere the diagonal does not move: dQ_kk = 0 identically
    assert sp.simplify(sphere.dQ.xreplace({l: k})) == 0


def test_kernels_refuse_a_readout_argument_for_a_fixed_readout():
    k = sq.kernels(sq.Model(2, 1, 0.1))
    with pytest.raises(ValueError, match="a \\(the student readout\\) is state only"):
        k.rhs(np.eye(2), np.zeros((2, 1)), np.eye(1), a=np.ones(2))
    trained = sq.kernels(sq.Model(2, 1, 0.1, lr_readout=0.1))
    assert trained.blocks == ("Q", "rho", "a")
    assert len(trained.rhs(np.eye(2), 0.1 * np.ones((2, 1)), np.eye(1), a=np.ones(2))) == 3
    with pytest.raises(ValueError, match=r"must end in shape \(2,\)"):
        trained.rhs(np.eye(2), np.zeros((2, 1)), np.eye(1), a=np.ones(3))


def test_sphere_start_must_be_on_the_sphere():
    m = sq.Model(2, 1, 0.1, constraint="sphere")
    with pytest.raises(ValueError, match="Q0: with constraint='sphere'"):
        sq.integrate(m, 2 * np.eye(2), np.zeros((2, 1)) + 0.1, np.eye(1), t_max=1.0)
    sol = sq.integrate(m, np.eye(2), np.array([[0.3], [0.1]]), np.eye(1), t_max=5.0)
    np.testing.assert_allclose(np.diagonal(sol.Q, axis1=1, axis2=2), 1.0, atol=1e-9)


def test_every_field_is_a_flag_and_bad_values_exit_2_naming_the_field(capsys):
    from symquad.cli import build_parser
    help_text = build_parser().parse_args(["equations", "--p", "2"])  # parses
    assert help_text.p == 2
    for f in model_fields():
        if f.name in ("lr", "noise", "lr_scaling"):
            continue
        assert f.metadata["flag"] in build_parser()._subparsers._group_actions[0].choices[
            "equations"].format_help(), f.name
    # in this process (exit status and stderr; two interpreter starts saved)
    from symquad.cli import main
    status, err = main(["equations", "--batch-size", "0"]), capsys.readouterr().err
    assert status == 2 and "batch_size" in err and "Traceback" not in err
    status, err = main(["equations", "--readout", "1,2"]), capsys.readouterr().err
    assert status == 2 and "readout must have length p = 3" in err

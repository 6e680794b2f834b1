import os
import pickle
import subprocess
import sys
from fractions import Fraction

import pytest

from symquad import Model


def test_defaults_and_derived_quantities():
    m = Model(p=3, p_star=2, lr=0.2)
    assert m.activation == (0, 0, 1) and m.activation_str == "z**2"
    assert m.is_quadratic and m.degree == 2 and m.noise == 0.0
    assert m.eta == 0.2
    assert Model(p=3, p_star=2, lr=0.2, lr_scaling="width").eta == pytest.approx(0.6)


def test_frozen_hashable_and_equal():
    a, b = Model(p=2, p_star=1, lr=0.1), Model(p=2, p_star=1, lr=0.1, activation="z**2")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.p = 3
    assert pickle.loads(pickle.dumps(a)) == a


@pytest.mark.parametrize("kwargs, match", [
    (dict(p=0, p_star=1, lr=0.1), r"p must be an integer in \[1, 4096\]"),
    (dict(p=2, p_star=0, lr=0.1), r"p_star must be an integer in \[1, 4096\]"),
    (dict(p=2, p_star=1, lr=0.0), r"lr must be > 0"),
    (dict(p=2, p_star=1, lr=-1.0), r"lr must be > 0"),
    (dict(p=2, p_star=1, lr=0.1, noise=-0.5), r"noise .* must be >= 0"),
    (dict(p=2, p_star=1, lr=float("nan")), r"lr must be finite"),
    (dict(p=2, p_star=1, lr=0.1, activation="sin(z)"), r"polynomial in z"),
    (dict(p=2, p_star=1, lr=0.1, activation="z**2 + y"), r"polynomial in z alone"),
    (dict(p=2, p_star=1, lr=0.1, activation="1/z"), r"polynomial in z"),
    (dict(p=2, p_star=1, lr=0.1, activation="3"), r"non-constant"),
    (dict(p=2, p_star=1, lr=0.1, lr_scaling="sqrt"), r"lr_scaling must be one of"),
])
def test_bad_values_name_the_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Model(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(p=2.5, p_star=1, lr=0.1), dict(p=True, p_star=1, lr=0.1),
                                    dict(p=2, p_star=1, lr="fast")])
def test_wrong_types(kwargs):
    with pytest.raises(TypeError):
        Model(**kwargs)


def test_activation_forms_agree():
    a = Model(p=1, p_star=1, lr=1, activation="z**3/3 + z/2 + 1")
    b = Model(p=1, p_star=1, lr=1, activation=(1, Fraction(1, 2), 0, Fraction(1, 3)))
    c = Model(p=1, p_star=1, lr=1, activation=[1, 0.5, 0, Fraction(1, 3), 0])
    assert a == b == c and not a.is_quadratic and a.degree == 3
    assert Model(p=1, p_star=1, lr=1, activation="2*z**2 + 5").is_quadratic
    assert not Model(p=1, p_star=1, lr=1, activation="z**2 + z").is_quadratic


def test_structure_key_is_stable_across_processes():
    code = "from symquad import Model; print(Model(p=3, p_star=2, lr=0.7).structure_key)"
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout.strip()
            for seed in ("0", "1", "2")}
    assert keys == {Model(p=3, p_star=2, lr=0.1).structure_key}
    assert Model(p=3, p_star=2, lr=0.1).structure_key != Model(p=2, p_star=3, lr=0.1).structure_key

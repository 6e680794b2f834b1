"""Default-deny: a field added through docs/extending.md is refused everywhere until a stage
opts in, and no cache or committed module is shared by models that differ in a field.

The synthetic fields are built from the recipe blocks of docs/extending.md (one per kind
of field: ``param``, ``structure``, ``time``), exactly as the page tells a contributor
to write them in ``symquad/spec.py``: here in a subclass of :class:`symquad.Model`, so
that the real specification is untouched.  Every public name of ``symquad.__all__``
and every CLI command is either called with the synthetic model (and must refuse it,
naming the field, before any work) or listed below as taking no model, with the
reason: a public name added later without either makes the test fail.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pytest

import symquad as sq
from symquad import spec, stages

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
KINDS = ("param", "structure", "time")


# --------------------------------------------------------------------------- the recipe
def recipe_blocks() -> dict:
    """``{kind: python source}``: the field declaration the page gives for each kind."""
    text = DOC.read_text(encoding="utf-8")
    blocks = dict(re.findall(r"<!-- recipe: (\w+) -->\s*```python\n(.*?)```", text, re.S))
    assert set(blocks) == set(KINDS), f"docs/extending.md gives recipes for {sorted(blocks)}"
    return blocks


def synthetic_class(kind: str):
    """A Model subclass with the one field of `kind` that docs/extending.md declares."""
    source = recipe_blocks()[kind]
    namespace = {"field": field, "_meta": spec._meta, "Model": spec.Model,
                 "MAX_DEGREE": spec.MAX_DEGREE}
    body = "\n".join("    " + line for line in source.splitlines())
    exec(f"class Synthetic(Model):\n{body}\n", namespace)       # the page's own text
    cls = dataclass(frozen=True, repr=False)(namespace["Synthetic"])
    added = [f for f in fields(cls) if f.name not in spec._FIELDS]
    assert len(added) == 1, "each recipe block declares one field"
    assert added[0].metadata["role"] == kind
    return cls, added[0]


def off_value(f):
    """A value of field `f` away from its default (what a user switching it on gives)."""
    if f.metadata["kind"] == "choice":
        return next(c for c in f.metadata["choices"] if c != f.default)
    return 0.5


def synthetic_model(kind: str, **values):
    cls, f = synthetic_class(kind)
    model = cls(**{"p": 2, "p_star": 1, "lr": 0.1, **values, f.name: off_value(f)})
    assert f.name in model.changed_fields()
    return model, f.name


@pytest.fixture(params=KINDS)
def synthetic(request):
    return synthetic_model(request.param)


# --------------------------------------------------------------------------- entry points
def _overlaps(m):
    rng = np.random.default_rng(0)
    G = rng.standard_normal((m.p + m.p_star, m.p + m.p_star + 3))
    C = G @ G.T / (m.p + m.p_star + 3)
    return C[:m.p, :m.p], C[:m.p, m.p:], C[m.p:, m.p:]


def _trajectories(m, R=4):
    Q, rho, T = _overlaps(m)
    t = np.linspace(0.0, 1.0, 3)
    return t, np.broadcast_to(Q, (R, 3) + Q.shape).copy(), \
        np.broadcast_to(rho, (R, 3) + rho.shape).copy(), T


def _weights(m, N=12):
    rng = np.random.default_rng(1)
    return rng.standard_normal((m.p, N)), rng.standard_normal((m.p_star, N))


#: public name -> a call with the model (each must raise, naming the field)
CALLS = {
    "derive": lambda m: sq.derive(m),
    "kernels": lambda m: sq.kernels(m),
    "integrate": lambda m: sq.integrate(m, *_overlaps(m), 1.0),
    "fluctuations": lambda m: sq.fluctuations(m, *_overlaps(m), 1000, [0.0, 1.0]),
    "simulate": lambda m: sq.simulate(m, N=50, t_max=0.1, replicas=2),
    "validate": lambda m: sq.validate(m, N=50, t_max=1.0, replicas=4),
    "compare": lambda m: sq.compare(m, *_trajectories(m)),
    "closest_solution": lambda m: sq.closest_solution(m, *_overlaps(m)[:2], _overlaps(m)[2]),
    "manifold_dimension": lambda m: sq.manifold_dimension(model=m),
    "zero_risk_point": lambda m: sq.zero_risk_point(np.eye(m.p)[:, :m.p_star], model=m),
    "random_manifold_points": lambda m: sq.random_manifold_points(
        m.p, m.p_star, 2, np.random.default_rng(0), model=m),
    "invariant_set_point": lambda m: sq.invariant_set_point(
        m.p, m.p_star, np.random.default_rng(0), model=m),
    "invariant_drift_study": lambda m: sq.invariant_drift_study(m, [50], 0.1, 2, 0),
    "hessian_spectrum": lambda m: sq.hessian_spectrum(m),
    "plateau": lambda m: sq.plateau(m),
    "escape_time": lambda m: sq.escape_time(m, 1000),
    "critical_weights": lambda m: sq.critical_weights(m, "plateau", 12),
    "weight_hessian": lambda m: sq.weight_hessian(m, *_weights(m)),
    "escape_threshold": lambda m: sq.escape_threshold(m),
    "weight_objective": lambda m: sq.weight_objective(m, *_weights(m)),
    "conservation_verdict": lambda m: sq.conservation_verdict(m),
    "survival_table": lambda m: sq.survival_table(m),
    "tau_from_t": lambda m: sq.tau_from_t(m, 1.0),
    "t_from_tau": lambda m: sq.t_from_tau(m, 1.0),
    "rate_per_tau": lambda m: sq.rate_per_tau(m, 1.0),
    "to_unnormalised": lambda m: sq.to_unnormalised(m),
    "overlaps_from_unnormalised": lambda m: sq.overlaps_from_unnormalised(m, *_overlaps(m)),
    "overlaps_to_unnormalised": lambda m: sq.overlaps_to_unnormalised(m, *_overlaps(m)),
    "optimal_schedule": lambda m: sq.optimal_schedule(m, 1.0, rho0=_overlaps(m)[1],
                                                      lr_max=1.0, n_pieces=1, maxiter=1),
}

#: public names that take no model, and why that is safe
NO_MODEL = {
    "Model": "the specification itself",
    "DEFAULT_MODEL": "a constant (the classic model)",
    "ArgumentParser": "argparse with allow_abbrev=False and one-line errors (no model)",
    "LR_SCALINGS": "a constant",
    "Equations": "built by derive (refuses)",
    "Kernels": "built by kernels (refuses); its methods: test_kernel_methods_declare_",
    "ODESolution": "built by integrate (refuses); save: saved files (test_saved_files_refuse)",
    "DivergenceError": "an exception",
    "Fluctuations": "built by fluctuations (refuses)",
    "StateLayout": "built from (p, p*, trained) by state_layout (refuses)",
    "SimulationRun": "built by simulate (refuses); save: saved files",
    "ValidationReport": "built by validate/compare (refuse); save: saved files",
    "ZeroRiskPoint": "a result type",
    "OptimalSchedule": "a result type (built by optimal_schedule, which refuses)",
    "optimal_schedule_figure": "plots an OptimalSchedule (optimal_schedule refuses)",
    "EscapePrediction": "a result type",
    "PlateauFixedPoint": "a result type",
    "HessianSpectrum": "a result type",
    "invariant_S": "a function of rho alone (S = rho^T rho)",
    "invariant_set_defect": "a function of (Q, rho, T) alone",
    "escape_times": "a function of a risk curve and a threshold",
    "power_law_spectrum": "builds a spectrum (a field value) from numbers",
    "power_law_curve_study": "builds its Model from numbers (the stages it calls declare)",
    "power_law_escape_study": "builds its Model from numbers (the stages it calls declare)",
    "power_law_figure": "results", "power_law_escape_figure": "results",
    "from_unnormalised": "returns a classic Model from numbers",
    "plot_invariant_drift": "plots a study (invariant_drift_study refuses)",
    "sweep": "runs a task: every built-in task refuses (test_sweep_tasks_refuse)",
    "dask_client": "no model", "connect_scheduler": "no model", "run_main": "no model",
    "load_sweep": "reads a store", "load_sweep_arrays": "reads a store",
    "register_task": "registers a function; model tasks declare their fields",
    "list_tasks": "no model", "escape_sweep_summary": "a table of results",
    "save_figure": "a figure", "sweep_errorbar_figure": "a table of results",
    "sweep_escape_figure": "a table of results", "sweep_heatmap_figure": "a table of results",
    "escape_sweep_figures": "a table of results", "escape_risk_curves_figure": "results",
    "hessian_spectra_figure": "results", "S_trajectories_figure": "results",
    "distance_strip_figure": "results",
    "phases_figure": "plots a solution (integrate refuses); the model only titles it",
}


def test_every_public_name_is_called_or_takes_no_model():
    both = set(CALLS) & set(NO_MODEL)
    assert not both, f"listed twice: {sorted(both)}"
    missing = sorted(set(sq.__all__) - set(CALLS) - set(NO_MODEL))
    assert not missing, (f"public names {missing} are neither called with a synthetic field "
                         f"(CALLS) nor listed as taking no model (NO_MODEL)")
    stale = sorted((set(CALLS) | set(NO_MODEL)) - set(sq.__all__))
    assert not stale, f"not public (any more): {stale}"


def _refused(call, model, name):
    with pytest.raises((ValueError, NotImplementedError)) as info:
        call(model)
    assert re.search(rf"\b{name}\b", str(info.value)), \
        f"refused, but without naming the field {name!r}: {info.value}"


@pytest.mark.parametrize("entry", sorted(CALLS))
def test_every_public_entry_point_refuses_a_new_field(entry, synthetic):
    model, name = synthetic
    _refused(CALLS[entry], model, name)


@pytest.mark.parametrize("form", ["matrix", "tensor", "entries"])
@pytest.mark.parametrize("what", ["derive", "kernels"])
def test_every_form_refuses_a_new_field(what, form, synthetic):
    model, name = synthetic
    _refused(lambda m: getattr(sq, what)(m, form=form), model, name)


@pytest.mark.parametrize("method", ["full", "reduced", "sde"])
def test_every_simulator_refuses_a_new_field(method, synthetic):
    model, name = synthetic
    _refused(lambda m: sq.simulate(m, N=50, t_max=0.1, replicas=2, method=method), model, name)


def _task(name):
    return lambda m: next(t for t in sq.list_tasks() if t.name == name).func(
        p=2, p_star=1, lr=0.1)


def _persist(m):
    from symquad.numeric.persist import model_to_dict
    return model_to_dict(m)


def _layout(m):
    from symquad.numeric.layout import state_layout
    return state_layout(m)


#: stage of symquad.stages.STAGES -> a call that reaches it first
STAGE_CALLS = {
    **{f"derive(form={f!r})": (lambda f: lambda m: sq.derive(m, form=f))(f)
       for f in ("entries", "matrix", "tensor")},
    "the LaTeX equations": lambda m: sq.derive(m).latex(),
    **{f"kernels(form={f!r})": (lambda f: lambda m: sq.kernels(m, form=f))(f)
       for f in ("entries", "matrix", "tensor")},
    **{f"the diffusion matrix (form={f!r})":
       (lambda f: lambda m: sq.kernels(m, form=f).diffusion(*_overlaps(m)))(f)
       for f in ("entries", "matrix", "tensor")},
    "the exact Jacobian": lambda m: sq.kernels(m).jacobian(*_overlaps(m)),
    "the state layout": _layout,
    "integrate": lambda m: sq.integrate(m, *_overlaps(m), 1.0),
    "integrate_batch": lambda m: __import__("symquad.numeric.ode_batch", fromlist=["x"])
    .integrate_batch(m, *(x[None] for x in _overlaps(m)[:2]), _overlaps(m)[2], 1.0),
    **{f"simulate(method={k!r})": (lambda k: lambda m: sq.simulate(
        m, N=50, t_max=0.1, replicas=2, method=k))(k) for k in ("full", "reduced", "sde")},
    "fluctuations": lambda m: sq.fluctuations(m, *_overlaps(m), 1000, [0.0, 1.0]),
    "the O(1/N) correction of the mean":
        lambda m: sq.fluctuations(m, *_overlaps(m), 1000, [0.0, 1.0], second_order=True),
    "the forward sensitivities":
        lambda m: __import__("symquad.numeric.sensitivity", fromlist=["x"]).risk_sensitivity(
            m, *_overlaps(m), [0.0, 1.0]),
    "the time conventions": lambda m: sq.tau_from_t(m, 1.0),
    "validate": lambda m: sq.validate(m, N=50, t_max=1.0, replicas=4),
    "compare": lambda m: sq.compare(m, *_trajectories(m)),
    **{f"sweep task {n!r}": _task(n) for n in ("plateau", "escape", "validate", "ode",
                                                "hessian")},
    "saved files": _persist,
    "optimal_schedule": CALLS["optimal_schedule"],
}


def test_every_stage_has_a_call():
    assert set(STAGE_CALLS) == set(stages.STAGES)


@pytest.mark.parametrize("stage", sorted(STAGE_CALLS))
def test_each_stage_declares_itself(stage, monkeypatch):
    """Every other stage opted in: this one still refuses, by its own declaration."""
    from symquad.studies import tasks
    from symquad._generated import assembly
    model, name = synthetic_model("param")
    monkeypatch.setattr(tasks, "task_model", lambda **values: model)
    # as if regenerated with the parameter (nothing below evaluates a kernel)
    monkeypatch.setattr(assembly, "PARAMS", assembly.PARAMS + (name,))
    for other, implemented in list(stages.STAGES.items()):
        if other != stage:
            monkeypatch.setitem(stages.STAGES, other, implemented + (name,))
    with pytest.raises(ValueError) as info:
        STAGE_CALLS[stage](model)
    assert str(info.value).startswith(f"{stage} does not support the model field(s) {name}="), \
        str(info.value)


def test_opting_in_is_per_stage(monkeypatch):
    """A stage that lists the field computes; the same model stays refused elsewhere."""
    model, name = synthetic_model("param")
    monkeypatch.setitem(stages.STAGES, "the time conventions",
                        stages.STAGES["the time conventions"] + (name,))
    assert sq.tau_from_t(model, 4.0) == pytest.approx(4.0 * model.eta / model.p)
    _refused(lambda m: sq.integrate(m, *_overlaps(m), 1.0), model, name)


def test_the_state_layout_refuses(synthetic):
    from symquad.numeric.layout import state_layout
    model, name = synthetic
    _refused(state_layout, model, name)


def test_saved_files_refuse(synthetic, tmp_path):
    from symquad.numeric.persist import model_to_dict
    model, name = synthetic
    _refused(model_to_dict, model, name)


def test_sweep_tasks_refuse(synthetic, monkeypatch):
    """Every built-in task (the wrapper every model task shares declares its stage)."""
    from symquad.studies import tasks
    model, name = synthetic
    monkeypatch.setattr(tasks, "task_model", lambda **values: model)
    builtin = [t for t in sq.list_tasks() if isinstance(t.func, tasks._ModelTask)]
    assert {t.name for t in builtin} >= {"plateau", "escape", "validate", "ode", "hessian"}
    for task in builtin:
        _refused(lambda m: task.func(p=2, p_star=1, lr=0.1), model, name)


# --------------------------------------------------------------------------- the CLI
#: command -> arguments that reach the model (or None: takes no model, with the reason)
COMMANDS = {
    "equations": [],
    "invariants": [],
    "landscape": [],
    "survival": [],
    "validate": ["--N", "50", "--replicas", "4", "--t-max", "1"],
    "regenerate": None,      # takes no model; committed modules: test_no_cache_is_shared
    "sweep": None,           # runs tasks: test_sweep_tasks_refuse
}


def test_every_cli_command_is_covered():
    from symquad.cli import COMMAND_MODULES
    assert set(COMMANDS) == set(COMMAND_MODULES)


@pytest.mark.parametrize("command", sorted(c for c, a in COMMANDS.items() if a is not None))
def test_every_cli_command_refuses_a_new_field(command, synthetic, monkeypatch, capsys):
    import importlib

    from symquad.cli import main
    model, name = synthetic
    # import every command module before patching any: a module first imported after
    # _model_args is patched would bind the patch at import, and monkeypatch would
    # "restore" it to the patch (the leak that broke later CLI tests in the session)
    modules = [importlib.import_module(f"symquad.cli.{module}")
               for module in ("_model_args", *COMMANDS)]
    for mod in modules:
        if hasattr(mod, "model_from_args"):
            monkeypatch.setattr(mod, "model_from_args", lambda args, **kw: model)
        if hasattr(mod, "_model"):
            monkeypatch.setattr(mod, "_model", lambda args, base: model)
    rc = main([command, *COMMANDS[command]])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert re.search(rf"\b{name}\b", err), err


# --------------------------------------------------------------------------- the caches
def _variants():
    """``(field, model, model with only that field changed)`` for every field."""
    base = sq.Model(p=2, p_star=1, lr=0.1)
    changes = {"p": 3, "p_star": 2, "lr": 0.2, "noise": 0.1, "activation": "z**3",
               "lr_scaling": "width", "teacher_activation": "z**3 - 3*z", "readout": (1, 2),
               "teacher_readout": 2, "lr_readout": 0.1, "weight_decay": 0.1, "batch_size": 2,
               "constraint": "sphere", "loss": "correlation",
               "lr_schedule": "inverse:100", "spectrum": "1/4:2,3/4:3/5"}
    assert set(changes) == {f.name for f in spec.model_fields()}, \
        "a new field: add the value it is varied to here"
    out = [(name, base, base.replace(**{name: value})) for name, value in changes.items()]
    for kind in KINDS:
        model, name = synthetic_model(kind)
        out.append((name, type(model)(p=2, p_star=1, lr=0.1), model))
    return out


@pytest.mark.parametrize("name,a,b", _variants(), ids=lambda x: x if isinstance(x, str) else "")
def test_no_cache_is_shared_across_a_field(name, a, b):
    """A field either keys every cache (structure key, stand-in of the symbolic caches, the
    width-independent modules) or is an argument the kernels receive at call time."""
    from symquad.numeric.kernels import activation_key
    meta = b.__dataclass_fields__[name].metadata
    keyed = a.structure_key != b.structure_key
    if meta["role"] == "param" and "switch" not in meta:
        assert not keyed, f"{name} is a kernel argument: it must not split the kernel caches"
        assert a.stand_in() == b.stand_in() and activation_key(a) == activation_key(b)
        if name not in spec._FIELDS:
            return                          # synthetic: refused by the kernels (above)
        # the shared module gets the value at call time: the drift differs
        ka, kb = sq.kernels(a), sq.kernels(b)
        Q, rho, T = _overlaps(a)
        assert not np.allclose(np.concatenate([x.ravel() for x in ka.rhs(Q, rho, T)]),
                               np.concatenate([x.ravel() for x in kb.rhs(Q, rho, T)]),
                               rtol=1e-9, atol=0), name
        return
    assert keyed, f"{name} changes the generated code but not the structure key"
    if name not in ("p", "p_star"):
        # the symbolic caches are keyed by the stand-ins
        assert (a.stand_in() != b.stand_in()
                or a.stand_in(a.p, a.p_star, activations=True)
                != b.stand_in(b.p, b.p_star, activations=True)), name
    # the loss enters the moment modules only through the error weights (c a, -b) they are
    # called with (symquad.numeric.kernels._moment_kernels; tests/test_correlation_loss.py);
    # the spectrum through the total covariance and the block fields' legs they are called
    # with (symquad.numeric.kernels._block_kernels; tests/test_spectrum_kernels.py)
    if name not in ("p", "p_star", "constraint", "lr_readout", "loss", "spectrum"):
        # the width-independent modules of moment kinds (tensor, special, their diffusion)
        assert activation_key(a) != activation_key(b), name


def test_committed_modules_only_for_their_own_structure():
    """The committed entry and tensor modules are chosen by structure, not a field list."""
    from symquad.numeric.kernels import _entry_module, _tensor_module, check_generated_for
    assert _entry_module(sq.Model(2, 1, 0.1))[1] == "symquad._generated.entries_p2_k1"
    assert _tensor_module(sq.Model(2, 1, 0.1, activation="z**3"))[1] == \
        "symquad._generated.tensor_cubic"
    # a trained readout is another structure: not the committed (fixed-readout) module
    assert not _entry_module(sq.Model(2, 1, 0.1, lr_readout=0.1))[1].startswith("symquad.")
    for kind in ("structure", "time"):
        model, name = synthetic_model(kind)
        assert not _entry_module(model)[1].startswith("symquad._generated"), kind
        cubic = model.replace(activation="z**3")
        assert not _tensor_module(cubic)[1].startswith("symquad._generated"), kind
        # and the generic generated modules (assembly, matrix, per-pair tensor) refuse it
        with pytest.raises(ValueError, match=name):
            check_generated_for(model, "the tensor modules")
    model, name = synthetic_model("param")      # an argument: the committed modules apply
    assert _entry_module(model)[1] == "symquad._generated.entries_p2_k1"
    check_generated_for(model, "the tensor modules")


def test_derive_takes_an_off_value_without_a_kernel_parameter(monkeypatch):
    """``off=`` on a field that is not a kernel parameter (the issue: derive() crashed for
    every model once such a field was in the specification)."""
    from symquad.symbolic.symbols import BATCH, WEIGHT_DECAY
    from symquad.symbolic.update import switched_off
    model, name = synthetic_model("structure")
    default = type(model)(p=2, p_star=1, lr=0.1)
    assert getattr(default, name) == model.__dataclass_fields__[name].metadata["off"]
    monkeypatch.setattr(spec, "model_fields", lambda: tuple(fields(type(model))))
    assert switched_off(default) == {WEIGHT_DECAY: 0, BATCH: 1}
    plain = sq.derive(sq.Model(2, 1, 0.1))
    assert sq.derive(default).dQ == plain.dQ and sq.derive(default).params == plain.params
    _refused(sq.derive, model, name)


def test_the_recipe_page_names_every_stage_and_only_files_that_exist():
    text = DOC.read_text(encoding="utf-8")
    missing = [stage for stage in stages.STAGES if f"`{stage}`" not in text]
    assert not missing, f"docs/extending.md does not list the stages {missing}"
    for path in set(re.findall(r"`(symquad/[\w/.]+\.py|tests/[\w/.]+\.py)`", text)):
        assert (ROOT / path).exists(), f"docs/extending.md names {path}, which does not exist"
    for name in ("_GENERATED_FOR", "_MOMENT_MODULE_FREE"):
        assert hasattr(__import__("symquad.numeric.kernels", fromlist=["x"]), name), name
    assert "_updated_row" in (ROOT / "symquad/symbolic/update.py").read_text()


def test_a_kernel_parameter_the_generated_code_lacks_is_not_dropped(monkeypatch):
    """Opted in before `symquad regenerate`: the kernels refuse instead of dropping it."""
    model, name = synthetic_model("param")
    for form in ("matrix", "tensor", "entries"):
        stage = f"kernels(form={form!r})"
        monkeypatch.setitem(stages.STAGES, stage, stages.STAGES[stage] + (name,))
        with pytest.raises(ValueError, match=f"take no parameter.*{name}.*regenerate"):
            sq.kernels(model, form=form).rhs(*_overlaps(model))


@pytest.mark.parametrize("kind", ["structure", "time"])
def test_analysis_caches_built_from_named_fields_refuse_others(kind, monkeypatch):
    """An analysis opted in by a rule still cannot reuse a cache that drops the field."""
    from symquad import applicability
    from symquad.symbolic.fixed_points import isotropic_reduction
    from symquad.symbolic.hessian import _risk_function
    model, name = synthetic_model(kind)
    for analysis in ("plateau_solution", "hessian"):
        monkeypatch.setitem(applicability.RULES[analysis], name, None)
    with pytest.raises(ValueError, match=f"cached isotropic reduction.*{name}"):
        isotropic_reduction(model=model)
    with pytest.raises(ValueError, match=f"cached risk.*{name}"):
        _risk_function(model)

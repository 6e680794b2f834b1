r"""Studies as tasks: plain functions of keyword parameters, registered by name and version.

A *task* is a module-level (hence picklable) function whose parameters are all
keyword parameters with scalar values (``int``, ``float``, ``str``, ``bool``)
and which returns a flat ``dict`` of results: scalars (one column each in a
sweep's table) and, optionally, numpy arrays (stored on the side, one ``.npz``
per point).  :func:`symquad.sweep` runs a task over a grid of parameters.

Built-in tasks (``symquad sweep --list`` prints them with their parameters):

======== ==========================================================================
name     what it returns
======== ==========================================================================
plateau  plateau fixed point of the full ODE: ``q``, ``risk``, growth ``rate`` κ
escape   escape time from a random start: prediction, ODE and SGD medians + spreads
validate :func:`symquad.validate`'s verdict and key numbers
ode      one ODE trajectory from a random or informed start: final risk, escape time
hessian  counts of negative / zero / positive Hessian eigenvalues at a critical point
======== ==========================================================================

Every built-in task takes every field of :class:`symquad.Model` as a parameter
(built from the field metadata, :func:`symquad.spec.model_fields`: a field
added to the specification is a grid axis of every task at once), followed by
the task's own parameters.  ``None`` means the field's default (a default
readout is ``1/p``, a default teacher activation the student's).  Activations
are polynomials in ``z``, coefficient strings or the names ``erf`` (erf(z/√2)) and
``relu`` (:func:`parse_activation`);
readouts are one number for every unit, a tuple of numbers, or their text with
the components separated by ``:`` (``"1/2:1/4"``); a sweep stores them as that
text of exact rationals (``0.5`` and ``"1/2"`` are one point).  A task refuses
by name every changed field that the analysis it runs was not derived for
(:mod:`symquad.studies.applicability`): the point becomes an error row naming
the field, never the classic model's numbers.

The *version* of a task is part of the key under which a sweep stores a point:
bump it whenever a change alters the numbers a task returns, so that stored
results of the old version are not mistaken for new ones.

User tasks: any callable (:func:`get_task` wraps it, name ``module.qualname``,
version from its ``__symquad_version__`` attribute, default ``"0"``, run-time
estimate from its ``__symquad_cost__`` attribute, see :attr:`Task.cost`) or a
dotted path ``"package.module:function"`` / ``"package.module.function"``,
which is *imported* (never evaluated) after checking that it is made of Python
identifiers.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType

import numpy as np

# modules, not validate / simulate: looked up when a task runs, so a replacement at the
# source (the tests' forbid / monkeypatch) takes effect
from ..numeric import simulate as _sim
from ..numeric.checks import MAX_TIMES, check_int, check_positive
from ..numeric.fluctuations import block_random_start
from ..numeric.layout import block_teacher
from ..spec import NAMED_ACTIVATIONS, Model, _to_fraction, model_fields, require
from ..spectrum import has_spectrum, parse_spectrum, spectrum_text
from ..stages import FIELDS_0_2, STAGES
from . import validation as _validation
from .applicability import refusal, require_analysis
from .escape_grid import median_se
from .validation import informed_start

__all__ = ["Task", "register_task", "register_model_task", "get_task", "list_tasks", "TASKS",
           "parse_activation", "parse_readout", "task_model", "model_parameters"]

_REGISTRY: dict = {}
#: registered tasks, name -> Task (read-only: register with :func:`register_task`)
TASKS = MappingProxyType(_REGISTRY)
#: names of the built-in tasks (filled below); reserved, never replaced
BUILTIN_TASKS: frozenset = frozenset()

_SCALARS = (bool, int, float, str)
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*([:.][A-Za-z_]\w*)$")


@dataclass(frozen=True)
class Task:
    """A registered study: ``func(**params) -> dict``.

    Attributes
    ----------
    name : str
    version : str
        Part of every stored point's key (bump when the numbers change).
    func : callable
        Module-level function of keyword parameters.
    defaults : dict
        Parameter name -> default value (``inspect.Parameter.empty`` if required).
    summary : str
        First line of the function's docstring.
    cost : callable or None
        ``cost(params) -> float``: an estimate of a point's run time from its
        parameters (all of them, as :meth:`bind` returns), cheap to evaluate
        and used only to order the points (a sweep on several workers submits
        the longest first, so that no large point starts last); only the
        ratios between points matter.  ``None``: no estimate (grid order).
    """

    name: str
    version: str
    func: object = field(repr=False)
    defaults: dict = field(repr=False)
    summary: str = field(default="", repr=False)
    cost: object = field(default=None, repr=False, compare=False)

    def estimated_cost(self, params: dict):
        """:attr:`cost` of one point, or ``None`` if there is none or it fails (never raises)."""
        if self.cost is None:
            return None
        try:
            value = float(self.cost(params))
        except Exception:           # an estimate must never stop a sweep
            return None
        return value if math.isfinite(value) and value >= 0 else None

    @property
    def required(self) -> tuple:
        """Names of the parameters without a default."""
        return tuple(k for k, v in self.defaults.items() if v is inspect.Parameter.empty)

    def bind(self, params: dict) -> dict:
        """All parameters of one call (defaults filled in), checked by name.

        Raises
        ------
        TypeError
            For an unknown parameter or a missing required one.
        """
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise TypeError(f"task {self.name!r} has no parameter(s) {unknown}; "
                            f"its parameters are {list(self.defaults)}")
        missing = [k for k in self.required if k not in params]
        if missing:
            raise TypeError(f"task {self.name!r} needs parameter(s) {missing}")
        out = {k: v for k, v in self.defaults.items() if v is not inspect.Parameter.empty}
        out.update(params)
        out = {k: out[k] for k in self.defaults}
        # model tasks write readouts in one canonical form (one point, one key)
        normalize = getattr(self.func, "normalize_params", None)
        return normalize(out) if normalize is not None else out

    def signature(self) -> str:
        """``name(p, p_star, lr=0.1, ...)`` for listings."""
        parts = [k if v is inspect.Parameter.empty else f"{k}={v!r}"
                 for k, v in self.defaults.items()]
        return f"{self.name}({', '.join(parts)})"


def _defaults_of(func, name) -> dict:
    sig = inspect.signature(func)
    out = {}
    for pname, par in sig.parameters.items():
        if par.kind in (par.VAR_POSITIONAL, par.VAR_KEYWORD, par.POSITIONAL_ONLY):
            raise TypeError(f"task {name!r}: parameter {pname!r} must be an ordinary keyword "
                            f"parameter (no *args, **kwargs or positional-only)")
        out[pname] = par.default
    return out


def _make_task(func, name, version) -> Task:
    if not callable(func):
        raise TypeError(f"a task must be callable, got {type(func).__name__}")
    doc = inspect.getdoc(func) or ""
    cost = getattr(func, "__symquad_cost__", None)
    return Task(name=name, version=str(version), func=func, defaults=_defaults_of(func, name),
                summary=doc.splitlines()[0] if doc else "",
                cost=cost if callable(cost) else None)


def _origin(func) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"


def register_task(name, version="1", *, replace=False):
    """Decorator: register a module-level function as the task `name` (with `version`).

    A name already registered for *another* function is refused (``ValueError``)
    unless ``replace=True``: a sweep's stored points are keyed by the task's
    name and version, so a silent replacement would mix the results of two
    functions in one store (bump `version` when you replace a task on purpose).
    Registering the same function again (same module and qualified name, as
    when a module is reloaded) just updates it.  The built-in tasks' names
    (:data:`BUILTIN_TASKS`) are reserved and never replaced, ``replace=True``
    included.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][\w.-]*", name):
        raise ValueError(f"task name must be an identifier-like string, got {name!r}")
    if not isinstance(replace, bool):
        raise TypeError(f"replace must be True or False, got {replace!r}")

    def deco(func):
        task = _make_task(func, name, version)
        old = _REGISTRY.get(name)
        if old is not None and _origin(old.func) != _origin(func):
            if name in BUILTIN_TASKS:
                raise ValueError(f"task name {name!r} is a built-in symquad task and cannot be "
                                 f"replaced; register your function under another name")
            if not replace:
                raise ValueError(f"task {name!r} is already registered ({_origin(old.func)}); "
                                 f"pass replace=True to replace it with {_origin(func)} (and "
                                 f"bump its version so stored points are recomputed)")
        _REGISTRY[name] = task
        return func
    return deco


def _import_dotted(path: str):
    if not _DOTTED.match(path):
        raise ValueError(f"task {path!r} is neither a registered task ({sorted(TASKS)}) nor "
                         f"a dotted path 'package.module:function' of Python identifiers")
    if ":" in path:
        mod, attr = path.split(":")
    else:
        mod, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(mod)
    except ImportError as exc:
        raise ValueError(f"task {path!r}: cannot import module {mod!r} ({exc})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"task {path!r}: module {mod!r} has no attribute {attr!r}") from None


def get_task(task) -> Task:
    """A :class:`Task` from a Task, a registered name, a dotted path or a callable."""
    if isinstance(task, Task):
        return task
    if isinstance(task, str):
        if task in TASKS:
            return TASKS[task]
        func = _import_dotted(task)
        name = task.replace(":", ".")
    elif callable(task):
        func = task
        name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"
    else:
        raise TypeError(f"task must be a registered name, a dotted path or a callable, "
                        f"got {type(task).__name__}")
    if "<locals>" in name or "<lambda>" in name:
        raise ValueError(f"task {name!r} must be a module-level function (picklable by "
                         f"reference on every worker), not a lambda or a nested function")
    return _make_task(func, name, getattr(func, "__symquad_version__", "0"))


def list_tasks() -> list:
    """The registered tasks (built-in ones register when this module is imported), by name."""
    return [TASKS[k] for k in sorted(TASKS)]


# ---------------------------------------------------------------------------
# helpers shared by the built-in tasks
# ---------------------------------------------------------------------------
def parse_activation(activation):
    """Coefficients ``(c0, c1, ..., cd)`` of ``σ(z) = Σ c_j z^j`` (or a name) from a task parameter.

    Accepts the names ``"erf"`` (erf(z/√2)) and ``"relu"`` (returned as the
    name), a polynomial in ``z`` as :class:`symquad.Model` reads it
    (``"z**3 - 3*z"``, by its restricted parser, never evaluated), a sequence of
    numbers, or a string of rational coefficients, lowest order first,
    separated by spaces or semicolons (``"0 0 1"`` is ``z²``), parsed number
    by number with :class:`fractions.Fraction`.
    """
    if isinstance(activation, str) and ("z" in activation
                                        or activation.strip().lower() in NAMED_ACTIVATIONS):
        return Model(1, 1, 1.0, activation=activation).activation
    if isinstance(activation, str):
        items = [s for s in re.split(r"[;\s]+", activation.strip()) if s]
        try:
            # bounded exponents: Fraction("1e-99999999") alone would take minutes
            coeffs = tuple(_to_fraction(s, "activation") for s in items)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"activation must be rational coefficients c0 c1 ... cd "
                             f"(lowest order first, e.g. '0 0 1' for z^2), got "
                             f"{activation!r}") from None
        if not coeffs:
            raise ValueError("activation must list at least two coefficients, got ''")
        return coeffs
    if isinstance(activation, (tuple, list)):
        return tuple(activation)
    raise TypeError(f"activation must be a polynomial in z, a string of coefficients or a "
                    f"sequence, got "
                    f"{type(activation).__name__}")


def parse_readout(value, name="readout"):
    """A readout task parameter as :class:`symquad.Model` reads it (a number or a tuple).

    Accepts a number, a tuple/list of numbers, or text: one number (``"1/2"``)
    or numbers separated by ``:`` (``"1/2:1/4"``, read number by number as
    exact rationals, never evaluated).
    """
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(":")]
        if not all(parts):
            raise ValueError(f"{name} must be a number or numbers separated by ':' "
                             f"(e.g. '1/2:1/4'), got {value!r}")
        return parts[0] if len(parts) == 1 else tuple(parts)
    if isinstance(value, list):
        return tuple(value)
    return value


def _readout_text(value, name):
    """Canonical text of a readout parameter: exact rationals joined by ``:`` (None stays)."""

    if value is None:
        return None
    value = parse_readout(value, name)
    items = value if isinstance(value, tuple) else (value,)
    if not items:
        raise ValueError(f"{name} must be a number or a non-empty tuple of numbers, got ()")
    return ":".join(str(_to_fraction(v, name)) for v in items)


def model_parameters(**overrides) -> dict:
    """``{name: default}`` of every :class:`~symquad.Model` field as a task parameter.

    Built from the field metadata (:func:`symquad.spec.model_fields`), in the
    fields' order.  Fields without a default (``p``, ``p_star``, ``lr``) are
    required (``inspect.Parameter.empty``) unless `overrides` gives them one;
    activations default to their text (``"z**2"``), the teacher activation
    and the readouts to None (the model's default).
    """
    unknown = set(overrides) - {f.name for f in model_fields()}
    if unknown:
        raise TypeError(f"model_parameters: {sorted(unknown)} are not Model fields")
    probe = Model(p=1, p_star=1, lr=1.0)
    out = {}
    for f in model_fields():
        if f.name in overrides:
            out[f.name] = overrides[f.name]
        elif f.name in ("p", "p_star", "lr"):
            out[f.name] = inspect.Parameter.empty
        elif f.default is None:
            out[f.name] = None
        elif f.metadata["kind"] == "activation":
            out[f.name] = probe.activation_str
        elif f.metadata["kind"] == "spectrum":
            out[f.name] = probe._field_text(f.name)        # the text "1:1", as grids give it
        else:
            out[f.name] = f.default
    return out


def task_model(**values):
    """The :class:`~symquad.Model` of a task's model parameters (None: the field's default).

    Activations go through :func:`parse_activation`, readouts through
    :func:`parse_readout`; everything is validated by the Model itself, so an
    error names the field and its allowed range.
    """
    kwargs = {}
    for f in model_fields():
        value = values.get(f.name)
        if value is None:
            if f.name in ("p", "p_star", "lr"):
                raise TypeError(f"{f.name} is required (a model field without a default)")
            continue
        kind = f.metadata["kind"]
        if kind == "activation":
            try:
                value = parse_activation(value)
            except (TypeError, ValueError) as exc:
                if f.name == "activation":
                    raise
                raise type(exc)(f"{f.name}: {exc}") from None
        elif kind == "readout":
            value = parse_readout(value, f.name)
        kwargs[f.name] = value
    return Model(**kwargs)


def _model_task_by_reference(module, qualname):
    """The model task defined as `qualname` in `module` (how a model task is unpickled)."""
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class _ModelTask:
    """A task body ``f(model, **own)`` called with every Model field as a keyword parameter.

    The parameters are those of :func:`model_parameters` followed by the
    body's own (``inspect.signature`` shows them all); a call builds the model
    with :func:`task_model` and passes it on.  Instances pickle by their
    module and qualified name, like a function (the decorated name must be a
    module-level attribute).
    """

    def __init__(self, name, body, model_defaults, fields=None):
        own = list(inspect.signature(body).parameters.values())
        if not own or own[0].name != "model":
            raise TypeError(f"model task {name!r}: the first parameter must be 'model'")
        self.name, self.body = name, body
        # the fields this task implements: a built-in task's entry of symquad.stages.STAGES
        # (the one table), else what its registration declares (default: symquad 0.2's)
        self.stage = f"sweep task {name!r}"
        self.fields = None if fields is None else tuple(fields)
        self.model_names = tuple(f.name for f in model_fields())
        clash = {p.name for p in own[1:]} & set(self.model_names)
        if clash:
            raise TypeError(f"model task {name!r}: parameters {sorted(clash)} are Model fields")
        kw = inspect.Parameter.KEYWORD_ONLY
        params = [inspect.Parameter(k, kw, default=v)
                  for k, v in model_parameters(**model_defaults).items()]
        params += [p.replace(kind=kw) for p in own[1:]]
        self.__signature__ = inspect.Signature(params)
        self.__module__, self.__name__ = body.__module__, body.__name__
        self.__qualname__, self.__doc__ = body.__qualname__, body.__doc__

    def __call__(self, **params):
        bound = self.__signature__.bind(**params)
        bound.apply_defaults()
        args = dict(bound.arguments)
        model = task_model(**{k: args.pop(k) for k in self.model_names})
        implemented = self.fields if self.fields is not None else STAGES.get(self.stage,
                                                                             FIELDS_0_2)
        require(model, self.stage, implemented,
                "a sweep task declares the fields it implements (symquad.stages.STAGES)")
        return self.body(model, **args)

    def normalize_params(self, params):
        """Readouts in their canonical text (:func:`_readout_text`); the rest unchanged."""
        out = dict(params)
        for name in ("readout", "teacher_readout"):
            if name in out:
                out[name] = _readout_text(out[name], name)
        # a spectrum in its canonical text (exact rationals): "0.25:2;0.75:0.6" and
        # "1/4:2,3/4:3/5" are one point
        if out.get("spectrum") is not None:
            out["spectrum"] = spectrum_text(parse_spectrum(out["spectrum"]))
        return out

    def __reduce__(self):
        return _model_task_by_reference, (self.__module__, self.__qualname__)

    def __repr__(self):
        return f"<model task {self.name!r}: {self.__qualname__}>"


def register_model_task(name, version="1", *, fields=None, cost=None, **model_defaults):
    """Decorator: register ``f(model, **own)`` as the task `name` taking every Model field.

    `model_defaults` sets defaults of model fields for this task (e.g.
    ``lr=0.1``; ``p``/``p_star`` stay required unless given).  `fields` are the
    fields beyond :data:`symquad.spec.CLASSIC_FIELDS` the body implements
    (default: a built-in task's entry of :data:`symquad.stages.STAGES`, else
    :data:`symquad.stages.FIELDS_0_2`); a model changing any other field is
    refused by name before the body runs.  `cost`: ``cost(params) -> float``, the
    task's run-time estimate (:attr:`Task.cost`).  Returns the task's callable
    (keyword parameters: every model field, then the body's own parameters).
    """
    def deco(body):
        wrapper = _ModelTask(name, body, model_defaults, fields)
        if cost is not None:
            wrapper.__symquad_cost__ = cost
        register_task(name, version)(wrapper)
        return wrapper
    return deco


def _sgd_cost(params, t_max):
    r"""Relative run time of `replicas` reduced-simulator runs of ``t_max·N`` steps.

    The per-replica-step cost model of :func:`symquad.numeric.simulate.estimate_seconds`
    (``3e-9 p (p + p*)`` s) without its floor, so that widths below ``p ≈ 5``
    still order by their work (measured on the escape task, ``N = 1000``, 48
    replicas, one core: 2.4, 3.4, 4.2 and 6.8 s at ``p = 2, 3, 4, 5``, ``p* = 1``,
    before the streamed escape crossings roughly halved each point; the order by
    ``p`` is unchanged: the longest-first makespan of the measured point times is
    within 4 % of the measured one, as `benchmarks/bench_sweep.py` prints;
    docs/benchmarks.md#sweeps).
    """
    p, ps = int(params["p"]), int(params["p_star"])
    return float(params.get("replicas", 1)) * float(t_max) * float(params.get("N", 1)) \
        * 3e-9 * p * (p + ps)


def _escape_cost(params):
    # the SGD part dominates; its horizon is a multiple of the escape time, which is not
    # known before the prediction is computed: log(N)/eta has its scaling (the plateau's
    # growth rate is proportional to the step size eta for small eta)
    lr, p = float(params["lr"]), int(params["p"])
    eta = lr * p if params.get("lr_scaling") == "width" else lr
    return _sgd_cost(params, math.log(max(float(params.get("N", 2)), 2.0)) / eta)


def _validate_cost(params):
    return _sgd_cost(params, params.get("t_max") or 1.0) * (1 + 4 * bool(params.get("fss")))


def _refuse(model, analysis):
    """Raise ValueError naming the changed fields `analysis` was not derived for."""

    require_analysis(model, analysis)


def _finite(x):
    x = float(x)
    return x if math.isfinite(x) else float("nan")


def _spread(samples, prefix):
    """Median, bootstrap s.e. of the median, 5/95 % quantiles and escaped fraction."""

    x = np.asarray(samples, float)
    ok = np.isfinite(x)
    out = {f"{prefix}_escaped": float(ok.mean()) if x.size else float("nan")}
    if ok.sum() >= 2:
        out.update({f"{prefix}_median": float(np.median(x[ok])),
                    f"{prefix}_median_se": median_se(x),
                    f"{prefix}_q05": float(np.quantile(x[ok], 0.05)),
                    f"{prefix}_q95": float(np.quantile(x[ok], 0.95))})
    else:
        out.update({f"{prefix}_{k}": float("nan") for k in ("median", "median_se", "q05", "q95")})
    return out


def _child_seeds(seed, n):
    """`n` independent integer seeds derived from `seed` (NumPy SeedSequence)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(int(seed)).spawn(n)]


# ---------------------------------------------------------------------------
# built-in tasks
# ---------------------------------------------------------------------------
@register_model_task("plateau", version="2", lr=0.1)
def plateau_task(model):
    r"""Plateau fixed point ``ρ = 0, Q = qI`` of the full ODE and the growth rate of ρ.

    Returns ``q``, ``risk``, ``rate`` (κ: ρ grows like ``e^{κt}``; ``<= 0``: no
    escape), ``eta`` and the gradient-flow values ``q_gf``, ``risk_gf``,
    ``rate_gf`` (:func:`symquad.plateau`; quadratic activation, ``T = I``).
    Fields the plateau analysis was not derived for are refused by name.
    """
    # lazy: scipy
    from ..numeric.landscape import plateau

    _refuse(model, "plateau")
    fp = plateau(model)
    return {"eta": float(model.eta), "q": float(fp.q), "risk": float(fp.risk),
            "rate": float(fp.rate), "q_gf": float(fp.q_gradient_flow),
            "risk_gf": float(fp.risk_gradient_flow), "rate_gf": float(fp.rate_gradient_flow)}


@register_model_task("escape", version="2", cost=_escape_cost, lr=0.1)
def escape_task(model, N=1000, replicas=64, seed=0, sgd=True):
    r"""Escape time from a random start: prediction, ODE and SGD medians with their spreads.

    * ``pred_sgd`` / ``pred_ode``: median of the predicted law
      (:func:`symquad.numeric.landscape.escape_prediction`, ``2·replicas``
      sampled directions) with and without the SGD-noise seeding of ρ
      (``pred_se``: bootstrap standard error of these medians);
    * ``ode_*``: ODE integrated from ``replicas`` realised random starts
      (exact law of ``Q(0), ρ(0)`` at this ``N``);
    * ``sgd_*`` (if `sgd`): ``replicas`` runs of the reduced SGD simulator up to
      ``2.2×`` the 90 % quantile of the predicted law.

    Each of ``ode``/``sgd`` gives the median, its bootstrap standard error, the
    5/95 % quantiles and the fraction that escaped.  Independent seeds for the
    three parts are derived from `seed`.  Escape: the risk falls halfway from
    the plateau to the minimum.  Fields the escape law was not derived for are
    refused by name.
    """
    # lazy: scipy
    from ..numeric import landscape as L

    m = model
    _refuse(m, "escape")
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or replicas < 2:
        raise ValueError(f"replicas must be an integer >= 2, got {replicas!r}")
    s_pred, s_ode, s_sgd = _child_seeds(seed, 3)
    fp = L.plateau(m)
    pred = L.escape_prediction(m, N, n_samples=2 * replicas, seed=s_pred)
    ode_samples = pred.samples + math.log(pred.sigma2) / (2 * pred.rate)
    out = {"eta": float(m.eta), "rate": float(fp.rate), "rate_gf": float(fp.rate_gradient_flow),
           "plateau_risk": float(fp.risk),
           "threshold": float(pred.threshold), "pred_sgd": float(pred.median),
           "pred_ode": float(np.nanmedian(ode_samples)), "pred_se": median_se(ode_samples)}
    Q0, r0 = L.random_start(m, N, replicas, seed=s_ode)
    t_ode = L.ode_escape_times(m, Q0, r0, 3 * float(np.nanmedian(ode_samples)))
    out.update(_spread(t_ode, "ode"))
    if sgd:
        t_max = 2.2 * float(np.nanquantile(pred.samples, 0.9))
        run = _sim.simulate(m, N=N, t_max=t_max, replicas=replicas, seed=s_sgd,
                            method="reduced", t_eval=np.linspace(0, t_max, 1201),
                            on_divergence="stop")
        t_sgd = L.escape_times(run.t, run.risk, pred.threshold)
        out.update(_spread(t_sgd, "sgd"))
        out["sgd_diverged"] = int(np.sum(run.status != "ok"))
    return out


@register_model_task("validate", version="3", cost=_validate_cost, p=4, p_star=2, lr=0.1)
def validate_task(model, N=2000, t_max=0.0, replicas=64, start=None, seed=0, method="reduced",
                  fss=False, invariant=False):
    r"""SGD against the ODE theory (:func:`symquad.validate`): the verdict and key numbers.

    ``t_max = 0`` means the default horizon of :func:`symquad.validate`, and
    ``start=None`` its default start (random for ``σ = c z²`` when the escape
    analysis applies, informed otherwise).  Every model field is honoured;
    the analyses validate skips for a field are named in ``escape_reason`` /
    ``invariant_skipped``.  The finite-size scaling and the invariant-drift
    study are off by default (each multiplies the cost); switch them on with
    ``fss=True`` / ``invariant=True``.  Returns deviations before/after the
    escape (and of a trained readout, ``readout_rms_*``), the band coverage,
    escape-time statistics, the fitted finite-size exponent when run,
    ``verdict`` (``"PASS"``, ``"FAIL"`` or ``"INCONCLUSIVE"``) and ``passed``.
    """
    rep = _validation.validate(model, N=N, t_max=None if not t_max else t_max,
                               replicas=replicas, start=start, seed=seed, method=method,
                               fss=fss, invariant=invariant)
    n = rep.numbers
    out = {"t_max_used": float(rep.config["t_max"]), "start_used": rep.config["start"],
           "diverged_replicas": int(n["diverged_replicas"]),
           "replicas_used": int(n["replicas_used"]),
           "band_inside_fraction": float(n["band"]["ode_inside_fraction"]),
           "band_max_mean_z": float(n["band"]["max_mean_z"])}
    for phase, d in n["deviation"].items():
        for key in ("risk_rms", "overlap_rms", "readout_rms"):
            if key not in d:
                continue
            mean = d[key]["mean"]
            out[f"{key}_{phase}"] = float("nan") if mean is None else float(mean)
    e = n["escape"]
    if e.get("defined"):
        for who in ("sgd", "ode", "difference"):
            for stat in ("mean", "median", "std"):
                v = e[who].get(stat)
                out[f"escape_{who}_{stat}"] = float("nan") if v is None else float(v)
        out["escape_sgd_escaped"] = int(e["sgd_escaped"])
        out["escape_ode_escaped"] = int(e["ode_escaped"])
    else:
        out["escape_reason"] = str(e.get("reason", ""))
    f = n.get("finite_size_scaling")
    if f:
        out.update(fss_exponent=float(f["exponent"]), fss_exponent_se=float(f["exponent_se"]),
                   fss_chi2_per_dof=float(f["chi2_per_dof"]))
    inv = n.get("invariant_drift")
    if inv:
        for key in ("random", "informed"):
            if key in inv:
                out[f"drift_{key}_exponent"] = _finite(inv[key]["exponent"])
    if n.get("invariant_drift_skipped"):
        out["invariant_skipped"] = str(n["invariant_drift_skipped"])
    out["passed"] = bool(rep.passed)
    out["verdict"] = rep.verdict          # PASS / FAIL / INCONCLUSIVE
    return out


@register_model_task("ode", version="2", lr=0.1)
def ode_task(model, start="random", N=1000, q0=1.0, overlap=0.5, t_max=100.0, seed=0,
             n_times=201):
    r"""One ODE trajectory (``T = I``) from a random or an informed start.

    ``start="random"``: ``(Q(0), ρ(0))`` drawn from the exact law of
    ``w_k ~ N(0, q0 I_N)`` at this ``N`` (seed `seed`; with
    ``constraint="sphere"`` the rows normalised, ``Q_kk = 1``); ``"informed"``:
    ``Q(0) = I``, ``ρ(0) = overlap·P`` (:func:`symquad.studies.validation.informed_start`).
    A trained readout starts from ``model.readout``.  Integrated to `t_max`
    with divergence reported, not raised.

    Returns ``ode_status`` ("ok"/"diverged"), ``t_end``, ``final_risk``,
    ``min_risk``, ``escape_time`` (first time the risk falls halfway from the
    plateau to the minimum; NaN when undefined, not reached, or the escape
    analysis was not derived for a field of the model), ``final_q_mean``
    (``tr Q/p``), ``final_rho_norm`` (``‖ρ‖_F``), ``final_rho_smin`` (smallest
    singular value of ρ); arrays ``t``, ``risk`` and, for a trained readout,
    ``readout_trajectory`` (n, p).
    """
    # lazy: scipy
    from ..numeric.integrate import integrate
    # lazy: scipy
    from ..numeric import landscape as L

    m = model
    T = np.eye(m.p_star)
    if has_spectrum(m):
        # an input spectrum: the isotropic teacher T^b = f_b I, the starts per block
        # (docs/model.md §1a): the random start's exact law per block, or the informed
        # start split like the teacher (Q^b = f_b I, rho^b = f_b overlap P)
        T = block_teacher(m, T)
        if start == "random":
            Q0, rho0 = block_random_start(m, T, N, 1, seed=seed, q0=q0)
            Q0, rho0 = Q0[0], rho0[0]
        elif start == "informed":
            Q0, rho0 = informed_start(m, overlap)       # split over the blocks
        else:
            raise ValueError(f"start must be 'random' or 'informed', got {start!r}")
    elif start == "random":
        Q0, rho0 = L.random_start(m, N, 1, seed=seed, q0=q0)
        Q0, rho0 = Q0[0], rho0[0]
        if m.constraint == "sphere":
            scale = 1.0 / np.sqrt(np.diag(Q0))
            Q0, rho0 = Q0 * np.outer(scale, scale), rho0 * scale[:, None]
    elif start == "informed":
        Q0, rho0 = informed_start(m, overlap)
    else:
        raise ValueError(f"start must be 'random' or 'informed', got {start!r}")

    t_max = check_positive("t_max", t_max)
    t_eval = np.linspace(0.0, t_max, check_int(n_times, "n_times", 2, MAX_TIMES))
    sol = integrate(m, Q0, rho0, T, t_max, t_eval=t_eval, on_divergence="stop")
    if has_spectrum(m):
        # the summaries below are of the Euclidean overlaps Q = Σ_b Q^b, ρ = Σ_b ρ^b
        sol = dataclasses.replace(sol, Q=sol.Q.sum(-3), rho=sol.rho.sum(-3))
    esc = float("nan")
    if m.is_quadratic and refusal(m, "escape") is None:
        try:
            thr = L.escape_threshold(m, 0.5)
            esc = float(L.escape_times(sol.t, sol.risk[None], thr)[0])
        except ValueError:
            pass
    s = np.linalg.svd(sol.rho[-1], compute_uv=False)
    out = {"ode_status": sol.status, "t_end": float(sol.t[-1]),
           "final_risk": _finite(sol.risk[-1]), "min_risk": _finite(np.nanmin(sol.risk)),
           "escape_time": esc, "final_q_mean": _finite(np.trace(sol.Q[-1]) / m.p),
           "final_rho_norm": _finite(np.linalg.norm(sol.rho[-1])),
           "final_rho_smin": _finite(s[-1]), "t": sol.t, "risk": sol.risk}
    if sol.readout is not None:
        out["readout_trajectory"] = sol.readout
    return out


@register_model_task("hessian", version="2", lr=0.1)
def hessian_task(model, point="plateau", N=12, rtol=1e-7):
    r"""Counts of negative, zero and positive eigenvalues of the weight-space Hessian.

    The Hessian of the population risk in the ``p·N`` student weights at
    `point` ∈ {"origin", "plateau", "minimum"} (``T = I``, exact spectrum from
    :func:`symquad.hessian_spectrum`); ``|λ| <= rtol·max|λ|`` counts as zero.
    Returns ``negative``, ``zero``, ``positive``, ``min_eigenvalue``,
    ``max_eigenvalue``.  (`lr` only builds the model; the risk does not depend
    on it.)  Fields the Hessian analysis was not derived for are refused by name.
    """
    # lazy: scipy
    from ..numeric.landscape import sign_counts
    # lazy: sympy
    from ..symbolic.hessian import hessian_spectrum

    _refuse(model, "hessian")
    ev = hessian_spectrum(model, point=point, N=N)
    neg, zero, pos = sign_counts(ev, rtol)
    return {"negative": neg, "zero": zero, "positive": pos,
            "min_eigenvalue": float(ev[0]), "max_eigenvalue": float(ev[-1])}


BUILTIN_TASKS = frozenset(_REGISTRY)

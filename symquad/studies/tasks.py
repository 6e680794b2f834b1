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

The *version* of a task is part of the key under which a sweep stores a point:
bump it whenever a change alters the numbers a task returns, so that stored
results of the old version are not mistaken for new ones.

User tasks: any callable (:func:`get_task` wraps it, name ``module.qualname``,
version from its ``__symquad_version__`` attribute, default ``"0"``) or a
dotted path ``"package.module:function"`` / ``"package.module.function"``,
which is *imported* (never evaluated) after checking that it is made of Python
identifiers.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

__all__ = ["Task", "register_task", "get_task", "list_tasks", "TASKS", "parse_activation"]

#: registered tasks, name -> Task
TASKS: dict = {}

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
    """

    name: str
    version: str
    func: object = field(repr=False)
    defaults: dict = field(repr=False)
    summary: str = field(default="", repr=False)

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
        return {k: out[k] for k in self.defaults}

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
    return Task(name=name, version=str(version), func=func, defaults=_defaults_of(func, name),
                summary=doc.splitlines()[0] if doc else "")


def register_task(name, version="1"):
    """Decorator: register a module-level function as the task `name` (with `version`)."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][\w.-]*", name):
        raise ValueError(f"task name must be an identifier-like string, got {name!r}")

    def deco(func):
        TASKS[name] = _make_task(func, name, version)
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
    """Coefficients ``(c0, c1, ..., cd)`` of ``σ(z) = Σ c_j z^j`` from a task parameter.

    Accepts a polynomial in ``z`` as :class:`symquad.Model` reads it
    (``"z**3 - 3*z"``, by its restricted parser, never evaluated), a sequence of
    numbers, or a string of rational coefficients, lowest order first,
    separated by spaces or semicolons (``"0 0 1"`` is ``z²``), parsed number
    by number with :class:`fractions.Fraction`.
    """
    if isinstance(activation, str) and "z" in activation:
        from ..spec import Model
        return Model(1, 1, 1.0, activation=activation).activation
    if isinstance(activation, str):
        items = [s for s in re.split(r"[;\s]+", activation.strip()) if s]
        try:
            coeffs = tuple(Fraction(s) for s in items)
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


def _model(p, p_star, lr, noise, lr_scaling, activation="z**2"):
    from ..spec import Model
    return Model(p=p, p_star=p_star, lr=lr, noise=noise, lr_scaling=lr_scaling,
                 activation=parse_activation(activation))


def _finite(x):
    x = float(x)
    return x if math.isfinite(x) else float("nan")


def _spread(samples, prefix):
    """Median, bootstrap s.e. of the median, 5/95 % quantiles and escaped fraction."""
    from .escape_grid import median_se

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
@register_task("plateau", version="1")
def plateau_task(p, p_star, lr=0.1, noise=0.0, lr_scaling="fixed", activation="z**2"):
    r"""Plateau fixed point ``ρ = 0, Q = qI`` of the full ODE and the growth rate of ρ.

    Returns ``q``, ``risk``, ``rate`` (κ: ρ grows like ``e^{κt}``; ``<= 0``: no
    escape), ``eta`` and the gradient-flow values ``q_gf``, ``risk_gf``,
    ``rate_gf`` (:func:`symquad.plateau`; quadratic activation, ``T = I``).
    """
    from ..numeric.landscape import plateau

    m = _model(p, p_star, lr, noise, lr_scaling, activation)
    fp = plateau(m)
    return {"eta": float(m.eta), "q": float(fp.q), "risk": float(fp.risk),
            "rate": float(fp.rate), "q_gf": float(fp.q_gradient_flow),
            "risk_gf": float(fp.risk_gradient_flow), "rate_gf": float(fp.rate_gradient_flow)}


@register_task("escape", version="1")
def escape_task(p, p_star, lr=0.1, lr_scaling="fixed", noise=0.0, N=1000, replicas=64,
                seed=0, sgd=True):
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
    the plateau to the minimum.
    """
    from ..numeric import landscape as L
    from .escape_grid import median_se

    m = _model(p, p_star, lr, noise, lr_scaling)
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
        from ..numeric.simulate import simulate
        t_max = 2.2 * float(np.nanquantile(pred.samples, 0.9))
        run = simulate(m, N=N, t_max=t_max, replicas=replicas, seed=s_sgd, method="reduced",
                       t_eval=np.linspace(0, t_max, 1201), on_divergence="stop")
        t_sgd = L.escape_times(run.t, run.risk, pred.threshold)
        out.update(_spread(t_sgd, "sgd"))
        out["sgd_diverged"] = int(np.sum(run.status != "ok"))
    return out


@register_task("validate", version="2")
def validate_task(p=4, p_star=2, lr=0.1, noise=0.0, lr_scaling="fixed", N=2000, t_max=0.0,
                  replicas=64, start="random", seed=0, method="reduced", fss=False,
                  invariant=False):
    r"""SGD against the ODE theory (:func:`symquad.validate`): the verdict and key numbers.

    ``t_max = 0`` means the default horizon of :func:`symquad.validate`.  The
    finite-size scaling and the invariant-drift study are off by default (each
    multiplies the cost); switch them on with ``fss=True`` / ``invariant=True``.
    Returns deviations before/after the escape, the band coverage, escape-time
    statistics, the fitted finite-size exponent when run, ``verdict`` (``"PASS"``,
    ``"FAIL"`` or ``"INCONCLUSIVE"``) and ``passed``.
    """
    from .validation import validate

    m = _model(p, p_star, lr, noise, lr_scaling)
    rep = validate(m, N=N, t_max=None if not t_max else t_max, replicas=replicas, start=start,
                   seed=seed, method=method, fss=fss, invariant=invariant)
    n = rep.numbers
    out = {"t_max_used": float(rep.config["t_max"]),
           "diverged_replicas": int(n["diverged_replicas"]),
           "replicas_used": int(n["replicas_used"]),
           "band_inside_fraction": float(n["band"]["ode_inside_fraction"]),
           "band_max_mean_z": float(n["band"]["max_mean_z"])}
    for phase, d in n["deviation"].items():
        for key in ("risk_rms", "overlap_rms"):
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
    f = n.get("finite_size_scaling")
    if f:
        out.update(fss_exponent=float(f["exponent"]), fss_exponent_se=float(f["exponent_se"]),
                   fss_chi2_per_dof=float(f["chi2_per_dof"]))
    inv = n.get("invariant_drift")
    if inv:
        for key in ("random", "informed"):
            if key in inv:
                out[f"drift_{key}_exponent"] = _finite(inv[key]["exponent"])
    out["passed"] = bool(rep.passed)
    out["verdict"] = rep.verdict          # PASS / FAIL / INCONCLUSIVE
    return out


@register_task("ode", version="1")
def ode_task(p, p_star, lr=0.1, noise=0.0, lr_scaling="fixed", activation="z**2",
             start="random", N=1000, q0=1.0, overlap=0.5, t_max=100.0, seed=0, n_times=201):
    r"""One ODE trajectory (``T = I``) from a random or an informed start.

    ``start="random"``: ``(Q(0), ρ(0))`` drawn from the exact law of
    ``w_k ~ N(0, q0 I_N)`` at this ``N`` (seed `seed`); ``"informed"``:
    ``Q(0) = I``, ``ρ(0) = overlap·P`` (:func:`symquad.studies.validation.informed_start`).
    Integrated to `t_max` with divergence reported, not raised.

    Returns ``ode_status`` ("ok"/"diverged"), ``t_end``, ``final_risk``,
    ``min_risk``, ``escape_time`` (first time the risk falls halfway from the
    plateau to the minimum; NaN when undefined or not reached),
    ``final_q_mean`` (``tr Q/p``), ``final_rho_norm`` (``‖ρ‖_F``),
    ``final_rho_smin`` (smallest singular value of ρ); arrays ``t`` and ``risk``.
    """
    from ..numeric.integrate import integrate
    from ..numeric import landscape as L

    m = _model(p, p_star, lr, noise, lr_scaling, activation)
    if start == "random":
        Q0, rho0 = L.random_start(m, N, 1, seed=seed, q0=q0)
        Q0, rho0 = Q0[0], rho0[0]
    elif start == "informed":
        from .validation import informed_start
        Q0, rho0 = informed_start(m, overlap)
    else:
        raise ValueError(f"start must be 'random' or 'informed', got {start!r}")
    from ..numeric.checks import MAX_TIMES, check_int, check_positive

    t_max = check_positive("t_max", t_max)
    t_eval = np.linspace(0.0, t_max, check_int(n_times, "n_times", 2, MAX_TIMES))
    sol = integrate(m, Q0, rho0, np.eye(m.p_star), t_max, t_eval=t_eval,
                    on_divergence="stop")
    esc = float("nan")
    if m.is_quadratic:
        try:
            thr = L.escape_threshold(m, 0.5)
            esc = float(L.escape_times(sol.t, sol.risk[None], thr)[0])
        except ValueError:
            pass
    s = np.linalg.svd(sol.rho[-1], compute_uv=False)
    return {"ode_status": sol.status, "t_end": float(sol.t[-1]),
            "final_risk": _finite(sol.risk[-1]), "min_risk": _finite(np.nanmin(sol.risk)),
            "escape_time": esc, "final_q_mean": _finite(np.trace(sol.Q[-1]) / m.p),
            "final_rho_norm": _finite(np.linalg.norm(sol.rho[-1])),
            "final_rho_smin": _finite(s[-1]), "t": sol.t, "risk": sol.risk}


@register_task("hessian", version="1")
def hessian_task(p, p_star, point="plateau", N=12, lr=0.1, rtol=1e-7):
    r"""Counts of negative, zero and positive eigenvalues of the weight-space Hessian.

    The Hessian of the population risk in the ``p·N`` student weights at
    `point` ∈ {"origin", "plateau", "minimum"} (``T = I``, exact spectrum from
    :func:`symquad.hessian_spectrum`); ``|λ| <= rtol·max|λ|`` counts as zero.
    Returns ``negative``, ``zero``, ``positive``, ``min_eigenvalue``,
    ``max_eigenvalue``.  (`lr` only builds the model; the risk does not depend on it.)
    """
    from ..numeric.landscape import sign_counts
    from ..symbolic.hessian import hessian_spectrum

    m = _model(p, p_star, lr, 0.0, "fixed")
    ev = hessian_spectrum(m, point=point, N=N)
    neg, zero, pos = sign_counts(ev, rtol)
    return {"negative": neg, "zero": zero, "positive": pos,
            "min_eigenvalue": float(ev[0]), "max_eigenvalue": float(ev[-1])}

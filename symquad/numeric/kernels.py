"""Numeric kernels: the generated right-hand sides and risk, ready to call.

No SymPy here.  Three forms of generated code, one signature
(:meth:`Kernels.rhs`):

* ``"matrix"``: ``σ = c z² + c0`` and ``σ* = c* z² + c0*``, the committed
  width-independent module of moment kinds (words of the combined covariance),
  cost ``O((p + p*)³)``;
* ``"tensor"``: any pair of polynomials ``(σ, σ*)``, width independent, cost
  ``O(p² (p + p*)²)``; committed for the built-in pairs and otherwise generated
  once per *pair* into the kernel cache (needs SymPy the first time only); the
  module holds a contraction plan that the hand-written
  :mod:`symquad.runtime.tensor_engine` evaluates;
* ``"entries"``: entry-by-entry modules for one ``(p, p*)`` (the independent
  small-width reference), committed for ``σ = σ* = z²`` at ``p, p* ≤ 3``, cached
  per model structure otherwise.

The matrix and tensor forms return the moment kinds of
:mod:`symquad.symbolic.moments`; the generated assembly
(:mod:`symquad._generated.assembly`, one function per constraint) turns them
into the drift.  The readouts, the weight decay, the batch size and the
learning rates are arguments, never part of a module.

Loaded modules are kept in memory per structure, so repeated calls (``integrate``
calls :func:`kernels` every time) do not re-read or re-execute files.  Every
module is checked against its trailing SHA-256 before it is used, committed
ones included: a hand edit raises an error that says to run ``symquad
regenerate``.  Cached modules carry the generator version in their file name
(:func:`symquad.kernel_files.generator_version`).  A cache folder that cannot be
written falls back to in-memory kernels with a warning; a cached module that is
corrupted, fails at import or lacks its functions is regenerated.
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..kernel_files import (GENERATED_DIR, KernelFileError, atomic_write, cached_path,
                            load_module_file, load_module_text)
from ..spec import Model, check_model

__all__ = ["Kernels", "kernels", "KERNEL_FORMS", "clear_kernel_memo", "default_form"]

KERNEL_FORMS = ("matrix", "tensor", "entries")

# (kind, key) -> (module, source); process-wide, guarded for threaded callers
_MEMO: dict = {}
_LOCK = threading.Lock()


def clear_kernel_memo() -> None:
    """Forget the loaded modules (the next :func:`kernels` call reloads from disk)."""
    with _LOCK:
        _MEMO.clear()


def _exact(values) -> np.ndarray:
    """Exact rationals in extended precision (the risk's cancellation needs them)."""
    return np.array([np.longdouble(c.numerator) / np.longdouble(c.denominator) for c in values])


@dataclass(frozen=True)
class Kernels:
    """Callable risk and ODE right-hand side of one model.

    Attributes
    ----------
    model : Model
    form : {"matrix", "tensor", "entries"}
    source : str
        Where the generated code came from (module name, cache file or ``<memory>``).
    blocks : tuple of str
        The state blocks :meth:`rhs` returns derivatives of: ``("Q", "rho")``,
        plus ``"a"`` when the readout is trained.
    layout : StateLayout
        The order of the state vector (rows and columns of :meth:`diffusion`).
    """

    model: Model
    form: str
    source: str
    _rhs: Callable = field(repr=False)
    _risk: Callable = field(repr=False)
    _moments: Callable | None = field(default=None, repr=False)

    @property
    def blocks(self) -> tuple:
        return ("Q", "rho", "a") if self.model.readout_trained else ("Q", "rho")

    @property
    def layout(self):
        from .layout import state_layout
        return state_layout(self.model)

    def _arrays(self, Q, rho, T, a):
        Q, rho, T = (np.asarray(x, dtype=float) for x in (Q, rho, T))
        p, k = self.model.p, self.model.p_star
        if Q.shape[-2:] != (p, p) or rho.shape[-2:] != (p, k) or T.shape[-2:] != (k, k):
            raise ValueError(
                f"overlaps must end in shapes Q ({p}, {p}), rho ({p}, {k}), T ({k}, {k}) for "
                f"{self.model!r}; got {Q.shape}, {rho.shape}, {T.shape}")
        if a is None:
            a = np.array([float(c) for c in self.model.readout])
        elif not self.model.readout_trained:
            raise ValueError("a (the student readout) is state only when it is trained "
                             "(lr_readout > 0); this model's readout is fixed at "
                             f"{self.model.readout!r}")
        else:
            a = np.asarray(a, dtype=float)
            if a.shape[-1:] != (p,):
                raise ValueError(f"a (the student readout) must end in shape ({p},), got "
                                 f"{a.shape}")
        return Q, rho, T, a

    def rhs(self, Q, rho, T, a=None):
        """Time derivative of every state block at ``(Q, ρ, T)`` (and ``a``).

        Returns ``(dQ/dt, dρ/dt)``, or ``(dQ/dt, dρ/dt, da/dt)`` when the
        readout is trained (then `a` is the current readout, default ``a(0)``).
        Leading batch dimensions are allowed.
        """
        dQ, drho, da = self._rhs(*self._arrays(Q, rho, T, a))
        return (dQ, drho, da) if self.model.readout_trained else (dQ, drho)

    def risk(self, Q, rho, T, a=None):
        """Population risk ``ε`` at ``(Q, ρ, T)`` (and ``a``); a float, or an array over batch dims."""
        Q, rho, T, a_float = self._arrays(Q, rho, T, a)
        readout = _exact(self.model.readout) if a is None else a_float
        out = self._risk(Q, rho, T, readout, _exact(self.model.teacher_readout))
        return float(out) if np.ndim(out) == 0 else out

    def diffusion(self, Q, rho, T, a=None):
        r"""Diffusion matrix ``D`` of the order parameters at ``(Q, ρ, T)`` (and ``a``).

        ``D_XY = Cov[φ_X, φ_Y]/b``, the covariance of the per-sample increments
        of one SGD step (:mod:`symquad.symbolic.diffusion`): over a unit of time
        the state ``X`` (:attr:`layout`: upper triangle of ``Q`` row by row, ``ρ``
        row-major, ``a`` when trained) moves by ``f dt + √(D/N) dB``.  Returns
        shape ``(..., dim, dim)``, symmetric positive semi-definite; leading batch
        dimensions allowed.  The first call of a form generates its module if
        needed (tensor: once per activation pair, entries: once per structure;
        both check their size first).
        """
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        return _diffusion_function(self.model, self.form)(Q, rho, T, a)

    def jacobian(self, Q, rho, T, a=None):
        r"""Exact Jacobian ``J_IJ = ∂f_I/∂X_J`` of the drift in the state order of :attr:`layout`.

        Derived by differentiating the entry route's drift symbolically
        (:mod:`symquad.symbolic.jacobian`), whatever this kernel's form: its cost
        grows fast with ``p`` (checked first; ``σ = z²`` reaches ``p ≈ 10``).
        Shape ``(..., dim, dim)``.
        """
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        return _jacobian_function(self.model)(Q, rho, T, a)[0]

    def risk_gradient(self, Q, rho, T, a=None):
        """Exact gradient ``∂ε/∂X`` of the population risk in the state order; ``(..., dim)``."""
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        return _jacobian_function(self.model)(Q, rho, T, a)[1]

    def risk_hessian(self, Q, rho, T, a=None):
        """Exact Hessian ``∂²ε/∂X∂X`` of the population risk in the state order; ``(..., dim, dim)``."""
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        return _jacobian_function(self.model)(Q, rho, T, a)[2]

    def moments(self, Q, rho, T, a=None):
        """The moment kinds ``(G, Gt, B, R)`` of :mod:`symquad.symbolic.moments` (matrix and
        tensor forms; ``R`` only for a trained readout)."""
        if self._moments is None:
            raise ValueError(f"form {self.form!r} has no moment kinds (it is assembled entry "
                             "by entry); use form='tensor' or form='matrix'")
        return self._moments(*self._arrays(Q, rho, T, a))


def _committed(name: str, required=("rhs", "risk")):
    """A committed ``symquad/_generated`` module, checksum-verified, memoised."""
    key = ("committed", name)
    with _LOCK:
        if key in _MEMO:
            return _MEMO[key]
    path = GENERATED_DIR / f"{name}.py"
    try:
        module = load_module_file(path, f"symquad._generated.{name}", required)
    except KernelFileError as exc:
        raise KernelFileError(
            f"{exc}. Committed kernels must not be edited by hand: run `symquad regenerate` "
            f"(or restore the file from version control).") from exc
    with _LOCK:
        _MEMO[key] = (module, f"symquad._generated.{name}")
        return _MEMO[key]


def _cached(kind: str, key: str, render: Callable[[], str], required=("rhs", "risk")):
    """A module generated on demand into the cache (see the module docstring)."""
    path = cached_path(kind, key)
    memo_key = (kind, key, path.name)
    with _LOCK:
        if memo_key in _MEMO:
            return _MEMO[memo_key]
    name = f"symquad_cached_{path.stem}"
    try:
        result = (load_module_file(path, name, required), str(path))
    except (OSError, KernelFileError):
        # missing, unreadable, corrupted, broken at import or incomplete: (re)generate
        text = render()
        result = _write_and_load(path, name, text, required)
    with _LOCK:
        _MEMO[memo_key] = result
    return result


def _write_and_load(path, name, text, required):
    try:
        atomic_write(path, text)
    except OSError as exc:
        warnings.warn(
            f"kernel cache folder {path.parent} cannot be written ({type(exc).__name__}: "
            f"{exc}); using in-memory kernels for this process. Set SYMQUAD_CACHE_DIR to a "
            f"writable folder to keep them.", RuntimeWarning, stacklevel=4)
        return load_module_text(text, name, "<memory>", required), "<memory>"
    return load_module_file(path, name, required), str(path)


def _diffusion_function(model: Model, form: str):
    """``D(Q, rho, T, a)`` of `model` in `form` (modules loaded once, see :func:`kernels`)."""
    params = _params(model)
    b = np.array([float(c) for c in model.teacher_readout])
    trained = model.readout_trained
    if form == "entries":
        from .._generated import ENTRY_MODULES  # noqa: F401 - the registry is imported first
        from ..spec import require
        require(model, "the diffusion matrix", _DIFFUSION_FIELDS)

        def render():
            from ..codegen.diffusion_render import render_diffusion_entries_module
            return render_diffusion_entries_module(model)
        key = model.structure_key + ("_trained" if trained else "")
        mod, _ = _cached("diffusion_entries", key, render, required=("diffusion",))
        return lambda Q, rho, T, a: mod.diffusion(Q, rho, T, a, b, params)
    assembly, _ = _committed("diffusion_assembly", required=("diffusion_none",
                                                             "diffusion_sphere"))
    assemble = assembly.DIFFUSION[model.constraint]
    names = assembly.KINDS[(model.constraint, trained)]
    if form == "matrix":
        mod, _ = _committed("diffusion_matrix", required=("kinds",))
        act = tuple(float(c[j]) for c, j in ((model.activation, 2), (model.teacher_activation, 2),
                                              (model.activation, 0),
                                              (model.teacher_activation, 0)))

        def source(Q, rho, T, a):
            return mod.kinds(Q, rho, T, a, b, model.noise, *act)
    else:
        mod = _diffusion_tensor_module(model)

        def source(Q, rho, T, a):
            return mod.kinds(Q, rho, T, a, b, model.noise, names)

    def D(Q, rho, T, a):
        batch = np.broadcast_shapes(Q.shape[:-2], rho.shape[:-2], T.shape[:-2], a.shape[:-1])
        return assemble(Q, rho, a, source(Q, rho, T, a), params, trained, batch)
    return D


def _jacobian_function(model: Model):
    """``(J, grad ε)(Q, rho, T, a)`` of `model` from its generated entry-route Jacobian module."""
    from ..spec import require
    require(model, "the Jacobian", _DIFFUSION_FIELDS)
    params = _params(model)
    b = np.array([float(c) for c in model.teacher_readout])

    def render():
        from ..codegen.diffusion_render import render_jacobian_entries_module
        return render_jacobian_entries_module(model)
    key = model.structure_key + ("_trained" if model.readout_trained else "")
    mod, _ = _cached("jacobian_entries", key, render, required=("jacobian",))
    return lambda Q, rho, T, a: mod.jacobian(Q, rho, T, a, b, params)


#: Specification fields the diffusion matrix follows (every field of the model).
_DIFFUSION_FIELDS = ("teacher_activation", "readout", "teacher_readout", "lr_readout",
                     "weight_decay", "batch_size", "constraint")


#: Largest activation degree (student or teacher) of the tensor-route diffusion: its
#: multigraph plan grows steeply with the degree — for z³ − 3z the largest kind has
#: 127285 multigraphs (563 orbits, 24 s to derive), for z² 1706 (17 orbits); degree 4
#: would have millions.
MAX_TENSOR_DIFFUSION_DEGREE = 3


def check_tensor_diffusion_size(model: Model) -> None:
    """Refuse, before any work, a tensor-route diffusion whose plan would be too large.

    Cost law: the largest kind, ``E[σ'σ'σ'σ' δ⁴]``, is a sum over multigraphs on
    4 external and 4 summed vertices, each a contraction of cost up to
    ``O(p⁴ n⁴)`` (``n = p + p*``); ``D`` has ``O(p⁴)`` entries.
    """
    deg = max(model.degree, model.teacher_degree)
    if deg > MAX_TENSOR_DIFFUSION_DEGREE:
        raise ValueError(
            f"the tensor-route diffusion matrix supports activations of degree <= "
            f"{MAX_TENSOR_DIFFUSION_DEGREE} (its 8-point multigraph plan grows too fast), got "
            f"degree {deg} ({model.activation_str!r}, teacher {model.teacher_activation_str!r}); "
            f"use form='entries' (small p) or a quadratic activation (form='matrix')")
    n = model.p + model.p_star
    if model.p ** 4 * n ** 4 > 10 ** 12:
        raise ValueError(
            f"the tensor-route diffusion matrix costs O(p^4 (p+p*)^4) = "
            f"{model.p ** 4 * n ** 4:.2g} operations per term at p={model.p}, "
            f"p_star={model.p_star} (limit 1e12); use a quadratic activation (form='matrix', "
            f"any width) or a smaller p")


def _diffusion_tensor_module(model: Model):
    check_tensor_diffusion_size(model)

    def render():
        from ..codegen.diffusion_render import render_diffusion_tensor_module
        from ..kernel_files import generator_version
        return render_diffusion_tensor_module(model.activation, model.teacher_activation,
                                              generator=generator_version())
    mod, _ = _cached("diffusion_tensor", activation_key(model), render, required=("kinds",))
    return mod


def _assembly():
    mod, _ = _committed("assembly", required=("drift_none", "drift_sphere"))
    return mod


def _params(model: Model) -> tuple:
    from .._generated.assembly import PARAMS
    values = model.kernel_params()
    return tuple(values[name] for name in PARAMS)


def _moment_kernels(model: Model, form: str, mod, source, extra=()) -> Kernels:
    """Kernels of a moment-kind module (matrix or tensor) through the generated assembly."""
    drift = getattr(_assembly(), f"drift_{model.constraint}")
    params = _params(model)
    b = np.array([float(c) for c in model.teacher_readout])
    trained, noise = model.readout_trained, model.noise

    def moments(Q, rho, T, a):
        return mod.moments(Q, rho, T, a, b, noise, trained, *extra)

    def rhs(Q, rho, T, a):
        G, Gt, B, R = moments(Q, rho, T, a)
        return drift(Q, rho, a, G, Gt, B, R, params)
    return Kernels(model, form, source, rhs,
                   lambda Q, rho, T, a, bb: mod.risk(Q, rho, T, a, bb, *extra), moments)


def _matrix_kernels(model: Model) -> Kernels:
    mod, source = _committed("quadratic_matrix", required=("moments", "risk"))
    extra = tuple(float(c[j]) for c, j in ((model.activation, 2), (model.teacher_activation, 2),
                                           (model.activation, 0), (model.teacher_activation, 0)))
    return _moment_kernels(model, "matrix", mod, source, extra)


def activation_key(model: Model) -> str:
    """Stable 16-hex-digit key of the activation pair (tensor kernels are per pair)."""
    text = "activation=" + ",".join(str(c) for c in model.activation)
    if not model.is_default("teacher_activation"):
        text += ";teacher=" + ",".join(str(c) for c in model.teacher_activation)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _tensor_module(model: Model):
    from .._generated import TENSOR_MODULES
    key = (tuple(str(c) for c in model.activation),
           tuple(str(c) for c in model.teacher_activation))
    committed = TENSOR_MODULES.get(key)
    if committed:
        return _committed(committed, required=("moments", "risk"))

    def render():
        from ..codegen.tensor_render import render_tensor_module
        from ..kernel_files import generator_version
        return render_tensor_module(model.activation, model.teacher_activation,
                                    generator=generator_version())
    return _cached("tensor", activation_key(model), render, required=("moments", "risk"))


def _entry_module(model: Model):
    from .._generated import ENTRY_MODULES
    committed = ENTRY_MODULES.get((model.p, model.p_star))
    if (committed and model.activation_str == "z**2" and model.is_default("teacher_activation")
            and model.constraint == "none" and not model.readout_trained):
        return _committed(committed)

    def render():
        from ..codegen.render import render_entries_module
        return render_entries_module(model)
    key = model.structure_key + ("_trained" if model.readout_trained else "")
    return _cached("entries", key, render)


def default_form(model: Model) -> str:
    """``"matrix"`` for quadratic ``σ`` and ``σ*``, else ``"tensor"``."""
    return "matrix" if model.is_quadratic else "tensor"


def kernels(model: Model, form: str | None = None) -> Kernels:
    """Numeric kernels of ``model``.

    Parameters
    ----------
    model : Model
    form : {"matrix", "tensor", "entries"}, optional
        Default ``"matrix"`` when ``σ`` and ``σ*`` are both ``c z² (+ c0)``,
        ``"tensor"`` for every other pair of polynomials.  ``"entries"`` is the
        entry-by-entry reference route, whose derivation cost grows fast with
        ``p`` (it checks the size first).

    Examples
    --------
    >>> import numpy as np, symquad as sq
    >>> k = sq.kernels(sq.Model(p=2, p_star=1, lr=0.1))
    >>> round(k.risk(np.eye(2), np.zeros((2, 1)), np.eye(1)), 6)
    1.5
    """
    check_model(model)
    if form is None:
        form = default_form(model)
    if form not in KERNEL_FORMS:
        raise ValueError(f"form must be one of {KERNEL_FORMS}, got {form!r}")
    if form == "matrix":
        if not model.is_quadratic:
            raise ValueError(
                f"form='matrix' needs quadratic activations c*z**2 (+ const) for the student "
                f"and the teacher, got {model.activation_str!r} and "
                f"{model.teacher_activation_str!r}; use form='tensor'")
        return _matrix_kernels(model)
    if form == "tensor":
        mod, source = _tensor_module(model)
        return _moment_kernels(model, "tensor", mod, source)
    mod, source = _entry_module(model)
    params = _params(model)
    b = np.array([float(c) for c in model.teacher_readout])
    return Kernels(model, form, source, lambda Q, rho, T, a: mod.rhs(Q, rho, T, a, b, params),
                   lambda Q, rho, T, a, bb: mod.risk(Q, rho, T, a, bb))

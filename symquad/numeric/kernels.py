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
  :mod:`symquad.runtime.tensor_engine` evaluates.  For pairs with ``"erf"``
  (erf(z/√2)) or ``"relu"`` the same moment kinds come from the generated
  closed forms of :mod:`symquad.codegen.special_render` (committed for the
  erf/ReLU pairs), evaluated over the index grids by
  :mod:`symquad.runtime.special_engine` (same cost order, the ReLU student's
  four-point function by quadrature);
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
written, or that others could have written (see :mod:`symquad.kernel_files`),
falls back to in-memory kernels with a warning; a cached module that is corrupted,
fails at import or lacks its functions is regenerated, and one that is not trusted
(a link, a FIFO, someone else's, writable by others) is never executed: it is
regenerated, with a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..kernel_files import (GENERATED_DIR, KernelFileError, UntrustedCacheError, cached_path,
                            load_module_file, load_module_text, read_cache_file,
                            write_cache_file)
from ..spec import Model, check_model, error_signal_weight
from ..spectrum import ISOTROPIC, has_spectrum
from ..stages import declare, stage_fields
from .checks import as_real_array, check_float_activation
from .layout import StateLayout, state_layout
from .._generated import ENTRY_MODULES
from .drift_derivatives import BlockDriftDerivatives, DriftDerivatives
from ..stages import require_known_structure
from .._generated import TENSOR_MODULES
from ..runtime.special_engine import four_point_method
from ..runtime.special_engine import SpecialEngine
from ..runtime.tensor_engine import combine
from ..runtime.sampled_diffusion import sampled_diffusion_cost, sampled_diffusion_kinds
from ..runtime.special_diffusion import erf_diffusion_cost, erf_diffusion_kinds, PRICE_NODES
# modules, not their names: generator_version and PARAMS are looked up when used, so a
# replacement in symquad.kernel_files or symquad._generated.assembly (tests) takes effect
from .. import kernel_files
from .._generated import assembly as _generated_assembly
from .block_diffusion import (sphere_projection, virtual_map, virtual_overlaps,
                              virtual_teacher_size)

__all__ = ["Kernels", "kernels", "KERNEL_FORMS", "clear_kernel_memo", "default_form",
           "single_thread_blas", "limited_blas", "blas_threads", "THREADS_ENV",
           "BLAS_LIMIT_FIELDS", "special_support", "check_kernels", "special_rhs_seconds",
           "require_diffusion", "diffusion_support", "erf_diffusion_seconds",
           "check_erf_diffusion_cost", "check_sampled_diffusion_cost",
           "sampled_diffusion_seconds",
           "check_special_cost", "SPECIAL_COST_PER_QUADRUPLE", "drift_state_seconds", "diffusion_seconds", "SPECIAL_WARN_SECONDS",
           "SPECIAL_REFUSE_SECONDS"]

KERNEL_FORMS = ("matrix", "tensor", "entries")

# (kind, key) -> (module, source); process-wide, guarded for threaded callers
_MEMO: dict = {}
_LOCK = threading.Lock()


def clear_kernel_memo() -> None:
    """Forget the loaded modules (the next :func:`kernels` call reloads from disk)."""
    with _LOCK:
        _MEMO.clear()


#: Kernels of at least this many fields (``p + p*``) run their matrix products on a fixed
#: number of BLAS threads (:func:`blas_threads`, default one).  Below it OpenBLAS does not
#: thread these products anyway (measured: identical timings and numbers at p = 64, p* = 2
#: with 1 and 2 threads), and the limit's own cost (~6 us) would matter.
BLAS_LIMIT_FIELDS = 48
#: Environment variable: BLAS threads of the kernels' products (default 1, see blas_threads).
THREADS_ENV = "SYMQUAD_THREADS"

_CONTROLLER = []


def blas_threads(threads=None) -> int:
    """The number of BLAS threads the kernels' products use.

    `threads` if given, else the environment variable ``SYMQUAD_THREADS``, else 1.
    One thread is the default because it is deterministic whatever the machine
    (the same numbers bit for bit, whatever the user's own thread settings) and
    never oversubscribes the cores beside other jobs.  More threads serve one
    large integration on an otherwise idle machine (``p + p* >= 48``; measured in
    benchmarks/bench_threads.py).

    Raises
    ------
    ValueError
        `threads` (or ``SYMQUAD_THREADS``) is not an integer from 1 to 1024.
    """
    source = "threads"
    if threads is None:
        text = os.environ.get(THREADS_ENV, "").strip()
        if not text:
            return 1
        source = THREADS_ENV
        try:
            threads = int(text)
        except ValueError:
            raise ValueError(f"{THREADS_ENV} must be an integer from 1 to 1024, got "
                             f"{text!r}") from None
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) \
            or not 1 <= threads <= 1024:
        raise ValueError(f"{source} must be an integer from 1 to 1024, got {threads!r}")
    return int(threads)


def limited_blas(threads=1):
    """Context manager: BLAS on `threads` threads inside (threadpoolctl), restored on exit."""
    # the controller knows the BLAS libraries loaded when it was made (scipy may load a
    # second one later): made again, ~0.5 ms, whenever modules were imported since
    loaded = len(sys.modules)
    if not _CONTROLLER or _CONTROLLER[0][0] != loaded:
        import threadpoolctl
        _CONTROLLER[:] = [(loaded, threadpoolctl.ThreadpoolController())]
    return _CONTROLLER[0][1].limit(limits=int(threads), user_api="blas")


def single_thread_blas():
    """Context manager: BLAS on one thread inside (threadpoolctl), restored on exit.

    The kernels' products are many and small-to-medium: threading them gains
    little on an idle machine and loses up to 30x beside other jobs (measured:
    the tensor kernel at p = 64 took 3.3 s with the library's two threads beside
    other jobs, 0.14 s on one), and thread counts change the rounding.  With the
    limit the results are the same for every thread setting of the user.
    """
    return limited_blas(1)


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
    threads : int
        BLAS threads of the products from ``p + p* >= 48`` and of the tensor
        form (:func:`blas_threads`; default 1, deterministic).
    """

    model: Model
    form: str
    source: str
    _rhs: Callable = field(repr=False)
    _risk: Callable = field(repr=False)
    _moments: Callable | None = field(default=None, repr=False)
    _readout: np.ndarray = field(default=None, repr=False, compare=False)
    _exact: tuple = field(default=None, repr=False, compare=False)
    _limit: bool = field(default=False, repr=False, compare=False)
    threads: int = field(default=1, repr=False, compare=False)
    #: the kernel parameters of the constant-η model (``PARAMS`` order); a schedule scales
    #: their ``eta`` by ``s(t)`` at each call (:meth:`params_at`)
    _params: tuple = field(default=None, repr=False, compare=False)
    #: the diffusion functions of :meth:`diffusion` and :meth:`_diffusion_pair`, by
    #: ``both``, each made at its first call (remaking it, ~40 µs a call: the structure
    #: key and the cache path of the model's generated modules)
    _diffusion: dict = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        # formed once: converting the exact readouts is not free at large p
        object.__setattr__(self, "_readout",
                           np.array([float(c) for c in self.model.readout]))
        object.__setattr__(self, "_exact", (_exact(self.model.readout),
                                            _exact(self.model.teacher_readout)))
        object.__setattr__(self, "_limit", self.form == "tensor" or
                           self.model.p + self.model.p_star >= BLAS_LIMIT_FIELDS)
        object.__setattr__(self, "_diffusion", {})

    @property
    def blocks(self) -> tuple:
        return ("Q", "rho", "a") if self.model.readout_trained else ("Q", "rho")

    @property
    def layout(self):
        return state_layout(self.model)

    def params_at(self, t=None) -> tuple:
        r"""The kernel parameters at time `t`: ``η(t) = η s(t)`` in place of ``η``.

        The one convention of time in every kernel: the drift, the diffusion and the
        Jacobian of a scheduled model at time ``t`` are those of the constant-η model at
        the step size ``η(t)`` (one SGD step at ``t = k/N`` uses ``η(k/N)``; every power
        of ``η`` and weight decay's ``ηλ`` follow).  `t` is required when the model has
        a schedule and ignored (may be None) when it has none.
        """
        if self._params is None:            # a Kernels built by hand, not by kernels()
            object.__setattr__(self, "_params", _params(_untimed(self.model, "kernels(form="
                                                                 f"{self.form!r})")))
        schedule = self.model.schedule
        if schedule.is_constant:
            return self._params
        if t is None:
            raise ValueError(f"t (the time) is required: this model has lr_schedule="
                             f"{self.model.lr_schedule!r}, so its kernels depend on t "
                             f"(rhs(Q, rho, T, a, t=...))")
        t = float(t)
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"t must be a finite time >= 0, got {t}")
        params = list(self._params)
        i = _eta_index()
        params[i] = params[i] * schedule.factor(t)
        return tuple(params)

    def _arrays(self, Q, rho, T, a):
        # complex input refused (never truncated); non-finite allowed inside solvers
        Q, rho, T = (as_real_array(x, n, finite=False, copy=False)
                     for x, n in ((Q, "Q"), (rho, "rho"), (T, "T")))
        p, k = self.model.p, self.model.p_star
        # an input spectrum: a block axis before the matrix axes (docs/model.md §1a)
        lead = (self.model.n_blocks,) if has_spectrum(self.model) else ()
        d = len(lead) + 2
        shapes = (lead + (p, p), lead + (p, k), lead + (k, k))
        if any(x.shape[x.ndim - d:] != want for x, want in zip((Q, rho, T), shapes)):
            hint = (" (per input block; the isotropic teacher's split of a total T is "
                    "symquad.numeric.layout.block_teacher(model, T))" if lead else "")
            raise ValueError(
                f"overlaps must end in shapes Q {shapes[0]}, rho {shapes[1]}, T {shapes[2]} "
                f"for {self.model!r}{hint}; got {Q.shape}, {rho.shape}, {T.shape}")
        if a is None:
            a = self._readout
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

    def rhs(self, Q, rho, T, a=None, t=None):
        """Time derivative of every state block at ``(Q, ρ, T)`` (and ``a``) at time `t`.

        Returns ``(dQ/dt, dρ/dt)``, or ``(dQ/dt, dρ/dt, da/dt)`` when the
        readout is trained (then `a` is the current readout, default ``a(0)``).
        Leading batch dimensions are allowed.  `t` is needed only with a
        learning-rate schedule (:meth:`params_at`).
        """
        params = self.params_at(t)
        args = self._arrays(Q, rho, T, a)
        with self._blas():
            dQ, drho, da = self._rhs(*args, params)
        return (dQ, drho, da) if self.model.readout_trained else (dQ, drho)

    def risk(self, Q, rho, T, a=None):
        """Population risk ``ε`` at ``(Q, ρ, T)`` (and ``a``); a float, or an array over batch dims."""
        Q, rho, T, a_float = self._arrays(Q, rho, T, a)
        readout = self._exact[0] if a is None else a_float
        with self._blas():
            out = self._risk(Q, rho, T, readout, self._exact[1])
        return float(out) if np.ndim(out) == 0 else out

    def population_loss(self, Q, rho, T, a=None):
        r"""The population loss ``E[ℓ]`` of the model's training loss (label noise included).

        :meth:`risk` is the square-loss generalisation error ``ε = ½E[(ŷ − y*)²]``
        whatever the loss; this is the loss SGD descends (:data:`symquad.spec.LOSSES`):

        .. math::  E[½(ŷ − y)²] = ε + Δ/2 \qquad\text{(square)},\qquad
                   −E[y ŷ] = −E[y^* ŷ] = ε − ½E[ŷ²] − ½E[y^{*2}] \qquad\text{(correlation)},

        with ``½E[ŷ²]`` and ``½E[y*²]`` the risk's own sum at teacher readout 0 and
        at student readout 0 (``ξ`` is independent of the fields and has mean 0).
        """
        Q, rho, T, a_float = self._arrays(Q, rho, T, a)
        a_num = self._exact[0] if a is None else a_float
        b_num = self._exact[1]

        def risk(a_, b_):
            with self._blas():
                return np.asarray(self._risk(Q, rho, T, a_, b_), dtype=float)
        eps = risk(a_num, b_num)
        if self.model.loss == "square":
            out = eps + 0.5 * self.model.noise
        else:
            out = eps - risk(a_num, 0 * b_num) - risk(0 * a_num, b_num)
        return float(out) if np.ndim(out) == 0 else out

    def diffusion(self, Q, rho, T, a=None, t=None):
        r"""Diffusion matrix ``D`` of the order parameters at ``(Q, ρ, T)`` (and ``a``).

        ``D_XY = Cov[φ_X, φ_Y]/b``, the covariance of the per-sample increments
        of one SGD step (:mod:`symquad.symbolic.diffusion`): over a unit of time
        the state ``X`` (:attr:`layout`: upper triangle of ``Q`` row by row, ``ρ``
        row-major, ``a`` when trained) moves by ``f dt + √(D/N) dB``.  Returns
        shape ``(..., dim, dim)``, symmetric positive semi-definite; leading batch
        dimensions allowed.  The first call of a form generates its module if
        needed (tensor: once per activation pair, entries: once per structure;
        both check their size first).  ``σ = σ* = erf(z/√2)``: the folded closed
        forms and Price-path quadrature of :mod:`symquad.runtime.special_diffusion`
        (cost checked first); ReLU and mixed pairs: the field-space cubature of
        :mod:`symquad.runtime.sampled_diffusion` (2^17 scrambled Sobol' points, 1e-3
        of max |D|, cost checked first).
        """
        # the stage refuses what it does not implement before the arrays are read
        declare(self.model, f"the diffusion matrix (form={self.form!r})")
        params = self.params_at(t)
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        D = self._kept_diffusion()
        # the tensor route's contractions on the kernels' threads, as the RHS: with the
        # library's two BLAS threads beside other jobs D at p = 16 (z³ − 3z) took 1629 ms
        # of CPU against 469 ms on one (benchmarks/bench_kernels.py --diffusion)
        with self._blas():
            return D(Q, rho, T, a, params)

    def jacobian(self, Q, rho, T, a=None, t=None):
        r"""Jacobian ``J_IJ = ∂f_I/∂X_J`` of the drift in the state order of :attr:`layout`.

        Matrix and tensor forms (every activation pair, any width): exact polynomial
        stencils of the drift kernels for polynomial activations, Richardson-extrapolated
        central differences for erf and ReLU (:mod:`symquad.numeric.drift_derivatives`).
        ``form='entries'``: the entry route's drift differentiated symbolically
        (:mod:`symquad.symbolic.jacobian`; the independent reference, its cost grows fast
        with ``p`` and is checked first).  Shape ``(..., dim, dim)``.
        """
        declare(self.model, "the exact Jacobian")
        params = self.params_at(t)
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        return self._jacobian_part(0, Q, rho, T, a, params)

    def risk_gradient(self, Q, rho, T, a=None):
        """Gradient ``∂ε/∂X`` of the population risk in the state order; ``(..., dim)``
        (the route of :meth:`jacobian`)."""
        declare(self.model, "the exact Jacobian")
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        return self._jacobian_part(1, Q, rho, T, a, self._params)

    def risk_hessian(self, Q, rho, T, a=None):
        """Hessian ``∂²ε/∂X∂X`` of the population risk in the state order; ``(..., dim, dim)``
        (the route of :meth:`jacobian`)."""
        declare(self.model, "the exact Jacobian")
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        return self._jacobian_part(2, Q, rho, T, a, self._params)

    def _jacobian_part(self, i, Q, rho, T, a, params):
        """Part `i` of ``(J, ∂ε/∂X, ∂²ε/∂X∂X)`` at kernel `params` (each computed when
        indexed, :func:`_jacobian_function`), on the kernels' BLAS threads (as the LNA's
        Jacobian, :meth:`_lna_terms`: the user's thread count would change the rounding)."""
        with self._blas():
            return _jacobian_function(_untimed(self.model, "the exact Jacobian"), self.form)(
                Q, rho, T, a, params)[i]

    def second_order(self, Q, rho, T, a=None, t=None):
        r"""``(f₁, ∂²f)``: the ``1/N`` term of the mean step and the drift's Hessian.

        One step ``X' = X + Φ/N`` has ``E[Φ] = f + f₁/N + O(N⁻²)`` (``|x|²/N`` and its
        correlation with the fields, the batch cross terms, the second order of weight
        decay and of the sphere's renormalisation); ``∂²f_I/∂X_J∂X_K`` the drift's second
        derivatives.  Matrix and tensor forms (every pair, any width): from the drift's
        moment kinds by Gaussian identities and stencils
        (:mod:`symquad.numeric.drift_derivatives`; the full Hessian by polarisation, its
        size checked); ``form='entries'``: the entry route, symbolic and exact
        (:mod:`symquad.symbolic.second_order`, polynomial activations, size checked).
        Shapes ``(..., dim)``, ``(..., dim, dim, dim)``.
        """
        declare(self.model, SECOND_ORDER_STAGE)
        params = self.params_at(t)
        given = (Q, rho, T, a)
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        model = _untimed(self.model, SECOND_ORDER_STAGE)
        if self.form == "entries":
            return _second_order_function(model)(Q, rho, T, a, params)
        require_diffusion(model, "the O(1/N) correction of the mean")
        der = _derivatives(model, self.form)
        lay = self.layout
        x = lay.pack(Q, rho, a if self.model.readout_trained else None)
        Du = None
        if model.constraint == "sphere":
            # the sphere's f₁ reads the unconstrained D^u: the same call (BLAS limit included)
            # as the LNA's, so the thread count never changes its rounding
            Du = self._diffusion_pair(*given, t=t, both=True)[1]
        # the derivatives' products on the kernels' BLAS threads, as the drift's and D's
        # (the user's thread count would change their rounding)
        with self._blas():
            return der.f1_sources(x, T, params, Du)["total"], der.hessian(x, T, params)

    def _risk_curvature(self, Q, rho, T, a, S):
        """``½ ∇²ε : Σ`` at one state: along ``Σ``'s eigenvectors (moment forms), or with the
        entry route's exact Hessian."""
        if self.form == "entries":
            return 0.5 * float(np.einsum("ij,ij->", self.risk_hessian(Q, rho, T, a), S))
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        model = _untimed(self.model, "the exact Jacobian")
        x = self.layout.pack(Q, rho, a if self.model.readout_trained else None)
        with self._blas():
            return float(_derivatives(model, self.form).risk_curvature(x, T, S))

    def _blas(self):
        """The kernels' BLAS thread limit (:attr:`threads`) where they take one, else none."""
        return limited_blas(self.threads) if self._limit else contextlib.nullcontext()

    def _rhs_with(self, Q, rho, T, a, params):
        """The drift in the state order at explicit kernel `params` (``η`` replaced, e.g.)."""
        args = self._arrays(Q, rho, T, a)
        with self._blas():
            dQ, drho, da = self._rhs(*args, tuple(params))
        return self.layout.pack(dQ, drho, da if self.model.readout_trained else None)

    def _diffusion_pair(self, Q, rho, T, a=None, t=None, both=False):
        """``D`` at time `t`, or ``(D, D^u)`` with the unconstrained ``D^u`` (`both`, the
        sphere's ``f₁``), from one evaluation of the diffusion kinds."""
        params = self.params_at(t)
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        Dfun = self._kept_diffusion(both)
        with self._blas():
            return Dfun(Q, rho, T, a, params)

    def _kept_diffusion(self, both=False):
        """The model's diffusion function (``both``: it returns ``(D, D^u)``), made once."""
        fn = self._diffusion.get(both)
        if fn is None:
            fn = self._diffusion[both] = _diffusion_function(_untimed(
                self.model, f"the diffusion matrix (form={self.form!r})"), self.form,
                both=both)
        return fn

    def _lna_terms(self, Q, rho, T, a, S, t=None, second_order=False, diffusion=None):
        r"""``(f, J, D, f₁, ½ ∂²f : Σ)`` at one state for the LNA and the O(1/N) mean.

        `diffusion`: ``(D, D^u)`` when known (interpolated along the trajectory by
        :func:`symquad.fluctuations`; ``D^u`` the unconstrained one on the sphere, else
        None); otherwise one evaluation of the diffusion kinds serves both.  The
        curvature is contracted along the eigenvectors of ``Σ`` (moment forms) without
        forming ``∂²f``.  The last two are None unless `second_order`.
        """
        params = self.params_at(t)
        Q, rho, T, a = self._arrays(Q, rho, T, a)
        model = _untimed(self.model, "the exact Jacobian")
        lay = self.layout
        trained = self.model.readout_trained
        f = lay.pack(*self.rhs(Q, rho, T, a if trained else None, t=t))
        sphere = second_order and model.constraint == "sphere" and self.form != "entries"
        if diffusion is None:
            D = self._diffusion_pair(Q, rho, T, a, t=t, both=sphere)
            D, Du = D if sphere else (D, None)
        else:
            D, Du = diffusion
        if self.form == "entries":
            J = _jacobian_function(model, "entries")(Q, rho, T, a, params)[0]
            if not second_order:
                return f, J, D, None, None
            f1, Hf = self.second_order(Q, rho, T, a if trained else None, t=t)
            return f, J, D, f1, 0.5 * np.einsum("...ijk,...jk->...i", Hf, S)
        der = _derivatives(model, self.form)
        x = lay.pack(Q, rho, a if trained else None)
        with self._blas():
            if not second_order:
                return f, der.jacobian(x, T, params), D, None, None
            _, J, curv = der.curvature(x, T, S, params)
            f1 = der.f1_sources(x, T, params, Du)["total"]
        return f, J, D, f1, curv

    def moments(self, Q, rho, T, a=None):
        """The moment kinds ``(G, Gt, B, R)`` of :mod:`symquad.symbolic.moments` (matrix and
        tensor forms; ``R`` only for a trained readout).  With an input spectrum: ``(Gb,
        Gtb, B, R)``, the block fields' kinds (..., B, p, p), (..., B, p, p*) of
        :mod:`symquad.symbolic.blocks` and ``B``, ``R`` at the total covariance ``Ω``."""
        if self._moments is None:
            raise ValueError(f"form {self.form!r} has no moment kinds (it is assembled entry "
                             "by entry); use form='tensor' or form='matrix'")
        with limited_blas(self.threads):
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
    """A module generated on demand into the cache (see the module docstring).

    A cache entry is executed only when :func:`symquad.kernel_files.read_cache_file`
    trusts it (owned by the user, not writable by others, no link, a regular
    file); an untrusted one is never executed: the module is regenerated into a
    fresh trusted file, or into memory when the folder itself is untrusted,
    with a warning that says why.
    """
    path = cached_path(kind, key)
    memo_key = (kind, key, path.name)
    with _LOCK:
        if memo_key in _MEMO:
            return _MEMO[memo_key]
    name = f"symquad_cached_{path.stem}"
    distrust = None
    try:
        result = (load_module_text(read_cache_file(path), name, str(path), required),
                  str(path))
    except UntrustedCacheError as exc:
        distrust = exc
    except (OSError, KernelFileError):
        pass     # missing, unreadable, corrupted, broken at import or incomplete
    else:
        with _LOCK:
            _MEMO[memo_key] = result
        return result
    result = _write_and_load(path, name, render(), required, distrust)
    with _LOCK:
        _MEMO[memo_key] = result
    return result


def _write_and_load(path, name, text, required, distrust=None):
    """Write ``text`` as a trusted cache file and load it (from memory: what was written)."""
    try:
        write_cache_file(path, text)
    except (OSError, UntrustedCacheError) as exc:
        why = exc if isinstance(exc, UntrustedCacheError) else \
            f"it cannot be written ({type(exc).__name__}: {exc})"
        warnings.warn(
            f"kernel cache folder {path.parent} is not used: {why}; using in-memory kernels "
            f"for this process. Set SYMQUAD_CACHE_DIR to a folder of your own that others "
            f"cannot write to keep them.", RuntimeWarning, stacklevel=5)
        return load_module_text(text, name, "<memory>", required), "<memory>"
    if distrust is not None:
        warnings.warn(f"{distrust}; it was not executed, the kernel was regenerated into a "
                      f"fresh file", RuntimeWarning, stacklevel=5)
    return load_module_text(text, name, str(path), required), str(path)


def diffusion_support(model: Model) -> str | None:
    """Why the diffusion matrix (and the finite-N routes) of `model` is not derived, or None.

    Polynomial pairs: the entry, matrix and tensor routes.  ``σ = σ* = erf(z/√2)``:
    the folded closed forms and the Price-path quadrature of
    :mod:`symquad.runtime.special_diffusion`.  Every other pair whose drift is
    derived (:func:`special_support`: ReLU, erf/ReLU and erf or ReLU with a
    polynomial): the field-space cubature of :mod:`symquad.runtime.sampled_diffusion`
    (its 8-point Gaussian moments have no closed form).
    """
    if model.is_polynomial:
        return None
    reason = special_support(model)
    if reason is not None:
        return reason
    for which, act, text in (("activation", model.activation, model.activation_str),
                             ("teacher_activation", model.teacher_activation,
                              model.teacher_activation_str)):
        if not isinstance(act, str) and len(act) - 1 > 2:
            return (f"{which}={text!r} (degree {len(act) - 1}) with an erf or "
                    f"ReLU partner: the field-space cubature's accuracy is established for "
                    f"polynomial degree <= 2 only (measured 5 % of max |D| for z**3 - 3*z)")
    return None


def require_diffusion(model: Model, what: str = "the diffusion matrix") -> None:
    """Refuse, naming the activations, a model whose diffusion matrix is not derived.

    ``D`` (and the Jacobian of the finite-N routes) are Gaussian moments of
    products of up to eight activations: derived for polynomial pairs and for
    ``σ = σ* = erf(z/√2)`` (:func:`diffusion_support`).  Everything that needs
    ``D`` — ``simulate(method="sde")``, :func:`symquad.fluctuations`,
    ``escape_time(method="sde")``, the whole-run criteria — calls this first.
    """
    reason = diffusion_support(model)
    if reason is not None:
        raise ValueError(f"{what} is not derived for this model: {reason}; use "
                         f"method='reduced' or 'full' for finite-N SGD of this model")


def require_polynomial_diffusion(model: Model, what: str) -> None:
    """Refuse, naming the activations, a model that is not polynomial: `what` (the O(1/N)
    mean correction, the forward sensitivities) rests on the entry route's exact
    symbolic derivatives, derived for polynomial activations only."""
    require_diffusion(model, what)
    if not model.is_polynomial:
        raise ValueError(f"{what} is derived for polynomial activations, got activation="
                         f"{model.activation_str!r}, teacher_activation="
                         f"{model.teacher_activation_str!r}")

#: Largest estimated seconds of one erf diffusion matrix (one state): refused above.
ERF_DIFFUSION_REFUSE_SECONDS = 600.0
#: Seconds per unit of the erf diffusion's cost law (numpy, one core): measured 8–29 ns
#: for p >= 4 with benchmarks/bench_erf_diffusion.py on the shared 2-core development
#: machine at load 10 (the law counts 24 nodes; states with variances near 1 use 12);
#: the bound used is pessimistic.
ERF_DIFFUSION_COST_PER_ASIN = 4e-8


def erf_diffusion_seconds(model: Model) -> float:
    """Estimated seconds of one erf ``D`` (cost law :func:`~symquad.runtime.special_diffusion.erf_diffusion_cost`)."""
    return ERF_DIFFUSION_COST_PER_ASIN * erf_diffusion_cost(model.p, model.p_star,
                                                            model.readout_trained)


def check_erf_diffusion_cost(model: Model) -> float:
    """Refuse (ValueError), before any work, an erf ``D`` estimated above the limit."""
    est = erf_diffusion_seconds(model)
    if est > ERF_DIFFUSION_REFUSE_SECONDS:
        raise ValueError(
            f"the erf diffusion matrix at p={model.p}, p_star={model.p_star} is estimated at "
            f"{est:.3g} s per state (cost ~ p^4 (p+p*)^4 x {_special_nodes()} quadrature "
            f"nodes / 96 arcsines; limit {ERF_DIFFUSION_REFUSE_SECONDS:g} s): use a smaller p")
    return est


#: Seconds per multiply–add of the field-space cubature's cost law
#: (:func:`~symquad.runtime.sampled_diffusion.sampled_diffusion_cost`): measured 2–8 ns at
#: p = 3–8 on the shared 2-core development machine at load 5–9 (pessimistic bound).
SAMPLED_DIFFUSION_COST_PER_MAC = 1e-8
#: Largest estimated seconds of one field-space-cubature diffusion matrix: refused above.
SAMPLED_DIFFUSION_REFUSE_SECONDS = 120.0


def sampled_diffusion_seconds(model: Model) -> float:
    """Estimated seconds of one ``D`` of a ReLU or mixed pair (the field-space cubature)."""
    return SAMPLED_DIFFUSION_COST_PER_MAC * sampled_diffusion_cost(
        model.p, model.p_star, model.readout_trained)


def check_sampled_diffusion_cost(model: Model) -> float:
    """Refuse (ValueError), before any work, a cubature ``D`` estimated above the limit."""
    est = sampled_diffusion_seconds(model)
    if est > SAMPLED_DIFFUSION_REFUSE_SECONDS:
        raise ValueError(
            f"the diffusion matrix of activation={model.activation_str!r} with "
            f"teacher_activation={model.teacher_activation_str!r} at p={model.p}, "
            f"p_star={model.p_star} is estimated at {est:.3g} s per state (field-space "
            f"cubature, cost ~ 2^17 points x (p^2 n^2 + p^4), n = p + p_star; limit "
            f"{SAMPLED_DIFFUSION_REFUSE_SECONDS:g} s): use a smaller p")
    return est


#: Typical seconds per multiply–add of the field-space cubature, for deciding what a study
#: runs (not for refusing): measured 0.3–0.6 ns at p = 4–8 (one state, load ~4 on the
#: shared 2-core machine; the refusal's bound above is 1e-8).
SAMPLED_DIFFUSION_TYPICAL_PER_MAC = 1e-9


def diffusion_seconds(model: Model, form: str | None = None) -> float:
    """Typical seconds of one diffusion matrix (one state), by route (a cost law).

    erf/erf: :func:`erf_diffusion_seconds`; ReLU and mixed pairs: the cubature's
    multiply–adds at :data:`SAMPLED_DIFFUSION_TYPICAL_PER_MAC`; polynomial pairs:
    matrix form ``1e-3 + 2e-7 p⁴`` (``O(p⁴)`` entries; 7.7 s at p = 64, load 5), tensor
    form ``0.2 + 3e-11 p⁴ n⁴`` (Python per program step, then the contractions; 0.35 s
    at p = 16 for z³ − 3z), entries ``1e-3`` once derived.
    """
    p, n = model.p, model.p + model.p_star
    if not model.is_polynomial:
        if (model.activation_kind, model.teacher_activation_kind) == ("erf", "erf"):
            return erf_diffusion_seconds(model)
        return SAMPLED_DIFFUSION_TYPICAL_PER_MAC * sampled_diffusion_cost(
            model.p, model.p_star, model.readout_trained)
    form = form or default_form(model)
    if form == "matrix":
        return 1e-3 + 2e-7 * p ** 4
    if form == "tensor":
        return 0.2 + 3e-11 * p ** 4 * n ** 4
    return 1e-3


def _special_nodes():
    return PRICE_NODES


def _diffusion_function(model: Model, form: str, both: bool = False):
    """``D(Q, rho, T, a)`` of `model` in `form` (modules loaded once, see :func:`kernels`).

    ``both=True`` (the sphere): ``(D, D^u)`` with ``D^u`` the diffusion matrix of the
    unconstrained step from the same kinds (the O(1/N) mean's renormalisation term).
    """
    declare(model, f"the diffusion matrix (form={form!r})")
    require_diffusion(model)
    if has_spectrum(model):
        return _block_diffusion_function(model, form, both)
    params = _params(model)
    b = np.array([float(c) for c in model.teacher_readout])
    trained = model.readout_trained
    if not model.is_polynomial and form == "entries":
        raise ValueError("form='entries' is for polynomial activations; erf models use "
                         "form='tensor'")
    if form == "entries":

        def render():
            # lazy: sympy
            from ..codegen.diffusion_render import render_diffusion_entries_module
            return render_diffusion_entries_module(model)
        mod, _ = _cached("diffusion_entries", model.structure_key, render,
                         required=("diffusion",))
        if both:
            free = _diffusion_function(model.replace(constraint="none"), form)
            return lambda Q, rho, T, a, params=params: (mod.diffusion(Q, rho, T, a, b, params),
                                                        free(Q, rho, T, a, params))
        return lambda Q, rho, T, a, params=params: mod.diffusion(Q, rho, T, a, b, params)
    check_generated_for(model, f"the diffusion matrix (form={form!r})")
    assembly, _ = _committed("diffusion_assembly", required=("diffusion_none",
                                                             "diffusion_sphere"))
    assemble = assembly.DIFFUSION[model.constraint]
    names = assembly.KINDS[(model.constraint, trained)]
    if not model.is_polynomial and (model.activation_kind, model.teacher_activation_kind) \
            == ("erf", "erf"):
        # erf: the folded closed forms and the Price-path quadrature (special_diffusion)
        check_erf_diffusion_cost(model)

        def source(Q, rho, T, a):
            return erf_diffusion_kinds(Q, rho, T, a, b, model.noise, names)
    elif not model.is_polynomial:
        # ReLU and mixed pairs: the field-space cubature (sampled_diffusion)
        check_sampled_diffusion_cost(model)

        def source(Q, rho, T, a):
            return sampled_diffusion_kinds(Q, rho, T, a, b, model.noise, names,
                                           model.activation, model.teacher_activation)
    elif form == "matrix":
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

    # the kinds are expectations against the loss's error signal e = c yhat - y
    # (spec.LOSSES), like the drift's moments: their output weights are (c a, -b), while
    # the assembly's readout factors (g_k = a_k sigma'(lambda_k) e) keep a
    c = float(error_signal_weight(model))

    def D(Q, rho, T, a, params=params):
        batch = np.broadcast_shapes(Q.shape[:-2], rho.shape[:-2], T.shape[:-2], a.shape[:-1])
        kinds = source(Q, rho, T, c * a)
        out = assemble(Q, rho, a, kinds, params, trained, batch)
        if both:
            # the kinds do not depend on the constraint (assembly.KINDS): one evaluation
            return out, assembly.DIFFUSION["none"](Q, rho, a, kinds, params, trained, batch)
        return out
    return D


def _block_diffusion_function(model: Model, form: str, both: bool = False):
    r"""``D(Q, rho, T, a)`` of a model with an input spectrum (block shapes in, block ``D`` out).

    The isotropic ``D`` of the *virtual* model — the same students, a teacher of ``p* + B n``
    fields with readout ``(b, 0, …, 0)``, no constraint — at the virtual covariance
    (:func:`~symquad.numeric.block_diffusion.virtual_overlaps`), mapped by the constant
    ``A`` and, on the sphere, the projection ``P`` (:mod:`symquad.numeric.block_diffusion`,
    docs/derivation.md §8.8): ``D = P A D_v Aᵀ Pᵀ``.  Every route of the isotropic ``D``
    serves (its own cost checks at the virtual width); ``both``: ``(D, A D_v Aᵀ)``.
    """
    p, ps, B = model.p, model.p_star, model.n_blocks
    extra = virtual_teacher_size(p, ps, B) - ps
    virtual = model.replace(spectrum=ISOTROPIC, p_star=ps + extra, constraint="none",
                            teacher_readout=tuple(model.teacher_readout) + (0,) * extra)
    Dv = _diffusion_function(virtual, form)
    A = virtual_map(model.spectrum, p, ps, model.readout_trained)
    # the block layout even for B = 1 (the isotropic model through this path: a test)
    lay = StateLayout(p, ps, model.readout_trained, B)
    sphere = model.constraint == "sphere"

    def D(Q, rho, T, a, params):
        Qv, rv, Tv = virtual_overlaps(model.spectrum, Q, rho, T)
        free = np.einsum("IJ,...JK,LK->...IL", A, Dv(Qv, rv, Tv, a, params), A)
        if not sphere:
            return (free, free) if both else free
        P = sphere_projection(lay, lay.pack(Q, rho, a if model.readout_trained else None))
        out = P @ free @ np.swapaxes(P, -1, -2)
        return (out, free) if both else out
    return D


def _jacobian_function(model: Model, form: str | None = None):
    """``(J, ∇ε, ∇²ε)(Q, rho, T, a, params)`` of `model`, each computed when indexed.

    ``form='entries'``: the generated entry-route Jacobian module (symbolic, exact,
    polynomial activations).  Any other form: the stencils of
    :mod:`symquad.numeric.drift_derivatives` on the moment kernels (every pair).
    """
    declare(model, "the exact Jacobian")
    require_diffusion(model, "the Jacobian")
    if form != "entries":
        der = _derivatives(model, form)
        lay = state_layout(model)
        trained = model.readout_trained

        class _Lazy:
            def __init__(self, Q, rho, T, a, params):
                self.x = lay.pack(Q, rho, a if trained else None)
                self.T, self.params = T, params

            def __getitem__(self, i):
                if i == 0:
                    return der.jacobian(self.x, self.T, self.params)
                if i == 1:
                    return der.risk_gradient(self.x, self.T)
                if i == 2:
                    return der.risk_hessian(self.x, self.T)
                raise IndexError(i)
        return _Lazy
    if not model.is_polynomial:
        raise ValueError("form='entries' is for polynomial activations")
    params = _params(model)
    b = np.array([float(c) for c in model.teacher_readout])

    def render():
        # lazy: sympy
        from ..codegen.diffusion_render import render_jacobian_entries_module
        return render_jacobian_entries_module(model)
    mod, _ = _cached("jacobian_entries", model.structure_key, render, required=("jacobian",))
    return lambda Q, rho, T, a, params=params: mod.jacobian(Q, rho, T, a, b, params)


def _derivatives(model: Model, form: str | None):
    """:class:`~symquad.numeric.drift_derivatives.DriftDerivatives` of `model` (memoised).

    Built on kernels with moment kinds: `form` ('matrix' or 'tensor', default the
    model's), the general matrix module for a classic model whose default kernel is
    the block form (it has no moment kinds).
    """
    form = check_kernels(model, None if form == "entries" else form)
    key = ("derivatives", form, model.structure_key, model)
    with _LOCK:
        cached = _MEMO.get(key)
    if cached is not None:
        return cached
    if has_spectrum(model):
        # the block drift's stencils; the risk ε(Ω) through the isotropic model's
        # derivatives at the total covariance (drift_derivatives.BlockDriftDerivatives)
        kern = dataclasses.replace(_block_kernels(model, form), _params=_params(model))
        iso = _derivatives(model.replace(spectrum=ISOTROPIC, constraint="none"), form)
        der = BlockDriftDerivatives(kern, iso)
    else:
        if form == "matrix":
            kern = _moment_kernels(model, "matrix", *_moment_module(model, "matrix"))
        else:
            kern = _kernels(model, form)
        der = DriftDerivatives(dataclasses.replace(kern, _params=_params(model)))
    with _LOCK:
        _MEMO[key] = der
    return der


def _second_order_function(model: Model):
    """``(f1, Hessian of f)(Q, rho, T, a)`` from the generated second-order entry module."""
    declare(model, SECOND_ORDER_STAGE)
    require_polynomial_diffusion(model, "the O(1/N) correction of the mean")
    params = _params(model)
    b = np.array([float(c) for c in model.teacher_readout])

    def render():
        # lazy: sympy
        from ..codegen.diffusion_render import render_second_order_entries_module
        return render_second_order_entries_module(model)
    mod, _ = _cached("second_order_entries", model.structure_key, render,
                     required=("second_order",))
    return lambda Q, rho, T, a, params=params: mod.second_order(Q, rho, T, a, b, params)


#: The stage of the O(1/N) mean correction in symquad.stages.STAGES (its fields: every
#: field of the model, symquad.symbolic.second_order).
SECOND_ORDER_STAGE = "the O(1/N) correction of the mean"
SECOND_ORDER_FIELDS = stage_fields(SECOND_ORDER_STAGE)


#: Largest activation degree (student or teacher) of the tensor-route diffusion: its
#: multigraph plan grows steeply with the degree — for z³ − 3z the largest kind has
#: 127285 multigraphs in 563 orbits (generated orbit-wise in 0.2 s), z² + z³/3 has
#: 1834740 in 6295 orbits, z² 1706 in 17; z⁴ would have 7180094 in 17700 orbits (5.1 s
#: to generate, load ~3 on 2 cores), each a contraction to evaluate at every call.
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
        # lazy: sympy
        from ..codegen.diffusion_render import render_diffusion_tensor_module
        return render_diffusion_tensor_module(model.activation, model.teacher_activation,
                                              generator=kernel_files.generator_version())
    mod, _ = _cached("diffusion_tensor", activation_key(model), render, required=("kinds",))
    return mod


def _assembly():
    mod, _ = _committed("assembly", required=("drift_none", "drift_sphere"))
    return mod


#: What the committed width-independent modules (the assembly of the drift and of the
#: diffusion, the matrix forms) and the per-pair tensor modules are generated for: widths
#: and activations are arguments or loop bounds, and the generators write one function per
#: constraint and readout state.  Any other field that keys the structure (a field added
#: later) is unknown to them.
_GENERATED_FOR = ("p", "p_star", "activation", "teacher_activation", "constraint",
                  "lr_readout", "loss", "spectrum")
# ``spectrum``: the moment modules are evaluated at the total covariance Ω with the block
# fields as legs, and the per-block drift is the generated block assembly
# (symquad._generated.block_assembly, one module for every B): _block_kernels.
# ``loss``: the drift in moment form is the same for every loss of spec.LOSSES (the abstract
# gradients are ``a_k σ'(λ_k) e`` with the error signal e opaque, tests/test_correlation_loss.py
# checks it), and the moment evaluators see the loss only through the error weights
# ``(c a, −b)`` that _moment_kernels passes them.


def check_generated_for(model: Model, what: str) -> None:
    """Refuse, naming them, fields of `model` that the generic generated modules do not know.

    A field whose role puts it into the structure key (:meth:`~symquad.Model.keyed_changes`)
    changes the generated code; the committed assembly and matrix modules and the per-pair
    tensor modules are generated without it, so reusing them would compute the old model.
    The entry route (``form='entries'``) generates one module per structure and has no
    such limit.
    """
    require_known_structure(model, f"{what}: the generated width-independent code",
                            _GENERATED_FOR, "extend the generators (symquad/codegen/), or "
                            "use form='entries'")


def _params(model: Model) -> tuple:
    params = _generated_assembly.PARAMS
    values = model.kernel_params()
    # a kernel parameter the generated code does not take would be dropped silently
    stale = [name for name in values if name not in params]
    if stale:
        raise ValueError(f"the generated kernels take no parameter(s) {stale} (their PARAMS "
                         f"are {params}): run `symquad regenerate` after adding a kernel "
                         f"parameter to the specification")
    return tuple(values[name] for name in params)


def _moment_kernels(model: Model, form: str, mod, source, extra=()) -> Kernels:
    """Kernels of a moment-kind module (matrix or tensor) through the generated assembly."""
    check_generated_for(model, f"kernels(form={form!r})")
    drift = getattr(_assembly(), f"drift_{model.constraint}")
    params = _params(model)
    b = np.array([float(c) for c in model.teacher_readout])
    trained, noise = model.readout_trained, model.noise
    # the moment kinds are expectations against the loss's error signal e = c yhat - y
    # (spec.LOSSES): the evaluators take its output weights (c a, -b) through `a`, and the
    # risk below keeps (a, -b), the square-loss error
    c = float(error_signal_weight(model))

    def moments(Q, rho, T, a):
        return mod.moments(Q, rho, T, c * np.asarray(a, dtype=float), b, noise, trained, *extra)

    def rhs(Q, rho, T, a, params=params):
        G, Gt, B, R = moments(Q, rho, T, a)
        return drift(Q, rho, a, G, Gt, B, R, params)
    return Kernels(model, form, source, rhs,
                   lambda Q, rho, T, a, bb: mod.risk(Q, rho, T, a, bb, *extra), moments)


def _moment_module(model: Model, form: str):
    """``(module, source, extra)`` of the moment kinds of `model` in `form` (matrix or tensor)."""
    if form == "matrix":
        mod, source = _committed("quadratic_matrix", required=("moments", "risk"))
        extra = tuple(float(c[j]) for c, j in ((model.activation, 2),
                                                (model.teacher_activation, 2),
                                                (model.activation, 0),
                                                (model.teacher_activation, 0)))
        return mod, source, extra
    if not model.is_polynomial:
        engine, source = _special_engine(model)
        return engine, source, ()
    mod, source = _tensor_module(model)
    return mod, source, ()


def block_covariances(spectrum, Q, rho, T):
    r"""The total covariance ``Ω`` and the block fields' legs of per-block overlaps.

    ``C^c = [[Q^c, ρ^c], [ρ^cᵀ, T^c]]`` (..., B, n, n); ``Ω = Σ_c s_c C^c`` (..., n, n), the
    covariance of the fields ``z = (λ, ν)`` under ``x ~ N(0, Σ_c s_c P_c)``; the legs
    (..., n, B n), ``legs[..., j, c n + l] = s_c C^c_{jl} = Cov(z_j, μ^c_l)`` with the block
    field ``μ^c_l`` of the ``l``-th row (student or teacher) through ``P_c``
    (docs/derivation.md §1a).  Returns ``(Q_Ω, ρ_Ω, T_Ω, legs)``.
    """
    s = np.array([float(sb) for _, sb in spectrum])
    C, p = combine(Q, rho, T)                       # (..., B, n, n)
    scaled = s[:, None, None] * C
    omega = scaled.sum(-3)
    n, B = C.shape[-1], C.shape[-3]
    legs = np.moveaxis(scaled, -3, -2).reshape(scaled.shape[:-3] + (n, B * n))
    return omega[..., :p, :p], omega[..., :p, p:], omega[..., p:, p:], legs


def _block_assembly():
    mod, _ = _committed("block_assembly", required=("drift_blocks_none", "drift_blocks_sphere"))
    return mod


def _block_kernels(model: Model, form: str) -> Kernels:
    """Kernels of a model with an input spectrum: the block drift from the moment kinds at ``Ω``.

    The moment module of the model's activations (the same as without the spectrum: it
    does not depend on it) is called at the total covariance ``Ω = Σ_c s_c C^c`` with the
    block fields as legs (:func:`block_covariances`), which gives ``Gb``, ``Gtb``
    (``E[σ'(λ_k) μ^c_l δ]``, Stein's lemma through the three-point sum's linear leg), ``B``
    and ``R`` at ``Ω``; the generated block assembly (:mod:`symquad._generated.block_assembly`,
    derived by :mod:`symquad.symbolic.blocks`) turns them into the per-block drift.  The risk
    is ``ε(Ω)``.  Fractions and eigenvalues are call-time values: one set of modules for
    every spectrum.
    """
    if form == "entries":                                  # pragma: no cover - declared first
        raise ValueError("kernels(form='entries') does not support the model field spectrum")
    check_generated_for(model, f"kernels(form={form!r})")
    mod, source, extra = _moment_module(model, form)
    drift = getattr(_block_assembly(), f"drift_blocks_{model.constraint}")
    params = _params(model)
    b = np.array([float(c) for c in model.teacher_readout])
    trained, noise = model.readout_trained, model.noise
    c = float(error_signal_weight(model))
    fs = np.array([float(f * s) for f, s in model.spectrum])
    tr_sigma = float(sum(f * s for f, s in model.spectrum))   # exact rationals, then float
    p, k, B = model.p, model.p_star, model.n_blocks

    def moments(Q, rho, T, a):
        Qo, ro, To, legs = block_covariances(model.spectrum, Q, rho, T)
        GL, _, Bk, R = mod.moments(Qo, ro, To, c * np.asarray(a, dtype=float), b, noise,
                                   trained, *extra, legs=legs)
        GL = np.moveaxis(GL.reshape(GL.shape[:-1] + (B, p + k)), -2, -3)   # (..., B, p, n)
        return GL[..., :p], GL[..., p:], Bk, R

    def rhs(Q, rho, T, a, params=params):
        Gb, Gtb, Bk, R = moments(Q, rho, T, a)
        return drift(Q, rho, Q.sum(-3), a, Gb, Gtb, Gb.sum(-3), Bk, R, fs, tr_sigma, params)

    def risk(Q, rho, T, a, bb):
        Qo, ro, To, _ = block_covariances(model.spectrum, Q, rho, T)
        return mod.risk(Qo, ro, To, a, bb, *extra)
    return Kernels(model, form, source, rhs, risk, moments)


def _uniform_readouts(model: Model) -> bool:
    """Fixed readouts, each uniform, no constraint, the square loss: the block-form kernel
    applies (it is generated for the error signal ``ŷ − y``)."""
    return (not model.readout_trained and model.constraint == "none"
            and model.loss == "square" and len(set(model.readout)) == 1 and len(set(model.teacher_readout)) == 1)


def _matrix_kernels(model: Model) -> Kernels:
    extra = tuple(float(c[j]) for c, j in ((model.activation, 2), (model.teacher_activation, 2),
                                           (model.activation, 0), (model.teacher_activation, 0)))
    if _uniform_readouts(model):
        check_generated_for(model, "kernels(form='matrix')")
        mod, source = _committed("quadratic_matrix_uniform")
        args = (model.p, model.p_star) + extra + (float(model.readout[0]),
                                                  float(model.teacher_readout[0]))
        params = _params(model)
        return Kernels(model, "matrix", source,
                       lambda Q, rho, T, a, params=params: mod.rhs(Q, rho, T, params, *args),
                       lambda Q, rho, T, a, b: mod.risk(Q, rho, T, *args))
    mod, source = _committed("quadratic_matrix", required=("moments", "risk"))
    return _moment_kernels(model, "matrix", mod, source, extra)


#: Fields the width-independent modules of moment kinds (tensor, special; their diffusion)
#: do not depend on: the widths are loop bounds, the constraint enters only the generated
#: assembly, and the trained readout is an argument of their ``moments``.  Every other field
#: that keys the structure (:meth:`~symquad.Model.structure_text`, a field added later
#: included) keys these modules too.
_MOMENT_MODULE_FREE = ("p", "p_star", "constraint", "lr_readout", "loss", "spectrum")


def activation_key(model: Model) -> str:
    """Stable 16-hex-digit key of a width-independent module of moment kinds.

    The model's structure (:meth:`~symquad.Model.structure_text`) without the
    fields such modules take as loop bounds or arguments: for the fields of
    symquad 0.2 that is the activation pair.
    """
    text = model.structure_text(exclude=_MOMENT_MODULE_FREE)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _is_committed_for(model: Model, canonical: Model, exclude=()) -> bool:
    """True when a committed module generated for `canonical` is `model`'s (same structure)."""
    return model.structure_text(exclude) == canonical.structure_text(exclude)


def _tensor_module(model: Model):
    key = (tuple(str(c) for c in model.activation),
           tuple(str(c) for c in model.teacher_activation))
    committed = TENSOR_MODULES.get(key)
    # the committed modules were generated for the pair's default model (codegen.tensor_render)
    if committed and _is_committed_for(model, Model(1, 1, 1.0, activation=model.activation,
                                                    teacher_activation=model.teacher_activation),
                                       _MOMENT_MODULE_FREE):
        return _committed(committed, required=("moments", "risk"))

    def render():
        # lazy: sympy
        from ..codegen.tensor_render import render_tensor_module
        return render_tensor_module(model.activation, model.teacher_activation,
                                    generator=kernel_files.generator_version())
    return _cached("tensor", activation_key(model), render, required=("moments", "risk"))


def _entry_module(model: Model):
    committed = ENTRY_MODULES.get((model.p, model.p_star))
    # committed for the default model of each width (codegen.render.CANONICAL_ENTRY_MODELS)
    if committed and _is_committed_for(model, Model(model.p, model.p_star, 1.0)):
        return _committed(committed)

    def render():
        # lazy: sympy
        from ..codegen.render import render_entries_module
        return render_entries_module(model)
    return _cached("entries", model.structure_key, render)


def default_form(model: Model) -> str:
    """``"matrix"`` for quadratic ``σ`` and ``σ*``, else ``"tensor"`` (erf and ReLU included)."""
    return "matrix" if model.is_quadratic else "tensor"


#: Seconds per unique quadruple ``(k ≤ l, a ≤ b)`` of the four-point sum of the special
#: kernels, by evaluator (:func:`symquad.runtime.special_engine.four_point_method`), and per
#: element of the ``O(p n²)`` three-point sum: upper bounds of what was measured on the
#: shared 2-core development machine at load 2.5–3 (one thread; benchmarks/bench_erf.py):
#: the erf fold 17 ns at p = 128 (p* = 2), the ReLU quadrature's sums 0.19–1.6 µs of CPU by
#: state at p = 64, p* = 4 (start to late, benchmarks/bench_special.py at load 11, one
#: thread, December 2026; 1–3.4 µs before the index coincidences and vectorised loops,
#: docs/special_activations.md), closed forms of a polynomial student with an erf/ReLU
#: teacher 33 ns (z², ReLU) to 0.4 µs (z⁴, erf) at p = 32, p* = 4.
SPECIAL_COST_PER_QUADRUPLE = {"fold": 40e-9, "closed": 0.8e-6, "quadrature": 2e-6}
SPECIAL_COST_PER_TRIPLE = 0.4e-6
#: One right-hand side of a special kernel estimated above this warns (an integration
#: takes hundreds to thousands of calls) ...
SPECIAL_WARN_SECONDS = 2.0
#: ... and above this is refused before anything is computed.
SPECIAL_REFUSE_SECONDS = 900.0


def special_support(model: Model) -> str | None:
    """Why the tensor kernels cannot evaluate ``model``'s activation pair (None if they can).

    Every pair of erf (erf(z/√2)), ReLU and polynomials has closed ``I_2, J_2, I_3``;
    ``I_4`` closes or has the ReLU quadrature except for a ReLU student with a
    polynomial teacher, whose mixed ``I_4`` (one ReLU and one polynomial field besides
    the two step functions) is not implemented (docs/special_activations.md).
    """
    if model.activation_kind == "relu" and model.teacher_activation_kind == "polynomial":
        return (f"activation='relu' with teacher_activation={model.teacher_activation_str!r}: "
                "the four-point function E[1{u_k>0}1{u_l>0} relu(u_a) sigma*(u_b)] of a ReLU "
                "student with a polynomial teacher is not implemented (it closes, but "
                "neither its closed form nor a quadrature exists in symquad); use a ReLU or "
                "erf teacher, or a polynomial student")
    return None


def special_rhs_seconds(model: Model) -> float:
    """Estimated seconds of one unbatched right-hand side of the special tensor kernels.

    ``p(p+1)/2 · n(n+1)/2`` quadruples of the four-point sum at
    :data:`SPECIAL_COST_PER_QUADRUPLE` plus ``p n²`` three-point elements (``p n · B n``
    with an input spectrum of ``B`` blocks: the block fields are ``B n`` legs).
    """
    p, n = model.p, model.p + model.p_star
    method = four_point_method(model.activation_kind, model.teacher_activation_kind)
    quads = p * (p + 1) / 2 * n * (n + 1) / 2
    return (quads * SPECIAL_COST_PER_QUADRUPLE[method]
            + p * n * n * model.n_blocks * SPECIAL_COST_PER_TRIPLE)


#: Seconds per drift state of the polynomial moment kernels, batched (upper bounds of what
#: benchmarks/bench_second_order.py measured on the shared 2-core machine at load ~2):
#: the matrix form ``5.5e-9 n³`` (p = 32, p* = 2), the tensor form ``4.4e-9 p² n²``
#: (z³ − 3z, p = 16), plus ~1e-5 s of fixed work per state at small widths.
DRIFT_STATE_COST = {"matrix": 1e-8, "tensor": 1e-8, "fixed": 2e-5}


def drift_state_seconds(model: Model, form: str | None = None) -> float:
    """Estimated seconds of one drift evaluation inside a batch of states (cost law).

    Matrix form ``1e-8 n³``, polynomial tensor form ``1e-8 p² n²`` (``n = p + p*``),
    plus ``2e-5`` s; erf, ReLU and mixed pairs: :func:`special_rhs_seconds`.
    """
    p, n = model.p, model.p + model.p_star
    if not model.is_polynomial:
        return special_rhs_seconds(model)
    form = form or default_form(model)
    if form == "matrix":
        return DRIFT_STATE_COST["matrix"] * n ** 3 + DRIFT_STATE_COST["fixed"]
    return DRIFT_STATE_COST["tensor"] * p * p * n * n + DRIFT_STATE_COST["fixed"]


def check_special_cost(model: Model) -> float:
    """Warn or refuse (ValueError) from :func:`special_rhs_seconds` before any kernel runs."""
    estimate = special_rhs_seconds(model)
    what = (f"one right-hand side of the {model.activation_str}/{model.teacher_activation_str} "
            f"tensor kernels at p={model.p}, p_star={model.p_star}")
    if estimate > SPECIAL_REFUSE_SECONDS:
        raise ValueError(
            f"{what} would take about {estimate:.3g} s (> {SPECIAL_REFUSE_SECONDS:.0f} s "
            f"allowed; the four-point sum grows like p^2 (p+p*)^2"
            + (", each ReLU-student term a quadrature" if model.activation_kind == "relu"
               else "") + "); use a smaller width")
    if estimate > SPECIAL_WARN_SECONDS:
        warnings.warn(f"{what} will take about {estimate:.3g} s (an ODE integration needs "
                      f"hundreds to thousands of them)", RuntimeWarning, stacklevel=3)
    return estimate


def _special_kernels(model: Model) -> Kernels:
    """Tensor kernels of a pair with erf or ReLU (:mod:`symquad.runtime.special_engine`)."""
    reason = special_support(model)
    if reason:
        raise ValueError(f"kernels: {reason}")
    engine, source = _special_engine(model)
    return _moment_kernels(model, "tensor", engine, source)


def _special_engine(model: Model):
    """``(SpecialEngine, source)`` of `model`'s activation pair (support and cost checked)."""
    reason = special_support(model)
    if reason:
        raise ValueError(f"kernels: {reason}")
    check_special_cost(model)
    # lazy: numba
    from .special import special_kernels, special_module_name
    key = ("special", activation_key(model))
    with _LOCK:
        cached = _MEMO.get(key)
    if cached is None:
        sk = special_kernels(model.activation, model.teacher_activation)
        source = getattr(sk.module, "__file__", None) or special_module_name(
            model.activation, model.teacher_activation)
        name = special_module_name(model.activation, model.teacher_activation)
        if (GENERATED_DIR / f"{name}.py").exists():
            source = f"symquad._generated.{name}"
        cached = (SpecialEngine(sk), source)
        with _LOCK:
            _MEMO[key] = cached
    return cached


def check_kernels(model: Model, form: str | None = None) -> str:
    """Every refusal of :func:`kernels` for ``model``, without building anything; the form.

    Studies that integrate the ODE after other work (``validate`` simulates SGD
    first) call this before that work, so an activation pair or form the
    kernels do not support is refused at once, not after the simulation
    (a ReLU student with a polynomial teacher was refused after 58 s of SGD).
    """
    check_model(model)
    check_float_activation(model.activation)
    check_float_activation(model.teacher_activation, "teacher_activation")
    if form is None:
        form = default_form(model)
    if form not in KERNEL_FORMS:
        raise ValueError(f"form must be one of {KERNEL_FORMS}, got {form!r}")
    declare(model, f"kernels(form={form!r})")
    if not model.is_polynomial and form != "tensor":
        raise ValueError(
            f"form={form!r} needs polynomial activations (it is built from Gaussian moments "
            f"of polynomials), got activation={model.activation_str!r}, teacher_activation="
            f"{model.teacher_activation_str!r}; erf (erf(z/sqrt(2))) and relu use "
            f"form='tensor' (the default)")
    if form == "matrix":
        if not model.is_quadratic:
            raise ValueError(
                f"form='matrix' needs quadratic activations c*z**2 (+ const) for the student "
                f"and the teacher, got {model.activation_str!r} and "
                f"{model.teacher_activation_str!r}; use form='tensor'")
    if form == "tensor" and not model.is_polynomial:
        reason = special_support(model)
        if reason:
            raise ValueError(f"kernels: {reason}")
        if special_rhs_seconds(model) > SPECIAL_REFUSE_SECONDS:
            check_special_cost(model)          # raises, naming the estimate
    return form


def kernels(model: Model, form: str | None = None, *, threads: int | None = None) -> Kernels:
    """Numeric kernels of ``model``.

    Parameters
    ----------
    model : Model
    form : {"matrix", "tensor", "entries"}, optional
        Default ``"matrix"`` when ``σ`` and ``σ*`` are both ``c z² (+ c0)``,
        ``"tensor"`` for every other pair — polynomials, and pairs with
        ``"erf"`` (erf(z/√2)) or ``"relu"``, whose ``I_2 … I_4`` are the closed
        forms (and the ReLU quadrature) of :mod:`symquad.runtime.special_engine`;
        their cost is estimated first (:func:`check_special_cost`).
        ``"entries"`` is the entry-by-entry reference route for polynomials,
        whose derivation cost grows fast with ``p`` (it checks the size first).
    threads : int, optional
        BLAS threads of the products (``p + p* >= 48``, and the tensor form);
        default ``SYMQUAD_THREADS`` or 1 (:func:`blas_threads`).

    Examples
    --------
    >>> import numpy as np, symquad as sq
    >>> k = sq.kernels(sq.Model(p=2, p_star=1, lr=0.1))
    >>> round(k.risk(np.eye(2), np.zeros((2, 1)), np.eye(1)), 6)
    1.5
    """
    n_threads = blas_threads(threads)
    check_model(model)                 # before model.schedule: a non-Model is a TypeError
    if not model.schedule.is_constant:
        # the generated code does not depend on the schedule (eta is an argument): the
        # constant-eta model's kernels, called with eta(t) (Kernels.params_at)
        form = check_kernels(model, form)
        base = _kernels(_untimed(model, f"kernels(form={form!r})"), form)
        kern = dataclasses.replace(base, model=model)
    else:
        kern = _kernels(model, form)
    kern = dataclasses.replace(kern, _params=_params(kern.model))
    return kern if n_threads == 1 else dataclasses.replace(kern, threads=n_threads)


def _eta_index() -> int:
    """Where ``eta`` sits in the kernels' ``PARAMS``."""
    return _generated_assembly.PARAMS.index("eta")


def _untimed(model: Model, stage: str) -> Model:
    """`model` with its schedule removed, after `stage` has accepted the schedule.

    The generated modules take ``η`` as an argument, so a scheduled model's code is the
    constant model's, called with ``η(t)``; the stage's own declaration (which must name
    ``lr_schedule``) is checked first, so a stage that does not implement schedules still
    refuses them.
    """
    if model.schedule.is_constant:
        return model
    declare(model, stage)
    return model.replace(lr_schedule="constant")


def _kernels(model: Model, form: str | None) -> Kernels:
    form = check_kernels(model, form)
    if has_spectrum(model):
        return _block_kernels(model, form)
    if form == "matrix":
        return _matrix_kernels(model)
    if form == "tensor" and not model.is_polynomial:
        return _special_kernels(model)
    if form == "tensor":
        mod, source = _tensor_module(model)
        return _moment_kernels(model, "tensor", mod, source)
    mod, source = _entry_module(model)
    params = _params(model)
    b = np.array([float(c) for c in model.teacher_readout])
    return Kernels(model, form, source,
                   lambda Q, rho, T, a, params=params: mod.rhs(Q, rho, T, a, b, params),
                   lambda Q, rho, T, a, bb: mod.risk(Q, rho, T, a, bb))

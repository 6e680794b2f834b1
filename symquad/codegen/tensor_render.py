r"""Render width-independent ("tensor") kernel modules for any polynomial activation.

A tensor module holds, for one pair of activations ``(σ, σ*)``:

* the vertex functions ``φ_j(D) = E[σ^{(j)}(x)]`` of the student and the
  teacher printed as numpy code (from
  :func:`symquad.symbolic.tensor.derive_tensor_form`);
* the derived multigraph terms of ``I_2, J_2, I_3, I_4``, grouped into a
  contraction plan (tables of edge multiplicities);
* two small functions, ``moments`` and ``risk``, that hand the plan to the
  hand-written engine :mod:`symquad.runtime.tensor_engine` (imported, never
  pasted), which evaluates it with Hadamard powers ``C^{∘j}/j!`` of the
  combined covariance ``C = [[Q, ρ], [ρᵀ, T]]`` and matrix products.

The moments are combined into the ODE by the generated assembly
(:mod:`symquad.codegen.assembly`).

**The 4-point sum.**  ``B_kl = Σ_ab w_a w_b I_4(k,l,a,b)`` is the only term
that costs ``O(p² n²)`` (``n = p + p*``).  Its multigraph terms carry edge
multiplicities ``(μ, α, β, γ, δ, ε)`` on the edges ``kl, ka, kb, la, lb, ab``
and vertex orders ``(j_k, j_l, j_a, j_b)``.  Grouped as

.. math::

   B_{kl} = \sum_μ \frac{C_{kl}^μ}{μ!} \sum_{(α,β)} \sum_{ab}
      E^{μαβ}_{k,ab}\, H^{μαβ}_{l,ab},\qquad
   E^{μαβ}_{k,ab} = φ_{j_k}(D_k) \frac{C_{ka}^α C_{kb}^β}{α!β!},

   H^{μαβ}_{l,ab} = \sum_{(γ,δ)} φ_{j_l}(D_l) \frac{C_{la}^γ C_{lb}^δ}{γ!δ!}
      \sum_ε \frac{C_{ab}^ε}{ε!} w_a φ_{j_a}(D_a)\, w_b φ_{j_b}(D_b),

each ``μ`` is one matrix product ``(p, K n²) × (K n², p)`` over all its keys
``(α, β)`` at once (``K`` keys; the ``a`` axis is cut into blocks to bound
memory).  The summand is symmetric under ``a ↔ b`` with ``(α,β,γ,δ) ↔
(β,α,δ,γ)``, so only keys with ``α ≤ β`` are kept, those with ``α < β``
counted twice (the generator checks the term set really is symmetric).
"""

from __future__ import annotations

import pprint
import textwrap
from collections import defaultdict

import sympy as sp

from ..kernel_files import BANNER, checksum_line
from ..spec import Model
from ..symbolic.tensor import VARIANCE, derive_tensor_form
from .printer import ScalarPrinter

__all__ = ["TENSOR_BUILTINS", "coefficient_key", "pair_key", "render_tensor_module",
           "tensor_plan"]


def coefficient_key(activation) -> tuple:
    """Registry key of an activation: ``str`` of each coefficient, lowest order first."""
    return tuple(str(c) for c in activation)


def pair_key(activation, teacher_activation) -> tuple:
    """Registry key of a pair ``(σ, σ*)``: the two coefficient keys."""
    return (coefficient_key(activation), coefficient_key(teacher_activation))


#: Activation pairs ``(σ, σ*)`` whose tensor modules are committed:
#: ``{pair_key: module name}`` (σ = σ* = z³, He₃ = z³ − 3z, z⁴, z + z², z²; and
#: a z² student learning a He₃ teacher).
TENSOR_BUILTINS = {
    pair_key(m.activation, m.teacher_activation): name
    for m, name in ((Model(1, 1, 1.0, activation="z**3"), "tensor_cubic"),
                    (Model(1, 1, 1.0, activation="z**3 - 3*z"), "tensor_hermite3"),
                    (Model(1, 1, 1.0, activation="z**4"), "tensor_quartic"),
                    (Model(1, 1, 1.0, activation="z + z**2"), "tensor_linear_quadratic"),
                    (Model(1, 1, 1.0, activation="z**2"), "tensor_square"),
                    (Model(1, 1, 1.0, activation="z**2", teacher_activation="z**3 - 3*z"),
                     "tensor_square_hermite3"))
}



def tensor_plan(tf):
    """Group the derived terms of ``I_2, J_2, I_3, I_4`` into the engine's tables.

    Returns
    -------
    dict
        ``RISK``: ε of ``Σ_ab w_a w_b C_ab^ε/ε! φ_ε(D_a) φ_ε(D_b)``;
        ``NOISE``: ε of ``C_kl^ε/ε! φ_{ε+1}(D_k) φ_{ε+1}(D_l)``;
        ``I3_DIRECT``: ``(μ, j_k, j_a)`` of ``C_kj φ_{j_k}(D_k) Σ_a C_ka^μ/μ! w_a φ_{j_a}(D_a)``;
        ``I3_THROUGH``: ``(μ, j_k, j_a)`` of ``φ_{j_k}(D_k) Σ_a C_ka^μ/μ! w_a φ_{j_a}(D_a) C_aj``;
        ``I4``: ``((μ, ((α, β, weight, j_k, ((γ, δ, j_l, ((ε, j_a, j_b), ...)), ...)), ...)), ...)``.
    """
    risk = tuple(sorted(e[(0, 1)] for e, _ in tf.I2.terms))
    noise = tuple(sorted(e[(0, 1)] for e, _ in tf.J2.terms))
    direct, through = [], []
    for edges, (jk, _, ja) in tf.I3.terms:
        entry = (edges[(0, 2)], jk, ja)
        (direct if edges[(0, 1)] else through).append(entry)
    nested = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    all_terms = set()
    for edges, (jk, jl, ja, jb) in tf.I4.terms:
        mu, alpha, beta = edges[(0, 1)], edges[(0, 2)], edges[(0, 3)]
        gamma, delta, eps = edges[(1, 2)], edges[(1, 3)], edges[(2, 3)]
        all_terms.add((mu, alpha, beta, gamma, delta, eps))
        if alpha <= beta:
            nested[mu][(alpha, beta, jk)][(gamma, delta, jl)].append((eps, ja, jb))
    mirror = {(m, b, a, d, g, e) for m, a, b, g, d, e in all_terms}
    if mirror != all_terms:  # pragma: no cover - guaranteed by the σ,σ vertices at a, b
        raise AssertionError("I4 terms are not symmetric under a <-> b")
    plan = []
    for mu in sorted(nested):
        keys = []
        for (alpha, beta, jk) in sorted(nested[mu]):
            inner = tuple((g, d, jl, tuple(sorted(nested[mu][(alpha, beta, jk)][(g, d, jl)])))
                          for (g, d, jl) in sorted(nested[mu][(alpha, beta, jk)]))
            keys.append((alpha, beta, 2 if alpha < beta else 1, jk, inner))
        plan.append((mu, tuple(keys)))
    return {"RISK": risk, "NOISE": noise, "I3_DIRECT": tuple(sorted(direct)),
            "I3_THROUGH": tuple(sorted(through)), "I4": tuple(plan)}


def _phi_lines(table, printer, indent):
    out = []
    for j, f in enumerate(table):
        if f == 0:
            code = "None"
        elif not f.free_symbols:
            value = sp.Rational(f)
            code = (f"numpy.full_like(D, {value.p}.0)" if value.q == 1
                    else f"numpy.full_like(D, {value.p}/{value.q})")
        else:
            code = printer.doprint(f.subs(VARIANCE, sp.Symbol("D")))
        out.append(f"{indent}{code},  # j = {j}")
    return out


def _phi_source(tf) -> list[str]:
    """``phi(D, p)``: ``φ_j`` of every field (students: σ, teachers: σ*), None where ≡ 0."""
    printer = ScalarPrinter()
    lines = ["def phi(D, p):",
             '    """φ_j(D_a) = E[σ_a^(j)(x)], x ~ N(0, D_a), j = 0..DEGREE, over all fields.',
             "",
             "    The first p fields are students (σ), the others teachers (σ*); None",
             '    where φ_j vanishes identically for both."""']
    if tf.same_activation:
        lines += ["    return ("] + _phi_lines(tf.phi, printer, "        ") + ["    )"]
        return lines
    lines += ["    student = _phi_one(D[..., :p], STUDENT)",
              "    teacher = _phi_one(D[..., p:], TEACHER)",
              "    return tuple(None if s is None and t is None else numpy.concatenate(",
              "        [numpy.zeros_like(D[..., :p]) if s is None else s,",
              "         numpy.zeros_like(D[..., p:]) if t is None else t], axis=-1)",
              "        for s, t in zip(student, teacher))",
              "",
              "",
              "def _phi_one(D, which):",
              '    """φ_j of one activation (STUDENT or TEACHER) on the variances D."""',
              "    if which == STUDENT:",
              "        return ("] + _phi_lines(tf.phi, printer, "            ") + [
              "        )",
              "    return ("] + _phi_lines(tf.phi_teacher, printer, "        ") + ["    )"]
    return lines


_API = '''

_PLAN = _engine.Plan(DEGREE, RISK, NOISE, I3_DIRECT, I3_THROUGH, I4, phi)


def moments(Q, rho, T, a, b, Delta, readout=False, legs=None):
    """Moment kinds (G, Gt, B, R) at (Q, rho, T) with readouts a, b; R is None unless readout.

    With legs (..., n, m), the covariances of further Gaussian variables with the
    fields, G is E[σ'(λ_k) μ_j δ] (..., p, m) of those legs and Gt is None.
    """
    return _engine.moments(_PLAN, Q, rho, T, a, b, Delta, readout, legs)


def risk(Q, rho, T, a, b):
    """Population risk ε = ½ E[(ŷ − y_clean)²]; shape (...,)."""
    return _engine.risk(_PLAN, Q, rho, T, a, b)
'''


def render_tensor_module(activation, teacher_activation=None, generator: str | None = None) -> str:
    """Tensor kernel module for the activations ``(σ, σ*)`` (any polynomials).

    ``generator`` (cached modules only) is recorded as ``GENERATOR`` so that a
    module written by another generator version is never used.
    """
    activation = tuple(activation)
    teacher_activation = activation if teacher_activation is None else tuple(teacher_activation)
    tf = derive_tensor_form(activation, teacher_activation)
    probe = Model(1, 1, 1.0, activation=activation, teacher_activation=teacher_activation)
    act, tact = probe.activation_str, probe.teacher_activation_str
    plan = tensor_plan(tf)
    counts = {name: len(getattr(tf, name).terms) for name in ("I2", "J2", "I3", "I4")}
    pair = f"σ(z) = {act}" + ("" if tf.same_activation else f", σ*(z) = {tact}")
    doc = textwrap.dedent(f'''\
        """Tensor-form moment kernels for {pair}, any width.

        Derived by symquad.symbolic.tensor (multigraph expansion of the 2-, 3-
        and 4-point functions; {counts['I2']} + {counts['J2']} + {counts['I3']} + {counts['I4']} terms for I2, J2, I3, I4) and
        rendered by symquad.codegen.tensor_render; evaluated by
        symquad.runtime.tensor_engine.  Cost O(p² (p + p*)²) per call.

        Argument layout (every array may carry the same leading batch dimensions):
            Q      (..., p, p)    student-student overlaps  W Wᵀ/N
            rho    (..., p, p*)   student-teacher overlaps  W W*ᵀ/N
            T      (..., p*, p*)  teacher-teacher overlaps  W* W*ᵀ/N
            a      (..., p)       student readout
            b      (..., p*)      teacher readout
            Delta  float          label-noise variance Δ
        Time is t = steps/N.
        """
        ''')
    out = [BANNER, doc, "import numpy\n", "from symquad.runtime import tensor_engine as _engine",
           "", f"ACTIVATION = {act!r}", f"TEACHER_ACTIVATION = {tact!r}",
           f"DEGREE = {tf.degree}"]
    if not tf.same_activation:
        out += ["STUDENT, TEACHER = 0, 1"]
    if generator is not None:
        out.append(f"GENERATOR = {generator!r}")
    out += ["", "# Contraction plan (see symquad.codegen.tensor_render.tensor_plan):",
            "#   RISK, NOISE: ε;  I3_DIRECT, I3_THROUGH: (μ, j_k, j_a);",
            "#   I4: (μ, ((α, β, weight, j_k, ((γ, δ, j_l, ((ε, j_a, j_b), ...)), ...)), ...))"]
    for name in ("RISK", "NOISE", "I3_DIRECT", "I3_THROUGH", "I4"):
        out.append(f"{name} = " + pprint.pformat(plan[name], width=96, compact=True)
                   .replace("\n", "\n" + " " * (len(name) + 3)))
    out += ["", ""] + _phi_source(tf)
    body = "\n".join(out) + "\n" + _API
    return body + checksum_line(body)

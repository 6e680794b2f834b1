"""The output of a simulation (:class:`SimulationRun`) and the population risk of overlaps.

Both simulators of :mod:`symquad.numeric.simulate` and the order-parameter SDE of
:mod:`symquad.numeric.sde` return a :class:`SimulationRun`; this module sits below
both so that the SDE does not import the simulator that dispatches to it.
``symquad.numeric.simulate`` re-exports both names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .checks import as_real_array, check_float_activation
from .status import MemberStatus
from .persist import model_to_dict, save_npz, load_npz, model_from_dict

__all__ = ["SimulationRun", "population_risk", "block_population_risk"]


# ---------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------
@dataclass
class SimulationRun(MemberStatus):
    """Recorded SGD trajectories of several independent replicas.

    Attributes
    ----------
    model : symquad.spec.Model
    N : int
        Input dimension.
    method : {"reduced", "full"}
    seed : int or None
    t : ndarray, shape (n,)
        Recorded times ``steps/N``.
    Q : ndarray, shape (replicas, n, p, p)
        Student overlaps ``W Wᵀ/N``.
    rho : ndarray, shape (replicas, n, p, p*)
        Student–teacher overlaps ``W W*ᵀ/N``.
    risk : ndarray, shape (replicas, n)
        Population risk ``ε = ½ E[(ŷ − y_clean)²]`` at the recorded weights.
    T : ndarray, shape (p*, p*)
        Teacher overlaps (fixed).
    status : ndarray of str, shape (replicas,)
        ``"ok"`` or ``"diverged"``.  After divergence a replica is frozen and
        its recorded entries are NaN (see `last_finite`).
    t_diverged : ndarray, shape (replicas,)
        Time of the divergence check that caught the blow-up (NaN if none);
        the blow-up happened in the ``check_every/N`` before it.
    last_finite : dict
        ``{"t": (replicas,), "Q": (replicas, p, p), "rho": (replicas, p, p*)}``
        (and ``"readout"`` (replicas, p) for a trained readout): the last
        checked finite state of each replica (the final state for replicas
        that did not diverge).
    readout : ndarray, shape (replicas, n, p), or None
        The student readout ``a(t)`` when it is trained, else None.
    """

    model: object
    N: int
    method: str
    seed: object
    t: np.ndarray
    Q: np.ndarray
    rho: np.ndarray
    risk: np.ndarray
    T: np.ndarray
    status: np.ndarray
    t_diverged: np.ndarray
    last_finite: dict = field(repr=False)
    check_every: int = 1
    readout: np.ndarray | None = field(default=None, repr=False)

    @property
    def replicas(self) -> int:
        """Number of replicas."""
        return self.Q.shape[0]

    def summary(self) -> str:
        """One-paragraph printable summary."""
        final = self.risk[:, -1]
        ok = np.isfinite(final)
        text = (f"SimulationRun(method={self.method!r}, N={self.N}, replicas={self.replicas}, "
                f"t_max={self.t[-1]:.4g}, {len(self.t)} records, seed={self.seed})\n"
                f"  final risk: mean {np.mean(final[ok]) if ok.any() else float('nan'):.4g}, "
                f"std {np.std(final[ok]) if ok.any() else float('nan'):.3g}")
        if self.n_diverged:
            text += (f"\n  DIVERGED: {self.n_diverged}/{self.replicas} replicas, first at "
                     f"t = {np.nanmin(self.t_diverged):.4g}")
        return text

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        div = f", {self.n_diverged} diverged" if self.n_diverged else ""
        return (f"SimulationRun({self.method}, N={self.N}, {self.replicas} replicas x "
                f"{len(self.t)} times in [{self.t[0]:.3g}, {self.t[-1]:.3g}], "
                f"seed={self.seed}{div}; {self.model!r})")

    def save(self, path) -> Path:
        """Write the run to ``path`` (``.npz`` with a JSON ``meta.json`` member), atomically.

        Arrays (``t, Q, rho, risk, T, status, t_diverged`` and the
        ``last_finite`` states) are stored exactly; the model, ``N``, the
        method, the seed and ``check_every`` go into the JSON metadata.
        :meth:`load` reads it back.
        """
        meta = {"model": model_to_dict(self.model), "N": int(self.N), "method": self.method,
                "seed": None if self.seed is None else int(self.seed),
                "check_every": int(self.check_every)}
        arrays = {"t": self.t, "Q": self.Q, "rho": self.rho, "risk": self.risk, "T": self.T,
                  "status": np.asarray(self.status, dtype=str),
                  "t_diverged": self.t_diverged,
                  **{f"last_finite_{key}": value for key, value in self.last_finite.items()}}
        if self.readout is not None:
            arrays["readout"] = self.readout
        return save_npz(path, "SimulationRun", meta, arrays)

    @classmethod
    def load(cls, path) -> "SimulationRun":
        """Read a run written by :meth:`save` (same arrays, same model)."""
        meta, arr = load_npz(path, "SimulationRun", ("model", "N", "method", "seed",
                                                     "check_every"),
                             ("t", "Q", "rho", "risk", "T", "status", "t_diverged"))
        last = {key[len("last_finite_"):]: value for key, value in arr.items()
                if key.startswith("last_finite_")}
        return cls(model=model_from_dict(meta["model"]), N=int(meta["N"]),
                   method=meta["method"], seed=meta["seed"], t=arr["t"], Q=arr["Q"],
                   rho=arr["rho"], risk=arr["risk"], T=arr["T"], status=arr["status"],
                   t_diverged=arr["t_diverged"], last_finite=last,
                   check_every=int(meta["check_every"]), readout=arr.get("readout"))


# ---------------------------------------------------------------------------
# population risk by Isserlis' theorem (second route to the kernels' risk)
# ---------------------------------------------------------------------------
def _double_factorial_odd(n: int) -> int:
    """``(n−1)!!`` for even ``n >= 0`` (the moment ``E[g^n]`` of a standard Gaussian)."""
    return math.prod(range(n - 1, 0, -2)) if n > 0 else 1


def _moment_table(deg: int) -> np.ndarray:
    """Coefficients ``m[i, j, k]`` with ``E[u^i v^j] = Σ_k m[i,j,k] c^k a^{(i−k)/2} b^{(j−k)/2}``.

    For a centred Gaussian pair with ``Var u = a``, ``Var v = b``,
    ``Cov(u, v) = c``, Isserlis' theorem sums over pairings: ``k`` pairs join
    a ``u`` with a ``v`` (``binom(i,k) binom(j,k) k!`` ways), the remaining
    ``i−k`` (resp. ``j−k``) factors pair among themselves (``(i−k−1)!!`` ways,
    zero when odd).
    """
    m = np.zeros((deg + 1, deg + 1, deg + 1))
    for i in range(deg + 1):
        for j in range(deg + 1):
            for k in range(min(i, j) + 1):
                if (i - k) % 2 or (j - k) % 2:
                    continue
                m[i, j, k] = (math.comb(i, k) * math.comb(j, k) * math.factorial(k)
                              * _double_factorial_odd(i - k) * _double_factorial_odd(j - k))
    return m


def _vertex_values(activation, D, top):
    """``φ_m(D) = E[σ^{(m)}(x)]``, ``x ~ N(0, D)``, ``m = 0..top`` (list of arrays like D).

    Typed from the textbook formulas (independent of symquad.symbolic.special):
    erf(z/√2): ``φ_{2r+1} = √(2/π) (−1)^r (2r−1)!! (1+D)^{−r−1/2}``, even orders 0;
    ReLU: ``φ_0 = √(D/2π)``, ``φ_1 = ½``, ``φ_m = He_{m−2}(0) D^{−(m−1)/2}/√(2π)``
    (``He_{2r}(0) = (−1)^r (2r−1)!!``, odd ones 0); a polynomial ``Σ c_j z^j``:
    ``Σ_j c_j j!/(j−m)! E[x^{j−m}]``.
    """
    out = []
    for m in range(top + 1):
        if activation == "erf":
            if m % 2 == 0:
                out.append(np.zeros_like(D))
            else:
                r = (m - 1) // 2
                out.append(math.sqrt(2 / math.pi) * (-1) ** r * _double_factorial_odd(2 * r)
                           * (1 + D) ** (-r - 0.5))
        elif activation == "relu":
            if m == 0:
                out.append(np.sqrt(np.maximum(D, 0) / (2 * math.pi)))
            elif m == 1:
                out.append(np.full_like(D, 0.5))
            elif m % 2:
                out.append(np.zeros_like(D))
            else:
                r = (m - 2) // 2
                out.append((-1) ** r * _double_factorial_odd(2 * r) * D ** (-(m - 1) / 2)
                           / math.sqrt(2 * math.pi))
        else:
            c = [float(v) for v in activation]
            val = np.zeros_like(D)
            for j in range(m, len(c)):
                q = j - m
                if q % 2 == 0 and c[j]:
                    val = val + c[j] * math.factorial(j) / math.factorial(q) \
                        * _double_factorial_odd(q) * D ** (q // 2)
            out.append(val)
    return out


def _special_pair(f, g, A, c, B):
    """``E[f(u) g(v)]`` for a centred Gaussian pair (variances A, B, covariance c).

    Closed forms typed from the literature: erf–erf ``(2/π) asin(c/√((1+A)(1+B)))``
    (Saad & Solla 1995); ReLU–ReLU the arc-cosine kernel ``√(AB)(sin θ + (π − θ)
    cos θ)/(2π)``, ``cos θ = c/√(AB)`` (Cho & Saul 2009); erf–ReLU
    ``c/√(2π(1+A))`` (erf at u).  With a polynomial: the finite Price expansion
    ``Σ_m c^m/m! φ^f_m(A) φ^g_m(B)`` (:func:`_vertex_values`).
    """
    if f == g == "erf":
        return 2 / math.pi * np.arcsin(np.clip(c / np.sqrt((1 + A) * (1 + B)), -1, 1))
    if f == g == "relu":
        ab = np.sqrt(np.maximum(A * B, 0))
        cos = np.clip(np.divide(c, ab, out=np.zeros_like(c), where=ab > 0), -1, 1)
        theta = np.arccos(cos)
        return ab * (np.sqrt(1 - cos * cos) + (math.pi - theta) * cos) / (2 * math.pi)
    if {f, g} == {"erf", "relu"}:
        Aerf = A if f == "erf" else B
        return c / np.sqrt(2 * math.pi * (1 + Aerf))
    top = min(len(x) - 1 for x in (f, g) if not isinstance(x, str))
    pf, pg = _vertex_values(f, A, top), _vertex_values(g, B, top)
    return sum(c ** m / math.factorial(m) * pf[m] * pg[m] for m in range(top + 1))


def _special_second_moments(C, p, student, teacher):
    """``E[σ_a(u_a) σ_b(u_b)]`` over every field pair, (..., n, n) (``σ_a`` by role)."""
    D = np.diagonal(C, axis1=-2, axis2=-1)
    Da, Db = D[..., :, None], D[..., None, :]
    out = np.empty(C.shape)
    blocks = ((slice(0, p), slice(0, p), student, student),
              (slice(0, p), slice(p, None), student, teacher),
              (slice(p, None), slice(p, None), teacher, teacher))
    for rows, cols, f, g in blocks:
        out[..., rows, cols] = _special_pair(f, g, Da[..., rows, :], C[..., rows, cols],
                                             Db[..., :, cols])
    out[..., p:, :p] = np.swapaxes(out[..., :p, p:], -1, -2)
    return out


def population_risk(model, Q, rho, T, readout=None) -> np.ndarray:
    """Population risk ``ε = ½ E[(ŷ − y_clean)²]`` from the overlaps.

    With ``z = (λ, ν) ~ N(0, C)``, ``C = [[Q, ρ], [ρᵀ, T]]``, output weights
    ``w = (a_1, …, a_p, −b_1, …, −b_p*)`` and activations ``σ_a`` (``σ`` for the
    students, ``σ*`` for the teachers),

    .. math::  ε = \\tfrac12 \\sum_{a,b} w_a w_b \\sum_{i,j} c^{(a)}_i c^{(b)}_j\\,
               E[z_a^i z_b^j],

    each bivariate moment evaluated exactly by Isserlis' theorem
    (:func:`_moment_table`).  Works for any polynomial activations and any
    batch of overlaps; a route independent of the generated kernels.  For
    erf(z/√2) and ReLU (and their mixed pairs with polynomials) the bivariate
    expectations are the closed forms of the literature, typed here
    (:func:`_special_pair`), not the generated kernels'.

    Parameters
    ----------
    model : Model or sequence of numbers
        The model (its activations and readouts), or an activation
        ``(c0, ..., cd)`` shared by student and teacher with the default
        readouts ``1/p``, ``1/p*``.
    Q : array_like, shape (..., p, p)
    rho : array_like, shape (..., p, p*)
    T : array_like, shape (p*, p*) or (..., p*, p*)
    readout : array_like, shape (..., p), optional
        The student readout (a trained one's current value); default the
        model's.

    Returns
    -------
    ndarray, shape (...)

    The states are evaluated in pieces of whole rows of the first batch axis, about
    :data:`RISK_PIECE_STATES` states each (one row where a row holds more): every
    operation is per state, so the pieces give the numbers of one evaluation of the
    whole batch (checked bit for bit), with temporaries of a few MiB per piece, not a
    whole record's (tracemalloc peak of one 4096-state piece, ``p = 5, p* = 1``,
    ``σ = z²``: 9.4 MiB; of a 192 × 1201 record at once: ~600 MB).
    """
    named = hasattr(model, "teacher_activation") and not model.is_polynomial
    risk = _named_population_risk if named else _polynomial_population_risk
    # not copied here: only read, and each piece is converted (copied) by `risk`
    Q, rho, T = (as_real_array(x, n, finite=False, copy=False)
                 for x, n in ((Q, "Q"), (rho, "rho"), (T, "T")))
    batch = np.broadcast_shapes(Q.shape[:-2], rho.shape[:-2], T.shape[:-2])
    inner = math.prod(batch[1:])
    if not batch or batch[0] * inner <= RISK_PIECE_STATES:
        return risk(model, Q, rho, T, readout)
    if readout is not None:
        readout = as_real_array(readout, "readout", finite=False, copy=False)
        readout = np.broadcast_to(readout, batch + readout.shape[-1:])
    Q, rho, T = (np.broadcast_to(x, batch + x.shape[-2:]) for x in (Q, rho, T))
    step = max(1, RISK_PIECE_STATES // max(inner, 1))
    out = np.empty(batch)
    for i in range(0, batch[0], step):
        rows = slice(i, i + step)
        out[rows] = risk(model, Q[rows], rho[rows], T[rows],
                         None if readout is None else readout[rows])
    return out


#: States per piece of :func:`population_risk`: each holds ~30 temporaries of its
#: states' joint covariances (6×6 at p = 5, p* = 1: ~9 MB in 4096 states), where the
#: whole record of a simulation (192 replicas × 1201 times) held ~600 MB.
RISK_PIECE_STATES = 4096


def _polynomial_population_risk(model, Q, rho, T, readout):
    """:func:`population_risk` of polynomial activations (Isserlis' theorem, all at once)."""
    if hasattr(model, "teacher_activation"):
        c_s = np.asarray([float(v) for v in check_float_activation(model.activation)])
        c_t = np.asarray([float(v) for v in check_float_activation(model.teacher_activation,
                                                                   "teacher_activation")])
        a = np.array([float(v) for v in model.readout]) if readout is None else \
            as_real_array(readout, "readout", finite=False)
        b = np.array([float(v) for v in model.teacher_readout])
    else:
        c_s = c_t = np.asarray([float(v) for v in check_float_activation(tuple(model))])
        a = b = None
    Q, rho, T = (as_real_array(x, n, finite=False) for x, n in ((Q, "Q"), (rho, "rho"), (T, "T")))
    p, ps = rho.shape[-2:]
    batch = np.broadcast_shapes(Q.shape[:-2], rho.shape[:-2], T.shape[:-2])
    Q = np.broadcast_to(Q, batch + (p, p))
    rho = np.broadcast_to(rho, batch + (p, ps))
    T = np.broadcast_to(T, batch + (ps, ps))
    C = np.concatenate([np.concatenate([Q, rho], -1),
                        np.concatenate([np.swapaxes(rho, -1, -2), T], -1)], -2)
    deg = max(len(c_s), len(c_t)) - 1
    c = np.zeros((p + ps, deg + 1))                               # coefficients per field
    c[:p, :len(c_s)] = c_s
    c[p:, :len(c_t)] = c_t
    mt = _moment_table(deg)
    var = np.diagonal(C, axis1=-2, axis2=-1)                      # (..., d)
    sd_pow = np.stack([np.sqrt(np.clip(var, 0, None)) ** n for n in range(deg + 1)], -1)
    cov_pow = np.stack([C ** k for k in range(deg + 1)], -1)      # (..., d, d, deg+1)
    # E[σ_a(z_a) σ_b(z_b)] = Σ_{ijk} c^a_i c^b_j m_ijk C_ab^k sd_a^{i-k} sd_b^{j-k}
    second = np.zeros(C.shape)
    for i in range(deg + 1):
        for j in range(deg + 1):
            cc = c[:, i][:, None] * c[:, j][None, :]
            if not cc.any():
                continue
            for k in range(min(i, j) + 1):
                if mt[i, j, k] == 0:
                    continue
                second += (cc * mt[i, j, k] * cov_pow[..., k]
                           * sd_pow[..., :, None, i - k] * sd_pow[..., None, :, j - k])
    if a is None:
        w = np.concatenate([np.full(p, 1.0 / p), np.full(ps, -1.0 / ps)])
        return 0.5 * np.einsum("a,...ab,b->...", w, second, w)
    w = np.concatenate([np.broadcast_to(a, second.shape[:-2] + (p,)),
                        np.broadcast_to(-b, second.shape[:-2] + (ps,))], axis=-1)
    return 0.5 * np.einsum("...a,...ab,...b->...", w, second, w)


def _named_population_risk(model, Q, rho, T, readout):
    """:func:`population_risk` of a model with erf(z/√2) or ReLU (:func:`_special_pair`)."""
    check_float_activation(model.activation)
    check_float_activation(model.teacher_activation, "teacher_activation")
    a = np.array([float(v) for v in model.readout]) if readout is None else \
        as_real_array(readout, "readout", finite=False)
    b = np.array([float(v) for v in model.teacher_readout])
    Q, rho, T = (as_real_array(x, n, finite=False) for x, n in ((Q, "Q"), (rho, "rho"), (T, "T")))
    p, ps = rho.shape[-2:]
    batch = np.broadcast_shapes(Q.shape[:-2], rho.shape[:-2], T.shape[:-2])
    C = np.concatenate([np.concatenate([np.broadcast_to(Q, batch + (p, p)),
                                        np.broadcast_to(rho, batch + (p, ps))], -1),
                        np.concatenate([np.swapaxes(np.broadcast_to(rho, batch + (p, ps)), -1, -2),
                                        np.broadcast_to(T, batch + (ps, ps))], -1)], -2)
    with np.errstate(invalid="ignore", divide="ignore"):
        second = _special_second_moments(C, p, model.activation, model.teacher_activation)
    w = np.concatenate([np.broadcast_to(a, second.shape[:-2] + (p,)),
                        np.broadcast_to(-b, second.shape[:-2] + (ps,))], axis=-1)
    return 0.5 * np.einsum("...a,...ab,...b->...", w, second, w)


def block_population_risk(model, Q, rho, T, readout=None):
    """``ε(Ω)`` of per-block overlaps: :func:`population_risk` at ``Ω = Σ_c s_c C^c``."""
    s = np.array([float(sc) for _, sc in model.spectrum])
    Q, rho, T = (np.asarray(x, dtype=float) for x in (Q, rho, T))
    w = s[:, None, None]
    return population_risk(model, (w * Q).sum(-3), (w * rho).sum(-3), (w * T).sum(-3),
                           readout)

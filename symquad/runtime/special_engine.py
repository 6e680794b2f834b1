r"""The tensor route's moment kinds for erf, ReLU and mixed activation pairs.

For a pair ``(σ, σ*)`` with a non-polynomial member (``"erf"`` = erf(z/√2),
``"relu"``) the 2-, 3- and 4-point functions are the closed forms (or, for a
ReLU student's ``I_4``, the quadrature) of a generated special module
(:mod:`symquad.codegen.special_render`, loaded by
:func:`symquad.numeric.special.special_kernels`).  This module evaluates the
moment kinds of :mod:`symquad.symbolic.moments` from them over the index grids
of the combined covariance ``C = [[Q, ρ], [ρᵀ, T]]`` (``n = p + p*`` fields,
output weights ``w = (a, −b)``):

* ``G_kj = Σ_a w_a I_3(k, j, a)`` for students ``k`` and all fields ``j`` (``O(p n²)``);
* ``B_kl = Σ_ab w_a w_b I_4(k, l, a, b) + Δ J_2(k, l)`` (``O(p² n²)``);
* ``R_k = Σ_a w_a I_2(k, a)`` (trained readouts only) and the risk
  ``ε = ½ Σ_ab w_a w_b I_2(a, b)`` (``O(n²)``, summed in ``numpy.longdouble``),

where each function is the student/teacher variant of the module (``I3_s`` for a
student ``a``, ``I3_t`` for a teacher, ``I4_ss``/``I4_st``/``I4_tt`` by the roles
of ``a, b``).  The generated assembly turns the moments into the drift, exactly as
for the polynomial tensor kernels (:func:`symquad.numeric.kernels._moment_kernels`).

The four-point sum uses ``I_4(k,l,a,b) = I_4(l,k,a,b) = I_4(k,l,b,a)``: only
``k ≤ l`` and ``a ≤ b`` are evaluated (``p(p+1)/2 · n(n+1)/2`` quadruples) and
the others are weighted ``2 − δ_ab``.  Three evaluators:

* **erf student** (any teacher): the folded form
  ``I_4 = F_4(Λ_kl, N_aa, N_ab, N_bb)`` (:func:`symquad.symbolic.special.four_point_folded`):
  ``Λ_kl = (1 + C_kk)(1 + C_ll) − C_kl²`` once per pair and ``N_ab = Λ C_ab −
  x_a·adj(I + C_{kl}) x_b`` with ``x_v = (C_kv, C_lv)`` (a rank-two update), so each
  quadruple costs a few arithmetic operations and one ``asin``;
* **ReLU student** with ReLU or erf teachers: the polar quadrature
  (:func:`symquad.numeric.special.relu_four_point_sums`, compiled);
* **polynomial student** with erf or ReLU teachers: the generated closed forms of
  the ten covariance entries, with the merged form ``I4_tt_aa`` on the teacher
  diagonal ``a = b`` of a ReLU teacher (where the general form contains
  ``E[δ(u_a)δ(u_b)]``).

Work is done in blocks of at most :data:`BLOCK_ELEMENTS` quadruples (bounded
memory, vectorised numpy).  Leading batch dimensions are allowed.
"""

from __future__ import annotations

import numpy

from .tensor_engine import combine, weights

__all__ = ["SpecialEngine", "BLOCK_ELEMENTS", "FOLD_BLOCK_ELEMENTS", "four_point_method"]

#: Quadruples ``(k ≤ l, a ≤ b)`` per block of the four-point sum (~2 MB per array) ...
BLOCK_ELEMENTS = 1 << 18
#: ... and ``(k ≤ l, a, b)`` elements per block of the erf student's folded sum (~0.5 MB
#: per array; measured 1.5–2x faster than 2 MB blocks at p = 64, the arrays stay in cache).
FOLD_BLOCK_ELEMENTS = 1 << 16


def four_point_method(student, teacher) -> str:
    """``"fold"`` (erf student), ``"quadrature"`` (ReLU student) or ``"closed"`` (polynomial)."""
    if student == "erf":
        return "fold"
    if student == "relu":
        return "quadrature"
    return "closed"


def _fold_chunk(p):
    """Side of the student chunks of the folded sum: ``max(16, ⌈p/8⌉)`` (whole block below 32)."""
    return p if p < 32 else max(16, -(-p // 8))


def _flat(C, w):
    """``C`` (..., n, n) and ``w`` (..., n) broadcast to one batch shape, flattened to (B, ·)."""
    batch = numpy.broadcast_shapes(C.shape[:-2], w.shape[:-1])
    n = C.shape[-1]
    Cf = numpy.ascontiguousarray(numpy.broadcast_to(C, batch + (n, n)).reshape(-1, n, n))
    wf = numpy.ascontiguousarray(numpy.broadcast_to(w, batch + (n,)).reshape(-1, n))
    return Cf, wf, batch


class SpecialEngine:
    """Moment kinds and risk of one special activation pair (see the module docstring).

    Parameters
    ----------
    kernels : symquad.numeric.special.SpecialKernels
        The pair's 2-, 3- and 4-point functions.
    """

    def __init__(self, kernels):
        self.k = kernels
        self.method = four_point_method(kernels.student, kernels.teacher)
        self.relu_teacher_diagonal = (self.method == "closed" and kernels.teacher == "relu")

    # ---- two- and three-point sums ------------------------------------------------
    def _two_point_blocks(self, C, p):
        """``I_2`` over all field pairs (..., n, n), student/teacher variants by block."""
        D = numpy.diagonal(C, axis1=-2, axis2=-1)
        Da, Db = D[..., :, None], D[..., None, :]
        out = numpy.empty(C.shape)
        out[..., :p, :p] = self.k.I2_ss(Da[..., :p, :], C[..., :p, :p], Db[..., :, :p])
        out[..., :p, p:] = self.k.I2_st(Da[..., :p, :], C[..., :p, p:], Db[..., :, p:])
        out[..., p:, :p] = numpy.swapaxes(out[..., :p, p:], -1, -2)
        out[..., p:, p:] = self.k.I2_tt(Da[..., p:, :], C[..., p:, p:], Db[..., :, p:])
        return out

    def _three_point(self, C, w, p, legs=None):
        """``G_kj = Σ_a w_a I_3(k, j, a)``; (B, p, n).

        ``I_3(k, j, a)`` depends on the field ``u_j`` only through ``C_kj`` and ``C_ja``
        (it is linear in them: Stein's lemma); `legs` (B, n, m), the covariances of ``m``
        further Gaussian variables with the fields, take their place: (B, p, m), the
        ``E[σ'(λ_k) μ_j δ]`` of the legs (an input spectrum's block fields).
        """
        Bt, n = C.shape[0], C.shape[-1]
        right = C if legs is None else legs
        m = right.shape[-1]
        D = numpy.diagonal(C, axis1=-2, axis2=-1)
        G = numpy.empty((Bt, p, m))
        # Cov(leg j, field a) as [j, a]
        across = C if legs is None else numpy.swapaxes(legs, -1, -2)
        # blocks of (batch elements) x (students k) x n x n elements: several batch
        # elements at once when p n² is small (ODE batches of many replicas)
        per_batch = p * m * n
        group = max(1, BLOCK_ELEMENTS // max(1, per_batch))
        step = p if group > 1 else max(1, BLOCK_ELEMENTS // max(1, m * n))
        for b0 in range(0, Bt, group):
            bs = slice(b0, min(Bt, b0 + group))
            c, d, wb = C[bs], D[bs], w[bs]
            r, x = right[bs], across[bs]
            for k0 in range(0, p, step):
                ks = slice(k0, min(p, k0 + step))
                Ckk = d[:, ks, None, None]
                Ckj = r[:, ks, :, None]
                Ck_ = c[:, ks, None, :]
                Cja = x[:, None, :, :]
                Caa = d[:, None, None, :]
                s = numpy.einsum("bkja,ba->bkj", self.k.I3_s(
                    Ckk, Ckj, Ck_[..., :p], Cja[..., :p], Caa[..., :p]), wb[:, :p])
                t = numpy.einsum("bkja,ba->bkj", self.k.I3_t(
                    Ckk, Ckj, Ck_[..., p:], Cja[..., p:], Caa[..., p:]), wb[:, p:])
                G[bs, ks] = s + t
        return G

    # ---- the four-point sum -------------------------------------------------------
    def _four_point(self, C, w, p):
        """``Σ_ab w_a w_b I_4(k, l, a, b)``; (B, p, p)."""
        if self.method == "quadrature":
            # lazy: numba
            from ..numeric.special import relu_four_point_sums
            return relu_four_point_sums(C, w, p, (self.k.teacher,))
        Bt, n = C.shape[0], C.shape[-1]
        pk, pl = numpy.triu_indices(p)
        ia, ib = numpy.triu_indices(n)
        # the triangle a <= b ordered by roles (ss, st, tt): each role a slice of columns
        role = numpy.where(ib < p, 0, numpy.where(ia < p, 1, 2))
        order = numpy.argsort(role, kind="stable")
        ia, ib, role = ia[order], ib[order], role[order]
        bounds = numpy.searchsorted(role, [0, 1, 2, 3])
        roles = [(name, slice(bounds[r], bounds[r + 1]))
                 for r, name in enumerate(("ss", "st", "tt")) if bounds[r + 1] > bounds[r]]
        D = numpy.diagonal(C, axis1=-2, axis2=-1)
        # per batch element, over the triangle: C_ab, C_aa, C_bb and the weights (2 − δ_ab) w_a w_b
        tri = {"ab": C[:, ia, ib], "aa": D[:, ia], "bb": D[:, ib],
               "w": w[:, ia] * w[:, ib] * (2.0 - (ia == ib)), "wfull": w}
        # rows: (batch element, k <= l) pairs
        bt = numpy.repeat(numpy.arange(Bt), pk.size)
        rk, rl = numpy.tile(pk, Bt), numpy.tile(pl, Bt)
        total = numpy.zeros(bt.size)
        if self.method == "fold":
            c = _fold_chunk(p)
            rows = max(1, FOLD_BLOCK_ELEMENTS // max(c * c, p * (n - p)))
        else:
            rows = max(1, BLOCK_ELEMENTS // ia.size)
        for r0 in range(0, bt.size, rows):
            sl = slice(r0, min(bt.size, r0 + rows))
            total[sl] = self._pair_block(C, D, tri, bt[sl], rk[sl], rl[sl], roles, ia, ib, p)
        S = numpy.empty((Bt, p, p))
        vals = total.reshape(Bt, pk.size)
        S[:, pk, pl] = vals
        S[:, pl, pk] = vals
        return S

    def _pair_block(self, C, D, tri, bt, k, l, roles, ia, ib, p):
        """Four-point sums of one block of (batch, k ≤ l) rows over the triangle a ≤ b."""
        one_batch = bool((bt == bt[0]).all())

        def rows_of(table):            # (rows, M): one batch element broadcasts
            return table[bt[:1]] if one_batch else table[bt]
        Ckk, Ckl, Cll = C[bt, k, k][:, None], C[bt, k, l][:, None], C[bt, l, l][:, None]
        xk, xl = C[bt, k, :], C[bt, l, :]
        if self.method == "fold":
            return self._fold_block(rows_of(C), rows_of(D), rows_of(tri["wfull"]), Ckk, Ckl,
                                    Cll, xk, xl, p)
        Cab, Caa, Cbb, weight = (rows_of(tri[x]) for x in ("ab", "aa", "bb", "w"))
        out = numpy.zeros(bt.size)
        for name, cols in roles:
            ra, rb = ia[cols], ib[cols]
            Cka, Ckb, Cla, Clb = xk[:, ra], xk[:, rb], xl[:, ra], xl[:, rb]
            args = (Caa[:, cols], Cab[:, cols], Cbb[:, cols])
            if name == "tt" and self.relu_teacher_diagonal:
                # a = b: the merged vertex relu² (the general form has E[δ(u_a)δ(u_b)])
                off = ra != rb
                F = numpy.empty(Cka.shape)
                F[:, off] = self.k.I4_tt(Ckk, Ckl, Cll, Cka[:, off], Ckb[:, off], Cla[:, off],
                                         Clb[:, off], *(x[:, off] for x in args))
                F[:, ~off] = self.k.I4_tt_aa(Ckk, Ckl, Cll, Cka[:, ~off], Cla[:, ~off],
                                             args[0][:, ~off])
            else:
                F = getattr(self.k, f"I4_{name}")(Ckk, Ckl, Cll, Cka, Ckb, Cla, Clb, *args)
            out += numpy.einsum("ij,ij->i", numpy.broadcast_to(weight[:, cols], F.shape), F)
        return out

    def _fold_block(self, C, D, w, Ckk, Ckl, Cll, xk, xl, p):
        """erf student: ``Σ_ab w_a w_b F_4(Λ, N_aa, N_ab, N_bb)`` of a block of rows.

        `C`, `D`, `w`: the rows' covariances, variances and weights (or one
        batch element's, broadcast).  On the full ``n × n`` grid of each row
        (measured faster than gathering the triangle ``a ≤ b``: the folded
        form's ``a``- and ``b``-only parts then stay ``(rows, n)`` vectors), by
        role blocks ``ss`` (upper chunks, :meth:`_fold_blocks`), ``st`` (twice:
        ``I_4`` is symmetric in ``a ↔ b``), ``tt``; ``N = Λ C − X Y`` with ``X = (x_k, x_l)`` and ``Y = adj(M) Xᵀ``
        written into one buffer per block (fewer temporaries: measured 10 % faster).
        """
        Lam = (1.0 + Ckk) * (1.0 + Cll) - Ckl * Ckl                     # (rows, 1)
        X = numpy.stack([xk, xl], axis=-1)                              # (rows, n, 2)
        Y = numpy.stack([(1.0 + Cll) * xk - Ckl * xl,
                         (1.0 + Ckk) * xl - Ckl * xk], axis=1)         # (rows, 2, n)
        Nd = Lam * D - numpy.einsum("rai,ria->ra", X, Y)                # N_vv, every field v
        w = numpy.broadcast_to(w, xk.shape)
        L3 = Lam[:, :, None]
        out = numpy.zeros(xk.shape[0])
        for name, ra, rb, mult in self._fold_blocks(p):
            N = numpy.multiply(L3, C[..., ra, rb])                      # N_ab (rows, ·, ·)
            N -= numpy.matmul(X[:, ra, :], Y[:, :, rb])
            F = getattr(self.k, f"F4_{name}")(L3, Nd[:, ra, None], N, Nd[:, None, rb])
            out += mult * numpy.einsum("iab,ia,ib->i", F, w[:, ra], w[:, rb])
        return out

    @staticmethod
    def _fold_blocks(p):
        """``(role, a-slice, b-slice, multiplicity)`` covering the ``a, b`` grid once.

        The student-student block is cut into ``c × c`` chunks and only the chunks
        on and above the diagonal are evaluated (``I_4`` is symmetric in ``a ↔ b``;
        off-diagonal chunks count twice): ``(c + 1)/(2c)`` of the work for ``c`` chunks
        per side (:func:`_fold_chunk`).
        """
        size = _fold_chunk(p)
        edges = list(range(0, p, size)) + [p]
        out = []
        for i in range(len(edges) - 1):
            for j in range(i, len(edges) - 1):
                out.append(("ss", slice(edges[i], edges[i + 1]),
                            slice(edges[j], edges[j + 1]), 1.0 if i == j else 2.0))
        out.append(("st", slice(0, p), slice(p, None), 2.0))
        out.append(("tt", slice(p, None), slice(p, None), 1.0))
        return out

    # ---- the moment kinds and the risk ---------------------------------------------
    def moments(self, Q, rho, T, a, b, Delta, readout=False, legs=None):
        """The moment kinds ``(G, Gt, B, R)`` at ``(Q, ρ, T)`` with readouts ``a``, ``b``.

        Same contract as :func:`symquad.runtime.tensor_engine.moments`: ``G``
        (..., p, p), ``Gt`` (..., p, p*), ``B`` (..., p, p) with the label noise
        ``Δ J_2``, ``R`` (..., p) or None unless `readout`; with `legs` (..., n, m)
        the first two are ``E[σ'(λ_k) μ_j δ]`` (..., p, m) of the legs and None.
        """
        C, p = combine(Q, rho, T)
        w = weights(a, b)
        Cf, wf, batch = _flat(C, w)
        n = Cf.shape[-1]
        Lf = None
        if legs is not None:
            legs = numpy.asarray(legs, dtype=float)
            m = legs.shape[-1]
            Lf = numpy.ascontiguousarray(numpy.broadcast_to(legs, batch + (n, m)).reshape(
                -1, n, m))
        G = self._three_point(Cf, wf, p, Lf)
        B = self._four_point(Cf, wf, p)
        if Delta:
            D = numpy.diagonal(Cf, axis1=-2, axis2=-1)[:, :p]
            B = B + Delta * self.k.J2(D[:, :, None], Cf[:, :p, :p], D[:, None, :])
        R = None
        if readout:
            D = numpy.diagonal(Cf, axis1=-2, axis2=-1)
            Dk, Da = D[:, :p, None], D[:, None, :]
            R = (numpy.einsum("bka,ba->bk", self.k.I2_ss(Dk, Cf[:, :p, :p], Da[:, :, :p]),
                              wf[:, :p])
                 + numpy.einsum("bka,ba->bk", self.k.I2_st(Dk, Cf[:, :p, p:], Da[:, :, p:]),
                                wf[:, p:]))
            R = R.reshape(batch + (p,))
        if Lf is not None:
            return G.reshape(batch + (p, Lf.shape[-1])), None, B.reshape(batch + (p, p)), R
        G = G.reshape(batch + (p, n))
        return G[..., :, :p], G[..., :, p:], B.reshape(batch + (p, p)), R

    def risk(self, Q, rho, T, a, b):
        """Population risk ``ε = ½ Σ_ab w_a w_b I_2(a, b)``; shape (...,).

        The closed ``I_2`` are float64; their weighted sum (student and teacher
        terms cancel near zero risk) runs in ``numpy.longdouble`` with the
        readouts in that precision (pass them as longdouble arrays).
        """
        C, p = combine(Q, rho, T)
        w = weights(a, b, numpy.longdouble)
        I2 = self._two_point_blocks(C, p).astype(numpy.longdouble)
        total = numpy.einsum("...a,...ab,...b->...", w, I2, w)
        return (0.5 * total).astype(float)

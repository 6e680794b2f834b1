r"""A compiled interpreter of pairwise tensor contractions over one flat workspace.

A contraction step

.. math::  Z[z] \mathrel{(+)=} \sum w[·]\, X[x]\, Y[y]

(``Z`` zeroed first or accumulated into, the weight operand ``w`` optional) is
described by its loop letters: per letter a dimension and the stride of each
operand along it (0 where the operand lacks the letter, so a letter missing from
``Z`` is summed).  Every operand is a region of one ``float64`` workspace
``W[b, :]`` (one row per state of a batch), so a whole straight-line program of
such steps is one integer table (:func:`encode`, one row per step) run by one
compiled function (:func:`run`): no Python or numpy call per step.  It replaces
thousands of small ``einsum`` calls whose fixed cost (~1–3 µs each) was most of
the diffusion matrix's time at small width (docs/benchmarks-finite-n.md).

The loops are plain multiply-adds in a fixed order (the output's letters outside,
the summed ones inside), so a step's value is the same sum as ``einsum``'s in
another order of the additions: equal to rounding.  The inner loops of a small matrix
product run in a register kernel (:func:`_axpy_rows`: four rows × 8 entries of ``z``
summed in registers, the same additions in the same order); short unit-stride runs of
steps that sum nothing (outer and elementwise products, the stacking of a group's
operand) in chunks of 8 as straight-line code (:func:`_axpy8`, :func:`_mul8`: a loop
of 8 or 16 entries otherwise runs in the loop vectoriser's scalar remainder).  A
weighted step may carry a third factor, ``Z += Σ ((X·Y)·U)·w`` (:func:`_inner3`): a final
whose operand ``X·Y``, a step that sums nothing, is never written.  numba
compiles :func:`run` once (``cache=True``: later processes load it from the on-disk
cache).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["MAX_LETTERS", "ROW", "encode", "gather", "kernel_of", "run"]

#: Most loop letters of one step (after merging letters contiguous in every operand).
MAX_LETTERS = 12

# header of a row: number of letters, operand offsets, output size, zero flag, weighted flag
# (0 none, 1 weighted, 2 weighted with a third factor), the third factor's offset
_NL, _X, _Y, _Z, _W, _ZSIZE, _ZERO, _WEIGHTED, _U = range(9)
_H = 9
_D, _XS, _YS, _ZS, _WS, _US = (_H + k * MAX_LETTERS for k in range(6))
#: Integers per encoded step.
ROW = _H + 6 * MAX_LETTERS
#: Shortest fastest output letter that :func:`encode` puts innermost, the summed letters
#: outside it (shorter: a dot product innermost).
AXPY_MIN = 4


def _strides(shape):
    """C-order strides (in elements) of `shape`."""
    out, acc = [0] * len(shape), 1
    for k in range(len(shape) - 1, -1, -1):
        out[k] = acc
        acc *= shape[k]
    return out


def encode(x, y, z, w=None, zero=True, u=None):
    """One step as a row of :data:`ROW` integers.

    Parameters
    ----------
    x, y, z : tuple
        ``(offset, letters, shape)`` of each operand in the workspace row (C order,
        one letter per axis; ``y`` may be ``(offset, "", ())`` for a constant).
    w : tuple, optional
        ``(offset, letter)``: a weight vector along one letter of ``x`` and ``y``
        (the term axis); every product is multiplied by it.
    zero : bool
        Zero ``z`` before accumulating (False: add to what it holds).
    u : tuple, optional
        ``(offset, letters, shape)``: a third factor (with `w` only),
        ``Z (+)= Σ ((X·Y)·U)·w`` — a weighted final whose operand ``X·Y`` (a step that
        sums nothing) is never written (``diffusion_engine._Executable``).

    The letters are ordered with ``z``'s outside (in its memory order) and the
    summed ones inside (longest last), except that ``z``'s fastest letter goes
    innermost when it has at least :data:`AXPY_MIN` entries; neighbouring letters
    that are contiguous in every operand are merged into one loop.
    """
    if u is not None and w is None:
        raise ValueError("a third factor u needs the weight w")
    dims, st = {}, {}
    for k, (off, letters, shape) in enumerate((x, y, z) if u is None else
                                              (x, y, z, (0, "", ()), u)):
        for ch, d, s in zip(letters, shape, _strides(shape)):
            dims[ch] = d
            st.setdefault(ch, [0, 0, 0, 0, 0])[k] += s
    if w is not None:
        st[w[1]][3] = 1
    letters = [ch for ch in dims if dims[ch] > 1]
    outer = sorted((ch for ch in letters if st[ch][2]), key=lambda c: -st[c][2])
    inner = sorted((ch for ch in letters if not st[ch][2]), key=lambda c: dims[c])
    if inner and outer and dims[outer[-1]] >= AXPY_MIN:
        # the summed letters just outside z's fastest one: the innermost loop then
        # updates independent entries of z (no chain of dependent additions)
        order = outer[:-1] + inner + outer[-1:]
    else:
        order = outer + inner
    loops = _merge(order, dims, st)
    if inner and outer:
        # or further out, where z's fastest letters merge into one longer loop (laid
        # out for it: diffusion_engine._layouts); the cheapest by the cost model
        for cut in range(len(outer) - 1):
            cand = _merge(outer[:cut] + inner + outer[cut:], dims, st)
            if _cost(cand, u is not None) < _cost(loops, u is not None):
                loops = cand
    if not loops:
        loops = [(1, [0, 0, 0, 0, 0])]
    if len(loops) > MAX_LETTERS:
        raise ValueError(f"a contraction step with {len(loops)} loops (at most {MAX_LETTERS})")
    row = np.zeros(ROW, dtype=np.int64)
    row[_NL] = len(loops)
    row[_X], row[_Y], row[_Z] = x[0], y[0], z[0]
    row[_W] = w[0] if w is not None else 0
    row[_ZSIZE] = math.prod(z[2])
    row[_ZERO] = int(zero)
    row[_WEIGHTED] = 2 if u is not None else int(w is not None)
    row[_U] = u[0] if u is not None else 0
    for k, (d, s) in enumerate(loops):
        row[_D + k] = d
        row[_XS + k], row[_YS + k], row[_ZS + k], row[_WS + k], row[_US + k] = s
    return row


def _merge(order, dims, st):
    """Loops ``(length, strides)`` in `order`, neighbours contiguous in every operand merged."""
    loops = []
    for ch in order:
        d, s = dims[ch], st[ch]
        if loops and all(a == b * d for a, b in zip(loops[-1][1], s)):
            loops[-1] = (loops[-1][0] * d, s)
        else:
            loops.append((d, s))
    return loops


def _takes_rows(loops, three=False):
    """Whether loops ``(length, (sx, sy, sz, sw, su))`` run in the register kernel: the
    condition of :func:`_rows_kernel` (which :func:`run` applies, never to a step with a
    third factor, `three`), on the loop list."""
    if len(loops) < 3 or three:
        return False
    (d0, (sx, sy, sz, sw, *_)), (_, s1), (d2, s2) = loops[-1], loops[-2], loops[-3]
    return (s1[2] == 0 and sw == 0 and sz == 1 and d0 >= 8 and s2[2] != 0
            and d2 >= ROWS_MIN and (sx, sy) in ((0, 1), (1, 0)))


def _cost(loops, three=False):
    """Estimated nanoseconds of a step's loops in :func:`run`, to rank loop orders.

    ~2 ns per entry of the innermost loop, ~5 ns per entry of the next, and per
    multiply-add 0.18 ns in a unit-stride update of 16 or more entries (which the
    compiler vectorises) or 0.35 ns in a shorter one — fitted to two rows measured on the
    development machine, one thread (``z_{abc} += Σ_k y_{ak} x_{bkc}``, ``p = 8``,
    ``n = 10``: 2.2 GMAC/s with runs of 8, 4.8 GMAC/s with runs of 64) —, 0.4 ns in a dot
    product and 0.45 ns with other strides (rough: such rows ran at 1–2.5 GMAC/s).  A step
    that takes the register kernel (:func:`_axpy_rows`): 0.08 ns per multiply-add (13–16
    GMAC/s measured on long sums, 5–6.5 on ``8 × 10 × 8`` products), ~6 ns per chunk of
    4 rows × 8 entries.
    """
    macs = math.prod(d for d, _ in loops)
    d0, (sx, sy, sz, *rest) = loops[-1]
    d1 = loops[-2][0] if len(loops) > 1 else 1
    if three and rest[1] not in (0, 1):
        sx = -1                                 # a third factor read with a stride
    if _takes_rows(loops, three):
        # the register kernel (_axpy_rows): four rows × 8 entries summed over d1 in
        # registers, ~0.08 ns per multiply-add (13 GMAC/s measured on long sums), ~6 ns
        # per chunk; a tail of d0 mod 8 entries as a short update
        n8 = d0 - d0 % 8
        return (macs * (0.08 * n8 + 0.35 * (d0 - n8)) / d0 + 6.0 * macs / (32 * d1)
                + 5.0 * macs / (d0 * d1 * 4))
    if sz == 0:
        per = 0.4
    elif sz == 1 and sx in (0, 1) and sy in (0, 1):
        per = 0.18 if d0 >= 16 else 0.35
    else:
        per = 0.45
    return macs * per + 2.0 * macs / d0 + 5.0 * macs / (d0 * d1)


@njit(cache=True)
def _acc8(V, d1, ao, sa1, bo, sb1, z):  # pragma: no cover
    """``z[0:8] += Σ_j a_j b_j[0:8]`` over ``d1`` terms, the 8 sums in registers.

    Loaded and stored once; no store inside the loop, so LLVM's SLP vectoriser
    can pack the eight chains into vector registers (indices unsigned: no
    wraparound test between them).
    """
    z0 = V[np.uint64(z + 0)]
    z1 = V[np.uint64(z + 1)]
    z2 = V[np.uint64(z + 2)]
    z3 = V[np.uint64(z + 3)]
    z4 = V[np.uint64(z + 4)]
    z5 = V[np.uint64(z + 5)]
    z6 = V[np.uint64(z + 6)]
    z7 = V[np.uint64(z + 7)]
    for _ in range(d1):
        a = V[np.uint64(ao)]
        z0 += a * V[np.uint64(bo + 0)]
        z1 += a * V[np.uint64(bo + 1)]
        z2 += a * V[np.uint64(bo + 2)]
        z3 += a * V[np.uint64(bo + 3)]
        z4 += a * V[np.uint64(bo + 4)]
        z5 += a * V[np.uint64(bo + 5)]
        z6 += a * V[np.uint64(bo + 6)]
        z7 += a * V[np.uint64(bo + 7)]
        ao += sa1
        bo += sb1
    V[np.uint64(z + 0)] = z0
    V[np.uint64(z + 1)] = z1
    V[np.uint64(z + 2)] = z2
    V[np.uint64(z + 3)] = z3
    V[np.uint64(z + 4)] = z4
    V[np.uint64(z + 5)] = z5
    V[np.uint64(z + 6)] = z6
    V[np.uint64(z + 7)] = z7


@njit(cache=True)
def _acc8w(V, d1, ao, sa1, bo, sb1, z, wo, sw1):  # pragma: no cover
    """:func:`_acc8` with ``a_j`` weighted by ``V[wo + j·sw1]``.

    Loaded and stored once; no store inside the loop, so LLVM's SLP vectoriser
    can pack the eight chains into vector registers (indices unsigned: no
    wraparound test between them).
    """
    z0 = V[np.uint64(z + 0)]
    z1 = V[np.uint64(z + 1)]
    z2 = V[np.uint64(z + 2)]
    z3 = V[np.uint64(z + 3)]
    z4 = V[np.uint64(z + 4)]
    z5 = V[np.uint64(z + 5)]
    z6 = V[np.uint64(z + 6)]
    z7 = V[np.uint64(z + 7)]
    for _ in range(d1):
        a = V[np.uint64(ao)] * V[np.uint64(wo)]
        z0 += a * V[np.uint64(bo + 0)]
        z1 += a * V[np.uint64(bo + 1)]
        z2 += a * V[np.uint64(bo + 2)]
        z3 += a * V[np.uint64(bo + 3)]
        z4 += a * V[np.uint64(bo + 4)]
        z5 += a * V[np.uint64(bo + 5)]
        z6 += a * V[np.uint64(bo + 6)]
        z7 += a * V[np.uint64(bo + 7)]
        ao += sa1
        bo += sb1
        wo += sw1
    V[np.uint64(z + 0)] = z0
    V[np.uint64(z + 1)] = z1
    V[np.uint64(z + 2)] = z2
    V[np.uint64(z + 3)] = z3
    V[np.uint64(z + 4)] = z4
    V[np.uint64(z + 5)] = z5
    V[np.uint64(z + 6)] = z6
    V[np.uint64(z + 7)] = z7


@njit(cache=True)
def _acc8x4(V, d1, ao, sa1, sa2, bo, sb1, sb2, z, sz2):  # pragma: no cover
    """Four rows of :func:`_acc8` at once: ``z_r[0:8] += Σ_j a_rj b_rj[0:8]``, ``r < 4``.

    Row ``r`` reads ``a`` at ``ao + r·sa2``, ``b`` at ``bo + r·sb2`` and writes ``z``
    at ``z + r·sz2`` (the next loop out, an output letter).  32 sums in registers:
    four independent chains of additions per column instead of one, so the loop runs
    at the adder's throughput, not its latency (an 8 × 10 × 8 product: ~80 MACs per
    chain of 10 dependent additions otherwise).  Same additions per entry, same order.
    """
    z0 = z
    z1 = z + 1 * sz2
    z2 = z + 2 * sz2
    z3 = z + 3 * sz2
    c00 = V[np.uint64(z0 + 0)]
    c01 = V[np.uint64(z0 + 1)]
    c02 = V[np.uint64(z0 + 2)]
    c03 = V[np.uint64(z0 + 3)]
    c04 = V[np.uint64(z0 + 4)]
    c05 = V[np.uint64(z0 + 5)]
    c06 = V[np.uint64(z0 + 6)]
    c07 = V[np.uint64(z0 + 7)]
    c10 = V[np.uint64(z1 + 0)]
    c11 = V[np.uint64(z1 + 1)]
    c12 = V[np.uint64(z1 + 2)]
    c13 = V[np.uint64(z1 + 3)]
    c14 = V[np.uint64(z1 + 4)]
    c15 = V[np.uint64(z1 + 5)]
    c16 = V[np.uint64(z1 + 6)]
    c17 = V[np.uint64(z1 + 7)]
    c20 = V[np.uint64(z2 + 0)]
    c21 = V[np.uint64(z2 + 1)]
    c22 = V[np.uint64(z2 + 2)]
    c23 = V[np.uint64(z2 + 3)]
    c24 = V[np.uint64(z2 + 4)]
    c25 = V[np.uint64(z2 + 5)]
    c26 = V[np.uint64(z2 + 6)]
    c27 = V[np.uint64(z2 + 7)]
    c30 = V[np.uint64(z3 + 0)]
    c31 = V[np.uint64(z3 + 1)]
    c32 = V[np.uint64(z3 + 2)]
    c33 = V[np.uint64(z3 + 3)]
    c34 = V[np.uint64(z3 + 4)]
    c35 = V[np.uint64(z3 + 5)]
    c36 = V[np.uint64(z3 + 6)]
    c37 = V[np.uint64(z3 + 7)]
    for _ in range(d1):
        a0 = V[np.uint64(ao)]
        b0 = bo
        a1 = V[np.uint64(ao + 1 * sa2)]
        b1 = bo + 1 * sb2
        a2 = V[np.uint64(ao + 2 * sa2)]
        b2 = bo + 2 * sb2
        a3 = V[np.uint64(ao + 3 * sa2)]
        b3 = bo + 3 * sb2
        c00 += a0 * V[np.uint64(b0 + 0)]
        c01 += a0 * V[np.uint64(b0 + 1)]
        c02 += a0 * V[np.uint64(b0 + 2)]
        c03 += a0 * V[np.uint64(b0 + 3)]
        c04 += a0 * V[np.uint64(b0 + 4)]
        c05 += a0 * V[np.uint64(b0 + 5)]
        c06 += a0 * V[np.uint64(b0 + 6)]
        c07 += a0 * V[np.uint64(b0 + 7)]
        c10 += a1 * V[np.uint64(b1 + 0)]
        c11 += a1 * V[np.uint64(b1 + 1)]
        c12 += a1 * V[np.uint64(b1 + 2)]
        c13 += a1 * V[np.uint64(b1 + 3)]
        c14 += a1 * V[np.uint64(b1 + 4)]
        c15 += a1 * V[np.uint64(b1 + 5)]
        c16 += a1 * V[np.uint64(b1 + 6)]
        c17 += a1 * V[np.uint64(b1 + 7)]
        c20 += a2 * V[np.uint64(b2 + 0)]
        c21 += a2 * V[np.uint64(b2 + 1)]
        c22 += a2 * V[np.uint64(b2 + 2)]
        c23 += a2 * V[np.uint64(b2 + 3)]
        c24 += a2 * V[np.uint64(b2 + 4)]
        c25 += a2 * V[np.uint64(b2 + 5)]
        c26 += a2 * V[np.uint64(b2 + 6)]
        c27 += a2 * V[np.uint64(b2 + 7)]
        c30 += a3 * V[np.uint64(b3 + 0)]
        c31 += a3 * V[np.uint64(b3 + 1)]
        c32 += a3 * V[np.uint64(b3 + 2)]
        c33 += a3 * V[np.uint64(b3 + 3)]
        c34 += a3 * V[np.uint64(b3 + 4)]
        c35 += a3 * V[np.uint64(b3 + 5)]
        c36 += a3 * V[np.uint64(b3 + 6)]
        c37 += a3 * V[np.uint64(b3 + 7)]
        ao += sa1
        bo += sb1
    V[np.uint64(z0 + 0)] = c00
    V[np.uint64(z0 + 1)] = c01
    V[np.uint64(z0 + 2)] = c02
    V[np.uint64(z0 + 3)] = c03
    V[np.uint64(z0 + 4)] = c04
    V[np.uint64(z0 + 5)] = c05
    V[np.uint64(z0 + 6)] = c06
    V[np.uint64(z0 + 7)] = c07
    V[np.uint64(z1 + 0)] = c10
    V[np.uint64(z1 + 1)] = c11
    V[np.uint64(z1 + 2)] = c12
    V[np.uint64(z1 + 3)] = c13
    V[np.uint64(z1 + 4)] = c14
    V[np.uint64(z1 + 5)] = c15
    V[np.uint64(z1 + 6)] = c16
    V[np.uint64(z1 + 7)] = c17
    V[np.uint64(z2 + 0)] = c20
    V[np.uint64(z2 + 1)] = c21
    V[np.uint64(z2 + 2)] = c22
    V[np.uint64(z2 + 3)] = c23
    V[np.uint64(z2 + 4)] = c24
    V[np.uint64(z2 + 5)] = c25
    V[np.uint64(z2 + 6)] = c26
    V[np.uint64(z2 + 7)] = c27
    V[np.uint64(z3 + 0)] = c30
    V[np.uint64(z3 + 1)] = c31
    V[np.uint64(z3 + 2)] = c32
    V[np.uint64(z3 + 3)] = c33
    V[np.uint64(z3 + 4)] = c34
    V[np.uint64(z3 + 5)] = c35
    V[np.uint64(z3 + 6)] = c36
    V[np.uint64(z3 + 7)] = c37


@njit(cache=True)
def _acc8x4w(V, d1, ao, sa1, sa2, bo, sb1, sb2, z, sz2, wo, sw1, sw2):  # pragma: no cover
    """:func:`_acc8x4` with ``a_rj`` weighted by ``V[wo + r·sw2 + j·sw1]``."""
    z0 = z
    z1 = z + 1 * sz2
    z2 = z + 2 * sz2
    z3 = z + 3 * sz2
    c00 = V[np.uint64(z0 + 0)]
    c01 = V[np.uint64(z0 + 1)]
    c02 = V[np.uint64(z0 + 2)]
    c03 = V[np.uint64(z0 + 3)]
    c04 = V[np.uint64(z0 + 4)]
    c05 = V[np.uint64(z0 + 5)]
    c06 = V[np.uint64(z0 + 6)]
    c07 = V[np.uint64(z0 + 7)]
    c10 = V[np.uint64(z1 + 0)]
    c11 = V[np.uint64(z1 + 1)]
    c12 = V[np.uint64(z1 + 2)]
    c13 = V[np.uint64(z1 + 3)]
    c14 = V[np.uint64(z1 + 4)]
    c15 = V[np.uint64(z1 + 5)]
    c16 = V[np.uint64(z1 + 6)]
    c17 = V[np.uint64(z1 + 7)]
    c20 = V[np.uint64(z2 + 0)]
    c21 = V[np.uint64(z2 + 1)]
    c22 = V[np.uint64(z2 + 2)]
    c23 = V[np.uint64(z2 + 3)]
    c24 = V[np.uint64(z2 + 4)]
    c25 = V[np.uint64(z2 + 5)]
    c26 = V[np.uint64(z2 + 6)]
    c27 = V[np.uint64(z2 + 7)]
    c30 = V[np.uint64(z3 + 0)]
    c31 = V[np.uint64(z3 + 1)]
    c32 = V[np.uint64(z3 + 2)]
    c33 = V[np.uint64(z3 + 3)]
    c34 = V[np.uint64(z3 + 4)]
    c35 = V[np.uint64(z3 + 5)]
    c36 = V[np.uint64(z3 + 6)]
    c37 = V[np.uint64(z3 + 7)]
    for _ in range(d1):
        a0 = V[np.uint64(ao + 0 * sa2)] * V[np.uint64(wo + 0 * sw2)]
        b0 = bo
        a1 = V[np.uint64(ao + 1 * sa2)] * V[np.uint64(wo + 1 * sw2)]
        b1 = bo + 1 * sb2
        a2 = V[np.uint64(ao + 2 * sa2)] * V[np.uint64(wo + 2 * sw2)]
        b2 = bo + 2 * sb2
        a3 = V[np.uint64(ao + 3 * sa2)] * V[np.uint64(wo + 3 * sw2)]
        b3 = bo + 3 * sb2
        c00 += a0 * V[np.uint64(b0 + 0)]
        c01 += a0 * V[np.uint64(b0 + 1)]
        c02 += a0 * V[np.uint64(b0 + 2)]
        c03 += a0 * V[np.uint64(b0 + 3)]
        c04 += a0 * V[np.uint64(b0 + 4)]
        c05 += a0 * V[np.uint64(b0 + 5)]
        c06 += a0 * V[np.uint64(b0 + 6)]
        c07 += a0 * V[np.uint64(b0 + 7)]
        c10 += a1 * V[np.uint64(b1 + 0)]
        c11 += a1 * V[np.uint64(b1 + 1)]
        c12 += a1 * V[np.uint64(b1 + 2)]
        c13 += a1 * V[np.uint64(b1 + 3)]
        c14 += a1 * V[np.uint64(b1 + 4)]
        c15 += a1 * V[np.uint64(b1 + 5)]
        c16 += a1 * V[np.uint64(b1 + 6)]
        c17 += a1 * V[np.uint64(b1 + 7)]
        c20 += a2 * V[np.uint64(b2 + 0)]
        c21 += a2 * V[np.uint64(b2 + 1)]
        c22 += a2 * V[np.uint64(b2 + 2)]
        c23 += a2 * V[np.uint64(b2 + 3)]
        c24 += a2 * V[np.uint64(b2 + 4)]
        c25 += a2 * V[np.uint64(b2 + 5)]
        c26 += a2 * V[np.uint64(b2 + 6)]
        c27 += a2 * V[np.uint64(b2 + 7)]
        c30 += a3 * V[np.uint64(b3 + 0)]
        c31 += a3 * V[np.uint64(b3 + 1)]
        c32 += a3 * V[np.uint64(b3 + 2)]
        c33 += a3 * V[np.uint64(b3 + 3)]
        c34 += a3 * V[np.uint64(b3 + 4)]
        c35 += a3 * V[np.uint64(b3 + 5)]
        c36 += a3 * V[np.uint64(b3 + 6)]
        c37 += a3 * V[np.uint64(b3 + 7)]
        ao += sa1
        bo += sb1
        wo += sw1
    V[np.uint64(z0 + 0)] = c00
    V[np.uint64(z0 + 1)] = c01
    V[np.uint64(z0 + 2)] = c02
    V[np.uint64(z0 + 3)] = c03
    V[np.uint64(z0 + 4)] = c04
    V[np.uint64(z0 + 5)] = c05
    V[np.uint64(z0 + 6)] = c06
    V[np.uint64(z0 + 7)] = c07
    V[np.uint64(z1 + 0)] = c10
    V[np.uint64(z1 + 1)] = c11
    V[np.uint64(z1 + 2)] = c12
    V[np.uint64(z1 + 3)] = c13
    V[np.uint64(z1 + 4)] = c14
    V[np.uint64(z1 + 5)] = c15
    V[np.uint64(z1 + 6)] = c16
    V[np.uint64(z1 + 7)] = c17
    V[np.uint64(z2 + 0)] = c20
    V[np.uint64(z2 + 1)] = c21
    V[np.uint64(z2 + 2)] = c22
    V[np.uint64(z2 + 3)] = c23
    V[np.uint64(z2 + 4)] = c24
    V[np.uint64(z2 + 5)] = c25
    V[np.uint64(z2 + 6)] = c26
    V[np.uint64(z2 + 7)] = c27
    V[np.uint64(z3 + 0)] = c30
    V[np.uint64(z3 + 1)] = c31
    V[np.uint64(z3 + 2)] = c32
    V[np.uint64(z3 + 3)] = c33
    V[np.uint64(z3 + 4)] = c34
    V[np.uint64(z3 + 5)] = c35
    V[np.uint64(z3 + 6)] = c36
    V[np.uint64(z3 + 7)] = c37


@njit(cache=True)
def _axpy_runs(V, d0, d1, ao, sa1, bo, sb1, zo, sz1, wo, sw1, weighted):  # pragma: no cover
    r"""``z[k] += a · b[k]`` for ``k < d0`` (unit strides), ``d1`` times.

    ``a = V[ao]`` (times ``V[wo]`` when `weighted`) is one number per outer iteration;
    ``b`` and ``z`` are unit-stride runs.  When ``z`` does not move along the outer loop
    (``sz1 == 0``: a summed letter just outside the run, ``z_c += Σ_j a_j b_{jc}``, the
    inner loops of a small matrix product) the run is cut into chunks of 8 whose sums
    stay in registers over the whole outer loop (:func:`_acc8`) — otherwise each of
    the ``d1`` updates loads and stores ``z``, and a run of 8 to 15 entries falls to
    the scalar remainder of the loop vectoriser's body.  The rest is the plain loop,
    with unit strides written as such (vectorised).  Every entry receives the same
    additions in the same order as in the plain loop: bit-identical.
    """
    n8 = d0 - d0 % 8 if sz1 == 0 else 0
    for c in range(0, n8, 8):
        if weighted:
            _acc8w(V, d1, ao, sa1, bo + c, sb1, zo + c, wo, sw1)
        else:
            _acc8(V, d1, ao, sa1, bo + c, sb1, zo + c)
    if n8 == d0:
        return
    if weighted:
        for _ in range(d1):
            a = V[np.uint64(ao)] * V[np.uint64(wo)]
            for k in range(n8, d0):
                V[np.uint64(zo + k)] += a * V[np.uint64(bo + k)]
            ao += sa1
            bo += sb1
            zo += sz1
            wo += sw1
    else:
        for _ in range(d1):
            a = V[np.uint64(ao)]
            for k in range(n8, d0):
                V[np.uint64(zo + k)] += a * V[np.uint64(bo + k)]
            ao += sa1
            bo += sb1
            zo += sz1


@njit(cache=True)
def _axpy_rows(V, d0, d1, d2, ao, sa1, sa2, bo, sb1, sb2, zo, sz2, wo, sw1, sw2,
               weighted):  # pragma: no cover
    r"""Three innermost loops ``z_{ic} += Σ_j a_{ij} b_{ijc}`` (``c < d0`` unit stride in
    ``z`` and ``b``, ``j < d1`` summed, ``i < d2`` an output letter; ``a_{ij}`` times the
    weight ``V[wo + i·sw2 + j·sw1]`` when `weighted`): the inner loops of a small matrix
    product.  Rows of ``z`` four at a time in chunks of 8 columns (:func:`_acc8x4`,
    :func:`_acc8x4w`), the rest as in :func:`_axpy_runs`.  Bit-identical to the plain
    loops (the weighted product ``(a·w)·b`` as in :func:`_inner_weighted`) as long as
    ``a``, ``b`` and the weights do not overlap ``z`` (``z`` is read once and written
    once; the diffusion engine never lets a step's result share memory with its inputs).
    """
    n8 = d0 - d0 % 8
    r = 0
    while r + 4 <= d2:
        for c in range(0, n8, 8):
            if weighted:
                _acc8x4w(V, d1, ao, sa1, sa2, bo + c, sb1, sb2, zo + c, sz2, wo, sw1, sw2)
            else:
                _acc8x4(V, d1, ao, sa1, sa2, bo + c, sb1, sb2, zo + c, sz2)
        if n8 < d0:
            for q in range(4):
                a_, b_, w_ = ao + q * sa2, bo + q * sb2, wo + q * sw2
                for _ in range(d1):
                    a = V[np.uint64(a_)] * V[np.uint64(w_)] if weighted else V[np.uint64(a_)]
                    for k in range(n8, d0):
                        V[np.uint64(zo + q * sz2 + k)] += a * V[np.uint64(b_ + k)]
                    a_ += sa1
                    b_ += sb1
                    w_ += sw1
        r += 4
        ao += 4 * sa2
        bo += 4 * sb2
        zo += 4 * sz2
        wo += 4 * sw2
    while r < d2:
        _axpy_runs(V, d0, d1, ao, sa1, bo, sb1, zo, 0, wo, sw1, weighted)
        r += 1
        ao += sa2
        bo += sb2
        zo += sz2
        wo += sw2


@njit(cache=True)
def _axpy8(V, zo, bo, a):  # pragma: no cover
    """``z[0:8] += a · b[0:8]`` as straight-line code: the eight loads of ``b`` and of ``z``
    first, then the eight stores (``z`` and ``b`` do not overlap), so LLVM's SLP vectoriser
    packs them into vector registers — a loop of 8 entries runs in the loop vectoriser's
    scalar remainder instead.  The same operation per entry as the loop."""
    b0 = V[np.uint64(bo + 0)]
    b1 = V[np.uint64(bo + 1)]
    b2 = V[np.uint64(bo + 2)]
    b3 = V[np.uint64(bo + 3)]
    b4 = V[np.uint64(bo + 4)]
    b5 = V[np.uint64(bo + 5)]
    b6 = V[np.uint64(bo + 6)]
    b7 = V[np.uint64(bo + 7)]
    z0 = V[np.uint64(zo + 0)]
    z1 = V[np.uint64(zo + 1)]
    z2 = V[np.uint64(zo + 2)]
    z3 = V[np.uint64(zo + 3)]
    z4 = V[np.uint64(zo + 4)]
    z5 = V[np.uint64(zo + 5)]
    z6 = V[np.uint64(zo + 6)]
    z7 = V[np.uint64(zo + 7)]
    V[np.uint64(zo + 0)] = z0 + a * b0
    V[np.uint64(zo + 1)] = z1 + a * b1
    V[np.uint64(zo + 2)] = z2 + a * b2
    V[np.uint64(zo + 3)] = z3 + a * b3
    V[np.uint64(zo + 4)] = z4 + a * b4
    V[np.uint64(zo + 5)] = z5 + a * b5
    V[np.uint64(zo + 6)] = z6 + a * b6
    V[np.uint64(zo + 7)] = z7 + a * b7


@njit(cache=True)
def _mul8(V, zo, xo, yo, c, weighted):  # pragma: no cover
    """``z[0:8] += x[0:8] · y[0:8]`` (times ``c`` after the product when `weighted`) as
    straight-line code, loads first, for the SLP vectoriser (see :func:`_axpy8`).  The
    loads and stores of ``z`` repeat :func:`_axpy8`'s on purpose: through one shared
    helper the rows that sum nothing ran 2-5 % slower (same bits; measured with
    ``bench_kernels.py --diffusion-segments``, two alternations, 6 December 2026)."""
    x0 = V[np.uint64(xo + 0)] * V[np.uint64(yo + 0)]
    x1 = V[np.uint64(xo + 1)] * V[np.uint64(yo + 1)]
    x2 = V[np.uint64(xo + 2)] * V[np.uint64(yo + 2)]
    x3 = V[np.uint64(xo + 3)] * V[np.uint64(yo + 3)]
    x4 = V[np.uint64(xo + 4)] * V[np.uint64(yo + 4)]
    x5 = V[np.uint64(xo + 5)] * V[np.uint64(yo + 5)]
    x6 = V[np.uint64(xo + 6)] * V[np.uint64(yo + 6)]
    x7 = V[np.uint64(xo + 7)] * V[np.uint64(yo + 7)]
    if weighted:
        x0 *= c
        x1 *= c
        x2 *= c
        x3 *= c
        x4 *= c
        x5 *= c
        x6 *= c
        x7 *= c
    z0 = V[np.uint64(zo + 0)]
    z1 = V[np.uint64(zo + 1)]
    z2 = V[np.uint64(zo + 2)]
    z3 = V[np.uint64(zo + 3)]
    z4 = V[np.uint64(zo + 4)]
    z5 = V[np.uint64(zo + 5)]
    z6 = V[np.uint64(zo + 6)]
    z7 = V[np.uint64(zo + 7)]
    V[np.uint64(zo + 0)] = z0 + x0
    V[np.uint64(zo + 1)] = z1 + x1
    V[np.uint64(zo + 2)] = z2 + x2
    V[np.uint64(zo + 3)] = z3 + x3
    V[np.uint64(zo + 4)] = z4 + x4
    V[np.uint64(zo + 5)] = z5 + x5
    V[np.uint64(zo + 6)] = z6 + x6
    V[np.uint64(zo + 7)] = z7 + x7


@njit(cache=True)
def _inner(V, d0, d1, xo, yo, zo, sx0, sy0, sz0, sx1, sy1, sz1):  # pragma: no cover
    """The two innermost loops of an unweighted step (indices unsigned: no wraparound test).

    The case is chosen once, outside both loops: a dot product innermost (two partial
    sums halve the chain of dependent additions), or an update of independent entries
    of ``z`` with ``x`` or ``y`` constant along it, or neither.
    """
    if sz0 == 0:
        for _ in range(d1):
            acc0 = 0.0
            acc1 = 0.0
            k = 0
            while k + 1 < d0:
                acc0 += V[np.uint64(xo + k * sx0)] * V[np.uint64(yo + k * sy0)]
                acc1 += V[np.uint64(xo + (k + 1) * sx0)] * V[np.uint64(yo + (k + 1) * sy0)]
                k += 2
            if k < d0:
                acc0 += V[np.uint64(xo + k * sx0)] * V[np.uint64(yo + k * sy0)]
            V[np.uint64(zo)] += acc0 + acc1
            xo += sx1
            yo += sy1
            zo += sz1
    elif sz0 == 1 and (sx0 == 0 and sy0 == 1 or sy0 == 0 and sx0 == 1):
        # z += a · b along a unit-stride run, a the operand constant along it (an outer
        # product's row)
        if sx0 == 0:
            ao, sa, bo, sb = xo, sx1, yo, sy1
        else:
            ao, sa, bo, sb = yo, sy1, xo, sx1
        if d0 == 8:
            # exactly 8 (p = 8): straight-line, packed (through the chunked loop below
            # such rows ran 4-8 % slower, measured)
            for _ in range(d1):
                _axpy8(V, zo, bo, V[np.uint64(ao)])
                ao += sa
                bo += sb
                zo += sz1
        elif d0 < 64:
            # a short run: chunks of 8 as straight-line code, packed
            n8 = d0 - d0 % 8
            for _ in range(d1):
                a = V[np.uint64(ao)]
                for c in range(0, n8, 8):
                    _axpy8(V, zo + c, bo + c, a)
                for k in range(n8, d0):
                    V[np.uint64(zo + k)] += a * V[np.uint64(bo + k)]
                ao += sa
                bo += sb
                zo += sz1
        else:
            # unit strides written as such: the compiler vectorises the loop
            for _ in range(d1):
                a = V[np.uint64(ao)]
                for k in range(d0):
                    V[np.uint64(zo + k)] += a * V[np.uint64(bo + k)]
                ao += sa
                bo += sb
                zo += sz1
    elif sx0 == 0:
        for _ in range(d1):
            a = V[np.uint64(xo)]
            for k in range(d0):
                V[np.uint64(zo + k * sz0)] += a * V[np.uint64(yo + k * sy0)]
            xo += sx1
            yo += sy1
            zo += sz1
    elif sy0 == 0:
        for _ in range(d1):
            a = V[np.uint64(yo)]
            for k in range(d0):
                V[np.uint64(zo + k * sz0)] += V[np.uint64(xo + k * sx0)] * a
            xo += sx1
            yo += sy1
            zo += sz1
    elif sx0 == 1 and sy0 == 1 and sz0 == 1 and d0 == 8:
        for _ in range(d1):
            _mul8(V, zo, xo, yo, 1.0, False)
            xo += sx1
            yo += sy1
            zo += sz1
    elif sx0 == 1 and sy0 == 1 and sz0 == 1:
        # an elementwise product, unit strides written as such (vectorised)
        for _ in range(d1):
            for k in range(d0):
                V[np.uint64(zo + k)] += V[np.uint64(xo + k)] * V[np.uint64(yo + k)]
            xo += sx1
            yo += sy1
            zo += sz1
    else:
        for _ in range(d1):
            for k in range(d0):
                V[np.uint64(zo + k * sz0)] += (V[np.uint64(xo + k * sx0)]
                                               * V[np.uint64(yo + k * sy0)])
            xo += sx1
            yo += sy1
            zo += sz1


@njit(cache=True)
def _inner_weighted(V, d0, d1, xo, yo, zo, wo, sx0, sy0, sz0, sw0, sx1, sy1, sz1,
                    sw1):  # pragma: no cover
    """The two innermost loops of a weighted step (the weight is constant inside)."""
    if sw0 == 0 and sz0 == 1 and (sx0 == 0 and sy0 == 1 or sy0 == 0 and sx0 == 1):
        # unit strides written as such (the stacking of a group's operand in its
        # order): the compiler vectorises the loop
        if sx0 == 0:
            ao, sa, bo, sb = xo, sx1, yo, sy1
        else:
            ao, sa, bo, sb = yo, sy1, xo, sx1
        if d0 == 8:
            for _ in range(d1):
                _axpy8(V, zo, bo, V[np.uint64(ao)] * V[np.uint64(wo)])
                ao += sa
                bo += sb
                zo += sz1
                wo += sw1
            return
        for _ in range(d1):
            a = V[np.uint64(ao)] * V[np.uint64(wo)]
            for k in range(d0):
                V[np.uint64(zo + k)] += a * V[np.uint64(bo + k)]
            ao += sa
            bo += sb
            zo += sz1
            wo += sw1
        return
    if sw0 == 0 and sx0 == 1 and sy0 == 1 and sz0 == 1:
        # a weighted elementwise product (a partner added into its group's block),
        # unit strides written as such: (x·y)·w, as in the general loop below (which ran
        # such rows at 0.3-0.9 GMAC/s)
        for _ in range(d1):
            c = V[np.uint64(wo)]
            if d0 == 8:
                _mul8(V, zo, xo, yo, c, True)
            else:
                for k in range(d0):
                    V[np.uint64(zo + k)] += V[np.uint64(xo + k)] * V[np.uint64(yo + k)] * c
            xo += sx1
            yo += sy1
            zo += sz1
            wo += sw1
        return
    for _ in range(d1):
        if sw0 == 0 and sx0 == 0:
            # the weight and x constant in the loop (the stacking of a group's operand)
            a = V[np.uint64(xo)] * V[np.uint64(wo)]
            for k in range(d0):
                V[np.uint64(zo + k * sz0)] += a * V[np.uint64(yo + k * sy0)]
        elif sw0 == 0 and sy0 == 0:
            a = V[np.uint64(yo)] * V[np.uint64(wo)]
            for k in range(d0):
                V[np.uint64(zo + k * sz0)] += a * V[np.uint64(xo + k * sx0)]
        elif sz0 == 0:
            acc = 0.0
            for k in range(d0):
                acc += (V[np.uint64(xo + k * sx0)] * V[np.uint64(yo + k * sy0)]
                        * V[np.uint64(wo + k * sw0)])
            V[np.uint64(zo)] += acc
        else:
            for k in range(d0):
                V[np.uint64(zo + k * sz0)] += (V[np.uint64(xo + k * sx0)]
                                               * V[np.uint64(yo + k * sy0)]
                                               * V[np.uint64(wo + k * sw0)])
        xo += sx1
        yo += sy1
        zo += sz1
        wo += sw1


@njit(cache=True)
def _mul3x8(V, zo, xo, b, uo, c):  # pragma: no cover
    """``z[0:8] += ((x[0:8]·b)·u[0:8])·c`` as straight-line code, loads first, for the SLP
    vectoriser (see :func:`_axpy8`); the order of :func:`_inner3`'s loops per entry.  Its
    loads and stores of ``z`` repeat :func:`_axpy8`'s on purpose, as :func:`_mul8`'s do."""
    x0 = V[np.uint64(xo + 0)] * b * V[np.uint64(uo + 0)] * c
    x1 = V[np.uint64(xo + 1)] * b * V[np.uint64(uo + 1)] * c
    x2 = V[np.uint64(xo + 2)] * b * V[np.uint64(uo + 2)] * c
    x3 = V[np.uint64(xo + 3)] * b * V[np.uint64(uo + 3)] * c
    x4 = V[np.uint64(xo + 4)] * b * V[np.uint64(uo + 4)] * c
    x5 = V[np.uint64(xo + 5)] * b * V[np.uint64(uo + 5)] * c
    x6 = V[np.uint64(xo + 6)] * b * V[np.uint64(uo + 6)] * c
    x7 = V[np.uint64(xo + 7)] * b * V[np.uint64(uo + 7)] * c
    z0 = V[np.uint64(zo + 0)]
    z1 = V[np.uint64(zo + 1)]
    z2 = V[np.uint64(zo + 2)]
    z3 = V[np.uint64(zo + 3)]
    z4 = V[np.uint64(zo + 4)]
    z5 = V[np.uint64(zo + 5)]
    z6 = V[np.uint64(zo + 6)]
    z7 = V[np.uint64(zo + 7)]
    V[np.uint64(zo + 0)] = z0 + x0
    V[np.uint64(zo + 1)] = z1 + x1
    V[np.uint64(zo + 2)] = z2 + x2
    V[np.uint64(zo + 3)] = z3 + x3
    V[np.uint64(zo + 4)] = z4 + x4
    V[np.uint64(zo + 5)] = z5 + x5
    V[np.uint64(zo + 6)] = z6 + x6
    V[np.uint64(zo + 7)] = z7 + x7


@njit(cache=True)
def _inner3(V, d0, d1, xo, yo, uo, zo, wo, sx0, sy0, su0, sz0, sw0, sx1, sy1, su1, sz1,
            sw1):  # pragma: no cover
    """The two innermost loops of a weighted step with a third factor,
    ``z += ((x·y)·u)·w`` per entry (the product ``x·y`` first: the value the step that
    sums nothing would have written, then the final's factor and its weight).

    An update of a unit-stride run of ``z`` with the weight constant along it and each
    factor either constant or unit-stride along it (the fused finals of
    ``diffusion_engine``: ``z_{abcd} += w x_{..} y_{..} u_{..}``) is written with its
    unit strides as such, the constant factors loaded once (the compiler vectorises
    the loop); ``x`` and ``y`` are swapped where that makes ``x`` the one that moves
    (``x·y = y·x`` exactly).  Any other strides: the plain loop.
    """
    if sz0 == 1 and sw0 == 0 and 0 <= sx0 <= 1 and 0 <= sy0 <= 1 and 0 <= su0 <= 1:
        if sx0 == 0 and sy0 == 1:
            xo, yo, sx0, sy0, sx1, sy1 = yo, xo, sy0, sx0, sy1, sx1
        if sx0 == 1 and sy0 == 0 and su0 == 1 and d0 < 64:
            # a short run (p = 16: 16 entries) with y constant: chunks of 8 as
            # straight-line code
            n8 = d0 - d0 % 8
            for _ in range(d1):
                c = V[np.uint64(wo)]
                b = V[np.uint64(yo)]
                for q in range(0, n8, 8):
                    _mul3x8(V, zo + q, xo + q, b, uo + q, c)
                for q in range(n8, d0):
                    V[np.uint64(zo + q)] += (V[np.uint64(xo + q)] * b
                                             * V[np.uint64(uo + q)]) * c
                xo += sx1
                yo += sy1
                uo += su1
                zo += sz1
                wo += sw1
            return
        for _ in range(d1):
            c = V[np.uint64(wo)]
            if sx0 == 1 and sy0 == 1 and su0 == 1:
                for k in range(d0):
                    V[np.uint64(zo + k)] += (V[np.uint64(xo + k)] * V[np.uint64(yo + k)]
                                             * V[np.uint64(uo + k)]) * c
            elif sx0 == 1 and su0 == 1:
                b = V[np.uint64(yo)]
                for k in range(d0):
                    V[np.uint64(zo + k)] += (V[np.uint64(xo + k)] * b
                                             * V[np.uint64(uo + k)]) * c
            elif su0 == 1:
                a = V[np.uint64(xo)] * V[np.uint64(yo)]
                for k in range(d0):
                    V[np.uint64(zo + k)] += (a * V[np.uint64(uo + k)]) * c
            elif sx0 == 1 and sy0 == 1:
                e = V[np.uint64(uo)]
                for k in range(d0):
                    V[np.uint64(zo + k)] += (V[np.uint64(xo + k)] * V[np.uint64(yo + k)]
                                             * e) * c
            elif sx0 == 1:
                b = V[np.uint64(yo)]
                e = V[np.uint64(uo)]
                for k in range(d0):
                    V[np.uint64(zo + k)] += (V[np.uint64(xo + k)] * b * e) * c
            else:
                a = V[np.uint64(xo)] * V[np.uint64(yo)] * V[np.uint64(uo)] * c
                for k in range(d0):
                    V[np.uint64(zo + k)] += a
            xo += sx1
            yo += sy1
            uo += su1
            zo += sz1
            wo += sw1
        return
    for _ in range(d1):
        for k in range(d0):
            V[np.uint64(zo + k * sz0)] += (V[np.uint64(xo + k * sx0)]
                                           * V[np.uint64(yo + k * sy0)]
                                           * V[np.uint64(uo + k * su0)]) * V[np.uint64(wo + k * sw0)]
        xo += sx1
        yo += sy1
        uo += su1
        zo += sz1
        wo += sw1


#: Fewest rows (entries of the output letter outside the summed one) for :func:`_axpy_rows`.
ROWS_MIN = 4


@njit(cache=True)
def _rows_kernel(nl, dims, xs, ys, zs, ws):  # pragma: no cover
    """Whether a step's three innermost loops run in :func:`_axpy_rows`: 0 no, 1 with ``x``
    constant along the run, 2 with ``y``.

    The weight (if any) constant along the run; the innermost loop a unit-stride run of
    ``z`` (and of one operand, the other constant along it) of at least 8 entries; the
    next one summed; the one outside it an output letter of at least :data:`ROWS_MIN`
    entries.
    """
    last = nl - 1
    if (nl < 3 or zs[last - 1] != 0 or ws[last] != 0 or zs[last] != 1 or dims[last] < 8
            or zs[last - 2] == 0 or dims[last - 2] < ROWS_MIN):
        return 0
    if xs[last] == 0 and ys[last] == 1:
        return 1
    if ys[last] == 0 and xs[last] == 1:
        return 2
    return 0


def kernel_of(row):
    """Which compiled kernel :func:`run` uses for an encoded step: ``"rows"`` (the
    small-matrix-product kernel, :func:`_axpy_rows`), ``"three"`` (a third factor,
    :func:`_inner3`), ``"weighted"`` or ``"inner"``."""
    nl = int(row[_NL])
    if row[_WEIGHTED] == 2:
        return "three"
    loops = [np.ascontiguousarray(row[o:o + MAX_LETTERS]) for o in (_D, _XS, _YS, _ZS, _WS)]
    if _rows_kernel(nl, *loops):
        return "rows"
    return "weighted" if row[_WEIGHTED] else "inner"


@njit(cache=True)
def run(W, code, start, stop):  # pragma: no cover - compiled
    """Run the steps ``code[start:stop]`` on every row of the workspace `W` (in place)."""
    B = W.shape[0]
    idx = np.zeros(MAX_LETTERS, np.int64)
    dims = np.zeros(MAX_LETTERS, np.int64)
    xs = np.zeros(MAX_LETTERS, np.int64)
    ys = np.zeros(MAX_LETTERS, np.int64)
    zs = np.zeros(MAX_LETTERS, np.int64)
    ws = np.zeros(MAX_LETTERS, np.int64)
    us = np.zeros(MAX_LETTERS, np.int64)
    for s in range(start, stop):
        nl = code[s, _NL]
        for k in range(nl):
            dims[k] = code[s, _D + k]
            xs[k] = code[s, _XS + k]
            ys[k] = code[s, _YS + k]
            zs[k] = code[s, _ZS + k]
            ws[k] = code[s, _WS + k]
            us[k] = code[s, _US + k]
        last = nl - 1
        d0, sx0, sy0, sz0, sw0 = dims[last], xs[last], ys[last], zs[last], ws[last]
        su0 = us[last]
        if nl >= 2:
            d1, sx1, sy1, sz1, sw1, su1 = (dims[last - 1], xs[last - 1], ys[last - 1],
                                           zs[last - 1], ws[last - 1], us[last - 1])
        else:
            d1, sx1, sy1, sz1, sw1, su1 = 1, 0, 0, 0, 0, 0
        weighted = code[s, _WEIGHTED]
        # the inner loops of a small matrix product (the summed letter just outside a
        # unit-stride run of z, an output letter of 4 or more outside it): three loops
        # in one kernel, four rows at a time (_axpy_rows); 1 or 2: which operand is
        # constant along the run
        rows = 0 if weighted == 2 else _rows_kernel(nl, dims, xs, ys, zs, ws)
        d2, sx2, sy2, sz2, sw2 = 1, 0, 0, 0, 0
        if rows:
            d2, sx2, sy2, sz2, sw2 = (dims[last - 2], xs[last - 2], ys[last - 2],
                                      zs[last - 2], ws[last - 2])
        for b in range(B):
            V = W[b]
            if code[s, _ZERO]:
                # indices unsigned: no wraparound test, so the loop is vectorised
                # (signed, it ran at ~1 entry per ns: half the time of the rows that
                # sum nothing, measured)
                z0 = code[s, _Z]
                for k in range(code[s, _ZSIZE]):
                    V[np.uint64(z0 + k)] = 0.0
            for k in range(nl):
                idx[k] = 0
            xo, yo, zo, wo, uo = code[s, _X], code[s, _Y], code[s, _Z], code[s, _W], code[s, _U]
            while True:
                if weighted == 2:
                    _inner3(V, d0, d1, xo, yo, uo, zo, wo, sx0, sy0, su0, sz0, sw0,
                            sx1, sy1, su1, sz1, sw1)
                elif rows == 1:
                    _axpy_rows(V, d0, d1, d2, xo, sx1, sx2, yo, sy1, sy2, zo, sz2, wo, sw1,
                               sw2, weighted)
                elif rows == 2:
                    _axpy_rows(V, d0, d1, d2, yo, sy1, sy2, xo, sx1, sx2, zo, sz2, wo, sw1,
                               sw2, weighted)
                elif weighted:
                    _inner_weighted(V, d0, d1, xo, yo, zo, wo, sx0, sy0, sz0, sw0,
                                    sx1, sy1, sz1, sw1)
                else:
                    _inner(V, d0, d1, xo, yo, zo, sx0, sy0, sz0, sx1, sy1, sz1)
                # the outer loops: an odometer over letters 0 … nl − 3 (nl − 4)
                k = last - 2 - (rows > 0)
                while k >= 0:
                    idx[k] += 1
                    xo += xs[k]
                    yo += ys[k]
                    zo += zs[k]
                    wo += ws[k]
                    uo += us[k]
                    if idx[k] < dims[k]:
                        break
                    xo -= xs[k] * dims[k]
                    yo -= ys[k] * dims[k]
                    zo -= zs[k] * dims[k]
                    wo -= ws[k] * dims[k]
                    uo -= us[k] * dims[k]
                    idx[k] = 0
                    k -= 1
                if k < 0:
                    break


@njit(cache=True)
def gather(W, src, lo):  # pragma: no cover - compiled
    """``W[b, lo + i] = W[b, src[i]]`` for every row ``b`` of the workspace and every ``i``.

    The leaves of a program, gathered from its inputs (:mod:`diffusion_engine`): the same
    copies as ``numpy.take(W, src, axis=1, out=W[:, lo:lo + len(src)])`` (the sources
    must lie outside the written span), a third of its time (0.47 → 0.15 ms for the
    2.8·10⁵ entries of ``z² + z³/3`` at ``p = 8``, measured): no index checks or
    buffering per entry.
    """
    for b in range(W.shape[0]):
        V = W[b]
        for i in range(src.size):
            V[np.uint64(lo + i)] = V[np.uint64(src[i])]


def _compile_run():
    """Compile :func:`run` (or load it from numba's on-disk cache) for the workspace's types
    with LLVM's SLP vectoriser on.

    numba leaves the SLP vectoriser off by default (a global setting, read when a
    function's machine code is generated); the register kernels (:func:`_acc8`,
    :func:`_acc8x4`) are straight-line code over eight adjacent entries that only the SLP
    vectoriser packs into vector registers (measured on the development machine: 2.3 →
    11.8 GMAC/s on ``z_c += Σ_j a_j b_{jc}`` with 200 terms; no change without it).  It
    changes no rounding: no reassociation, no fused multiply-add.  The setting is restored
    at once; other signatures compile lazily without it (same values, slower).
    """
    import numba
    old = numba.config.SLP_VECTORIZE
    numba.config.SLP_VECTORIZE = True
    try:
        run.compile((numba.float64[:, ::1], numba.int64[:, ::1], numba.int64, numba.int64))
    finally:
        numba.config.SLP_VECTORIZE = old


_compile_run()

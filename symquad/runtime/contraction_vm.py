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
another order of the additions: equal to rounding.  numba compiles :func:`run`
once (``cache=True``: later processes load it from the on-disk cache).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["MAX_LETTERS", "ROW", "encode", "run"]

#: Most loop letters of one step (after merging letters contiguous in every operand).
MAX_LETTERS = 12

# header of a row: number of letters, operand offsets, output size, zero flag, weighted flag
_NL, _X, _Y, _Z, _W, _ZSIZE, _ZERO, _WEIGHTED = range(8)
_H = 8
_D, _XS, _YS, _ZS, _WS = (_H + k * MAX_LETTERS for k in range(5))
#: Integers per encoded step.
ROW = _H + 5 * MAX_LETTERS
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


def encode(x, y, z, w=None, zero=True):
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

    The letters are ordered with ``z``'s outside (in its memory order) and the
    summed ones inside (longest last), except that ``z``'s fastest letter goes
    innermost when it has at least :data:`AXPY_MIN` entries; neighbouring letters
    that are contiguous in every operand are merged into one loop.
    """
    dims, st = {}, {}
    for k, (off, letters, shape) in enumerate((x, y, z)):
        for ch, d, s in zip(letters, shape, _strides(shape)):
            dims[ch] = d
            st.setdefault(ch, [0, 0, 0, 0])[k] += s
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
            if _cost(cand) < _cost(loops):
                loops = cand
    if not loops:
        loops = [(1, [0, 0, 0, 0])]
    if len(loops) > MAX_LETTERS:
        raise ValueError(f"a contraction step with {len(loops)} loops (at most {MAX_LETTERS})")
    row = np.zeros(ROW, dtype=np.int64)
    row[_NL] = len(loops)
    row[_X], row[_Y], row[_Z] = x[0], y[0], z[0]
    row[_W] = w[0] if w is not None else 0
    row[_ZSIZE] = math.prod(z[2])
    row[_ZERO] = int(zero)
    row[_WEIGHTED] = int(w is not None)
    for k, (d, s) in enumerate(loops):
        row[_D + k] = d
        row[_XS + k], row[_YS + k], row[_ZS + k], row[_WS + k] = s
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


def _cost(loops):
    """Estimated nanoseconds of a step's loops in :func:`run`, to rank loop orders.

    ~2 ns per entry of the innermost loop, ~5 ns per entry of the next, and per
    multiply-add 0.18 ns in a unit-stride update of 16 or more entries (which the
    compiler vectorises) or 0.35 ns in a shorter one — fitted to two rows measured on the
    development machine, one thread (``z_{abc} += Σ_k y_{ak} x_{bkc}``, ``p = 8``,
    ``n = 10``: 2.2 GMAC/s with runs of 8, 4.8 GMAC/s with runs of 64) —, 0.4 ns in a dot
    product and 0.45 ns with other strides (rough: such rows ran at 1–2.5 GMAC/s).
    """
    macs = math.prod(d for d, _ in loops)
    d0, (sx, sy, sz, _) = loops[-1]
    d1 = loops[-2][0] if len(loops) > 1 else 1
    if sz == 0:
        per = 0.4
    elif sz == 1 and sx in (0, 1) and sy in (0, 1):
        per = 0.18 if d0 >= 16 else 0.35
    else:
        per = 0.45
    return macs * per + 2.0 * macs / d0 + 5.0 * macs / (d0 * d1)


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
    elif sx0 == 0 and sy0 == 1 and sz0 == 1:
        # unit strides written as such: the compiler vectorises the loop
        for _ in range(d1):
            a = V[np.uint64(xo)]
            for k in range(d0):
                V[np.uint64(zo + k)] += a * V[np.uint64(yo + k)]
            xo += sx1
            yo += sy1
            zo += sz1
    elif sy0 == 0 and sx0 == 1 and sz0 == 1:
        for _ in range(d1):
            a = V[np.uint64(yo)]
            for k in range(d0):
                V[np.uint64(zo + k)] += V[np.uint64(xo + k)] * a
            xo += sx1
            yo += sy1
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
        for _ in range(d1):
            a = V[np.uint64(ao)] * V[np.uint64(wo)]
            for k in range(d0):
                V[np.uint64(zo + k)] += a * V[np.uint64(bo + k)]
            ao += sa
            bo += sb
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
def run(W, code, start, stop):  # pragma: no cover - compiled
    """Run the steps ``code[start:stop]`` on every row of the workspace `W` (in place)."""
    B = W.shape[0]
    idx = np.zeros(MAX_LETTERS, np.int64)
    dims = np.zeros(MAX_LETTERS, np.int64)
    xs = np.zeros(MAX_LETTERS, np.int64)
    ys = np.zeros(MAX_LETTERS, np.int64)
    zs = np.zeros(MAX_LETTERS, np.int64)
    ws = np.zeros(MAX_LETTERS, np.int64)
    for s in range(start, stop):
        nl = code[s, _NL]
        for k in range(nl):
            dims[k] = code[s, _D + k]
            xs[k] = code[s, _XS + k]
            ys[k] = code[s, _YS + k]
            zs[k] = code[s, _ZS + k]
            ws[k] = code[s, _WS + k]
        last = nl - 1
        d0, sx0, sy0, sz0, sw0 = dims[last], xs[last], ys[last], zs[last], ws[last]
        if nl >= 2:
            d1, sx1, sy1, sz1, sw1 = (dims[last - 1], xs[last - 1], ys[last - 1],
                                      zs[last - 1], ws[last - 1])
        else:
            d1, sx1, sy1, sz1, sw1 = 1, 0, 0, 0, 0
        weighted = code[s, _WEIGHTED]
        for b in range(B):
            V = W[b]
            if code[s, _ZERO]:
                z0 = code[s, _Z]
                for k in range(code[s, _ZSIZE]):
                    V[z0 + k] = 0.0
            for k in range(nl):
                idx[k] = 0
            xo, yo, zo, wo = code[s, _X], code[s, _Y], code[s, _Z], code[s, _W]
            while True:
                if weighted:
                    _inner_weighted(V, d0, d1, xo, yo, zo, wo, sx0, sy0, sz0, sw0,
                                    sx1, sy1, sz1, sw1)
                else:
                    _inner(V, d0, d1, xo, yo, zo, sx0, sy0, sz0, sx1, sy1, sz1)
                # the outer loops: an odometer over letters 0 … nl − 3
                k = last - 2
                while k >= 0:
                    idx[k] += 1
                    xo += xs[k]
                    yo += ys[k]
                    zo += zs[k]
                    wo += ws[k]
                    if idx[k] < dims[k]:
                        break
                    xo -= xs[k] * dims[k]
                    yo -= ys[k] * dims[k]
                    zo -= zs[k] * dims[k]
                    wo -= ws[k] * dims[k]
                    idx[k] = 0
                    k -= 1
                if k < 0:
                    break

r"""A compiled loop for the mixed terms of the diffusion assembly: kinds read in place.

A block of ``D`` (:mod:`symquad._generated.diffusion_assembly`) holds terms
``X_{ij} r_i c_j`` with ``X`` a moment kind read at the block's row and column units,
``X_{ij} = M[ι(i, j)]``.  The flat position ``ι`` of a C-ordered kind array is linear
in the indices (``Σ_a u_a s_a``, ``s_a`` its strides), and every unit is a row unit
or a column unit, so ``ι(i, j) = ρ_i + γ_j``: one offset per row and one per column
(:func:`symquad.runtime.diffusion_engine._kind_offsets`).  :func:`kind_term` reads the
kind there, multiplies and adds in one pass over the block, where numpy took a gathered
``R × C`` copy of the kind (``take``), an outer product ``r c`` (a padded matrix
product), a multiply and an add, each a pass over the block and a Python call
(:func:`symquad.runtime.diffusion_engine.mixed_sum`).  The arithmetic is theirs, in
their order: ``(r_i c_j) X_{ij}`` rounded after each operation, the terms summed left
to right into ``T``, then ``acc + T`` — the same bits (no fused multiply-add, no
reassociation: numba's defaults).  numba compiles it once (``cache=True``).
"""

from __future__ import annotations

from numba import njit

__all__ = ["kind_term"]

#: The modes of :func:`kind_term`: the first of several terms, a middle one, the last
#: one (adds the total into the block), the only one.
FIRST, MIDDLE, LAST, ONLY = 0, 1, 2, 3


@njit(cache=True)
def kind_term(acc, tot, X, ro, co, r, c, mode):  # pragma: no cover - compiled
    """One mixed term ``v_ij = (r_i c_j) X[ro_i + co_j]`` of a block, by `mode`.

    ``FIRST``: ``tot = v``; ``MIDDLE``: ``tot += v``; ``LAST``: ``acc += tot + v``;
    ``ONLY``: ``acc += v``.  `acc`, `tot` ``(R, C)`` C-contiguous; `X` a kind array
    flattened; `ro`, `r` of length ``R``, `co`, `c` of length ``C``.  The mode's branch
    is outside the loops.
    """
    R, C = acc.shape
    if mode == 0:
        for i in range(R):
            oi, ri, t = ro[i], r[i], tot[i]
            for j in range(C):
                t[j] = (ri * c[j]) * X[oi + co[j]]
    elif mode == 1:
        for i in range(R):
            oi, ri, t = ro[i], r[i], tot[i]
            for j in range(C):
                t[j] += (ri * c[j]) * X[oi + co[j]]
    elif mode == 2:
        for i in range(R):
            oi, ri, t, z = ro[i], r[i], tot[i], acc[i]
            for j in range(C):
                z[j] += t[j] + (ri * c[j]) * X[oi + co[j]]
    else:
        for i in range(R):
            oi, ri, z = ro[i], r[i], acc[i]
            for j in range(C):
                z[j] += (ri * c[j]) * X[oi + co[j]]

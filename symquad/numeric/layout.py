r"""The state vector of the order parameters: one layout for the diffusion, the LNA and the SDE.

The state of a model is ``X = (Q_ij for i <= j, ρ_im, a_i)``:

* the upper triangle of ``Q`` row by row, diagonal included
  (``Q_11, Q_12, …, Q_1p, Q_22, …, Q_pp``: ``p(p+1)/2`` entries);
* ``ρ`` row-major (``ρ_11, …, ρ_1p*, ρ_21, …``: ``p·p*`` entries);
* the student readout ``a_1..a_p`` when it is trained (``lr_readout > 0``).

This is the order of :meth:`symquad.numeric.kernels.Kernels.diffusion`'s
rows and columns, of :func:`symquad.fluctuations`' covariance and of the
entry route's diffusion matrix.  An off-diagonal ``Q_ij`` appears once: the
covariance of the symmetric matrix ``Q`` is that of its upper triangle.

With an input spectrum of ``B`` blocks (``Model.spectrum``, docs/model.md §1a) the state
holds the overlaps of every block, ``Q^b = W P_b Wᵀ/N`` and ``ρ^b = W P_b W*ᵀ/N``:
``X = (Q^1 upper triangle, …, Q^B upper triangle, ρ^1, …, ρ^B, a)``, the arrays
carrying a block axis before the matrix axes (``Q`` of shape ``(..., B, p, p)``, ``ρ``
``(..., B, p, p*)``); the entries are named ``Qb<b>_i_j``, ``rhob<b>_i_m``.  The
isotropic model (the default spectrum) has no block axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from ..spectrum import has_spectrum
from ..stages import declare

__all__ = ["StateLayout", "state_layout", "block_teacher"]


@dataclass(frozen=True)
class StateLayout:
    """Names, sizes and packing of the order-parameter state of a model.

    Attributes
    ----------
    p, p_star : int
    trained : bool
        Whether the readout ``a`` is part of the state.
    spectrum_blocks : int
        ``B``, the number of blocks of the input spectrum when ``Q`` and ``ρ`` carry a
        block axis; 0 (the default) for the isotropic model, which has none.

    Examples
    --------
    >>> lay = StateLayout(2, 1, False)
    >>> lay.names
    ('Q_1_1', 'Q_1_2', 'Q_2_2', 'rho_1_1', 'rho_2_1')
    >>> lay.dim
    5
    """

    p: int
    p_star: int
    trained: bool = False
    spectrum_blocks: int = 0

    @property
    def n_blocks(self) -> int:
        """Copies of ``(Q, ρ)`` in the state: ``B``, or 1 without a block axis."""
        return max(1, self.spectrum_blocks)

    @property
    def n_q(self) -> int:
        """Entries of the upper triangles of ``Q`` (every block): ``B p(p+1)/2``."""
        return self.n_blocks * self.p * (self.p + 1) // 2

    @property
    def n_rho(self) -> int:
        """Entries of ``ρ`` (every block): ``B p·p*``."""
        return self.n_blocks * self.p * self.p_star

    @property
    def n_a(self) -> int:
        """Entries of the readout in the state: ``p`` when trained, else 0."""
        return self.p if self.trained else 0

    @property
    def dim(self) -> int:
        """Length of the state vector."""
        return self.n_q + self.n_rho + self.n_a

    @property
    def blocks(self) -> tuple:
        """``("Q", "rho")`` or ``("Q", "rho", "a")``."""
        return ("Q", "rho", "a") if self.trained else ("Q", "rho")

    @cached_property
    def upper(self) -> tuple:
        """Row and column indices ``(iu, ju)`` of the upper triangle, in state order."""
        iu, ju = np.triu_indices(self.p)
        return iu, ju

    @cached_property
    def entries(self) -> tuple:
        """``(block, i, j)`` of every state entry (0-based; ``j`` is None for ``a``).

        With a block axis the overlaps' entries are ``("Q", c, i, j)`` and
        ``("rho", c, i, m)`` with the (0-based) input block ``c``.
        """
        iu, ju = self.upper
        if not self.spectrum_blocks:
            out = [("Q", int(i), int(j)) for i, j in zip(iu, ju)]
            out += [("rho", i, m) for i in range(self.p) for m in range(self.p_star)]
        else:
            out = [("Q", c, int(i), int(j)) for c in range(self.spectrum_blocks)
                   for i, j in zip(iu, ju)]
            out += [("rho", c, i, m) for c in range(self.spectrum_blocks) for i in range(self.p)
                    for m in range(self.p_star)]
        out += [("a", i, None) for i in range(self.n_a)]
        return tuple(out)

    @cached_property
    def names(self) -> tuple:
        """Entry names ``Q_i_j``, ``rho_i_m``, ``a_i`` (1-based, as the symbolic entry symbols);
        with a block axis ``Qb<c>_i_j`` and ``rhob<c>_i_m``."""
        out = []
        for entry in self.entries:
            if entry[0] == "a":
                out.append(f"a_{entry[1] + 1}")
            elif len(entry) == 4:
                name, c, i, j = entry
                out.append(f"{name}b{c + 1}_{i + 1}_{j + 1}")
            else:
                name, i, j = entry
                out.append(f"{name}_{i + 1}_{j + 1}")
        return tuple(out)

    def slices(self) -> dict:
        """``{block: slice}`` of each block in the state vector."""
        out = {"Q": slice(0, self.n_q), "rho": slice(self.n_q, self.n_q + self.n_rho)}
        if self.trained:
            out["a"] = slice(self.n_q + self.n_rho, self.dim)
        return out

    def index(self, name: str) -> int:
        """Position of the entry called `name` (``"Q_1_2"``, ``"rho_2_1"``, ``"a_1"``)."""
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(f"no state entry {name!r}; entries: {', '.join(self.names)}") \
                from None

    def _overlap_shapes(self):
        lead = (self.spectrum_blocks,) if self.spectrum_blocks else ()
        return lead + (self.p, self.p), lead + (self.p, self.p_star)

    def pack(self, Q, rho, a=None) -> np.ndarray:
        """State vector(s) ``(..., dim)`` from ``Q (..., p, p)``, ``ρ (..., p, p*)`` (, ``a``).

        With a block axis ``Q (..., B, p, p)`` and ``ρ (..., B, p, p*)``.
        """
        Q = np.asarray(Q, dtype=float)
        rho = np.asarray(rho, dtype=float)
        q_shape, rho_shape = self._overlap_shapes()
        if Q.shape[Q.ndim - len(q_shape):] != q_shape or \
                rho.shape[rho.ndim - len(rho_shape):] != rho_shape:
            raise ValueError(f"Q and rho must end in shapes {q_shape} and {rho_shape}, got "
                             f"{Q.shape} and {rho.shape}")
        iu, ju = self.upper
        k = len(q_shape)
        parts = [Q[..., iu, ju].reshape(Q.shape[:Q.ndim - k] + (self.n_q,)),
                 rho.reshape(rho.shape[:rho.ndim - k] + (self.n_rho,))]
        if self.trained:
            if a is None:
                raise ValueError("a (the trained readout) is part of the state: pass it")
            a = np.asarray(a, dtype=float)
            if a.shape[-1:] != (self.p,):
                raise ValueError(f"a must end in shape ({self.p},), got {a.shape}")
            parts.append(a)
        elif a is not None:
            raise ValueError("a is state only for a trained readout (lr_readout > 0)")
        batch = np.broadcast_shapes(*(x.shape[:-1] for x in parts))
        return np.concatenate([np.broadcast_to(x, batch + x.shape[-1:]) for x in parts], -1)

    def unpack(self, x):
        """``(Q, ρ, a)`` from state vector(s) ``(..., dim)``; ``a`` is None unless trained."""
        x = np.asarray(x, dtype=float)
        if x.shape[-1:] != (self.dim,):
            raise ValueError(f"state vectors must end in length {self.dim}, got {x.shape}")
        s = self.slices()
        iu, ju = self.upper
        q_shape, rho_shape = self._overlap_shapes()
        Q = np.empty(x.shape[:-1] + q_shape)
        upper = x[..., s["Q"]].reshape(x.shape[:-1] + q_shape[:-2] + (len(iu),))
        Q[..., iu, ju] = upper
        Q[..., ju, iu] = upper
        rho = x[..., s["rho"]].reshape(x.shape[:-1] + rho_shape)
        a = x[..., s["a"]].copy() if self.trained else None
        return Q, rho.copy(), a

    def __repr__(self) -> str:
        blocks = f", spectrum_blocks={self.spectrum_blocks}" if self.spectrum_blocks else ""
        return (f"StateLayout(p={self.p}, p_star={self.p_star}, trained={self.trained}"
                f"{blocks}: {self.dim} entries = {self.n_q} Q + {self.n_rho} rho"
                + (f" + {self.n_a} a)" if self.trained else ")"))


def state_layout(model) -> StateLayout:
    """The :class:`StateLayout` of a :class:`~symquad.spec.Model`.

    A model with a non-default ``spectrum`` has a block axis of ``B = model.n_blocks``
    (also for ``B = 1``: a single block with an eigenvalue other than 1 keeps the
    shapes of every spectrum model); the isotropic model has none.
    """
    declare(model, "the state layout")
    blocks = model.n_blocks if has_spectrum(model) else 0
    return StateLayout(model.p, model.p_star, model.readout_trained, blocks)


def block_teacher(model, T) -> np.ndarray:
    r"""The per-block teacher overlaps of an isotropic teacher: ``T^b = f_b T``; ``(..., B, p*, p*)``.

    A teacher whose rows are spread evenly over the input directions (e.g. drawn
    ``w*_m ~ N(0, I_N)`` independently of the blocks) has ``W* P_b W*ᵀ/N → f_b T`` as
    ``N → ∞``: the default of every stage that takes the total ``T``.  Any other split
    (the teacher's power per block) is the user's ``T`` of shape ``(B, p*, p*)``.

    Parameters
    ----------
    model : Model
        Its ``spectrum`` gives the fractions ``f_b``.
    T : array_like, shape (..., p*, p*)
        The total teacher overlap ``Σ_b T^b = W* W*ᵀ/N``.
    """
    T = np.asarray(T, dtype=float)
    if T.shape[-2:] != (model.p_star, model.p_star):
        raise ValueError(f"T must end in shape ({model.p_star}, {model.p_star}), got "
                         f"{T.shape}")
    f = np.array([float(fb) for fb, _ in model.spectrum])
    return f[:, None, None] * T[..., None, :, :]

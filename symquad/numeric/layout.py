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
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from ..stages import declare

__all__ = ["StateLayout", "state_layout"]


@dataclass(frozen=True)
class StateLayout:
    """Names, sizes and packing of the order-parameter state of a model.

    Attributes
    ----------
    p, p_star : int
    trained : bool
        Whether the readout ``a`` is part of the state.

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

    @property
    def n_q(self) -> int:
        """Entries of the upper triangle of ``Q``: ``p(p+1)/2``."""
        return self.p * (self.p + 1) // 2

    @property
    def n_rho(self) -> int:
        """Entries of ``ρ``: ``p·p*``."""
        return self.p * self.p_star

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
        """``(block, i, j)`` of every state entry (0-based; ``j`` is None for ``a``)."""
        iu, ju = self.upper
        out = [("Q", int(i), int(j)) for i, j in zip(iu, ju)]
        out += [("rho", i, m) for i in range(self.p) for m in range(self.p_star)]
        out += [("a", i, None) for i in range(self.n_a)]
        return tuple(out)

    @cached_property
    def names(self) -> tuple:
        """Entry names ``Q_i_j``, ``rho_i_m``, ``a_i`` (1-based, as the symbolic entry symbols)."""
        return tuple(f"{b}_{i + 1}" if j is None else f"{b}_{i + 1}_{j + 1}"
                     for b, i, j in self.entries)

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

    def pack(self, Q, rho, a=None) -> np.ndarray:
        """State vector(s) ``(..., dim)`` from ``Q (..., p, p)``, ``ρ (..., p, p*)`` (, ``a``)."""
        Q = np.asarray(Q, dtype=float)
        rho = np.asarray(rho, dtype=float)
        if Q.shape[-2:] != (self.p, self.p) or rho.shape[-2:] != (self.p, self.p_star):
            raise ValueError(f"Q and rho must end in shapes ({self.p}, {self.p}) and "
                             f"({self.p}, {self.p_star}), got {Q.shape} and {rho.shape}")
        iu, ju = self.upper
        parts = [Q[..., iu, ju], rho.reshape(rho.shape[:-2] + (self.n_rho,))]
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
        Q = np.empty(x.shape[:-1] + (self.p, self.p))
        Q[..., iu, ju] = x[..., s["Q"]]
        Q[..., ju, iu] = x[..., s["Q"]]
        rho = x[..., s["rho"]].reshape(x.shape[:-1] + (self.p, self.p_star))
        a = x[..., s["a"]].copy() if self.trained else None
        return Q, rho.copy(), a

    def __repr__(self) -> str:
        return (f"StateLayout(p={self.p}, p_star={self.p_star}, trained={self.trained}: "
                f"{self.dim} entries = {self.n_q} Q + {self.n_rho} rho"
                + (f" + {self.n_a} a)" if self.trained else ")"))


def state_layout(model) -> StateLayout:
    """The :class:`StateLayout` of a :class:`~symquad.spec.Model`."""
    declare(model, "the state layout")
    return StateLayout(model.p, model.p_star, model.readout_trained)

"""The per-member status vocabulary shared by every batched result.

A batched result (:class:`~symquad.numeric.simulation_run.SimulationRun`, the
replicas of a simulation; :class:`~symquad.numeric.ode_batch.BatchODESolution`,
the starts of a batched ODE solve) carries one status string per member,
``"ok"`` or ``"diverged"``.  :class:`MemberStatus` derives the masks and counts
from that array once, so the two results cannot drift apart in what
"diverged" means.
"""

from __future__ import annotations

import numpy as np

__all__ = ["OK", "DIVERGED", "MemberStatus"]

OK = "ok"
DIVERGED = "diverged"


class MemberStatus:
    """Mixin for a result with a ``status`` array of ``"ok"``/``"diverged"``."""

    status: np.ndarray

    @property
    def diverged(self) -> np.ndarray:
        """Boolean mask of the members (replicas or starts) that diverged."""
        return np.asarray(self.status) == DIVERGED

    @property
    def n_diverged(self) -> int:
        """Number of members that diverged."""
        return int(np.count_nonzero(self.diverged))

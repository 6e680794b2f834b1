"""Errors and warnings of the numeric runtime."""

import numpy as np

__all__ = ["DivergenceError"]


class DivergenceError(RuntimeError):
    """A trajectory (ODE or SGD) diverged.

    Attributes
    ----------
    t : float
        Time (``steps/N``) at which divergence was detected.
    last_finite : dict
        The last finite state, e.g. ``{"t": ..., "Q": ..., "rho": ...}``.
    partial : object or None
        What was computed up to the divergence (an ODE solution or a
        simulation run), when available.
    """

    def __init__(self, message, t, last_finite, partial=None):
        super().__init__(message)
        self.t = float(t)
        self.last_finite = last_finite
        self.partial = partial


def describe_state(state: dict) -> str:
    """Short printable summary of a state dict for error messages."""
    parts = []
    for key, value in state.items():
        arr = np.asarray(value)
        if arr.ndim == 0:
            parts.append(f"{key}={float(arr):.6g}")
        else:
            parts.append(f"max|{key}|={np.max(np.abs(arr)):.3g}")
    return ", ".join(parts)

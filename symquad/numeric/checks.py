"""Input validation shared by the numeric runtime (clear errors naming the parameter)."""

from __future__ import annotations

import numpy as np

__all__ = ["as_overlaps", "check_positive", "check_int"]


def check_positive(name: str, value, integer: bool = False, allow_zero: bool = False):
    """Return ``value`` if it is a finite number > 0 (>= 0 with ``allow_zero``)."""
    kind = "an integer" if integer else "a number"
    bound = ">= 0" if allow_zero else "> 0"
    if isinstance(value, bool) or not np.isscalar(value) or not np.isreal(value):
        raise TypeError(f"{name} must be {kind} {bound}, got {value!r}")
    if integer and int(value) != value:
        raise TypeError(f"{name} must be {kind} {bound}, got {value!r}")
    if not np.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        allowed = "[0, inf)" if allow_zero else "(0, inf)"
        raise ValueError(f"{name} must be a finite {kind.split()[-1]} {bound} "
                         f"(allowed range: {allowed}), got {value!r}")
    return int(value) if integer else float(value)


def check_int(value, name: str, minimum: int = 1) -> int:
    """Return ``value`` as an int if it is an integer >= ``minimum`` (else ValueError)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def as_overlaps(model, Q, rho, T, names=("Q0", "rho0", "T"), tol: float = 1e-9):
    """Validate overlap matrices for ``model``; return float arrays ``(Q, rho, T)``.

    Checks shapes ``(p, p)``, ``(p, p*)``, ``(p*, p*)``, finiteness, symmetry of
    ``Q`` and ``T``, and that the joint covariance ``[[Q, ρ], [ρᵀ, T]]`` is
    positive semi-definite (it is the Gram matrix of the weights / N).
    """
    p, k = model.p, model.p_star
    arrays = []
    for name, value, shape in zip(names, (Q, rho, T), ((p, p), (p, k), (k, k))):
        arr = np.asarray(value, dtype=float)
        if arr.shape != shape:
            raise ValueError(f"{name} must have shape {shape} for p={p}, p_star={k}; "
                             f"got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite")
        arrays.append(arr)
    Q, rho, T = arrays
    for name, arr in ((names[0], Q), (names[2], T)):
        scale = max(1.0, float(np.max(np.abs(arr))))
        if np.max(np.abs(arr - arr.T)) > tol * scale:
            raise ValueError(f"{name} must be symmetric")
    C = np.block([[Q, rho], [rho.T, T]])
    C = 0.5 * (C + C.T)
    low = float(np.min(np.linalg.eigvalsh(C)))
    scale = max(1.0, float(np.max(np.abs(C))))
    if low < -tol * scale * C.shape[0]:
        raise ValueError(
            f"({names[0]}, {names[1]}, {names[2]}) is not a Gram matrix of weights / N: the joint "
            f"covariance [[{names[0]}, {names[1]}], [{names[1]}^T, {names[2]}]] must be positive "
            f"semi-definite; smallest eigenvalue {low:.3g}")
    return Q, rho, T

r"""Jacobian of the drift, gradient and Hessian of the risk by per-coordinate differences.

The kernels now take these derivatives along state directions from the moment kernels
(:mod:`symquad.numeric.drift_derivatives`, every pair, with the O(1/N) mean's terms);
this per-coordinate helper stays as a second, independent route in the tests.

The exact Jacobian of the polynomial models differentiates the entry route's
polynomials (:mod:`symquad.symbolic.jacobian`); an erf model's drift is a sum of
the closed forms of :mod:`symquad.runtime.special_engine`, smooth (analytic) in
the state on the whole cone of positive semi-definite overlaps.  Its derivatives
are taken numerically, by Richardson-extrapolated central differences in every
state entry (the same convention as the exact route: ``Q_kl`` with ``k < l``
moves both ``Q_kl`` and ``Q_lk``):

.. math::  D_h = \frac{f(x + h e_j) − f(x − h e_j)}{2h},\qquad
           J_{·j} = \frac{4 D_{h/2} − D_h}{3} + O(h⁴ f^{(5)}) + O(ε |f| / h),

with ``h = STEP · max(1, |x_j|)`` (``STEP = 1e-3``: truncation ``~1e-12``,
rounding ``~1e-13`` relative), all ``4 · dim`` shifted states in one batched
call.  The risk's Hessian is the same rule applied to second differences
(``∂²ε/∂x_i∂x_j`` from the four corners ``(±h, ±h)``, extrapolated in ``h``).
Stated accuracy ``1e-8`` relative to the largest entry, tested against the
exact Jacobian of a polynomial model (the same helper on ``σ = z²``) and against
the closed derivatives of the erf risk (``∂I_2/∂C_ab = J_2``) in
``tests/test_special_diffusion.py``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["STEP", "numeric_jacobian_function"]

#: Relative step of the central differences.
STEP = 1e-3


def _shifts(x, h):
    """States ``x ± h_j e_j`` and ``x ± (h_j/2) e_j``: (..., 4, dim, dim)."""
    dim = x.shape[-1]
    eye = np.eye(dim) * h[..., None, :]
    base = x[..., None, None, :]
    signs = np.array([1.0, -1.0, 0.5, -0.5])[:, None, None]
    return base + signs * eye[..., None, :, :]


def _richardson(F, h):
    """``J[..., i, j]`` from ``F`` (..., 4, dim_j, out_i) at the shifts of :func:`_shifts`."""
    Dh = (F[..., 0, :, :] - F[..., 1, :, :]) / (2.0 * h[..., :, None])
    Dh2 = (F[..., 2, :, :] - F[..., 3, :, :]) / h[..., :, None]
    return np.swapaxes((4.0 * Dh2 - Dh) / 3.0, -1, -2)


def numeric_jacobian_function(k):
    """``(J, ∇ε, ∇²ε)(Q, ρ, T, a)`` of kernels `k` by extrapolated central differences.

    Same contract as the exact route: arrays in the state order of
    ``k.layout``, leading batch dimensions allowed.
    """
    lay = k.layout
    trained = k.model.readout_trained

    def at(X, T, extra):
        """State blocks of the shifted states ``X`` (batch + extra + (dim,)), ``T`` broadcast."""
        Q, rho, a = lay.unpack(X)
        T = np.asarray(T, dtype=float)
        T = T.reshape(T.shape[:-2] + (1,) * extra + T.shape[-2:])
        T = np.broadcast_to(T, X.shape[:-1] + T.shape[-2:])
        return Q, rho, T, (a if trained else None)

    def rhs(X, T, extra):
        return lay.pack(*k.rhs(*at(X, T, extra)))

    def risk(X, T, extra):
        return np.asarray(k.risk(*at(X, T, extra)), dtype=float)

    class _Derivatives:
        """``(J, ∇ε, ∇²ε)`` at one state, each computed when indexed (the exact route's tuple)."""

        def __init__(self, Q, rho, T, a):
            self.x = lay.pack(Q, rho, a if trained else None)
            self.h = STEP * np.maximum(1.0, np.abs(self.x))
            self.T = T

        def __getitem__(self, i):
            x, h, T = self.x, self.h, self.T
            if i == 0:
                return _richardson(rhs(_shifts(x, h), T, 2), h)
            if i == 1:
                return _richardson(risk(_shifts(x, h), T, 2)[..., None], h)[..., 0, :]
            if i == 2:
                return _hessian(lambda X: risk(X, T, 3), x, h)
            raise IndexError(i)
    return _Derivatives


def _hessian(risk, x, h):
    """``∂²ε/∂x_i∂x_j`` by the four-corner second difference, extrapolated in ``h``."""
    dim = x.shape[-1]

    def second(scale):
        hs = h * scale
        e = np.eye(dim) * hs[..., None, :]                  # (..., dim, dim): row j = h_j e_j
        ei, ej = e[..., :, None, :], e[..., None, :, :]
        base = x[..., None, None, :]
        corners = np.stack([base + ei + ej, base + ei - ej, base - ei + ej, base - ei - ej],
                           axis=-4)                          # (..., 4, dim, dim, dim)
        r = risk(corners)                                    # (..., 4, dim, dim)
        num = r[..., 0, :, :] - r[..., 1, :, :] - r[..., 2, :, :] + r[..., 3, :, :]
        return num / (4.0 * hs[..., :, None] * hs[..., None, :])
    H = (4.0 * second(0.5) - second(1.0)) / 3.0
    return 0.5 * (H + np.swapaxes(H, -1, -2))

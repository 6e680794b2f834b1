r"""The order-parameter SDE: finite-``N`` SGD at a cost independent of ``N``.

``simulate(model, ..., method="sde")`` integrates, for every replica, the Itô SDE

.. math::  dX = f(X)\,dt + \sqrt{D(X)/N}\; dB_t

of the state ``X`` (:class:`~symquad.numeric.layout.StateLayout`: upper triangle of
``Q``, ``ρ``, a trained readout), with ``f`` the ODE's drift
(:meth:`Kernels.rhs`) and ``D`` the diffusion matrix of one SGD step
(:meth:`Kernels.diffusion`): the first two moments of SGD's increments over a
time ``dt`` (``N dt`` steps) at leading order in ``1/N``.  The Itô form is the
right one: each SGD step's noise is evaluated at the state before the step,
and the second-order terms of the update (the ``η²`` part of ``dQ``, the sphere's
renormalisation) are already in ``f``.

**Scheme.**  Heun's predictor–corrector for the drift with the Itô noise of
Euler–Maruyama, staggered: the noise ``ζ`` has mean zero and covariance ``h D(X_m)/N``
at the drift's midpoint ``X_m = X + f(X) h/2`` (a deterministic point: still Itô), it
enters Heun's predictor, ``X̃ = X + f(X) h + ζ``, and the step is
``X ← X + ½(f(X) + f(X̃)) h + ζ``.  Two noises (:mod:`symquad.numeric.sde_noise`,
``simulate(noise=...)``): ``"gaussian"``, ``ζ = √(h/N) L ξ`` with ``L Lᵀ = D(X_m)`` (see
:func:`_sqrt_psd`) and ``ξ`` standard normal; ``"sampled"``, ``ζ = s √(hM/(Nb)) (φ̄_M − f)``,
the mean per-sample increment of ``M`` fresh draws of the fields with a random sign — the
same mean and covariance, zero odd moments (a simplified weak Euler scheme of the
same SDE, docs/derivation.md §8.4), and no ``D``.  The default is chosen by cost
(:func:`~symquad.numeric.sde_noise.default_noise`).  The drift is integrated at
second order, so the deterministic error is ``O(h²)`` and the remaining bias of the
law is ``O(h/N)`` (the noise's own weak order 1, at the noise's scale ``1/N``).
Plain Euler–Maruyama was first-order in the drift: with the step control
below it biased the mean risk of a converging run (``p = 3, p* = 2, η = 0.3,
b = 4``, ``N = 2000``, ``t = 15``) by −5 % — 30 standard errors of 400 replicas
— because the control bounds the change of the state, not of its distance to
the fixed point it approaches.

**Conserved quantities.**  Where the flow conserves a function of the state whose
noise vanishes at leading order, SGD's spread of it is ``O(1/N²)``-small and a step's
``O(h)`` errors dominate it.  Issue 22's variant (``σ = z²``, trained readout:
``dQ_kk = (4η/η_a) a_k da_k`` sample by sample, so ``I_k = Q_kk − (2η/η_a) a_k²`` moves
only through the ``η²`` terms and the Itô term ``−(2η/η_a) D_{a_k a_k}/N``): over the same
``h``, SGD's ``Q_kk`` increment sees the readout's own noise and drift inside the step
(``∫ 2c a da = c(a'² − a²) − c∫(da)²``, ``c = 2η/η_a``), a step with the noise after
the predictor and at ``X`` does not, and ``I`` diffuses by ``4c² h² f_a² D_aa/N`` per unit
time: the variance of ``tr Q/p`` at ``N = 1000`` was 57 times SGD's (``7.4·10⁻⁸`` against
``1.3·10⁻⁹``, 512 and 1024 replicas), at every time after the readout's relaxation, and
the law criterion false-FAILed 4 of 20 seeds.  The noise in the predictor supplies the
drift's half of the iterated integral ``∫∫ dW ds`` (``½ h J ζ``) and the noise at ``X_m``
the noise coefficient's half (``½ h (f·∇) b ΔW``), as in a weak second-order scheme
(Kloeden & Platen 1992, the chapter on weak Taylor approximations, derivative-free
order-2 schemes), and the cross terms cancel; what remains is the fluctuation of
``ζ_a²`` about ``h D_aa/N`` (``O(h/N²)`` per unit time; the Milstein term, which needs
the noise's derivative, is not taken).  Heun's deterministic error on ``I`` per step is
``−c e_a²``, ``e = ½ h (f(X̃) − f(X))`` the difference of Heun's and Euler's increments,
so the step is also bounded by ``‖e‖ <= NOISE_ACCURACY ‖ζ‖`` (:func:`_noise_step`): the
deterministic error is a fraction of what the noise moves the state in the step. That
bound binds in fast transients (steps ``≈ 0.03`` while the readout relaxes) and not at a
floor, where ``‖e‖/‖ζ‖ ≈ (λh)^{3/2}``: the variant's run to ``t = 100`` takes 558 steps
instead of 501.  It is applied with the O(1/N) drift (``finite_n=True``: the mode that
claims SGD's law beyond leading order, at a finite ``N``) and never below
``dt/NOISE_GROWTH²``: ``‖ζ‖ ∝ N^{-1/2}``, so without that floor its step would shrink
like ``N^{-1/2}`` in a transient, and without ``finite_n`` the cost stays independent of
``N``.  Measured there (1024 replicas each, ``t = 3``; benchmarks/whole_run_law_study.py):
``Var I`` 7.7·10⁻⁸ → 2.2·10⁻⁹ (SGD 0.93·10⁻⁹; the excess falls like ``1/N²``: 4.8, 2.8, 2.0 times SGD's at
``N = 1000, 2000, 4000``), the
mean of ``I`` −2.2·10⁻⁵ ± 0.2·10⁻⁵ → −0.1·10⁻⁵ ± 0.2·10⁻⁵ from SGD's (with the O(1/N)
drift; without it +1.45·10⁻⁵, the drift the SDE then misses).

**Step-size control.**  ``h = min(dt, c / r)`` with ``c = 0.01``
(:data:`RELATIVE_STEP`) and the rate ``r`` the largest, over the live replicas and
the entries, of

* ``min(|f_i|/(|X_i| + N^{-1/2}), κ_i)`` for an entry that *grows multiplicatively*:
  it moves away from 0 (``f_i X_i > 0``), its drift grows (``κ_i > 0``) and is carried
  by its size (``|f_i| <= 2 κ_i |X_i|``, :data:`MULTIPLICATIVE`);
* ``(c/0.2)·κ_r``, ``κ_r`` the relative change of the replica's whole drift per unit
  time (:data:`DRIFT_CHANGE`: the drift changes by at most 20 % in a step).

``κ_i = (f(X_m)_i − f_i) sign(f_i)/((h/2) |f_i|)`` and ``κ_r = ‖f(X_m) − f‖/((h/2)‖f‖)``
come from the previous step's drift midpoint (``f(X_m) − f = (h/2) J f + O(h²)``, free
of the noise, which the predictor carries).  For a growth
at rate ``κ`` (``f = κ X``) both estimates of the first item are ``κ``, so ``κh ≤ 0.01``:
Heun's rate error is ``(κh)²κ/6``, and a growth over ``L`` e-folds (an escape from
the plateau: ``L ≈ ½ log N``) is timed to a relative ``(κh)²/6 < 10⁻⁴``; below the
noise scale ``N^{-1/2}`` (the size of the noise an entry receives per unit of time)
its relative accuracy does not matter and the bound relaxes.  Why only growth: the
relative bound ``|f_i|/(|X_i| + N^{-1/2})`` alone (the rule before) also bounded
entries whose drift is *not* carried by their size — an entry crossing zero, or one
that starts at exactly 0 with a non-zero drift — where it made each step grow by 1 %
from ``0.01 N^{-1/2}/|f_i|``: about ``50 log N`` steps per zero crossing (measured
119, 240, 409, 628, 855 steps for ``t ≤ 1`` at ``N = 10³ … 10¹⁰`` from ``ρ(0) = 0``,
``σ = z² + z³/3``; now 8, 5, 5, 5, 5), although Heun integrates a slowly changing
drift without it.  Decays and relaxations (``κ_i < 0``) are bounded by the second
item (``λh ≤ 0.2``, Heun's stability with room) and by ``dt`` (default
:data:`DEFAULT_DT`), which caps the step where nothing moves; there (the approach to
a fixed point at rate ``λ``) the relative error of the distance to it grows like
``λ³h²t/6``.  The recorded times are hit exactly.  The tests check that at
``N → ∞`` the scheme converges to the ODE at second order in ``h``, that the mean
risk has no bias against SGD late in a converging run, that a step twice as small
does not change the law of the risk and of the escape time beyond their
statistical error, that the step count from an exact zero does not grow with ``N``,
and that growth is still resolved at ``κh ≤ 0.01``.

**Constraint.**  On the sphere the rows of ``D`` and the drift of every ``Q_kk``
vanish, so ``Q_kk`` stays at its start; after every step the state is projected
back (``Q ← S Q S``, ``ρ ← S ρ`` with ``S = diag(√(Q_kk(0)/Q_kk))``) to remove
rounding.

**Cost** per step ``O(R · (cost of 3 f) + noise)``, independent of ``N``: the
Gaussian noise adds one ``D`` and a ``dim³`` factorisation per replica, the sampled
noise an ``n × n`` eigendecomposition (``n = p + p*``) and ``M (p n + p²)``
multiply-adds per replica.  Random numbers: the same seed streams as the other
simulators (teacher, initialisation, data, ...): the same ``seed`` gives the same
random start as ``method="reduced"``, and the increments come from the data stream.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import DivergenceError
from .layout import state_layout
from .kernels import _derivatives, _untimed, check_kernels, kernels, require_diffusion
from .drift_derivatives import finite_n_drift, step_shift
from .sde_noise import SampledNoise, check_noise, default_noise
from .simulation_run import SimulationRun, block_population_risk, population_risk
from ..spectrum import block_axis, has_spectrum
from ..stages import declare
from .errors import describe_state

__all__ = ["simulate_sde", "DEFAULT_DT", "RELATIVE_STEP", "sde_form", "sde_noise",
           "MAX_SDE_DIM"]

#: Largest SDE time step (time unit ``t = steps/N``).
DEFAULT_DT = 0.2
#: Largest relative change of a state entry through the drift in one step.
RELATIVE_STEP = 0.01
#: The step's noise at the drift's midpoint and in Heun's predictor (module docstring,
#: "Conserved quantities"); False: the noise at the step's start, after the predictor (the
#: scheme before, kept to measure what the change does).
STAGGERED = True
#: Largest difference of Heun's and Euler's drift increments in a step, relative to the
#: step's noise (:func:`_noise_step`); 0 switches this control off.
NOISE_ACCURACY = 0.1
#: Largest growth of the noise-relative step from one step to the next.
NOISE_GROWTH = 4.0
#: Largest state dimension the SDE accepts (a ``dim × dim`` eigendecomposition per
#: replica and step): p = 64, p* = 2 has dim = 2208.
MAX_SDE_DIM = 2500


def sde_form(model) -> str:
    """Kernels of the SDE: ``"matrix"`` for quadratic activations, else ``"entries"`` for
    ``p + p* <= 4`` (fast explicit polynomials), else ``"tensor"`` (erf and ReLU too)."""
    if not model.is_polynomial:
        return "tensor"
    if model.is_quadratic:
        return "matrix"
    # the entry route has no kernels for an input spectrum (docs/model.md §1a)
    return ("entries" if model.p + model.p_star <= 4 and not has_spectrum(model)
            else "tensor")


#: An entry grows multiplicatively (``f_i ≈ κ X_i``, ``κ > 0``) when it moves away from 0,
#: its drift grows at the relative rate ``κ_i > 0`` and ``|f_i| <= MULTIPLICATIVE κ_i |X_i|``.
MULTIPLICATIVE = 2.0
#: Largest relative change of the drift (the whole state's, in norm) in one step: Heun's
#: stability and the accuracy of relaxations (``λh <= 0.2``).
DRIFT_CHANGE = 0.2


def _rate(f, x, floor, drift_rate, state_rate):
    r"""The step control's rate ``r`` (the step is ``min(dt, RELATIVE_STEP / r)``).

    ``r = max(max_i g_i, (RELATIVE_STEP / DRIFT_CHANGE) · max_r κ_r)`` over the live
    replicas and entries (module docstring, "Step-size control"):

    * ``g_i = min(|f_i|/(|X_i| + N^{-1/2}), κ_i)`` for an entry that grows
      multiplicatively (``f_i X_i > 0``, ``κ_i > 0``, ``|f_i| <= 2 κ_i |X_i|``), else 0;
    * ``κ_r`` (`state_rate`): the relative change of the replica's whole drift per unit
      time, ``‖f(X̃) − f(X)‖/(h ‖f(X)‖)``.

    ``κ_i`` (`drift_rate`, signed: positive where ``|f_i|`` grows) is the relative change
    of entry ``i``'s drift per unit time over the replica's last step, ``+∞`` before
    the first (then ``g_i`` is the relative bound alone).
    """
    ax = np.abs(x)
    af = np.abs(f)
    relative = af / (ax + floor)
    with np.errstate(invalid="ignore"):
        grows = (f * x > 0) & (drift_rate > 0) & (af <= MULTIPLICATIVE * drift_rate * ax)
    g = np.where(grows, np.minimum(relative, drift_rate), 0.0)
    return float(max(np.max(g), RELATIVE_STEP / DRIFT_CHANGE * np.max(state_rate)))


def _drift_change(f, f_pred, h):
    r"""``(κ_i, κ_r)``: the drift's relative rate of change per entry (signed) and per replica.

    From `f_pred` at a point ``X + f h`` ahead without the noise: ``f(X + f h) − f(X) = h J f
    + O(h²)`` (the step passes the drift's midpoint, ``h/2``).  ``κ_i = (f_pred_i − f_i)
    sign(f_i)/(h |f_i|)`` is ``κ`` for growth ``f = κ X`` and ``−λ`` for a decay, 0 for a
    constant drift; an entry with ``f_i = 0`` gets 0.  ``κ_r = ‖f_pred − f‖/(h ‖f‖)`` (0
    where ``f = 0``).
    """
    change = f_pred - f
    af = np.abs(f)
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = np.where(af > 0, change * np.sign(f) / (h * af), 0.0)
        norm = np.linalg.norm(f, axis=-1)
        whole = np.where(norm > 0, np.linalg.norm(change, axis=-1) / (h * norm), 0.0)
    return kappa, whole


def _noise_step(err, noise, h):
    r"""The next step each replica's drift accuracy allows, relative to its noise.

    `err` ``= h (f(X + f h/2) − f(X)) ≈ ½ h² J f`` is the difference of Heun's and Euler's
    drift increments (the error of the lower order; Heun's own is ``O(h³)``) and `noise`
    the step's noise ``ζ`` (``∝ √h``).  Keeping ``‖err‖ <= NOISE_ACCURACY ‖ζ‖`` bounds the
    deterministic error by a fraction of what the noise moves the state in the same step:
    a quantity the flow conserves (``Q_kk − (2η/η_a) a_k²`` with a trained readout and
    ``σ = z²``) then drifts by at most ``NOISE_ACCURACY²`` of its Itô term (module
    docstring, "Conserved quantities").  ``‖err‖ ∝ h²`` and ``‖ζ‖ ∝ √h``: the step that
    meets the bound is ``h (NOISE_ACCURACY ‖ζ‖/‖err‖)^{2/3}``, grown by at most
    :data:`NOISE_GROWTH` per step.
    """
    e = np.linalg.norm(err, axis=-1)
    z = np.linalg.norm(noise, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(e > 0, (NOISE_ACCURACY * z / e) ** (2.0 / 3.0), np.inf)
    return h * np.minimum(ratio, NOISE_GROWTH)


def _sqrt_psd(D):
    """A factor ``L`` with ``L Lᵀ = D`` of a batch of PSD matrices.

    Cholesky of ``D + ε I`` with ``ε = 10⁻¹³·max|D|`` (the zero rows of the sphere's
    ``Q_kk`` make ``D`` singular; the jitter adds a noise variance 13 orders of
    magnitude below the rest); a batch Cholesky refuses falls back to the
    symmetric square root from ``eigh`` (negative rounding eigenvalues clipped).
    """
    scale = np.max(np.abs(D), axis=(-2, -1), keepdims=True)
    jitter = 1e-13 * np.where(scale > 0, scale, 1.0) * np.eye(D.shape[-1])
    try:
        return np.linalg.cholesky(D + jitter)
    except np.linalg.LinAlgError:
        w, V = np.linalg.eigh(D)
        return V * np.sqrt(np.clip(w, 0.0, None))[..., None, :]


def sde_noise(model, form=None, noise=None) -> tuple:
    """``(form, noise)`` of an SDE run: the kernels' form and the noise, checked.

    ``form`` defaults to :func:`sde_form`, ``noise`` to
    :func:`symquad.numeric.sde_noise.default_noise` (Gaussian where ``D`` is cheap).  The
    Gaussian noise needs ``D`` (refused, naming the activations, where it is not derived)
    and a ``dim³`` factorisation per replica and step (refused above :data:`MAX_SDE_DIM`
    entries); the sampled noise needs the drift only (its kernels' refusals,
    :func:`~symquad.numeric.kernels.check_kernels`, come first).
    """
    noise = check_noise(noise)
    form = check_kernels(model, form or sde_form(model))
    noise = noise or default_noise(model, form)
    if noise == "gaussian":
        if has_spectrum(model):
            # D exists for blocks (docs/derivation.md §8.8) but this SDE's law is not yet
            # checked against the reduced simulator with it: the sampled noise is
            raise ValueError(f"method='sde' with noise='gaussian' does not support the model "
                             f"field spectrum={model._field_text('spectrum')} (its law with "
                             f"the block D is not yet checked); use noise='sampled'")
        require_diffusion(model, "the order-parameter SDE's Gaussian noise (its diffusion "
                                 "matrix)")
        dim = state_layout(model).dim
        if dim > MAX_SDE_DIM:
            raise ValueError(f"method='sde' with noise='gaussian' at p={model.p}, "
                             f"p_star={model.p_star} has a state of {dim} entries (limit "
                             f"{MAX_SDE_DIM}: a dim^3 square root per replica and step); "
                             f"use noise='sampled'")
    return form, noise


def simulate_sde(model, N, t_max, replicas, seed, X0, T, rec_steps, on_divergence, blowup,
                 dt=None, form=None, progress=False, noise=None, finite_n=False):
    """Implementation of ``simulate(method="sde")`` (arguments checked by the caller).

    ``X0`` are the initial coordinates of :func:`symquad.numeric.simulate._initial_coordinates`
    (so the start has the same law, and for the same seed the same values, as for
    the other methods); ``rec_steps`` the recorded times in SGD steps.  `finite_n`: add
    the O(1/N) part of SGD's mean drift (:func:`~symquad.numeric.drift_derivatives.finite_n_drift`)
    and a step schedule's shift at each jump, so the SDE's mean is SGD's to O(1/N).
    """
    declare(model, "simulate(method='sde')")
    dt = DEFAULT_DT if dt is None else float(dt)
    if not (math.isfinite(dt) and dt > 0):
        raise ValueError(f"dt must be a finite number > 0, got {dt!r}")
    lay = state_layout(model)
    form, noise = sde_noise(model, form, noise)
    k = kernels(model, form)
    der = _derivatives(_untimed(model, "simulate(method='sde')"), form) if finite_n else None
    p, ps = model.p, model.p_star
    blocks = has_spectrum(model)           # X0 (R, B, n, n): per-block coordinates
    lead = block_axis(model)
    C0 = X0 @ np.swapaxes(X0, -1, -2)
    Q = C0[..., :p, :p].copy()
    rho = C0[..., :p, p:].copy()
    a = (np.tile([float(c) for c in model.readout], (replicas, 1)) if model.readout_trained
         else None)
    x = lay.pack(Q, rho, a)
    sphere = model.constraint == "sphere"
    # the sphere keeps the Euclidean norms Σ_c Q^c_kk with an input spectrum
    q_diag = np.diagonal(Q.sum(1) if blocks else Q, axis1=-2, axis2=-1).copy()
    ss = np.random.SeedSequence(seed)
    rng_data = np.random.default_rng(ss.spawn(5)[2])
    sampled = SampledNoise(model, N, replicas, rng_data) if noise == "sampled" else None
    times = np.asarray(rec_steps, dtype=float) / N
    n_rec = len(times)
    Qs = np.full((replicas, n_rec) + lead + (p, p), np.nan)
    rhos = np.full((replicas, n_rec) + lead + (p, ps), np.nan)
    readouts = np.full((replicas, n_rec, p), np.nan) if model.readout_trained else None
    status = np.array(["ok"] * replicas, dtype=object)
    t_div = np.full(replicas, np.nan)
    alive = np.ones(replicas, dtype=bool)
    last = {"t": np.zeros(replicas), "Q": Q.copy(), "rho": rho.copy()}
    if model.readout_trained:
        last["readout"] = a.copy()
    floor = 1.0 / math.sqrt(N)
    # relative rate of change of each entry's drift over the replica's last step (none yet)
    drift_rate = np.full((replicas, lay.dim), np.inf)
    state_rate = np.zeros(replicas)
    # the largest step the noise-relative accuracy allows each replica (_noise_step); the
    # first step is small, the control grows it by at most NOISE_GROWTH per step
    noise_step = np.full(replicas, dt / NOISE_GROWTH**2)
    # (with the O(1/N) drift only: the mode that claims SGD's law beyond leading order, at
    # a finite N; without it the cost stays independent of N)
    noise_control = bool(finite_n and STAGGERED and NOISE_ACCURACY)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=float(times[-1]), unit="t", leave=False,
                   desc=f"SDE (N={N}, {replicas} replicas)")

    def record(i):
        Qr, rr, ar = lay.unpack(x[alive])
        Qs[alive, i], rhos[alive, i] = Qr, rr
        if readouts is not None:
            readouts[alive, i] = ar

    schedule = model.schedule
    t = 0.0
    i_rec = 0
    while i_rec < n_rec and times[i_rec] <= 0.0:
        record(i_rec)
        i_rec += 1
    steps = 0
    with np.errstate(over="ignore", invalid="ignore"):
        while i_rec < n_rec and alive.any():
            live = np.nonzero(alive)[0]
            Qa, ra, aa = lay.unpack(x[live])
            out = k.rhs(Qa, ra, T, aa, t=t)
            f = lay.pack(*out)
            rate = (_rate(f, x[live], floor, drift_rate[live], state_rate[live]) if f.size
                    else 0.0)
            h = dt if not rate > 0 else min(dt, RELATIVE_STEP / rate)
            if noise_control:
                h = min(h, max(float(np.min(noise_step[live])), dt / NOISE_GROWTH**2))
            h = min(h, times[i_rec] - t)
            if not np.isfinite(h) or h <= 0:
                h = times[i_rec] - t
            # no step across a kink or jump of the learning-rate schedule
            ahead = schedule.breakpoints(t * (1 + 1e-14) + 1e-300, t + h)
            t_end = t + h
            if ahead:
                h = ahead[0] - t
                t_end = ahead[0] - 1e-13 * max(1.0, ahead[0])   # the left limit of a jump
            # the noise's coefficients at the drift's midpoint X + f h/2 (deterministic: Itô)
            # and the noise in Heun's predictor: the two halves of the drift–noise iterated
            # integrals, without which a quantity the dynamics conserves diffuses at O(h²/N)
            # per unit time (module docstring, "Conserved quantities")
            t_mid = t + 0.5 * (t_end - t)
            if STAGGERED:
                Qm, rm, am = lay.unpack(x[live] + f * (0.5 * h))
                f_mid = lay.pack(*k.rhs(Qm, rm, T, am, t=t_mid))
                drift_rate[live], state_rate[live] = _drift_change(f, f_mid, 0.5 * h)
            else:
                Qm, rm, am, f_mid, t_mid = Qa, ra, aa, f, t
            if sampled is None:
                D = k.diffusion(Qm, rm, T, am, t=t_mid)
                L = _sqrt_psd(0.5 * (D + np.swapaxes(D, -1, -2)))
                xi = rng_data.standard_normal((replicas, lay.dim))[live]
                dW = math.sqrt(h / N) * np.einsum("rij,rj->ri", L, xi)
            else:
                dW = sampled(live, Qm, rm, T, am, f_mid, h, k.params_at(t_mid))
            Qp, rp, ap = lay.unpack(x[live] + f * h + (dW if STAGGERED else 0.0))
            f_pred = lay.pack(*k.rhs(Qp, rp, T, ap, t=t_end))
            if not STAGGERED:
                drift_rate[live], state_rate[live] = _drift_change(f, f_pred, h)
            elif noise_control:
                noise_step[live] = _noise_step(h * (f_mid - f), dW, h)
            # the O(1/N) drift at the step's start (Euler: it is itself O(1/N))
            g = finite_n_drift(der, k, x[live], T, f, t, N) if finite_n else 0.0
            x[live] = x[live] + (0.5 * (f + f_pred) + g) * h + dW
            if finite_n:
                # SGD's lag at a jump of η (its first step with the new rate: δ_N/N later)
                if ahead and schedule.jumps(ahead[0] - 1e-12 * max(1.0, ahead[0]),
                                            ahead[0] + 1e-12 * max(1.0, ahead[0])):
                    Qj, rj, aj = lay.unpack(x[live])
                    x[live] += step_shift(k, Qj, rj, T, aj, ahead[0], N) / N
            if sphere:
                Qn, rn, an = lay.unpack(x[live])
                s = np.sqrt(q_diag[live] / np.diagonal(Qn.sum(1) if blocks else Qn,
                                                       axis1=-2, axis2=-1))
                if blocks:
                    s = s[:, None]              # every block's rows scaled alike
                x[live] = lay.pack(Qn * s[..., :, None] * s[..., None, :],
                                   rn * s[..., :, None], an)
            t += h
            steps += 1
            if bar is not None:
                bar.update(h)
            bad = live[~(np.all(np.isfinite(x[live]), axis=1)
                         & (np.max(np.abs(x[live]), axis=1) < blowup))]
            if bad.size:
                status[bad] = "diverged"
                t_div[bad] = t
                alive[bad] = False
            good = np.nonzero(alive)[0]
            Qg, rg, ag = lay.unpack(x[good])
            last["t"][good] = t
            last["Q"][good], last["rho"][good] = Qg, rg
            if model.readout_trained:
                last["readout"][good] = ag
            while i_rec < n_rec and t >= times[i_rec] - 1e-12 * max(1.0, times[i_rec]):
                record(i_rec)
                i_rec += 1
    if bar is not None:
        bar.close()
    risk = (block_population_risk if blocks else population_risk)(model, Qs, rhos, T,
                                                                    readouts)
    run = SimulationRun(model=model, N=N, method="sde", seed=seed, t=times, Q=Qs, rho=rhos,
                        risk=risk, T=T, status=status.astype(str), t_diverged=t_div,
                        last_finite=last, check_every=1, readout=readouts)
    run.sde_steps = steps
    run.sde_noise = noise
    if run.n_diverged and on_divergence == "raise":
        first = int(np.nanargmin(t_div))
        state = {"t": last["t"][first], "Q": last["Q"][first], "rho": last["rho"][first]}
        raise DivergenceError(
            f"the order-parameter SDE diverged in {run.n_diverged}/{replicas} replicas (first "
            f"at t = {t_div[first]:.6g}, replica {first}); last finite state at t = "
            f"{last['t'][first]:.6g}: {describe_state(state)}. Lower the learning rate, or "
            f"pass on_divergence='stop' to keep the partial run.", t_div[first], state,
            partial=run)
    return run

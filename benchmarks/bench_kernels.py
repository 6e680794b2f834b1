"""Cost of one ODE right-hand-side evaluation.

Side by side in one run:
  * the generated matrix-form kernel (width independent, O((p+p*)^3)),
  * a live ``sympy.lambdify`` of the same equations written out entry by entry
    (what a user gets without codegen; only feasible for small p),
  * the committed entry-by-entry generated kernels where they exist,
  * the hand-written square-activation ODE of committee_learning
    (IdePHICS/DimensionlessDynamicsSGD, ``committee_learning/ode/square.py``),
    when ``SYMQUAD_PEER_PATH`` points at a checkout of it (the repository root or
    its ``committee_learning`` folder); it is imported from there, never copied,
  * optionally (``--before FILE``) an older generated ``quadratic_matrix.py``,
and the growth of the matrix-form kernel's cost with p from 1 to 512.

The peer measures time as ``τ = steps·η/(pN)``, so its right-hand side is
``(p/η)`` times symquad's (t = steps/N); its outputs carry the same ``1/p``,
``1/p*`` factors.  Every row checks ``peer = (p/η)·symquad`` numerically
(relative 1e-9) before timing, so both compute the same ODE.

    OMP_NUM_THREADS=1 SYMQUAD_PEER_PATH=/path/to/DimensionlessDynamicsSGD \
        python benchmarks/bench_kernels.py [--max-p 512] [--lambdify-max-p 6] [--repeat 5]

``--diffusion`` instead times the diffusion matrix ``D`` (:meth:`Kernels.diffusion`)
against one RHS call of the same kernels, for ``z²``, ``z² + z³/3`` and ``z³ − 3z`` at
``p`` in ``--diffusion-p`` (``p* = 2``, trained readout), with the library's default
BLAS threads and pinned to one (threadpoolctl), side by side; the tensor kinds alone,
and with ``--engine-before FILE`` those of an older ``runtime/diffusion_engine.py`` on
the same plan and state (values checked equal); the class route
(``diffusion_engine.USE_PROGRAM = False``: one contraction per edge set, no CSE); where
``--reference-max-p`` allows, the former term-by-term tensor route
(``tensor_kinds_reference``) too; and the first call for each activation in a fresh
kernel cache (a subprocess: derivation, generation, planning), also with numba's
cache empty.  ``--diffusion-cost`` reports what one ``D`` executes (program steps,
calls, multiply-adds by where they run) and its lower bounds at the measured
matrix-product rates.  ``--diffusion-segments`` times one ``D`` phase by phase (setup,
interpreter, numpy steps, group products, symmetrisation; a replay of the program checked
bit for bit against the engine) and the interpreter's rows by kind.

    python benchmarks/bench_kernels.py --diffusion [--diffusion-p 2,4,8,16]
    python benchmarks/bench_kernels.py --diffusion-cost --activations "z**3 - 3*z"
    python benchmarks/bench_kernels.py --diffusion-segments --diffusion-p 8

``--relu`` times one ReLU right-hand side (ReLU student and teacher, ``p* = 2``) over a
batch of ``--relu-states`` random-start states (``N = 10⁴``), with default threads and
pinned to one (threadpoolctl and ``numba.set_num_threads(1)``), each checkout in its own
subprocess; ``--relu-before PATH`` times another checkout (e.g. ``git archive`` of an older
commit unpacked in a folder) on the same states in the same run, for the speed-up.  It
also prints the four-point sums' quadruples and integrand evaluations per quadruple.

    python benchmarks/bench_kernels.py --relu [--relu-p 4,8,16] [--relu-before /tmp/base]
"""

import importlib
import importlib.util
import math
import os
import pathlib
import sys
import time
import timeit
import types

import numpy as np
import sympy as sp

import symquad as sq
from symquad.entry import ArgumentParser


def _point(p, k, rng):
    n = p + k
    G = rng.standard_normal((n, n + 2))
    C = G @ G.T / (n + 2)
    return C[:p, :p].copy(), C[:p, p:].copy(), C[p:, p:].copy()


def _tensor_case(act, p, rng):
    """The tensor-route case of the cost and segment tables: ``(p, 2)``, trained readout.

    Returns the model, its tensor kernels (``D`` evaluated once: generation and planning
    done), a random state ``(Q, ρ, T, a, b)``, its diffusion plan and the kinds ``D`` reads.
    """
    from symquad._generated import diffusion_assembly as assembly
    from symquad.numeric.kernels import _diffusion_tensor_module
    model = sq.Model(p, 2, 0.1, activation=act, lr_readout=0.1)
    k = sq.kernels(model, "tensor")
    Q, rho, T = _point(p, 2, rng)
    a, b = np.full(p, 1.0 / p), np.ones(2)
    k.diffusion(Q, rho, T, a)
    plan = _diffusion_tensor_module(model).PLAN
    names = tuple(assembly.KINDS[(model.constraint, True)])
    return model, k, (Q, rho, T, a, b), plan, names


def time_call(fn, repeat):
    """Best-of-`repeat` CPU seconds per call, with the call count auto-scaled to ~0.05 s.

    CPU time of this process (``time.process_time``), so that other processes on
    a shared machine do not count; BLAS runs single-threaded here
    (``OMP_NUM_THREADS=1``), so CPU time is also wall time on an idle machine.
    """
    timer = timeit.Timer(fn, timer=time.process_time)
    number, _ = timer.autorange()
    number = max(1, number // 4)
    return min(timer.repeat(repeat=repeat, number=number)) / number


def live_lambdify(model):
    eq = sq.derive(model, form="matrix")
    risk, dQ, drho = eq.explicit()
    Qs, Rs, Ts = eq.entry_symbols
    args = sorted(set(Qs) | set(Rs) | set(Ts), key=lambda s: s.name)
    f = sp.lambdify(args + [eq.eta, eq.noise], [dQ, drho], "numpy")
    index = {}
    for name, M in (("Q", Qs), ("rho", Rs), ("T", Ts)):
        for i in range(M.rows):
            for j in range(M.cols):
                index.setdefault(M[i, j], (name, i, j))
    where = [index[s] for s in args]

    def rhs(Q, rho, T):
        mats = {"Q": Q, "rho": rho, "T": T}
        return f(*[mats[n][i, j] for n, i, j in where], model.eta, model.noise)
    return rhs


def load_peer():
    """committee_learning's ``ode.square`` module from ``$SYMQUAD_PEER_PATH``, or None.

    Only ``_config``, ``ode/base.py`` and ``ode/square.py`` are executed (the
    package ``__init__`` files import compiled extensions we do not need).
    """
    path = os.environ.get("SYMQUAD_PEER_PATH")
    if not path:
        return None
    root = pathlib.Path(path)
    for candidate in (root / "committee_learning" / "committee_learning",
                      root / "committee_learning", root):
        if (candidate / "ode" / "square.py").is_file():
            break
    else:
        return None
    for name, folder in (("committee_learning", candidate),
                         ("committee_learning.ode", candidate / "ode")):
        mod = types.ModuleType(name)
        mod.__path__ = [str(folder)]
        sys.modules[name] = mod
    return importlib.import_module("committee_learning.ode.square")


def load_before(path):
    """An older generated matrix-kernel module from a file (for a before/after column)."""
    spec = importlib.util.spec_from_file_location("quadratic_matrix_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def peer_rhs(square, model, Q, rho, T):
    """The peer's (Φ, Ψ) = (dQ/dτ, dρ/dτ) at (Q, ρ, T), as a zero-argument call."""
    ode = square.SquaredActivationODE(T, Q, rho, 0.01, noise_term=True,
                                      gamma_over_p=model.eta / model.p, noise=model.noise,
                                      quadratic_terms=True)
    return ode._compute_Phi_Psi


def main(max_p=512, lambdify_max_p=6, repeat=5, p_star=2, before=None):
    rng = np.random.default_rng(0)
    square = load_peer()
    old = load_before(before) if before else None
    print(f"# one RHS evaluation (unbatched), p* = {p_star}; best of {repeat}; CPU microseconds")
    print("# peer: " + ("committee_learning ode/square.py from $SYMQUAD_PEER_PATH" if square
                        else "peer not available (set SYMQUAD_PEER_PATH)"))
    print(f"{'p':>5} {'matrix kernel':>14} {'entry kernel':>13} {'live lambdify':>14} "
          f"{'lambdify/matrix':>16} {'peer':>9} {'peer/matrix':>12} {'before':>9} "
          f"{'before/matrix':>14}")
    p = 1
    rows = []
    while p <= max_p:
        model = sq.Model(p=p, p_star=p_star, lr=0.1, noise=0.1)
        Q, rho, T = _point(p, p_star, rng)
        k_matrix = sq.kernels(model, form="matrix")
        t_matrix = time_call(lambda: k_matrix.rhs(Q, rho, T), repeat)
        t_entries = t_live = None
        try:
            from symquad._generated import ENTRY_MODULES
            if (p, p_star) in ENTRY_MODULES:
                k_entries = sq.kernels(model, form="entries")
                t_entries = time_call(lambda: k_entries.rhs(Q, rho, T), repeat)
        except ImportError:  # pragma: no cover
            pass
        if p <= lambdify_max_p:
            live = live_lambdify(model)
            np.testing.assert_allclose(np.array(live(Q, rho, T)[0], dtype=float),
                                       k_matrix.rhs(Q, rho, T)[0], rtol=1e-10, atol=1e-12)
            t_live = time_call(lambda: live(Q, rho, T), repeat)

        t_peer = t_before = None
        if square is not None:
            phi_psi = peer_rhs(square, model, Q, rho, T)
            Phi, Psi = phi_psi()
            dQ, drho = k_matrix.rhs(Q, rho, T)
            scale = p / model.eta                      # d/dτ = (p/η) d/dt
            for ours, theirs in ((dQ, Phi), (drho, Psi)):
                err = np.max(np.abs(scale * ours - theirs)) / np.max(np.abs(theirs))
                assert err < 1e-9, f"peer and symquad differ at p={p}: {err:.2e}"
            t_peer = time_call(phi_psi, repeat)
        if old is not None:
            c = 1.0
            args = (Q, rho, T, model.eta, model.noise, p, p_star, c)
            ref = old.rhs(*args)
            for a, b in zip(ref, k_matrix.rhs(Q, rho, T)):
                assert np.max(np.abs(a - b)) <= 1e-12 * np.max(np.abs(a))
            t_before = time_call(lambda: old.rhs(*args), repeat)

        def fmt(x):
            return f"{x * 1e6:.1f}" if x is not None else "-"
        ratio = f"{t_live / t_matrix:.1f}x" if t_live else "-"
        peer_ratio = f"{t_peer / t_matrix:.2f}x" if t_peer else "-"
        before_ratio = f"{t_before / t_matrix:.2f}x" if t_before else "-"
        print(f"{p:>5} {fmt(t_matrix):>14} {fmt(t_entries):>13} {fmt(t_live):>14} {ratio:>16} "
              f"{fmt(t_peer):>9} {peer_ratio:>12} {fmt(t_before):>9} {before_ratio:>14}",
              flush=True)
        rows.append((p, t_matrix, t_peer, t_before))
        p *= 2
    if len(rows) >= 3:
        ps, ts = np.array([r[:2] for r in rows]).T
        big = ps >= 64
        if big.sum() >= 2:
            slope = np.polyfit(np.log(ps[big]), np.log(ts[big]), 1)[0]
            print(f"# matrix kernel cost ~ p^{slope:.2f} for p >= 64 "
                  f"(O(p^3) matrix products; BLAS makes small p overhead-bound)")


DIFFUSION_ACTIVATIONS = ("z**2", "z**2 + z**3/3", "z**3 - 3*z")

_FIRST_CALL = """
import sys, time
import numpy as np
import symquad as sq
t0 = time.perf_counter()
m = sq.Model(4, 2, 0.1, activation=sys.argv[1], lr_readout=0.1)
k = sq.kernels(m, "tensor")
Q, rho, T = np.eye(4) * 0.5, np.zeros((4, 2)) + 0.1, np.eye(2)
k.diffusion(Q, rho, T, np.full(4, 0.25))
print(time.perf_counter() - t0)
"""


def first_call_seconds(activation, fresh_numba=False):
    """Wall seconds of the first tensor-route ``D`` at (4, 2) in a fresh kernel cache.

    `fresh_numba`: numba's cache too (the contraction interpreter compiled in the call,
    as in a new installation; otherwise it is loaded from the package's cache).
    """
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, SYMQUAD_CACHE_DIR=tmp)
        if fresh_numba:
            env["NUMBA_CACHE_DIR"] = os.path.join(tmp, "numba")
        out = subprocess.run([sys.executable, "-c", _FIRST_CALL, activation], env=env,
                             capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def load_engine(path):
    """An older ``runtime/diffusion_engine.py`` from a file, as a module beside the current one."""
    spec = importlib.util.spec_from_file_location("symquad.runtime._diffusion_engine_before",
                                                  path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def diffusion_main(ps, repeat, reference_max_p, first_call, activations=DIFFUSION_ACTIVATIONS,
                   engine_before=None):
    """D / RHS ratios (see the module docstring)."""
    import threadpoolctl
    from symquad._generated import diffusion_assembly as assembly
    from symquad.numeric.kernels import _diffusion_tensor_module
    from symquad.runtime import diffusion_engine as engine
    before = load_engine(engine_before) if engine_before else None
    rng = np.random.default_rng(0)
    print("# D and one RHS call, p* = 2, trained readout, unbatched; best of "
          f"{repeat}; CPU milliseconds; 'pinned' = BLAS on one thread (threadpoolctl); "
          "'kinds' / 'kinds before' = the tensor kinds alone, this engine and "
          f"{engine_before or '(no --engine-before)'}, pinned")
    print(f"{'activation':>16} {'p':>3} {'form':>7} {'RHS':>8} {'D':>9} {'D/RHS':>8} "
          f"{'D pinned':>9} {'D/RHS pinned':>13} {'kinds':>8} {'kinds before':>12} "
          f"{'class D':>8} {'former D':>9}")
    for act in activations:
        for p in ps:
            model = sq.Model(p, 2, 0.1, activation=act, lr_readout=0.1)
            form = "matrix" if model.is_quadratic else "tensor"
            k = sq.kernels(model, form)
            Q, rho, T = _point(p, 2, rng)
            a = np.full(p, 1.0 / p)
            k.diffusion(Q, rho, T, a)                       # generation and planning
            row = {}
            for label, limit in (("default", None), ("pinned", 1)):
                with threadpoolctl.threadpool_limits(limits=limit):
                    row[label] = (time_call(lambda: k.rhs(Q, rho, T, a), repeat),
                                  time_call(lambda: k.diffusion(Q, rho, T, a), repeat))
            former = "-"
            classes = "-"
            kinds = kinds_before = "-"
            if form == "tensor":
                plan = _diffusion_tensor_module(model).PLAN
                names = assembly.KINDS[(model.constraint, True)]
                b = np.ones(2)
                with threadpoolctl.threadpool_limits(limits=1):
                    kinds = time_call(lambda: engine.tensor_kinds(plan, Q, rho, T, a, b,
                                                                  model.noise, names), repeat)
                    if before is not None:
                        kinds_before = time_call(lambda: before.tensor_kinds(
                            plan, Q, rho, T, a, b, model.noise, names), repeat)
                        # the same kinds (both against the term-by-term sums, tested)
                        new = engine.tensor_kinds(plan, Q, rho, T, a, b, model.noise, names)
                        old = before.tensor_kinds(plan, Q, rho, T, a, b, model.noise, names)
                        for name in names:
                            scale = np.max(np.abs(old.arrays[name]))
                            assert np.max(np.abs(new.arrays[name] - old.arrays[name])) \
                                <= 1e-13 * scale, name
                kinds = f"{kinds * 1e3:.2f}"
                if before is not None:
                    kinds_before = f"{kinds_before * 1e3:.2f}"
                engine.USE_PROGRAM = False
                try:
                    classes = f"{time_call(lambda: k.diffusion(Q, rho, T, a), repeat) * 1e3:.2f}"
                finally:
                    engine.USE_PROGRAM = True
            if form == "tensor" and p <= reference_max_p:
                plan = _diffusion_tensor_module(model).PLAN
                b = np.ones(2)
                names = ("M001", "M002", "M110", "M111", "M200", "M201", "M220", "M310", "M400")
                t0 = time.process_time()
                engine.tensor_kinds_reference(plan, Q, rho, T, a, b, model.noise, names)
                former = f"{(time.process_time() - t0) * 1e3:.1f}"
            (r0, d0), (r1, d1) = row["default"], row["pinned"]
            print(f"{act:>16} {p:>3} {form:>7} {r0 * 1e3:8.3f} {d0 * 1e3:9.2f} {d0 / r0:8.0f} "
                  f"{d1 * 1e3:9.2f} {d1 / r1:13.0f} {kinds:>8} {kinds_before:>12} "
                  f"{classes:>8} {former:>9}", flush=True)
    if first_call:
        print("# first tensor-route D at (4, 2) in a fresh kernel cache (wall seconds, incl. "
              "derivation); 'fresh numba' = numba's cache empty too (the interpreter compiled)")
        for act in [a for a in activations if a != "z**2"]:
            print(f"{act:>16} {first_call_seconds(act):8.1f} "
                  f"{first_call_seconds(act, fresh_numba=True):8.1f} (fresh numba)", flush=True)


def matmul_rate(size=512, repeat=5):
    """Multiply-adds per second of one ``size × size`` numpy matrix product (best of `repeat`)."""
    x = np.random.default_rng(0).standard_normal((size, size))
    y = x.T.copy()
    return size ** 3 / time_call(lambda: x @ y, repeat)


def call_floor(repeat=5):
    """CPU seconds of one numpy call that does no arithmetic (a 2-element ``c_einsum``)."""
    from symquad.runtime import diffusion_engine as engine
    x = np.ones((1, 2))
    return time_call(lambda: engine._c_einsum("...ta,...ta->...ta", x, x), repeat)


def diffusion_batched_main(cases, repeat, engine_before=None):
    """The tensor kinds over a batch of states (the SDE's and the LNA's replicas in one call).

    ``cases``: ``(activation, p, states)``; ``p* = 2``, trained readout, BLAS pinned to
    one thread.  Per case: the kinds of ``states`` random states in one call (CPU ms,
    best of `repeat`), per state, and with `engine_before` (an older
    ``runtime/diffusion_engine.py``) the same call of that engine in this process, its
    kinds asserted equal to ≤ 10⁻¹³ of each kind's largest entry.
    """
    import threadpoolctl
    from symquad.runtime import diffusion_engine as engine
    before = load_engine(engine_before) if engine_before else None
    rng = np.random.default_rng(0)
    print(f"# tensor kinds of a batch of states in one call, p* = 2, trained readout, one "
          f"thread; CPU ms, best of {repeat}; 'before' = {engine_before or '(none)'}")
    print(f"{'activation':>16} {'p':>3} {'states':>6} {'kinds':>9} {'per state':>9} "
          f"{'before':>9} {'per state':>9} {'before/now':>10}")
    for act, p, states in cases:
        model, _, _, plan, names = _tensor_case(act, p, rng)
        points = [_point(p, 2, rng) for _ in range(states)]
        Q, rho, T = (np.stack([x[i] for x in points]) for i in range(3))
        a, b = np.full((states, p), 1.0 / p), np.ones((states, 2))
        args = (plan, Q, rho, T, a, b, model.noise, names)
        with threadpoolctl.threadpool_limits(limits=1):
            now = time_call(lambda: engine.tensor_kinds(*args), repeat)
            line = (f"{act:>16} {p:>3} {states:>6} {now * 1e3:9.2f} "
                    f"{now / states * 1e3:9.3f}")
            if before is not None:
                then = time_call(lambda: before.tensor_kinds(*args), repeat)
                new, old = engine.tensor_kinds(*args), before.tensor_kinds(*args)
                for name in names:
                    scale = np.max(np.abs(old.arrays[name]))
                    assert np.max(np.abs(new.arrays[name] - old.arrays[name])) \
                        <= 1e-13 * scale, name
                line += f" {then * 1e3:9.2f} {then / states * 1e3:9.3f} {then / now:10.2f}"
        print(line, flush=True)


def diffusion_cost_main(ps, repeat, activations):
    """What one tensor-route ``D`` costs, and the least it could cost in this form.

    Per activation and ``p`` (``p* = 2``, trained readout, one state, BLAS pinned to one
    thread): the program's pairwise steps and finals and their multiply-adds
    (:meth:`_Program.cost`: every class's steps after CSE, the term axis included);
    how the engine runs them (:meth:`_Executable.cost`: Python-level calls,
    multiply-adds in the compiled interpreter — the group stacking counted one per
    element —, in numpy steps and in the groups' products after the shared operands
    are summed first); the measured time of the kinds; and two *lower bounds* of this
    form, the executed multiply-adds at the measured rate of a 512 × 512 matrix product
    (``R``) and at the rate of the program's typical product shape, ``(p² × n) @ (n × p²)``
    (``R_n``), against one RHS call.
    """
    import threadpoolctl
    from symquad.runtime import diffusion_engine as engine
    rng = np.random.default_rng(0)
    with threadpoolctl.threadpool_limits(limits=1):
        rate, floor = matmul_rate(), call_floor()
        print(f"# one thread: matmul rate R = {rate / 1e9:.2f} GMAC/s (512 x 512), "
              f"floor of one numpy call {floor * 1e6:.2f} us; times in ms, best of {repeat}")
        print(f"{'activation':>16} {'p':>3} {'steps':>6} {'finals':>6} {'prog MACs':>9} "
              f"{'calls':>6} {'vm rows':>7} {'MACs vm':>8} {'numpy':>8} {'groups':>8} "
              f"{'kinds':>8} {'R_n':>5} {'MACs/R':>7} {'MACs/R_n':>8} {'RHS':>7} "
              f"{'kinds/RHS':>9} {'bound/RHS':>9} {'bound_n/RHS':>11}")
        for act in activations:
            for p in ps:
                model, k, (Q, rho, T, a, b), plan, names = _tensor_case(act, p, rng)
                prog = engine._program(plan, names, p, p + 2).cost()
                exe = engine._executable(plan, names, p, p + 2, 1).cost()
                n = p + 2
                x = np.random.default_rng(1).standard_normal((p * p, n))
                y = x.T.copy()
                rate_n = p * p * n * p * p / time_call(lambda: x @ y, repeat)
                macs = exe["macs_vm"] + exe["macs_numpy"] + exe["macs_groups"]
                t_rhs = time_call(lambda: k.rhs(Q, rho, T, a), repeat)
                t_kinds = time_call(lambda: engine.tensor_kinds(plan, Q, rho, T, a, b,
                                                                model.noise, names), repeat)
                print(f"{act:>16} {p:>3} {prog['steps']:>6} {prog['finals']:>6} "
                      f"{prog['macs_steps'] + prog['macs_finals']:9.2e} {exe['calls']:>6} "
                      f"{exe['vm_rows']:>7} {exe['macs_vm']:8.2e} {exe['macs_numpy']:8.2e} "
                      f"{exe['macs_groups']:8.2e} {t_kinds * 1e3:8.2f} {rate_n / 1e9:5.1f} "
                      f"{macs / rate * 1e3:7.2f} {macs / rate_n * 1e3:8.2f} {t_rhs * 1e3:7.3f} "
                      f"{t_kinds / t_rhs:9.1f} {macs / rate / t_rhs:9.1f} "
                      f"{macs / rate_n / t_rhs:11.1f}", flush=True)


def best_order_macs(subscripts, shapes):
    """Fewest multiply-adds of a pairwise contraction tree for one einsum, by dynamic programming.

    ``subscripts`` as ``_pairwise_plan`` takes them (``"...tab,...tb->...ta"``, a term
    axis ``t`` and the batch's ``...`` allowed), ``shapes`` the operands' shapes without
    the batch.  The cost model is the planner's: a step costs the product of the sizes
    of all letters of its two operands and keeps the letters that the output or an
    operand outside it holds; the term axis, in every operand and the output,
    multiplies every step.  The operands with one letter besides ``t`` (vertex
    functions) whose letter another operand holds are left out, as if free: any tree
    over all operands induces a tree over the others whose steps hold no more letters,
    so the result is a *lower bound* of every pairwise order's multiply-adds (an operand
    may be summed over the letters only it holds before its step, at its size: what
    taking such a vector with it first costs).  Over the rest, every binary tree is
    searched (``O(3^m)`` for ``m`` operands).
    """
    from functools import lru_cache
    ins, out = subscripts.split("->")
    ops = [s.replace("...", "") for s in ins.split(",")]
    out = out.replace("...", "")
    dims = {}
    for sub, shape in zip(ops, shapes):
        dims.update(zip(sub, shape))
    terms = dims.pop("t", 1)
    ops = [frozenset(sub) - {"t"} for sub in ops]
    out = frozenset(out) - {"t"}
    big = [s for s in ops if len(s) > 1]
    big += [s for s in ops if len(s) <= 1 and not any(s <= b for b in big)]
    m = len(big)
    full = (1 << m) - 1
    letters = [frozenset().union(*(big[i] for i in range(m) if S >> i & 1)) for S in range(1 << m)]

    def kept(S):
        return frozenset(c for c in letters[S] if c in out or c in letters[full ^ S])

    def forms(S):
        # (letters, cost so far) of a side of a step: an intermediate holds what the
        # output or an operand outside it holds; an operand is taken whole, or first
        # summed over the letters only it holds (one pass over it, as a free vertex
        # vector would), whichever makes the step cheaper
        if S & (S - 1):
            return [(kept(S), 0)]
        if kept(S) == letters[S]:
            return [(letters[S], 0)]
        return [(letters[S], 0), (kept(S), math.prod(dims[c] for c in letters[S]))]

    @lru_cache(maxsize=None)
    def best(S):
        if S & (S - 1) == 0:
            return 0
        result, sub = None, (S - 1) & S
        while sub:
            if sub < S ^ sub:
                step = min(ca + cb + math.prod(dims[c] for c in la | lb)
                           for la, ca in forms(sub) for lb, cb in forms(S ^ sub))
                cost = best(sub) + best(S ^ sub) + step
                result = cost if result is None else min(result, cost)
            sub = (sub - 1) & S
        return result
    return terms * best(full)


def diffusion_floor_main(ps, activations):
    """Whether another contraction order would cut the tensor route's multiply-adds.

    Per activation and ``p`` (``p* = 2``, trained readout): the multiply-adds of every
    class's contraction (its terms included, no CSE across classes) in the greedy
    order the engine takes (``_pairwise_plan``) and the least any pairwise order could
    take per class (:func:`best_order_macs`, a lower bound), by kind, and the
    program's after CSE (``_Program.cost``).  No timing: the counts are exact.
    """
    from symquad.runtime import diffusion_engine as engine
    from symquad.numeric.kernels import _diffusion_tensor_module
    from symquad._generated import diffusion_assembly as assembly
    print(f"{'activation':>16} {'p':>3} {'kind':>5} {'classes':>7} {'greedy':>9} "
          f"{'floor':>9} {'floor/greedy':>12} {'program (CSE)':>13}")
    for act in activations:
        for p in ps:
            model = sq.Model(p, 2, 0.1, activation=act, lr_readout=0.1)
            plan = _diffusion_tensor_module(model).PLAN
            names = tuple(assembly.KINDS[(model.constraint, True)])
            n = p + 2
            rows = {}
            for name in names:
                for _, _, full, classes in engine._compiled(plan, name):
                    for subs, edges, vertices, _, _, weights in classes:
                        sub, core = engine._class_contraction(subs, edges, vertices, full,
                                                             len(weights), p, n)
                        steps, _ = engine._pairwise_plan(sub, core)
                        row = rows.setdefault(name, [0, 0, 0])
                        row[0] += 1
                        row[1] += sum(f for _, _, f in steps)
                        row[2] += best_order_macs(sub, core)
            cost = engine._program(plan, names, p, n).cost()
            total = [sum(r[i] for r in rows.values()) for i in range(3)]
            for name, (count, greedy, best) in sorted(rows.items(), key=lambda kv: -kv[1][1]) \
                    + [("all", total)]:
                tail = f" {cost['macs_steps'] + cost['macs_finals']:13.3e}" if name == "all" else ""
                print(f"{act:>16} {p:>3} {name:>5} {count:>7} {greedy:9.3e} {best:9.3e} "
                      f"{best / greedy:12.3f}{tail}", flush=True)


def _segment_replay(exe, CP, stud, summed, Delta, clock):
    """One call of ``exe`` (an ``_Executable``, one state) run phase by phase.

    ``_Executable._run``'s own phases in its order (the caller checks the kinds equal
    the engine's bit for bit), each timed into `clock` (a dict of seconds): ``setup``
    (inputs, leaves, weights), ``interpreter``, ``numpy steps``, ``group products``,
    ``symmetrisation``.
    """
    B = 1
    W = np.empty((B, exe.size))
    views, group_views = exe._step_views(W, B), exe._group_views(W, B)

    def timed(phase, fn, *args):
        t0 = time.perf_counter()
        result = fn(*args)
        clock[phase] = clock.get(phase, 0.0) + time.perf_counter() - t0
        return result

    timed("setup", exe._load, W, CP, stud, summed, Delta, B)
    for seg, view in zip(exe.segments, views):
        timed("interpreter" if seg[0] == "vm" else "numpy steps", exe._segment, W, seg, view, B)
    out = timed("group products", exe._group_products, W, B, group_views)
    return timed("symmetrisation", exe._symmetrised, out)


def diffusion_segments_main(ps, repeat, activations):
    """Where one tensor-route ``D`` spends its time, phase by phase (one state, one thread).

    Per activation and ``p`` (``p* = 2``, trained readout): ``D``, the kinds alone and one
    RHS call; one call of the program replayed segment by segment
    (:func:`_segment_replay`, its kinds asserted equal to ``tensor_kinds``' bit for bit),
    each phase the minimum over `repeat` calls; then the interpreter's rows alone (one
    ``run`` call per class of rows, operands in cache): the register kernel, other rows
    that sum a letter, rows that sum nothing (plain, weighted).  Milliseconds.
    """
    import threadpoolctl
    from symquad.runtime import contraction_vm as vm
    from symquad.runtime import diffusion_engine as engine
    from symquad.runtime import tensor_engine
    rng = np.random.default_rng(0)
    with threadpoolctl.threadpool_limits(limits=1):
        for act in activations:
            for p in ps:
                model, k, (Q, rho, T, a, b), plan, names = _tensor_case(act, p, rng)
                t_d = time_call(lambda: k.diffusion(Q, rho, T, a), repeat)
                t_k = time_call(lambda: engine.tensor_kinds(plan, Q, rho, T, a, b, model.noise,
                                                            names), repeat)
                t_r = time_call(lambda: k.rhs(Q, rho, T, a), repeat)
                # the program's inputs, as tensor_kinds prepares them
                _, C, w, _, phi = engine._inputs(plan, Q, rho, T, a, b)
                CP = np.stack(tensor_engine._hadamard_powers(C, plan["__top__"]), axis=-3)
                PHI = np.stack(phi, axis=-2)
                stud, summed = PHI[..., :p], PHI * w[..., None, :]
                exe = engine._executable(plan, names, p, p + 2, 1)
                want = engine.tensor_kinds(plan, Q, rho, T, a, b, model.noise, names).arrays
                best = {}
                for _ in range(repeat):
                    clock = {}
                    got = _segment_replay(exe, CP, stud, summed, model.noise, clock)
                    for key, v in clock.items():
                        best[key] = min(best.get(key, np.inf), v)
                for name in names:
                    assert np.array_equal(got[name][0], want[name]), name
                print(f"{act} p = {p}: D {t_d * 1e3:.2f}, kinds {t_k * 1e3:.2f}, RHS "
                      f"{t_r * 1e3:.3f} (D/RHS {t_d / t_r:.0f}); D - kinds "
                      f"{(t_d - t_k) * 1e3:.2f}; workspace {exe.size} doubles; {sum(s[0] == 'vm' for s in exe.segments)} "
                      f"interpreter calls, {sum(s[0] == 'step' for s in exe.segments)} numpy "
                      f"steps, {len(exe.groups)} groups", flush=True)
                print("   replayed: " + ", ".join(f"{key} {v * 1e3:.2f}"
                                                  for key, v in best.items()), flush=True)
                code = exe.code
                classes = {}
                for r in range(len(code)):
                    nl = code[r, vm._NL]
                    if vm.kernel_of(code[r]) == "rows":
                        label = "register kernel"
                    elif any(code[r, vm._ZS + j] == 0 for j in range(nl)):
                        label = "other contracting"
                    else:
                        label = "nothing summed, " + ("weighted" if code[r, vm._WEIGHTED]
                                                      else "plain")
                    classes.setdefault(label, []).append(r)
                W = rng.standard_normal((1, exe.size))
                parts = []
                for label, rows in classes.items():
                    sub = np.ascontiguousarray(code[rows])
                    macs = sum(int(np.prod(sub[i, vm._D:vm._D + sub[i, vm._NL]]))
                               for i in range(len(sub)))
                    t = time_call(lambda: vm.run(W, sub, 0, len(sub)), repeat)
                    parts.append(f"{label} {len(rows)} rows {t * 1e3:.2f} "
                                 f"({macs / t / 1e9:.1f} GMAC/s)")
                print("   rows alone: " + "; ".join(parts), flush=True)


# ---- the ReLU drift (issue 26: the SDE's cost for a ReLU student) --------------------------

_RELU_TIMER = """
import json, sys, time
import numpy as np
import symquad as sq
from symquad.numeric.landscape import random_start
p, states, repeat = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
m = sq.Model(p, 2, 0.1, activation="relu")
Q, rho = random_start(m, 10**4, states, seed=0)
k = sq.kernels(m)
T = np.eye(2)
k.rhs(Q, rho, T)                                  # compilation / cache load, not timed
out = {}
import numba, threadpoolctl
for label, limit in (("default", None), ("pinned", 1)):
    threads = numba.get_num_threads()
    with threadpoolctl.threadpool_limits(limits=limit):
        if limit:
            numba.set_num_threads(1)
        best = (float("inf"), float("inf"))
        for _ in range(repeat):
            w, c = time.perf_counter(), time.process_time()
            k.rhs(Q, rho, T)
            best = min(best, (time.perf_counter() - w, time.process_time() - c))
        numba.set_num_threads(threads)
    out[label] = best
out["file"] = sq.__file__
print(json.dumps(out))
"""


def _relu_rhs_seconds(root, p, states, repeat):
    """Best-of-`repeat` (wall, CPU) seconds of one ReLU RHS over `states` random-start states
    (N = 10⁴, seed 0) at (p, 2), default threads and pinned (threadpoolctl and numba limited
    to one thread), in a subprocess importing symquad from `root`."""
    import json
    import subprocess
    env = dict(os.environ, PYTHONPATH=str(root))
    # run in `root`: ``python -c`` puts the working directory first on sys.path
    out = subprocess.run([sys.executable, "-c", _RELU_TIMER, str(p), str(states), str(repeat)],
                         env=env, cwd=str(root), capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def relu_main(ps, states, repeat, before=None):
    """One ReLU RHS (ReLU student and teacher, (p, 2)) over `states` random-start states:
    the four-point sums' quadruples and nodes (this checkout's route), its time with default
    and pinned threads, and the same for the checkout `before` (a path) in the same run."""
    from symquad.numeric import special as NS
    from symquad.numeric.landscape import random_start
    from symquad.runtime.tensor_engine import combine
    root = pathlib.Path(__file__).resolve().parent.parent
    print(f"# one ReLU RHS over {states} random-start states (N = 1e4), p* = 2; best of "
          f"{repeat}; wall and CPU ms; 'pinned' = BLAS and numba on one thread; load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    head = (f"{'p':>3} {'quadruples':>10} {'nodes/q':>8} {'wall':>8} {'CPU':>8} "
            f"{'wall pin':>9} {'CPU pin':>8}")
    if before:
        head += f" {'before wall':>11} {'before pin':>10} {'speed-up':>9} {'pinned':>7}"
    print(head)
    for p in ps:
        m = sq.Model(p, 2, 0.1, activation="relu")
        Q, rho = random_start(m, 10**4, states, seed=0)
        C = combine(Q, rho, np.eye(2))[0]
        _, counts = NS.relu_four_point_grid(C, p, ("relu",), nodes=True)
        quads = states * (p * (p + 1) // 2) * ((p + 2) * (p + 3) // 2)
        now = _relu_rhs_seconds(root, p, states, repeat)
        assert now["file"].startswith(str(root)), now["file"]
        (w0, c0), (w1, c1) = now["default"], now["pinned"]
        line = (f"{p:>3} {quads:>10} {counts.sum() / quads:>8.2f} {w0 * 1e3:>8.1f} "
                f"{c0 * 1e3:>8.1f} {w1 * 1e3:>9.1f} {c1 * 1e3:>8.1f}")
        if before:
            old = _relu_rhs_seconds(before, p, states, repeat)
            assert old["file"].startswith(str(pathlib.Path(before).resolve())), old["file"]
            b0, b1 = old["default"][0], old["pinned"][0]
            line += f" {b0 * 1e3:>11.1f} {b1 * 1e3:>10.1f} {b0 / w0:>9.2f} {b1 / w1:>7.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-p", type=int, default=512)
    parser.add_argument("--lambdify-max-p", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--p-star", type=int, default=2)
    parser.add_argument("--before", help="an older generated quadratic_matrix.py to compare")
    parser.add_argument("--diffusion", action="store_true", help="time D against the RHS")
    parser.add_argument("--diffusion-cost", action="store_true",
                        help="D's program: calls, multiply-adds, call overhead, lower bound")
    parser.add_argument("--diffusion-batched", metavar="ACT:P:STATES;...",
                        help="the tensor kinds of a batch of states in one call, e.g. "
                        "'z**2 + z**3/3:4:64;z**3 - 3*z:8:64' (with --engine-before: beside it)")
    parser.add_argument("--diffusion-floor", action="store_true",
                        help="D's multiply-adds in the greedy and in the best contraction order")
    parser.add_argument("--diffusion-segments", action="store_true",
                        help="D's time phase by phase, and the interpreter's rows by kind")
    parser.add_argument("--diffusion-p", default="2,4,8,16")
    parser.add_argument("--reference-max-p", type=int, default=8)
    parser.add_argument("--no-first-call", action="store_true")
    parser.add_argument("--engine-before", help="an older runtime/diffusion_engine.py: its "
                        "tensor kinds timed beside this engine's (--diffusion)")
    parser.add_argument("--activations", default=",".join(DIFFUSION_ACTIVATIONS),
                        help="comma-separated activations for --diffusion")
    parser.add_argument("--relu", action="store_true",
                        help="time the ReLU RHS over a batch of states (issue 26)")
    parser.add_argument("--relu-p", default="4,8,16")
    parser.add_argument("--relu-states", type=int, default=64)
    parser.add_argument("--relu-before", help="another checkout (path) to time beside this one")
    args = parser.parse_args()
    if args.diffusion_cost:
        diffusion_cost_main([int(x) for x in args.diffusion_p.split(",")], args.repeat,
                            [a for a in args.activations.split(",") if a != "z**2"])
        raise SystemExit(0)
    if args.diffusion_batched:
        cases = []
        for item in args.diffusion_batched.split(";"):
            act, p, states = item.rsplit(":", 2)
            if not (p.isdigit() and states.isdigit() and int(p) >= 1 and int(states) >= 1):
                parser.error(f"--diffusion-batched: {item!r} is not ACTIVATION:P:STATES "
                             "with P and STATES positive integers")
            cases.append((act.strip(), int(p), int(states)))
        diffusion_batched_main(cases, args.repeat, args.engine_before)
        raise SystemExit(0)
    if args.diffusion_floor:
        diffusion_floor_main([int(x) for x in args.diffusion_p.split(",")],
                             [a for a in args.activations.split(",") if a != "z**2"])
        raise SystemExit(0)
    if args.diffusion_segments:
        diffusion_segments_main([int(x) for x in args.diffusion_p.split(",")], args.repeat,
                                [a for a in args.activations.split(",") if a != "z**2"])
        raise SystemExit(0)
    if args.relu:
        relu_main([int(x) for x in args.relu_p.split(",")], args.relu_states, args.repeat,
                  args.relu_before)
        raise SystemExit(0)
    if args.diffusion:
        diffusion_main([int(x) for x in args.diffusion_p.split(",")], args.repeat,
                       args.reference_max_p, not args.no_first_call,
                       args.activations.split(","), args.engine_before)
        raise SystemExit(0)
    main(args.max_p, args.lambdify_max_p, args.repeat, args.p_star, args.before)

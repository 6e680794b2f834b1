"""Cost of the width-independent tensor route (issue: any polynomial activation at any width).

Side by side in one run, for σ = z³ and σ = z³ − 3z:

* **first derivation**: a fresh Python process with an empty kernel cache derives the
  activation and writes its kernel module (SymPy import included: what a new user
  pays once per activation);
* **new width**: a fresh process loads that cached module and evaluates the RHS at a
  width never used before (checksum + import + first call);
* **one RHS** at p = 8, 64, 256 for p* = 4, 8: the tensor kernel, the σ = z² matrix
  kernel at the same (p, p*), and the floor: one ``(p², n) × (n, n)`` matrix product,
  ``n = p + p*`` (the intrinsic O(p² n²) cost of a degree >= 3 activation);
* **conditioning**: float64 kernels against a 40-digit mpmath evaluation of the
  printed polynomials at p = 64, p* = 8 (max relative error over the entries checked);
* **threads**: one RHS with the BLAS library's default thread count and pinned to one
  thread (``OMP_NUM_THREADS=1``), side by side in fresh processes, on the idle machine
  and beside another numpy job (a process doing large matrix products on the
  library's default threads), and whether the numbers are bit-identical.

    OMP_NUM_THREADS=1 python benchmarks/bench_tensor.py [--repeat 3] [--no-mpmath]
    python benchmarks/bench_tensor.py --threads-only
"""

import os
import subprocess
import sys
import tempfile
import textwrap
import timeit

import numpy as np

import symquad as sq
from symquad.entry import ArgumentParser

ACTIVATIONS = ("z**3", "z**3 - 3*z")


def _point(p, k, rng):
    n = p + k
    G = rng.standard_normal((n, n + 3))
    C = G @ G.T / (n + 3)
    return C[:p, :p].copy(), C[:p, p:].copy(), C[p:, p:].copy()


def best_time(fn, repeat):
    """Best-of-`repeat` seconds per call (call count auto-scaled to ~0.05 s)."""
    timer = timeit.Timer(fn)
    number, elapsed = timer.autorange()
    if elapsed / number > 1.0:          # slow calls: `repeat` single calls
        return min(timer.repeat(repeat=repeat, number=1))
    number = max(1, number // 4)
    return min(timer.repeat(repeat=repeat, number=number)) / number


def fresh_process_seconds(code, cache):
    """Run ``code`` in a fresh interpreter with SYMQUAD_CACHE_DIR=cache; it prints seconds."""
    env = {**os.environ, "SYMQUAD_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


FIRST = """
    import time
    t0 = time.perf_counter()
    from symquad.kernel_files import atomic_write, cached_path, load_module_file, generator_version
    from symquad.codegen.tensor_render import render_tensor_module
    from symquad.numeric.kernels import activation_key
    import symquad as sq
    m = sq.Model(p=4, p_star=2, lr=0.1, activation={act!r})
    path = cached_path("tensor", activation_key(m))
    atomic_write(path, render_tensor_module(m.activation, generator=generator_version()))
    load_module_file(path, "m")
    print(time.perf_counter() - t0)
"""

NEW_WIDTH = """
    import time
    t0 = time.perf_counter()
    import numpy as np
    from symquad.kernel_files import load_module_file, cached_path
    from symquad.numeric.kernels import activation_key
    import symquad as sq
    # coefficients, not a string: parsing a string imports SymPy (~1 s), which a
    # user who already derived the activation need not pay
    m = sq.Model(p=37, p_star=5, lr=0.1, activation={coeffs!r})
    mod = load_module_file(cached_path("tensor", activation_key(m)), "m")
    mod.rhs(np.eye(37), np.zeros((37, 5)), np.eye(5), 0.1, 0.0)
    print(time.perf_counter() - t0)
"""


def in_process_new_width_seconds(act):
    """kernels() at a width not used before in this process, plus its first RHS."""
    sq.kernels(sq.Model(p=3, p_star=2, lr=0.1, activation=act))      # activation loaded
    start = timeit.default_timer()
    kern = sq.kernels(sq.Model(p=41, p_star=6, lr=0.1, activation=act))
    kern.rhs(np.eye(41), np.zeros((41, 6)), np.eye(6))
    return timeit.default_timer() - start


def derivation_table():
    print("# first derivation (fresh process, empty cache); a new width (p=37, p*=5) in a fresh "
          "process from the cached module, interpreter start-up and imports included; a new "
          "width (p=41, p*=6) in a running process; each with one RHS call")
    print(f"{'activation':>12} {'first derivation [s]':>21} {'new width, fresh [s]':>21} "
          f"{'new width, in process [s]':>26}")
    for act in ACTIVATIONS:
        with tempfile.TemporaryDirectory() as cache:
            first = fresh_process_seconds(FIRST.format(act=act), cache)
            coeffs = tuple(str(c) for c in sq.Model(1, 1, 1.0, activation=act).activation)
            new = fresh_process_seconds(NEW_WIDTH.format(coeffs=coeffs), cache)
        here = in_process_new_width_seconds(act)
        print(f"{act:>12} {first:21.2f} {new:21.3f} {here:26.4f}")


def rhs_table(repeat):
    print("\n# one RHS evaluation, best of repeats, milliseconds; floor = (p², n) @ (n, n)")
    print(f"{'p':>4} {'p*':>3} {'floor':>9} {'z² matrix':>10} "
          + " ".join(f"{a:>12} {'/floor':>7}" for a in ACTIVATIONS))
    rng = np.random.default_rng(0)
    for k in (4, 8):
        for p in (8, 64, 256):
            Q, rho, T = _point(p, k, rng)
            n = p + k
            A, B = rng.standard_normal((p * p, n)), rng.standard_normal((n, n))
            floor = best_time(lambda: A @ B, repeat)
            mat = sq.kernels(sq.Model(p=p, p_star=k, lr=0.1))
            t_mat = best_time(lambda: mat.rhs(Q, rho, T), repeat)
            cells = []
            for act in ACTIVATIONS:
                kern = sq.kernels(sq.Model(p=p, p_star=k, lr=0.1, noise=0.1, activation=act))
                t = best_time(lambda: kern.rhs(Q, rho, T), repeat if p < 256 else 1)
                cells.append(f"{t * 1e3:12.2f} {t / floor:7.1f}")
            print(f"{p:4d} {k:3d} {floor * 1e3:9.3f} {t_mat * 1e3:10.3f} " + " ".join(cells),
                  flush=True)


def _near_solution(p, k, eps, rng, N=200):
    """Overlaps of students = teachers replicated p/k times + eps noise (risk ~ eps²)."""
    Ws = np.linalg.qr(rng.standard_normal((N, k)))[0].T * np.sqrt(N)
    W = np.repeat(Ws, p // k, axis=0) + eps * rng.standard_normal((p, N))
    return W @ W.T / N, W @ Ws.T / N, Ws @ Ws.T / N


def conditioning_table():
    from symquad.symbolic.tensor import reference_entries
    print("\n# float64 vs 40-digit mpmath at p=64, p*=8 (entries dQ[0,0], dQ[0,1], dQ[5,60], "
          "drho[3,2], risk); 'near zero risk': students = replicated teachers + eps noise")
    print(f"{'activation':>12} {'point':>22} {'max rel. error':>15} {'max abs. error':>15} "
          f"{'risk':>10} {'risk rel. error':>16}")
    cases = [(act, f"random, scale {s:g}", s) for act in ACTIVATIONS + ("z**4",) for s in (1, 3)]
    cases += [("z**3 - 3*z", f"near zero risk, eps {e:g}", -e) for e in (1e-2, 1e-4, 1e-6)]
    for act, label, scale in cases:
        model = sq.Model(p=64, p_star=8, lr=0.3, noise=0.0 if scale < 0 else 0.2,
                         activation=act)
        rng = np.random.default_rng(64)
        if scale > 0:
            Q, rho, T = (scale * x for x in _point(64, 8, rng))
        else:
            Q, rho, T = _near_solution(64, 8, -scale, rng)
        ref = reference_entries(model, Q, rho, T, [(0, 0), (0, 1), (5, 60)], [(3, 2)],
                                risk=True)
        kern = sq.kernels(model)
        dQ, drho = kern.rhs(Q, rho, T)
        got = {("risk",): kern.risk(Q, rho, T), ("drho", 3, 2): drho[3, 2]}
        got.update({("dQ", a, b): dQ[a, b] for a, b in [(0, 0), (0, 1), (5, 60)]})
        abs_err = {key: abs(got[key] - float(v)) for key, v in ref.items()}
        rel = max(abs_err[key] / abs(float(v)) for key, v in ref.items())
        risk = float(ref[("risk",)])
        print(f"{act:>12} {label:>22} {rel:15.2e} {max(abs_err.values()):15.2e} "
              f"{risk:10.2e} {abs_err[('risk',)] / abs(risk):16.2e}", flush=True)


THREAD_WORKER = """
    import hashlib, sys, timeit
    import numpy as np
    import symquad as sq
    p, k, act, repeat = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    from symquad.numeric.kernels import single_thread_blas
    rng = np.random.default_rng(0)
    n = p + k
    G = rng.standard_normal((n, n + 3))
    with single_thread_blas():        # the same input bytes whatever the thread count
        C = G @ G.T / (n + 3)
    Q, rho, T = C[:p, :p].copy(), C[:p, p:].copy(), C[p:, p:].copy()
    kern = sq.kernels(sq.Model(p=p, p_star=k, lr=0.1, noise=0.1, activation=act))
    out = kern.rhs(Q, rho, T)
    timer = timeit.Timer(lambda: kern.rhs(Q, rho, T))
    number, elapsed = timer.autorange()
    number = max(1, number // 4)
    best = min(timer.repeat(repeat=repeat, number=number)) / number
    digest = hashlib.sha256(b"".join(x.tobytes() for x in out)).hexdigest()[:12]
    print(best, digest)
"""

NUMPY_JOB = """
    import numpy as np
    a = np.random.default_rng(0).standard_normal((1500, 1500))
    while True:
        a = np.tanh(a @ a / 1500.0)
"""


def _thread_run(p, k, act, repeat, pinned):
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env.pop("OPENBLAS_NUM_THREADS", None)
    if pinned:
        env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(THREAD_WORKER), str(p), str(k),
                          act, str(repeat)], env=env, capture_output=True, text=True, check=True)
    seconds, digest = out.stdout.split()
    return float(seconds), digest


def threads_table(repeat):
    print("\n# one RHS, library-default BLAS threads vs pinned to one thread (alternating "
          "fresh processes, best of two each), milliseconds; same numbers = identical bytes")
    print(f"{'situation':>24} {'kernel':>16} {'p':>4} {'p*':>3} {'default':>10} {'pinned':>10} "
          f"{'default/pinned':>15} {'same numbers':>13}")
    cases = [(64, 4, "z**3 - 3*z"), (256, 4, "z**3 - 3*z"), (128, 4, "z**2"), (256, 2, "z**2")]
    for situation in ("idle", "beside a numpy job"):
        job = None
        if situation != "idle":
            env = dict(os.environ)
            env.pop("OMP_NUM_THREADS", None)
            job = subprocess.Popen([sys.executable, "-c", textwrap.dedent(NUMPY_JOB)], env=env)
        try:
            for p, k, act in cases:
                reps = repeat if p < 256 else 2
                # alternating fresh processes, best of each: a neighbour's burst on the
                # shared machine then hits both settings alike instead of one of them
                t_def = t_one = float("inf")
                for _ in range(2):
                    t, h_def = _thread_run(p, k, act, reps, pinned=False)
                    t_def = min(t_def, t)
                    t, h_one = _thread_run(p, k, act, reps, pinned=True)
                    t_one = min(t_one, t)
                kind = "tensor " + act if act != "z**2" else "matrix z**2"
                print(f"{situation:>24} {kind:>16} {p:4d} {k:3d} {t_def * 1e3:10.2f} "
                      f"{t_one * 1e3:10.2f} {t_def / t_one:15.2f} {str(h_def == h_one):>13}",
                      flush=True)
        finally:
            if job is not None:
                job.kill()
                job.wait()


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-mpmath", action="store_true", help="skip the conditioning table")
    parser.add_argument("--threads-only", action="store_true",
                        help="only the default-threads vs one-thread table")
    args = parser.parse_args()
    print(f"# OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    if args.threads_only:
        threads_table(args.repeat)
        return
    derivation_table()
    rhs_table(args.repeat)
    if not args.no_mpmath:
        conditioning_table()
    threads_table(args.repeat)


if __name__ == "__main__":
    main()

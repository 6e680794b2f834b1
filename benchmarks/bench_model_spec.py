"""The default model before and after the model specification: same numbers, same speed.

Runs the same measurements on two checkouts of symquad side by side, alternating
them (A, B, A, B, …) so that the load of a shared machine hits both alike:

* the ODE right-hand side of the default model (matrix form) at p = 4, 16, 64
  and of σ = z³ − 3z (tensor form) at p = 16, 64;
* ``integrate`` of the default model from a random start to t = 200;
* ``simulate`` of the default model (reduced: N = 2000, 64 replicas, t = 20;
  full: N = 500, 8 replicas, t = 2);

and compares their outputs: the simulators must give identical numbers (same
seeds, bit for bit), the kernels and the ODE the same numbers to rounding.

``--before`` is a checkout of the earlier version (e.g. ``git worktree add
/tmp/symquad-0.2 ce95ed1``, made outside this repository); the current tree is
the "after".  Both need their numba kernels compiled: a first warm-up round is
not timed.

    python benchmarks/bench_model_spec.py --before /tmp/symquad-0.2 [--rounds 3]
    OMP_NUM_THREADS=1 python benchmarks/bench_model_spec.py --before /tmp/symquad-0.2
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

import numpy as np

from symquad.entry import ArgumentParser

HERE = pathlib.Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent(r'''
    import json, sys, time, timeit
    import numpy as np
    import symquad as sq

    out_dir = sys.argv[1]
    res = {"timings": {}, "package": sq.__file__}

    def best(fn, number, repeat=5):
        return min(timeit.repeat(fn, number=number, repeat=repeat)) / number

    rng = np.random.default_rng(0)
    for p, k, act in ((4, 2, "z**2"), (16, 4, "z**2"), (64, 2, "z**2"),
                      (16, 4, "z**3 - 3*z"), (64, 4, "z**3 - 3*z")):
        n = p + k
        G = rng.standard_normal((n, n + 3))
        C = G @ G.T / (n + 3)
        Q, rho, T = C[:p, :p].copy(), C[:p, p:].copy(), C[p:, p:].copy()
        kern = sq.kernels(sq.Model(p, k, 0.1, noise=0.1, activation=act))
        dQ, drho = kern.rhs(Q, rho, T)[:2]
        np.save(f"{out_dir}/rhs_{p}_{k}_{act.replace(' ', '')}.npy",
                np.concatenate([dQ.ravel(), drho.ravel(), [kern.risk(Q, rho, T)]]))
        number = 2000 if act == "z**2" and p < 64 else (500 if act == "z**2" else 5)
        res["timings"][f"rhs {act} p={p} p*={k}"] = best(lambda: kern.rhs(Q, rho, T), number)

    m = sq.DEFAULT_MODEL
    rho0 = 0.03 * np.random.default_rng(1).standard_normal((m.p, m.p_star))
    t0 = time.perf_counter()
    sol = sq.integrate(m, np.eye(m.p), rho0, np.eye(m.p_star), t_max=200.0)
    res["timings"]["integrate default t=200"] = time.perf_counter() - t0
    np.save(f"{out_dir}/integrate.npy", sol.risk)

    for method, N, R, t_max in (("reduced", 2000, 64, 20.0), ("full", 500, 8, 2.0)):
        t0 = time.perf_counter()
        run = sq.simulate(m, N=N, t_max=t_max, replicas=R, seed=3, method=method)
        res["timings"][f"simulate {method} N={N} R={R} t={t_max:g}"] = time.perf_counter() - t0
        np.save(f"{out_dir}/simulate_{method}.npy", np.concatenate([run.Q.ravel(),
                                                                    run.rho.ravel()]))
    print(json.dumps(res))
''')


def run_worker(tree, out_dir):
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PYTHONHASHSEED", None)
    # run outside both trees: the current folder comes first on sys.path
    proc = subprocess.run([sys.executable, "-c", WORKER, str(out_dir)], env=env, cwd=out_dir,
                          capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if not result["package"].startswith(str(tree)):
        raise RuntimeError(f"the worker imported {result['package']}, not the tree {tree}")
    return result


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="checkout of the earlier version")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per version")
    args = parser.parse_args()
    before = pathlib.Path(args.before).resolve()
    trees = {"before": before, "after": HERE}
    threads = os.environ.get("OMP_NUM_THREADS", "library default")
    print(f"before: {before}\nafter:  {HERE}\nBLAS threads: {threads}")
    timings = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {name: pathlib.Path(tmp) / name for name in trees}
        for d in dirs.values():
            d.mkdir()
        for name, tree in trees.items():          # warm-up: numba compilation, caches
            run_worker(tree, dirs[name])
        for _ in range(args.rounds):
            for name, tree in trees.items():
                timings[name].append(run_worker(tree, dirs[name])["timings"])
        print("\nnumbers (after vs before):")
        for f in sorted(dirs["before"].glob("*.npy")):
            a, b = np.load(f), np.load(dirs["after"] / f.name)
            if f.name.startswith("simulate"):
                print(f"  {f.stem:34s} identical: {np.array_equal(a, b, equal_nan=True)}")
            else:
                rel = float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
                print(f"  {f.stem:34s} max relative difference {rel:.1e}")
    print("\ntimings (best of the rounds; seconds):")
    print(f"  {'measurement':40s} {'before':>10s} {'after':>10s} {'after/before':>13s}")
    for key in timings["before"][0]:
        b = min(t[key] for t in timings["before"])
        a = min(t[key] for t in timings["after"])
        unit = 1e6 if key.startswith("rhs") else 1.0
        label = " (us)" if unit > 1 else ""
        print(f"  {key + label:40s} {b * unit:10.4g} {a * unit:10.4g} {a / b:13.2f}")


if __name__ == "__main__":
    main()

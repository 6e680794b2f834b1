"""Phase breakdown of ``symquad validate`` (the main job), optionally against an older revision.

Runs :func:`symquad.validate` with its default statistics (the defaults of
``symquad validate``: DEFAULT_MODEL, N = 2000, 64 replicas, finite-size
scaling over N = 100..10000, drift study of S at N = 250..2000) and prints the
time of each phase (SGD main run, ODE from every replica's start, analysis,
finite-size scaling, drift study), wall clock and CPU time of the whole call.

With ``--before REV`` the same job also runs on the code of git revision
``REV`` (extracted with ``git archive`` into a temporary folder, imported in
a subprocess), alternating after/before ``--repeat`` times, so the ratio is
measured side by side in one run on the same machine state.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_validate.py
    OMP_NUM_THREADS=1 python benchmarks/bench_validate.py --before 324470f
    python benchmarks/bench_validate.py --quick      # small statistics, a smoke test

Machine load matters on a shared machine: the script prints the load
average before and after each run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile

from symquad.entry import ArgumentParser

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# the job, as a script run in a fresh interpreter (so imports and compile caches count
# the way they do for a user); prints one JSON line
_JOB = r"""
import json, os, resource, sys, time
t0 = time.perf_counter()
import symquad as sq
import symquad.studies.validation as V
import symquad.studies.invariant_drift as D
kwargs = json.loads(sys.argv[1])
# the same phase timers for every revision: wrap the module-level functions validate calls
acc = {"ode": 0.0, "finite_size_scaling": 0.0, "invariant_drift": 0.0}
depth = [0]
def timed(name, fn):
    def wrapper(*a, **k):
        if depth[0]:                      # ODE solves inside the FSS count as FSS
            return fn(*a, **k)
        depth[0] += 1
        tick = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[name] += time.perf_counter() - tick
            depth[0] -= 1
    return wrapper
import inspect
own_timers = "runtime_phases_s" in inspect.getsource(V.validate)
if not own_timers:                        # older revisions: time them from outside
    V._ode_per_replica = timed("ode", V._ode_per_replica)
    V.finite_size_scaling = timed("finite_size_scaling", V.finite_size_scaling)
    D.invariant_drift_study = timed("invariant_drift", D.invariant_drift_study)
t1 = time.perf_counter()
rep = V.validate(sq.DEFAULT_MODEL, **kwargs)
t2 = time.perf_counter()
ru = resource.getrusage(resource.RUSAGE_SELF)
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
n = rep.numbers
if own_timers:
    phases = dict(n["runtime_phases_s"])
else:
    phases = {"sgd main run + analysis": (t2 - t1) - sum(acc.values()), **acc}
print(json.dumps({"import_s": t1 - t0, "validate_s": t2 - t1,
                  "cpu_s": ru.ru_utime + ru.ru_stime + ch.ru_utime + ch.ru_stime,
                  "phases": phases, "workers": rep.config.get("workers", 1),
                  "verdict": n.get("verdict", {}).get("verdict"),
                  "fss_exponent": n.get("finite_size_scaling", {}).get("exponent"),
                  "symquad": os.path.dirname(sq.__file__)}))
"""

_QUICK = dict(N=400, replicas=32, fss_N=[50, 200, 800, 3200], fss_replicas=16, fss_t_max=4.0,
              n_times=121, invariant_N=[100, 400], invariant_replicas=4)


def _run(src_root, kwargs):
    env = dict(os.environ, PYTHONPATH=src_root)
    env.setdefault("OMP_NUM_THREADS", "1")
    load0 = os.getloadavg()[0]
    out = subprocess.run([sys.executable, "-c", _JOB, json.dumps(kwargs)], env=env,
                         capture_output=True, text=True, cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise RuntimeError(f"job failed in {src_root}:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["load"] = (load0, os.getloadavg()[0])
    return res


def _extract(rev, dest):
    """The tree of git revision `rev` under `dest` (no worktree, no checkout)."""
    archive = subprocess.run(["git", "-C", REPO, "archive", "--format=tar", rev, "symquad"],
                             capture_output=True, check=True).stdout
    path = os.path.join(dest, "archive.tar")
    with open(path, "wb") as fh:
        fh.write(archive)
    with tarfile.open(path) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _print(label, res):
    ph = res["phases"] or {}
    total = res["validate_s"]
    parts = ", ".join(f"{k} {v:.1f} s ({100 * v / total:.0f}%)" for k, v in ph.items())
    print(f"{label:>7s}: validate {total:6.1f} s wall, {res['cpu_s']:6.1f} s CPU "
          f"(+ import {res['import_s']:.1f} s); load {res['load'][0]:.1f} -> "
          f"{res['load'][1]:.1f}; verdict {res['verdict']}")
    if parts:
        overlap = " (studies in parallel workers: phases overlap)" if res["workers"] > 1 else ""
        print(f"{'':>9s}{parts}{overlap}")
    sys.stdout.flush()


def main(argv=None):
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", metavar="REV", help="also time git revision REV")
    ap.add_argument("--repeat", type=int, default=1, help="alternating runs of each")
    ap.add_argument("--quick", action="store_true", help="small statistics (smoke test)")
    ap.add_argument("--workers", type=int, nargs="+", default=None,
                    help="also time these worker counts (validate(workers=...)) side by side")
    args = ap.parse_args(argv)
    kwargs = dict(_QUICK) if args.quick else {}
    print(f"symquad validate phase breakdown; python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"statistics: {'quick' if args.quick else 'default'}")
    with tempfile.TemporaryDirectory() as tmp:
        roots = [("after", REPO, kwargs)]
        for w in args.workers or ():
            roots.append((f"w={w}", REPO, dict(kwargs, workers=w)))
        if args.before:
            roots.append(("before", _extract(args.before, tmp), kwargs))
        results = {label: [] for label, _, _ in roots}
        for _ in range(max(1, args.repeat)):
            for label, root, kw in roots:
                res = _run(root, kw)
                results[label].append(res)
                _print(label, res)
    if args.before:
        a = min(r["validate_s"] for r in results["after"])
        b = min(r["validate_s"] for r in results["before"])
        ac = min(r["cpu_s"] for r in results["after"])
        bc = min(r["cpu_s"] for r in results["before"])
        print(f"speed-up (best of {args.repeat}): wall {b / a:.2f}x ({b:.1f} s -> {a:.1f} s), "
              f"CPU {bc / ac:.2f}x ({bc:.1f} s -> {ac:.1f} s)")


if __name__ == "__main__":
    main()

"""One point of the escape sweep: its time, CPU, peak memory, alone and two at once.

The sweep benchmark (``bench_sweep.py``) runs 8 points of the built-in ``escape`` task;
on 2 workers its speed-up is limited by how much more CPU the same point needs when
both cores run at once (memory traffic).  This measures that quantity directly on its
largest point (``p = 5``, ``p* = 1``, ``lr = 0.1`` scaled by the width, ``N = 1000``,
seed 0; 192 replicas as in ``--replicas 192``):

* *alone*: the point in a fresh process, timed after the imports and a warm-up point
  (the SGD kernels loaded): wall and CPU seconds (user + system, ``getrusage``) of
  the point, the process's peak resident memory (``ru_maxrss``);
* *two at once*: the same point in two fresh processes started together; the ratio
  of their CPU seconds to the CPU seconds alone is the inflation (1.0: the two cores
  do not slow each other).

With ``--against DIR`` the same is measured for another version of the package (a
tree holding ``symquad/``, e.g. ``git archive <commit> symquad | tar -x -C DIR``),
alternating with this one, round by round, so that both see the same load.  Each
setting runs with the default BLAS threads and pinned to one (``OMP_NUM_THREADS=1``,
as in a sweep's workers).  The numbers of the point (a digest of its result) must be
the same for every run.  The load average is printed before each run: on a shared
machine a third process makes the walls of "two at once" longer than their CPU
seconds; the CPU ratio is the robust figure.

``--allocator`` runs the point alone on one BLAS thread (as in a worker) under glibc's
defaults and under ``MALLOC_TRIM_THRESHOLD_=65536``, the setting distributed's nannies give
every worker and symquad's local clusters drop (``symquad.studies.sweep.LOCAL_WORKER_CONFIG``),
alternating round by round: CPU and system seconds and minor page faults.

Usage::

    python benchmarks/bench_escape_point.py                          # this version, 3 rounds
    python benchmarks/bench_escape_point.py --against /tmp/old --rounds 3
    python benchmarks/bench_escape_point.py --allocator --rounds 2   # the workers' allocator
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PARAMS = dict(p=5, p_star=1, lr=0.1, lr_scaling="width", N=1000, seed=0)


def point(replicas):
    """Child process: one warm-up point, then the timed point; prints one JSON line."""
    from symquad.numeric.simulate import warm_kernels
    from symquad.studies import tasks

    warm_kernels()
    tasks.escape_task(**PARAMS, replicas=2)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    s0, w0 = time.time(), time.perf_counter()
    out = tasks.escape_task(**PARAMS, replicas=replicas)
    w1, s1 = time.perf_counter(), time.time()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    digest = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()[:12]
    print(json.dumps({"wall": w1 - w0, "cpu": cpu, "sys": r1.ru_stime - r0.ru_stime,
                      "minflt": r1.ru_minflt - r0.ru_minflt, "maxrss": r1.ru_maxrss / 1024,
                      "start": s0, "end": s1, "digest": digest}))


def _launch(path, replicas, threads, environ=None):
    env = {**os.environ, "PYTHONPATH": path}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.pop("OMP_NUM_THREADS", None)
    if environ is not None:                 # the allocator's settings, exactly these
        env.pop("MALLOC_TRIM_THRESHOLD_", None)
        env.update(environ)
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--point",
                             str(replicas)], env=env, stdout=subprocess.PIPE, text=True)


def _result(proc):
    out, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"the point's process failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def measure(versions, rounds, replicas, threads):
    """``{version: {"alone": [...], "pair": [...]}}`` over `rounds` alternating rounds."""
    rows = {name: {"alone": [], "pair": []} for name in versions}
    label = "default threads" if threads is None else f"OMP_NUM_THREADS={threads}"
    for r in range(rounds):
        for name, path in versions.items():
            load = os.getloadavg()[0]
            a = _result(_launch(path, replicas, threads))
            rows[name]["alone"].append(a)
            print(f"[{label}] round {r} {name:5} alone: wall {a['wall']:.2f} s, cpu "
                  f"{a['cpu']:.2f} s, peak RSS {a['maxrss']:.0f} MiB, digest {a['digest']} "
                  f"(load {load:.2f})", flush=True)
        for name, path in versions.items():
            load = os.getloadavg()[0]
            pair = [_result(p) for p in [_launch(path, replicas, threads) for _ in range(2)]]
            rows[name]["pair"].append(pair)
            overlap = min(x["end"] for x in pair) - max(x["start"] for x in pair)
            print(f"[{label}] round {r} {name:5} two at once: walls {pair[0]['wall']:.2f}, "
                  f"{pair[1]['wall']:.2f} s, cpu {pair[0]['cpu']:.2f}, {pair[1]['cpu']:.2f} s, "
                  f"overlap {overlap:.2f} s, digests {pair[0]['digest']} {pair[1]['digest']} "
                  f"(load {load:.2f})", flush=True)
    return rows


def summary(rows, label):
    lines = []
    for name, r in rows.items():
        alone, pair = r["alone"], [x for p in r["pair"] for x in p]
        cpu_alone = _median([x["cpu"] for x in alone])
        cpu_pair = _median([x["cpu"] for x in pair])
        lines.append(
            f"{label:17} {name:5}: alone wall {_median([x['wall'] for x in alone]):.2f} s, "
            f"cpu {cpu_alone:.2f} s (medians of {len(alone)}), peak RSS "
            f"{max(x['maxrss'] for x in alone):.0f} MiB; two at once cpu {cpu_pair:.2f} s, "
            f"wall {_median([x['wall'] for x in pair]):.2f} s (medians of {len(pair)}): "
            f"cpu inflation {cpu_pair / cpu_alone:.3f}")
    digests = {x["digest"] for r in rows.values() for x in r["alone"] + sum(r["pair"], [])}
    lines.append(f"{label:17} same numbers in every run: {len(digests) == 1}")
    return lines


#: ``--allocator``: glibc's defaults, and the setting distributed's nannies give every
#: worker (an explicit trim threshold also turns off glibc's dynamic mmap threshold).
ALLOCATORS = (("glibc defaults", {}),
              ("MALLOC_TRIM_THRESHOLD_=65536", {"MALLOC_TRIM_THRESHOLD_": "65536"}))


def allocators(rounds, replicas):
    """The point alone on one BLAS thread under each of :data:`ALLOCATORS`, alternating."""
    print("| round | setting | CPU s | system s | wall s | minor page faults | load |")
    print("|---|---|---|---|---|---|---|")
    for r in range(rounds):
        for name, environ in ALLOCATORS:
            x = _result(_launch(ROOT, replicas, 1, environ))
            print(f"| {r} | {name} | {x['cpu']:.2f} | {x['sys']:.2f} | {x['wall']:.2f} | "
                  f"{x['minflt']} | {os.getloadavg()[0]:.2f} |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--against", metavar="DIR", help="another version's tree (holds symquad/)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=192)
    ap.add_argument("--allocator", action="store_true",
                    help="the point alone, one BLAS thread, under glibc's defaults and under "
                         "distributed's MALLOC_TRIM_THRESHOLD_=65536, alternating")
    ap.add_argument("--point", type=int, metavar="REPLICAS", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.point is not None:
        point(args.point)
        return
    if args.rounds < 1 or args.replicas < 2:
        ap.error("--rounds must be >= 1 and --replicas >= 2")
    if args.allocator:
        allocators(args.rounds, args.replicas)
        return
    versions = {"this": ROOT}
    if args.against:
        if not os.path.isdir(os.path.join(args.against, "symquad")):
            ap.error(f"--against {args.against}: no symquad/ there")
        versions = {"other": os.path.abspath(args.against), "this": ROOT}
    print(f"escape point p=5, {args.replicas} replicas; load before: "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    lines = []
    for threads in (None, 1):
        label = "default threads" if threads is None else "OMP_NUM_THREADS=1"
        lines += summary(measure(versions, args.rounds, args.replicas, threads), label)
    print()
    print("\n".join(lines))
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

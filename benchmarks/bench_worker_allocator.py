"""The escape sweep's largest point under glibc's defaults and under distributed's worker setting.

distributed's nannies start each worker with ``MALLOC_TRIM_THRESHOLD_=65536``; an
explicit trim threshold also turns off glibc's dynamic mmap threshold, so every array
above 128 KiB is mapped, faulted in page by page and unmapped again.  symquad's local
clusters drop the variable (``symquad.studies.sweep.LOCAL_WORKER_CONFIG``).  This runs
the ``escape`` task's ``p = 5`` point (``p* = 1``, ``N = 1000``, 192 replicas, one BLAS
thread, as in a worker) in fresh processes, alternating the two settings round by
round, after a warm-up point in each, and prints its CPU seconds, system seconds and
minor page faults (``getrusage``) and the load average.

Usage::

    python benchmarks/bench_worker_allocator.py             # 3 rounds
    python benchmarks/bench_worker_allocator.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r'''
import json, resource, time
from symquad.numeric.simulate import warm_kernels
from symquad.studies import tasks
P = dict(p=5, p_star=1, lr=0.1, lr_scaling="width", N=1000, seed=0)
warm_kernels()
tasks.escape_task(**P, replicas=2)
r0 = resource.getrusage(resource.RUSAGE_SELF)
w0 = time.perf_counter()
tasks.escape_task(**P, replicas=192)
w1 = time.perf_counter()
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
                  "sys": r1.ru_stime - r0.ru_stime, "wall": w1 - w0,
                  "minflt": r1.ru_minflt - r0.ru_minflt}))
'''

SETTINGS = (("glibc defaults", {}), ("MALLOC_TRIM_THRESHOLD_=65536",
                                     {"MALLOC_TRIM_THRESHOLD_": "65536"}))


def run_point(extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    env.update(extra)
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    print("| round | setting | CPU s | system s | wall s | minor page faults | load |")
    print("|---|---|---|---|---|---|---|")
    for k in range(args.rounds):
        for name, extra in SETTINGS:
            r = run_point(extra)
            print(f"| {k} | {name} | {r['cpu']:.2f} | {r['sys']:.2f} | {r['wall']:.2f} | "
                  f"{r['minflt']} | {os.getloadavg()[0]:.2f} |", flush=True)


if __name__ == "__main__":
    main()

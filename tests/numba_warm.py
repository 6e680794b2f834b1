"""Compile symquad's numba kernels into numba's on-disk cache before pytest-xdist's workers start.

Run by tests/conftest.py in the controller of a distributed run, as one process per group
of kernels at once (``python tests/numba_warm.py simulators``, ``... quadrature``,
``... engine``).  Without it, in a fresh checkout (numba's cache is next to the sources, empty after
a clone) each worker compiled the same kernels for itself when its first test needed them:
measured on the 2-core machine, the reduced simulator's kernels 11 s of CPU and the ReLU
quadrature's 12 s per process.  The calls below are the public routes with the argument
types the tests use, so the workers only load the cache (about 0.5 s per group).  Every call
is tiny and its result is discarded; a kernel this misses is still compiled where it is
first needed, as before (nothing depends on this for correctness).
"""

import sys

import numpy as np


def simulators():
    """The SGD simulators' kernels: reduced (polynomial, general), full, and their lanes."""
    import symquad as sq
    from symquad.numeric.simulate import warm_kernels

    warm_kernels()                     # reduced_steps, reduced_steps_lanes (its own lock)
    t = np.array([0.0, 4 / 64])
    for model in (sq.Model(2, 1, 0.1, activation="relu"),          # the general kernels
                  sq.Model(2, 1, 0.1, batch_size=2, weight_decay=0.1)):
        for replicas in (1, 8):
            sq.simulate(model, N=64, t_max=4 / 64, replicas=replicas, seed=0, t_eval=t)
    for model in (sq.Model(2, 1, 0.1), sq.Model(2, 1, 0.1, activation="relu")):
        sq.simulate(model, N=16, t_max=2 / 16, replicas=2, seed=0, method="full",
                    t_eval=np.array([0.0, 2 / 16]))


def quadrature():
    """The ReLU/erf four-point quadrature: serial, threaded, grid and scalar."""
    from symquad.numeric import special

    rng = np.random.default_rng(0)
    p, n = 3, 5
    G = rng.standard_normal((2, n, n + 3))
    C = G @ G.transpose(0, 2, 1) / (n + 3)
    w = rng.standard_normal((2, n))
    threshold = special.PARALLEL_MIN_EVALUATIONS
    try:
        for teacher in ("relu", "erf"):
            for special.PARALLEL_MIN_EVALUATIONS in (10 ** 18, 0):   # serial, threaded
                special.relu_four_point_sums(C, w, p, (teacher,))
            special.relu_four_point_grid(C, p, (teacher,))
    finally:
        special.PARALLEL_MIN_EVALUATIONS = threshold
    c = C[0]
    special.relu_four_point(*(c[i, j] for i, j in (
        (0, 0), (0, 1), (1, 1), (0, 3), (0, 4), (1, 3), (1, 4), (3, 3), (3, 4), (4, 4))))


def engine():
    """The diffusion engine's compiled interpreter (its import compiles ``run``: ~5.7 s of CPU
    in a fresh checkout, measured on the 2-core machine; then ~0.6 s to load) and the
    leaves' gather, at the types ``_Executable`` passes (a C-contiguous workspace, ``intp``
    sources, an integer offset), and the assembly's in-place kind terms at the types
    ``diffusion_engine.kind_sum`` passes (tests/test_numba_warm.py checks them)."""
    from symquad.runtime import assembly_vm, contraction_vm

    contraction_vm.gather(np.zeros((1, 4)), np.arange(2, dtype=np.intp), 2)
    at = np.zeros(1, dtype=np.intp)
    assembly_vm.kind_term(np.zeros((1, 1)), np.zeros((1, 1)), np.zeros(1), at, at,
                          np.zeros(1), np.zeros(1), assembly_vm.ONLY)


#: the groups, one process each
GROUPS = {"simulators": simulators, "quadrature": quadrature, "engine": engine}

if __name__ == "__main__":
    GROUPS[sys.argv[1]]()

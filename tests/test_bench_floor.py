"""``bench_kernels.best_order_macs``: the least multiply-adds of any pairwise contraction order.

The docs cite it (``bench_kernels.py --diffusion-floor``) to show that the tensor route's
multiply-adds are not a matter of contraction order; checked here against an exhaustive
enumeration of merge sequences (another algorithm: every pair at every step, no subsets)
and against a matrix chain whose best order is known by hand.
"""
import itertools
import math
import runpy
from pathlib import Path

import pytest

BENCH = runpy.run_path(str(Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernels.py"),
                       run_name="bench_kernels")
best_order_macs = BENCH["best_order_macs"]


def _every_order(subscripts, shapes):
    """Least multiply-adds over every sequence of pairwise merges (vertex vectors free)."""
    ins, out = subscripts.split("->")
    ops = [frozenset(s.replace("...", "")) - {"t"} for s in ins.split(",")]
    dims = {}
    for sub, shape in zip(ins.split(","), shapes):
        dims.update(zip(sub.replace("...", ""), shape))
    terms = dims.get("t", 1)
    out = frozenset(out.replace("...", "")) - {"t"}
    big = [s for s in ops if len(s) > 1]
    ops = big + [s for s in ops if len(s) <= 1 and not any(s <= b for b in big)]

    def search(current):
        if len(current) == 1:
            return 0
        best = None
        for i, x in enumerate(current):
            # an operand summed alone over the letters only it holds (one pass over it)
            rest = current[:i] + current[i + 1:]
            private = x - out.union(*rest)
            if private and x in ops:
                cost = math.prod(dims[c] for c in x) + search(rest + [x - private])
                best = cost if best is None else min(best, cost)
        for i, j in itertools.combinations(range(len(current)), 2):
            rest = [c for k, c in enumerate(current) if k not in (i, j)]
            union = current[i] | current[j]
            held = out.union(*rest) if rest else out
            cost = math.prod(dims[c] for c in union) + search(rest + [union & held])
            best = cost if best is None else min(best, cost)
        return best
    return terms * search(ops)


def test_matrix_chain_takes_the_cheap_order():
    # (AB)C: 2·100·2 + 2·2·100 = 800; A(BC): 100·2·100 + 2·100·100 = 40000
    assert best_order_macs("ab,bc,cd->ad", [(2, 100), (100, 2), (2, 100)]) == 800


@pytest.mark.parametrize("subscripts, shapes", [
    ("...tab,...tbc,...tca,...ta,...tc->...tb", [(3, 4, 5), (3, 5, 6), (3, 6, 4), (3, 4), (3, 6)]),
    ("...tad,...tbe,...tde,...tce,...td->...tabc",
     [(2, 4, 7), (2, 4, 7), (2, 7, 7), (2, 4, 7), (2, 7)]),
    ("tab,tcd,tac,tbd,te->tabcd", [(5, 3, 3), (5, 3, 3), (5, 3, 3), (5, 3, 3), (5, 9)]),
    # a component apart from the output (a summed pair ef with its vectors): summed alone
    ("...tad,...tef,...tdf,...te,...tf->...ta", [(3, 4, 6), (3, 6, 6), (3, 6, 6), (3, 6), (3, 6)]),
    ("...tab,...tef,...ta,...te,...tf->...tab", [(3, 8, 8), (3, 6, 6), (3, 8), (3, 6), (3, 6)]),
])
def test_equals_every_merge_sequence(subscripts, shapes):
    assert best_order_macs(subscripts, shapes) == _every_order(subscripts, shapes)


def test_greedy_never_beats_the_floor():
    # the engine's greedy order on every class of a small plan (z³ − 3z, p = 3)
    import symquad as sq
    from symquad._generated import diffusion_assembly as assembly
    from symquad.numeric.kernels import _diffusion_tensor_module
    from symquad.runtime import diffusion_engine as engine
    p, n = 3, 5
    model = sq.Model(p, 2, 0.1, activation="z**3 - 3*z", lr_readout=0.1)
    plan = _diffusion_tensor_module(model).PLAN
    checked = 0
    for name in assembly.KINDS[(model.constraint, True)]:
        for _, _, full, classes in engine._compiled(plan, name):
            for subs, edges, vertices, _, _, weights in classes[:40]:
                sub, core = engine._class_contraction(subs, edges, vertices, full,
                                                     len(weights), p, n)
                steps, _ = engine._pairwise_plan(sub, core)
                assert sum(f for _, _, f in steps) >= best_order_macs(sub, core), sub
                checked += 1
    assert checked > 100

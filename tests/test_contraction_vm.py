"""The compiled contraction interpreter equals ``numpy.einsum`` step by step.

:mod:`symquad.runtime.contraction_vm` runs pairwise contractions described by
strides over one flat workspace.  Each case below is checked against ``einsum`` of
the same operands (an independent implementation): plain and weighted steps,
accumulation into what the output holds, a constant operand, summed letters of one
operand only, merged contiguous loops, both loop orders, and a batch of states.
"""

import numpy as np
import pytest

from symquad.runtime import contraction_vm as vm

CASES = [
    ("tab,tbc->tac", {"t": 3, "a": 4, "b": 5, "c": 6}),
    ("tdgc,tgba->tbadc", {"t": 2, "a": 3, "b": 4, "c": 5, "d": 2, "g": 7}),   # summed inside
    ("tab,tcd->tabcd", {"t": 3, "a": 2, "b": 3, "c": 4, "d": 5}),              # outer product
    ("tabc,tc->tab", {"t": 5, "a": 4, "b": 4, "c": 6}),
    ("tab,tb->tab", {"t": 4, "a": 2, "b": 3}),                                 # short z letter
    ("tab,tcb->a", {"t": 3, "a": 5, "b": 4, "c": 2}),                          # c of y only, t summed
    ("ta,ta->", {"t": 7, "a": 3}),                                             # a scalar
    ("tab,tab->tab", {"t": 1, "a": 1, "b": 6}),                                # unit dimensions
    ("tab,ab->tab", {"t": 3, "a": 2, "b": 8}),                    # elementwise, y broadcast
]


def _layout(subscripts, dims):
    ins, out = subscripts.split("->")
    xs, ys = ins.split(",")
    shapes = [tuple(dims[c] for c in s) for s in (xs, ys, out)]
    sizes = [int(np.prod(s)) for s in shapes]
    offsets = [1, 1 + sizes[0], 1 + sizes[0] + sizes[1]]       # slot 0: a constant
    return (xs, ys, out), shapes, sizes, offsets


@pytest.mark.parametrize("subscripts,dims", CASES)
@pytest.mark.parametrize("weighted", [False, True])
def test_step_equals_einsum(subscripts, dims, weighted):
    rng = np.random.default_rng(0)
    (xs, ys, zs), shapes, sizes, (xo, yo, zo) = _layout(subscripts, dims)
    wo = zo + sizes[2]
    B = 3
    W = rng.standard_normal((B, wo + dims["t"]))
    z0 = W[:, zo:zo + sizes[2]].copy()
    w = ("t", wo) if weighted else None
    row = vm.encode((xo, xs, shapes[0]), (yo, ys, shapes[1]), (zo, zs, shapes[2]),
                    w=(wo, "t") if weighted else None, zero=not weighted)
    vm.run(W, row[None], 0, 1)
    for b in range(B):
        x = W[b, xo:xo + sizes[0]].reshape(shapes[0])
        y = W[b, yo:yo + sizes[1]].reshape(shapes[1])
        if w is not None:
            x = x * W[b, wo:wo + dims["t"]].reshape((-1,) + (1,) * (len(shapes[0]) - 1))
        want = np.einsum(subscripts, x, y).ravel() + (z0[b] if weighted else 0.0)
        got = W[b, zo:zo + sizes[2]]
        assert np.max(np.abs(got - want)) <= 1e-13 * max(1.0, np.max(np.abs(want)))


def test_constant_operand_copies_and_transposes():
    # y = the constant slot (no letters): z = x read in another axis order
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4))
    W = np.zeros((1, 1 + x.size + x.size))
    W[0, 0] = 1.0
    W[0, 1:1 + x.size] = x.ravel()
    row = vm.encode((1, "tab", x.shape), (0, "", ()), (1 + x.size, "tba", (2, 4, 3)))
    vm.run(W, row[None], 0, 1)
    assert np.array_equal(W[0, 1 + x.size:].reshape(2, 4, 3), x.transpose(0, 2, 1))


def test_contiguous_letters_are_merged_and_the_loop_order_follows_the_rule():
    # 'tab,tab->tab' is one contiguous loop in every operand
    row = vm.encode((0, "tab", (2, 3, 4)), (24, "tab", (2, 3, 4)), (48, "tab", (2, 3, 4)))
    assert row[0] == 1 and row[vm._D] == 24
    # a summed letter goes inside z's fastest letter when that one is long enough ...
    row = vm.encode((0, "ab", (3, 8)), (24, "bc", (8, 5)), (64, "ac", (3, 5)))
    loops = row[vm._D:vm._D + row[0]].tolist()
    assert loops == [3, 8, 5]
    # ... and innermost when it is short (a dot product)
    row = vm.encode((0, "ab", (3, 8)), (24, "bc", (8, 2)), (40, "ac", (3, 2)))
    assert row[vm._D:vm._D + row[0]].tolist() == [3, 2, 8]


def test_too_many_loops_are_refused():
    letters = "abcdefghijklm"                           # 13 letters of length 2, none merge
    x = (0, letters, (2,) * 13)
    z = (2 ** 13, letters[::-1], (2,) * 13)
    with pytest.raises(ValueError, match="at most 12"):
        vm.encode(x, (0, "", ()), z)


@pytest.mark.parametrize("subscripts,dims,weighted", [
    ("ij,jc->ic", {"i": 5, "j": 3, "c": 10}, False),     # four rows + one, a tail of 2
    ("jc,ij->ic", {"i": 8, "j": 10, "c": 8}, False),     # the operands the other way round
    ("ij,ijc->ic", {"i": 6, "j": 4, "c": 16}, False),    # b moves with the row too
    ("aij,jc->aic", {"a": 2, "i": 4, "j": 2, "c": 9}, False),   # an odometer letter outside
    ("ij,jc->ic", {"i": 7, "j": 3, "c": 8}, "j"),        # weighted along the summed letter
    ("ji,jc->ic", {"i": 4, "j": 5, "c": 12}, "j"),
    ("ij,ijc->ic", {"i": 6, "j": 4, "c": 8}, "i"),       # ... along the rows
])
def test_small_matrix_products_take_the_register_kernel_bit_for_bit(subscripts, dims, weighted):
    # z_ic += Σ_j (w_j or w_i) a_ij b_jc through the register micro-kernel (_axpy_rows),
    # accumulated into what z holds, on two states: equal to the same additions in the
    # same order (z + a_i0 b_0c, then + a_i1 b_1c, ...) done by numpy, entry by entry —
    # exactly, not to rounding
    rng = np.random.default_rng(2)
    (xs, ys, zs), shapes, sizes, (xo, yo, zo) = _layout(subscripts, dims)
    wo = zo + sizes[2]
    W = rng.standard_normal((2, wo + (dims[weighted] if weighted else 0)))
    start = W.copy()
    row = vm.encode((xo, xs, shapes[0]), (yo, ys, shapes[1]), (zo, zs, shapes[2]),
                    w=(wo, weighted) if weighted else None, zero=False)
    assert vm.kernel_of(row) == "rows"
    vm.run(W, row[None], 0, 1)
    for b in range(2):
        x = start[b, xo:xo + sizes[0]].reshape(shapes[0])
        y = start[b, yo:yo + sizes[1]].reshape(shapes[1])
        ops = dict(zip((xs, ys), (x, y)))
        a_sub = next(s for s in (xs, ys) if "c" not in s)
        b_sub = next(s for s in (xs, ys) if "c" in s)
        a, bb = ops[a_sub], ops[b_sub]
        want = start[b, zo:zo + sizes[2]].reshape(shapes[2]).copy()
        for j in range(dims["j"]):
            av = np.take(a, j, axis=a_sub.index("j"))[..., None]      # (…, i, 1)
            if weighted == "j":
                av = av * start[b, wo + j]
            elif weighted == "i":
                av = av * start[b, wo:wo + dims["i"], None]
            bv = np.take(bb, j, axis=b_sub.index("j"))                # (…, [i,] c)
            if "i" not in b_sub:
                bv = np.expand_dims(bv, -2)
            want = want + av * bv
        assert np.array_equal(W[b, zo:zo + sizes[2]].reshape(shapes[2]), want)


def test_other_steps_do_not_take_the_register_kernel():
    # too few rows, a short run, a dot product innermost; weighted with a short run
    assert vm.kernel_of(vm.encode((0, "ij", (3, 3)), (9, "jc", (3, 8)),
                                  (40, "ic", (3, 8)))) == "inner"
    assert vm.kernel_of(vm.encode((0, "ij", (6, 3)), (18, "jc", (3, 4)),
                                  (40, "ic", (6, 4)))) == "inner"
    assert vm.kernel_of(vm.encode((0, "ij", (6, 9)), (54, "jc", (9, 2)),
                                  (80, "ic", (6, 2)))) == "inner"
    assert vm.kernel_of(vm.encode((0, "ij", (6, 3)), (18, "jc", (3, 4)),
                                  (40, "ic", (6, 4)), w=(70, "j"))) == "weighted"


@pytest.mark.parametrize("subscripts,dims,weighted,inner", [
    ("ta,tb->tab", {"t": 3, "a": 5, "b": 8}, False, (8, 0, 1, 1)),        # outer product
    ("tb,ta->tab", {"t": 3, "a": 5, "b": 8}, False, (8, 1, 0, 1)),        # ... the other way
    ("ta,tb->tab", {"t": 3, "a": 5, "b": 19}, False, (19, 0, 1, 1)),      # chunks of 8 + 3
    ("tb,ta->tab", {"t": 3, "a": 5, "b": 19}, False, (19, 1, 0, 1)),      # ... the other way
    ("ta,tb->tab", {"t": 3, "a": 5, "b": 6}, False, (6, 0, 1, 1)),        # no chunk, 6 alone
    ("tab,tb->tab", {"t": 3, "a": 4, "b": 8}, False, (8, 1, 1, 1)),       # elementwise
    ("ta,tb->tab", {"t": 3, "a": 5, "b": 8}, "t", (8, 0, 1, 1)),          # weighted stacking
    ("tb,ta->tab", {"t": 3, "a": 5, "b": 8}, "t", (8, 1, 0, 1)),          # ... the other way
    ("tab,tb->tab", {"t": 3, "a": 4, "b": 8}, "t", (8, 1, 1, 1)),         # weighted elementwise
    ("tab,tb->tab", {"t": 3, "a": 4, "b": 11}, "t", (11, 1, 1, 1)),       # ... a longer run
])
def test_runs_of_eight_and_weighted_elementwise_products_bit_for_bit(subscripts, dims,
                                                                     weighted, inner):
    # steps that sum nothing whose innermost loop is a unit-stride run of 8 entries, or
    # of 9-63 in chunks of 8 (straight-line code for the SLP vectoriser: _axpy8, _mul8),
    # or a weighted
    # elementwise product: the loop structure asserted (so those branches run), then the
    # result equal, exactly, to the same operations done by numpy on two states
    # (x·y, (x·y)·w, or (x·w)·y for the operand constant along the run), accumulated
    rng = np.random.default_rng(3)
    (xs, ys, zs), shapes, sizes, (xo, yo, zo) = _layout(subscripts, dims)
    wo = zo + sizes[2]
    W = rng.standard_normal((2, wo + dims["t"]))
    start = W.copy()
    row = vm.encode((xo, xs, shapes[0]), (yo, ys, shapes[1]), (zo, zs, shapes[2]),
                    w=(wo, weighted) if weighted else None, zero=False)
    nl = row[vm._NL]
    assert tuple(row[o + nl - 1] for o in (vm._D, vm._XS, vm._YS, vm._ZS)) == inner
    assert nl == 1 or row[vm._WS + nl - 1] == 0
    vm.run(W, row[None], 0, 1)
    for b in range(2):
        x = start[b, xo:xo + sizes[0]].reshape(shapes[0])
        y = start[b, yo:yo + sizes[1]].reshape(shapes[1])
        z = start[b, zo:zo + sizes[2]].reshape(shapes[2])
        w = start[b, wo:wo + dims["t"]][:, None, None]
        xb = x.reshape([dims[c] if c in xs else 1 for c in zs])            # broadcast to z
        yb = y.reshape([dims[c] if c in ys else 1 for c in zs])
        if not weighted:
            want = z + xb * yb
        elif inner[1] == 1 and inner[2] == 1:
            want = z + xb * yb * w
        else:                              # the operand constant along the run, weighted
            const, run_ = (xb, yb) if inner[1] == 0 else (yb, xb)
            want = z + (const * w) * run_
        assert np.array_equal(W[b, zo:zo + sizes[2]].reshape(shapes[2]), want)


@pytest.mark.parametrize("letters,dims", [
    (("tabcd", "tb", "tcd", "tabcd"), {"t": 2, "a": 3, "b": 4, "c": 2, "d": 8}),  # y constant, 2 × 8
    (("tab", "tab", "ta", "tab"), {"t": 2, "a": 3, "b": 16}),       # u constant along the run
    (("ta", "tab", "tab", "tab"), {"t": 2, "a": 3, "b": 16}),       # x constant: x, y swapped
    (("tab", "ta", "tb", "tab"), {"t": 2, "a": 3, "b": 70}),        # a long run (the loop)
    (("tab", "ta", "ta", "tab"), {"t": 2, "a": 3, "b": 12}),        # x moves alone
    (("ta", "ta", "tab", "tab"), {"t": 2, "a": 3, "b": 9}),         # u moves alone
    (("ta", "ta", "ta", "tab"), {"t": 2, "a": 3, "b": 5}),          # all constant along it
    (("tba", "tab", "tb", "tab"), {"t": 2, "a": 5, "b": 4}),        # x strided: plain loop
])
def test_a_third_factor_multiplies_each_product_bit_for_bit(letters, dims):
    # z += ((x·y)·u)·w per entry (contraction_vm._inner3, the finals that read a step
    # that sums nothing): the branches of its loops, each against the same products done
    # by numpy in the same order on two states, accumulated into what z holds — exactly
    rng = np.random.default_rng(4)
    shapes = [tuple(dims[c] for c in s) for s in letters]
    sizes = [int(np.prod(s)) for s in shapes]
    offs = np.cumsum([1] + sizes).tolist()
    wo = offs[4]
    W = rng.standard_normal((2, wo + dims["t"]))
    start = W.copy()
    (xs, ys, us, zs), (xo, yo, uo, zo) = letters, offs[:4]
    row = vm.encode((xo, xs, shapes[0]), (yo, ys, shapes[1]), (zo, zs, shapes[3]),
                    w=(wo, "t"), zero=False, u=(uo, us, shapes[2]))
    assert vm.kernel_of(row) == "three"
    vm.run(W, row[None], 0, 1)
    for b in range(2):
        x, y, u, z = (start[b, o:o + n].reshape(s)
                      for o, n, s in zip((xo, yo, uo, zo), sizes, shapes))
        # each operand in z's axis order, broadcast over the letters it lacks
        xb, yb, ub = (a.transpose([s.index(c) for c in zs if c in s]).reshape(
                      [dims[c] if c in s else 1 for c in zs])
                      for a, s in ((x, xs), (y, ys), (u, us)))
        w = start[b, wo:wo + dims["t"]].reshape((-1,) + (1,) * (len(zs) - 1))
        want = z + ((xb * yb) * ub) * w
        assert np.array_equal(W[b, zo:zo + sizes[3]].reshape(shapes[3]), want)


def test_a_third_factor_with_the_term_axis_summed_equals_einsum():
    # the term axis summed into z (a final with several terms): equal to einsum to rounding
    rng = np.random.default_rng(5)
    dims = {"t": 3, "a": 4, "b": 16, "c": 5}
    letters = ("tab", "tbc", "tca", "abc")
    shapes = [tuple(dims[c] for c in s) for s in letters]
    sizes = [int(np.prod(s)) for s in shapes]
    xo, yo, uo, zo, wo = np.cumsum([1] + sizes).tolist()
    W = rng.standard_normal((1, wo + dims["t"]))
    start = W.copy()
    row = vm.encode((xo, "tab", shapes[0]), (yo, "tbc", shapes[1]), (zo, "abc", shapes[3]),
                    w=(wo, "t"), zero=True, u=(uo, "tca", shapes[2]))
    vm.run(W, row[None], 0, 1)
    x, y, u = (start[0, o:o + n].reshape(s) for o, n, s in zip((xo, yo, uo), sizes, shapes))
    want = np.einsum("tab,tbc,tca,t->abc", x, y, u, start[0, wo:])
    got = W[0, zo:zo + sizes[3]].reshape(shapes[3])
    assert np.max(np.abs(got - want)) <= 1e-13 * np.max(np.abs(want))
    with pytest.raises(ValueError, match="third factor u needs the weight"):
        vm.encode((xo, "tab", shapes[0]), (yo, "tbc", shapes[1]), (zo, "abc", shapes[3]),
                  u=(uo, "tca", shapes[2]))


def test_the_cost_model_takes_the_register_kernel_exactly_where_run_does():
    # encode ranks loop orders by _cost; a loop list costed as the register kernel
    # (0.08 ns per multiply-add) that run() sends elsewhere would be chosen for a speed
    # it does not get.  The compiled selector (_rows_kernel, what run() applies) is the
    # second route: over every combination of the strides and lengths its condition
    # reads, the cost model's branch agrees with it
    import itertools

    seen = set()
    for nl, (sx, sy, sz, sw), sz1, sz2, d0, d2 in itertools.product(
            (2, 3, 4), itertools.product((0, 1), repeat=4), (0, 1), (0, 3), (7, 8), (3, 4)):
        loops = [(2, (1, 1, 5, 0))] * (nl - 3) + [(d2, (2, 2, sz2, 0)),
                                                 (6, (3, 3, sz1, 0)),
                                                 (d0, (sx, sy, sz, sw))]
        loops = loops[-nl:]
        arrays = [np.zeros(vm.MAX_LETTERS, np.int64) for _ in range(5)]
        for k, (d, s) in enumerate(loops):
            arrays[0][k] = d
            for a in range(4):
                arrays[1 + a][k] = s[a]
        rows = bool(vm._rows_kernel(nl, *arrays))
        assert vm._takes_rows(loops) == rows, loops
        seen.add(rows)
    assert seen == {True, False}
    # and the cost itself: a weight that varies along the run keeps the step out of the
    # register kernel, so it is not costed below the vectorised update's 0.18 ns per
    # multiply-add (the register kernel's estimate here: ~0.085)
    loops = [(8, (8, 0, 8, 0)), (64, (1, 8, 0, 0)), (8, (0, 1, 1, 1))]
    macs = 8 * 64 * 8
    assert not vm._takes_rows(loops)
    assert vm._cost(loops) >= 0.18 * macs
    loops[-1] = (8, (0, 1, 1, 0))                     # the weight constant: it does
    assert vm._takes_rows(loops) and vm._cost(loops) < 0.1 * macs


@pytest.mark.parametrize("states", [1, 3])
def test_gather_copies_what_numpy_take_copies(states):
    # the leaves' gather: W[b, lo + i] = W[b, src[i]] for every state, as numpy's take
    # (an independent route) copies them; repeated and out-of-order sources included
    rng = np.random.default_rng(4)
    W = rng.standard_normal((states, 500))
    src = np.concatenate([rng.integers(0, 200, 150), np.arange(40, 60), [7, 7, 199]])
    want = W.copy()
    want[:, 250:250 + src.size] = np.take(W, src, axis=1)
    vm.gather(W, src.astype(np.intp), 250)
    assert np.array_equal(W, want)
    assert not np.array_equal(want[:, 250:250 + src.size], np.take(W, src[::-1], axis=1))

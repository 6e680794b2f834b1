"""Sweep scheduling: longest points first from the task's run-time estimate, no needless child.

The order is checked where it matters, on a Dask worker: one in-process worker
runs the points one after the other, in the order the scheduler hands them out,
and each point appends its parameter to a log.
"""

from __future__ import annotations

import logging

import pytest

import symquad as sq
from symquad.studies import point_runner
from symquad.studies.sweep import longest_first
from symquad.studies.tasks import get_task


def logged(x, log=""):
    """Appends `x` to the file `log`; its cost estimate is x (so larger x first)."""
    with open(log, "a") as fh:
        fh.write(f"{x}\n")
    return {"y": x}


logged.__symquad_cost__ = lambda params: params["x"]


def no_estimate(x, log=""):
    with open(log, "a") as fh:
        fh.write(f"{x}\n")
    return {"y": x}


def _todo(task, xs):
    return [(f"k{x}", task.bind({"x": x})) for x in xs]


def test_longest_first_orders_by_the_estimate_and_keeps_ties_and_unknowns_stable():
    task = get_task(logged)
    assert [p["x"] for _, p in longest_first(task, _todo(task, [1, 5, 3, 5, 2]))] == \
        [5, 5, 3, 2, 1]
    plain = get_task(no_estimate)
    assert plain.cost is None
    assert [p["x"] for _, p in longest_first(plain, _todo(plain, [1, 5, 3]))] == [1, 5, 3]


def test_a_failing_or_meaningless_estimate_puts_the_point_first_and_never_raises():
    def cost(params):
        return {1: float("nan"), 2: "x", 3: 3.0, 4: -1.0}[params["x"]]    # KeyError at 9
    task = get_task(logged)
    object.__setattr__(task, "cost", cost)
    assert task.estimated_cost({"x": 2}) is None and task.estimated_cost({"x": 9}) is None
    assert [p["x"] for _, p in longest_first(task, _todo(task, [3, 1, 2, 4, 9]))] == \
        [1, 2, 4, 9, 3]


def test_the_escape_estimate_orders_widths_as_measured():
    # measured (tasks._sgd_cost): 2.4, 3.4, 4.2, 6.8 s at p = 2..5, p* = 1, N = 1000, 48 replicas
    task = get_task("escape")
    costs = [task.estimated_cost(task.bind({"p": p, "p_star": 1, "N": 1000, "replicas": 48}))
             for p in (2, 3, 4, 5)]
    assert all(c is not None for c in costs) and costs == sorted(costs)
    more = task.estimated_cost(task.bind({"p": 2, "p_star": 1, "N": 1000, "replicas": 192}))
    assert more == pytest.approx(4 * costs[0])
    v = get_task("validate")
    assert v.estimated_cost(v.bind({"p": 6})) > v.estimated_cost(v.bind({"p": 3}))


@pytest.mark.parametrize("func, expected", [(logged, [4, 3, 2, 1]), (no_estimate, [1, 2, 3, 4])],
                         ids=["estimate", "grid-order"])
def test_a_dask_worker_runs_the_points_longest_first(func, expected, tmp_path):
    from distributed import Client, LocalCluster

    log = tmp_path / "order.log"
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                           dashboard_address=None, silence_logs=logging.ERROR)
    client = Client(cluster)
    try:
        df = sq.sweep(func, {"x": [1, 2, 3, 4], "log": [str(log)]}, tmp_path / "st",
                      client=client, progress=False)
    finally:
        client.close()
        cluster.close()
    assert list(df["status"]) == ["ok"] * 4 and list(df["x"]) == [1, 2, 3, 4]   # grid order
    assert [int(v) for v in log.read_text().split()] == expected


def test_no_child_process_without_a_timeout(tmp_path, monkeypatch):
    def refuse(self):
        raise AssertionError("a point process was started without timeout=")
    monkeypatch.setattr(point_runner.PointProcess, "_start", refuse)
    df = sq.sweep(logged, {"x": [1, 2], "log": [str(tmp_path / "log")]}, tmp_path / "st",
                  workers=1, progress=False)
    assert list(df["status"]) == ["ok", "ok"]
    # the guard above is live: with a timeout the same sweep needs the child
    with pytest.raises(AssertionError, match="a point process was started"):
        sq.sweep(logged, {"x": [3], "log": [str(tmp_path / "log")]}, tmp_path / "st2",
                 workers=1, progress=False, timeout=30)

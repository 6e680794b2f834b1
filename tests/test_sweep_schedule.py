"""Sweep scheduling: longest points first from the task's run-time estimate, no needless child.

The order is checked where it matters, on a Dask worker: one in-process worker
runs the points one after the other, in the order the scheduler hands them out,
and each point appends its parameter to a log.
"""

from __future__ import annotations

import logging

import numpy as np
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


# ---------------------------------------------------------------------------
# warm workers: the imports and the compiled SGD kernels before the first point
# ---------------------------------------------------------------------------
def test_symquad_tasks_warm_the_numerics_and_the_kernels_other_tasks_their_module():
    from symquad.studies.sweep import _warm_modules

    mods, kernels = _warm_modules(get_task("escape"))
    assert kernels and {"symquad.studies.tasks", "symquad.numeric.simulate",
                        "scipy.stats"} <= set(mods)
    assert _warm_modules(get_task(logged)) == ([__name__], False)


def test_the_warm_up_loads_the_kernels_only_when_asked(monkeypatch):
    from symquad.studies import sweep as sweep_module
    from symquad.studies.sweep import _import_modules

    calls = []
    monkeypatch.setattr(sweep_module, "warm_kernels", lambda: calls.append(1))
    _import_modules(["json", "no_such_module_xyz"])        # a bad module never raises
    assert calls == []
    _import_modules(["json"], True)
    assert calls == [1]


def test_warming_on_a_missing_cache_takes_the_compile_lock(monkeypatch, tmp_path):
    # a missing cache index: the tiny runs happen under the lock next to the cache
    from symquad.numeric import simulate as S

    held = []
    real_lock = S._compile_lock

    def spy(path):
        held.append(path)
        return real_lock(path)

    monkeypatch.setattr(S, "_kernel_cache_paths",
                        lambda ds: [str(tmp_path / "cache" / "k.nbi")] * len(ds))
    monkeypatch.setattr(S, "_compile_lock", spy)
    assert S.warm_kernels() is False
    assert held == [str(tmp_path / "cache" / "k.nbi")]
    assert (tmp_path / "cache" / "symquad-kernels.lock").exists()


def test_the_compile_lock_lets_one_process_in_at_a_time(tmp_path):
    # flock on separately opened files: two holders exclude each other (so do processes)
    import threading

    from symquad.numeric.simulate import _compile_lock

    path = str(tmp_path / "k.nbi")
    inside, order = threading.Event(), []
    release = threading.Event()

    def first():
        with _compile_lock(path):
            order.append("first in")
            inside.set()
            release.wait(30)
            order.append("first out")

    def second():
        inside.wait(30)
        with _compile_lock(path):
            order.append("second in")

    a, b = threading.Thread(target=first), threading.Thread(target=second)
    a.start(), b.start()
    inside.wait(30)
    b.join(0.3)                      # the second waits while the first holds the lock
    assert b.is_alive() and order == ["first in"]
    release.set()
    a.join(30), b.join(30)
    assert order == ["first in", "first out", "second in"]


def test_warm_kernels_reports_a_complete_cache_and_leaves_results_unchanged():
    from symquad.numeric.simulate import simulate, warm_kernels

    m = sq.Model(2, 1, 0.1)
    before = simulate(m, N=100, t_max=0.5, replicas=5, seed=3).risk
    warm_kernels()                   # compiles here if this checkout never did
    assert warm_kernels() is True
    np.testing.assert_array_equal(simulate(m, N=100, t_max=0.5, replicas=5, seed=3).risk,
                                  before)


def test_a_local_cluster_sweep_reports_its_phases_and_closes_its_workers(tmp_path, monkeypatch,
                                                                        capfd):
    # cheap version of the test below: the sweep's own local cluster, in this process
    from distributed import Client, LocalCluster

    from symquad.studies import sweep as S

    made = []

    def in_process(n):
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=False,
                               dashboard_address=None, silence_logs=logging.ERROR)
        made.append((cluster, list(cluster.workers.values())))
        return Client(cluster), cluster, []

    monkeypatch.setattr(S, "_local_client", in_process)
    df = sq.sweep(logged, {"x": [1, 2, 3], "log": [str(tmp_path / "log")]}, tmp_path / "st",
                  workers=2, progress=False)
    assert list(df["status"]) == ["ok"] * 3
    info = df.attrs["sweep"]
    assert info.executor == "local dask cluster, 2 worker processes"
    assert set(info.phases) == {"plan", "cluster_start", "warm_up", "points", "close"}
    assert all(v >= 0 for v in info.phases.values())
    cluster, workers = made[0]
    assert len(workers) == 2 and all(w.status.name == "closed" for w in workers)
    assert cluster.status.name == "closed"
    out, err = capfd.readouterr()
    assert out == "" and err == "", err
    serial = sq.sweep(logged, {"x": [1], "log": [str(tmp_path / "log")]}, tmp_path / "st2",
                      workers=1, progress=False)
    assert set(serial.attrs["sweep"].phases) == {"plan", "points"}


@pytest.mark.slow
def test_a_local_cluster_sweep_reports_its_phases_and_leaves_no_worker(tmp_path, capfd):
    import psutil

    before = {c.pid for c in psutil.Process().children(recursive=True)}
    df = sq.sweep(logged, {"x": [1, 2, 3], "log": [str(tmp_path / "log")]}, tmp_path / "st",
                  workers=2, progress=False)
    assert list(df["status"]) == ["ok"] * 3
    info = df.attrs["sweep"]
    assert info.executor == "local dask cluster, 2 worker processes"
    assert set(info.phases) == {"plan", "cluster_start", "warm_up", "points", "close"}
    assert all(v >= 0 for v in info.phases.values())
    # the nannies closed together: no worker process left, nothing printed
    def workers_left():
        left = []
        for c in psutil.Process().children(recursive=True):
            try:
                # multiprocessing's resource tracker stays for the life of this process
                if c.pid not in before and c.status() != psutil.STATUS_ZOMBIE \
                        and "resource_tracker" not in " ".join(c.cmdline()):
                    left.append(c)
            except psutil.NoSuchProcess:
                pass
        return left
    assert workers_left() == []
    out, err = capfd.readouterr()
    assert out == "" and err == "", err
    serial = sq.sweep(logged, {"x": [1], "log": [str(tmp_path / "log")]}, tmp_path / "st2",
                      workers=1, progress=False)
    assert set(serial.attrs["sweep"].phases) == {"plan", "points"}


@pytest.mark.slow
def test_warm_local_cluster_gives_the_serial_numbers_of_the_escape_task(tmp_path):
    # the warm-up (imports, the compiled kernels' tiny runs) changes no point's numbers
    grid = {"p": [2, 3], "p_star": [1], "lr_scaling": ["width"], "N": [300], "replicas": [8],
            "seed": [0]}
    a = sq.sweep("escape", grid, tmp_path / "serial", workers=1, progress=False)
    b = sq.sweep("escape", grid, tmp_path / "dask", workers=2, progress=False)
    assert b.attrs["sweep"].phases["warm_up"] > 0
    for col in ("pred_sgd", "ode_median", "sgd_median", "sgd_median_se"):
        np.testing.assert_array_equal(a[col].to_numpy(), b[col].to_numpy(), err_msg=col)


def test_local_clusters_start_their_workers_without_the_statistical_profiler(monkeypatch):
    # the profiler samples each worker's stack every 10 ms for a dashboard symquad's
    # clusters do not serve; the nannies copy the configuration active at construction.
    # distributed's MALLOC_TRIM_THRESHOLD_ made every point 1.3-1.4x slower on a worker
    # than serially (glibc's dynamic mmap threshold off): the workers get the allocator
    # of the user's process, computed by the nannies' own function
    import dask
    import distributed
    from distributed import nanny

    from symquad.studies import sweep as S

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    seen = {}

    class Stop(Exception):
        pass

    def recording(*args, **kwargs):
        seen["profile"] = dask.config.get("distributed.worker.profile.enabled")
        seen["environ"] = nanny._get_env_variables("distributed.nanny.pre-spawn-environ")
        raise Stop

    monkeypatch.setattr(distributed, "LocalCluster", recording)
    with pytest.raises(Stop):
        S._local_client(1)
    assert seen["profile"] is False
    assert "MALLOC_TRIM_THRESHOLD_" not in seen["environ"]
    # the single-threaded BLAS of the workers is kept
    assert seen["environ"].get("OMP_NUM_THREADS") == "1"
    # only for that construction: the user's own configuration is left as it was
    assert dask.config.get("distributed.worker.profile.enabled") is True
    assert "MALLOC_TRIM_THRESHOLD_" in dask.config.get("distributed.nanny.pre-spawn-environ")

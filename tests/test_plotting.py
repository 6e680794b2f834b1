"""symquad.plotting: figures are built with the object-oriented API.

No global backend switch (``matplotlib.use`` is never called), no figure left
registered with pyplot, PNG files written atomically (no temporary file left).
"""

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest

from symquad import plotting


@pytest.fixture
def no_backend_switch(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("symquad.plotting must not call matplotlib.use")
    monkeypatch.setattr(matplotlib, "use", forbidden)
    plt.close("all")
    yield
    assert plt.get_fignums() == [], "a figure was left open in pyplot"


def _escape_records():
    ode = [{"conv": conv, "p_star": 1, "p": p, "N": [100, 1000], "ode": [5.0, 8.0],
            "ode_se": [0.2, 0.3], "pred_ode": [5.1, 8.1], "fit_rate": 0.3, "fit_rate_se": 0.01,
            "rate": 0.31, "rate_gf": 0.2, "fit_logpref": 0.1, "fit_logpref_se": 0.05,
            "pred_logpref": 0.12} for conv in ("width", "fixed") for p in (1, 8)]
    sgd = [{"conv": "width", "p_star": 1, "p": 1, "N": N, "sgd": t, "sgd_se": 0.3,
            "pred_sgd": t + 0.1} for N, t in ((100, 4.0), (1000, 7.0))]
    return ode, sgd


def test_figures_leave_nothing_open(tmp_path, no_backend_switch):
    study = {"Ns": np.array([100, 400]),
             "informed": {"mean": np.array([0.1, 0.05]), "sem": np.array([0.01, 0.005]),
                          "fit": {"exponent": -0.5, "exponent_se": 0.05, "prefactor": 1.0}}}
    assert plotting.plot_invariant_drift(study, tmp_path / "drift.png").stat().st_size > 1000
    t = np.linspace(0, 1, 5)
    S = np.repeat(np.eye(3, 2)[None], 5, 0)
    assert plotting.plot_S_components(t, S, t, S, tmp_path / "S.png").stat().st_size > 1000
    ode, sgd = _escape_records()
    figs = [plotting.escape_rate_prefactor_figure(ode, {}, {"width": 0.1, "fixed": 0.1}),
            plotting.escape_time_vs_N_figure(ode, sgd),
            plotting.escape_time_vs_p_figure(ode, sgd, N=1000)]
    for i, fig in enumerate(figs):
        path = plotting.save_figure(fig, tmp_path / f"e{i}.png")
        with open(path, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    # atomic writes leave no temporary file behind
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def _sweep_table():
    import pandas as pd
    rows = []
    for p in (1, 2, 4):
        for N in (100, 1000, 10000):
            rows.append({"p": p, "N": N, "seed": 0, "status": "ok",
                         "sgd_median": p + np.log(N), "sgd_median_se": 0.1,
                         "ode_median": p + np.log(N) - 0.5, "ode_median_se": 0.2,
                         "pred_sgd": p + np.log(N) + 0.05, "pred_ode": p + np.log(N) - 0.45})
    rows.append({"p": 8, "N": 100, "seed": 0, "status": "error", "sgd_median": np.nan})
    return pd.DataFrame(rows)


def test_sweep_figures_draw_the_table(tmp_path, no_backend_switch):
    df = _sweep_table()
    fig = plotting.sweep_errorbar_figure(df, "N", "sgd_median", "sgd_median_se", group="p")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"                 # N spans two decades
    curves = [container.lines[0] for container in ax.containers]
    assert len(curves) == 3                          # p = 1, 2, 4; the error row (p=8) is left out
    np.testing.assert_allclose(curves[1].get_ydata(), 2 + np.log([100, 1000, 10000]))
    plotting.save_figure(fig, tmp_path / "eb.png")
    fig = plotting.sweep_escape_figure(df, "p", group="N")
    plotting.save_figure(fig, tmp_path / "esc.png")
    fig = plotting.sweep_heatmap_figure(df, "N", "p", "sgd_median")
    image = fig.axes[0].images[0].get_array()
    # rows p = 1, 2, 4 (p=8 only has an error row), columns N = 100, 1000, 10000
    expected = np.array([[p + np.log(N) for N in (100, 1000, 10000)] for p in (1, 2, 4)])
    np.testing.assert_allclose(np.ma.getdata(image), expected)
    plotting.save_figure(fig, tmp_path / "hm.png")
    with pytest.raises(ValueError, match="column 'lr'"):
        plotting.sweep_errorbar_figure(df, "lr", "sgd_median")
    with pytest.raises(ValueError, match="reduce"):
        plotting.sweep_heatmap_figure(df, "N", "p", "sgd_median", reduce="sum")

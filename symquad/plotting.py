"""All of symquad's figures, in one place.

Every function builds its figure with matplotlib's object-oriented API
(:class:`matplotlib.figure.Figure` attached to a ``FigureCanvasAgg``): the
global backend is never switched (no ``matplotlib.use``) and no figure is
registered with ``pyplot``, so nothing is left open and an interactive session
that imports symquad keeps its own backend.  Functions named ``*_figure(s)``
return :class:`~matplotlib.figure.Figure` objects; functions named ``plot_*``
write a PNG (atomically: a temporary file in the same folder, then
:func:`os.replace`) and return its path.

Contents
--------
* validation report: :func:`validation_figures` (risk band, overlaps,
  finite-size scaling, escape times);
* implicit bias: :func:`plot_invariant_drift`, :func:`plot_S_components`;
* escape from the plateau: :func:`escape_rate_prefactor_figure`,
  :func:`escape_time_vs_N_figure`, :func:`escape_time_vs_p_figure`;
* sweeps (a table from :func:`symquad.sweep` / :func:`symquad.load_sweep`):
  :func:`sweep_errorbar_figure`, :func:`sweep_escape_figure`,
  :func:`sweep_heatmap_figure`, :func:`escape_sweep_figures`.
"""

from __future__ import annotations

import os

import numpy as np

from ._atomic import atomic_file

__all__ = [
    "new_figure", "save_figure", "validation_figures", "plot_invariant_drift",
    "plot_S_components", "escape_rate_prefactor_figure", "escape_time_vs_N_figure",
    "escape_time_vs_p_figure", "sweep_errorbar_figure", "sweep_escape_figure",
    "sweep_heatmap_figure", "escape_sweep_figures",
]


# ---------------------------------------------------------------------------
# figure plumbing
# ---------------------------------------------------------------------------
def new_figure(figsize, nrows=1, ncols=1, **subplot_kw):
    """A ``(Figure, axes)`` pair on an Agg canvas, outside pyplot's figure registry.

    ``axes`` is a single Axes for ``nrows = ncols = 1``, else an array (as
    :meth:`Figure.subplots` returns it).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, **subplot_kw)
    return fig, axes


def save_figure(fig, path, dpi=120):
    """Write `fig` to `path` (format from the suffix) atomically; returns `path`.

    The image is written to a temporary file in the destination folder and
    renamed over `path`, so a reader never sees a half-written file.
    """
    suffix = os.path.splitext(os.fspath(path))[1] or ".png"
    with atomic_file(path) as fh:
        fig.savefig(fh, dpi=dpi, format=suffix.lstrip("."))
    return path


def _color_cycle():
    import matplotlib

    return matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]


# ---------------------------------------------------------------------------
# validation report
# ---------------------------------------------------------------------------
def validation_figures(report) -> dict:
    """Figures of a :class:`symquad.ValidationReport`: ``{"risk", "overlaps", "fss", "escape"}``.

    ``"fss"`` is present when the report has a finite-size scaling, ``"escape"``
    when escape times were measured.
    """
    figs = {}
    c, n = report.config, report.numbers
    t = report.t
    lo, hi = n["band"]["percentiles"]
    ok = np.all(np.isfinite(report.sgd_risk), axis=1)
    sr, orisk = report.sgd_risk[ok], report.ode_risk[ok]
    fig, ax = new_figure((7, 4.5))
    if sr.size:
        ax.fill_between(t, np.percentile(sr, lo, axis=0), np.percentile(sr, hi, axis=0),
                        color="C0", alpha=0.3, label=f"SGD {lo:g}-{hi:g}% of replicas")
        ax.plot(t, sr.mean(0), color="C0", lw=1.5, label="SGD mean")
        if c["replicas_share_ode"]:
            ax.plot(t, orisk[0], "k--", lw=1.5, label="ODE")
        else:
            for r in range(min(len(orisk), 20)):
                ax.plot(t, orisk[r], color="k", lw=0.5, alpha=0.3,
                        label="ODE from each replica's start" if r == 0 else None)
            ax.plot(t, np.nanmedian(orisk, 0), "k--", lw=1.5, label="ODE (median)")
    e = n["escape"]
    if e.get("defined"):
        ax.axhline(e["threshold"], color="C3", lw=0.8, ls=":", label="escape threshold")
    ax.set_xlabel("t = steps / N")
    ax.set_ylabel("population risk")
    ax.set_yscale("log")
    source = (f"N={c['N']}, {c['replicas']} replicas, {c['start']} start"
              if c.get("source", "simulation") == "simulation"
              else f"{c['source']}, {c['replicas']} replicas")
    ax.set_title(f"{c['model']}\n{source}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    figs["risk"] = fig

    # overlaps: one representative replica, every entry, SGD solid vs ODE dashed
    p, ps = report.sgd_rho.shape[-2:]
    fig, axes = new_figure((12, 4), 1, 3)
    r0 = int(np.argmax(ok)) if ok.any() else 0
    for i in range(p):
        for j in range(i, p):
            line, = axes[0].plot(t, report.sgd_Q[r0, :, i, j], lw=1)
            axes[0].plot(t, report.ode_Q[r0, :, i, j], "--", color=line.get_color(), lw=1)
        for j in range(ps):
            line, = axes[1].plot(t, report.sgd_rho[r0, :, i, j], lw=1)
            axes[1].plot(t, report.ode_rho[r0, :, i, j], "--", color=line.get_color(), lw=1)
    axes[0].set_title(f"Q entries, replica {r0} (solid SGD, dashed ODE)", fontsize=8)
    axes[1].set_title(f"ρ entries, replica {r0} (solid SGD, dashed ODE)", fontsize=8)
    rn = np.sqrt(np.sum(report.sgd_rho[ok] ** 2, axis=(-2, -1)))
    on = np.sqrt(np.sum(report.ode_rho[ok] ** 2, axis=(-2, -1)))
    if rn.size:
        axes[2].fill_between(t, np.percentile(rn, lo, 0), np.percentile(rn, hi, 0),
                             alpha=0.3, color="C0", label=f"SGD {lo:g}-{hi:g}%")
        axes[2].plot(t, rn.mean(0), color="C0", label="SGD mean")
        axes[2].plot(t, np.nanmedian(on, 0), "k--", label="ODE (median)")
    axes[2].set_title("‖ρ‖_F over replicas", fontsize=8)
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xlabel("t")
    fig.tight_layout()
    figs["overlaps"] = fig

    f = n.get("finite_size_scaling")
    if f:
        fig, ax = new_figure((5.5, 4.5))
        Ns, D, S = np.array(f["N"]), np.array(f["deviation"]), np.array(f["deviation_se"])
        ax.errorbar(Ns, D, yerr=S, fmt="o", label="SGD − ODE deviation")
        xx = np.geomspace(Ns.min(), Ns.max(), 50)
        ax.plot(xx, np.exp(f["intercept"]) * xx ** f["exponent"], "C1-",
                label=f"fit: N^({f['exponent']:.3f} ± {f['exponent_se']:.3f})")
        ax.plot(xx, D[0] * (xx / Ns[0]) ** -0.5, "k:", label="N^(-1/2)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N")
        ax.set_ylabel("RMS overlap deviation")
        ax.set_title(f"finite-size scaling ({f['start']} start, t ≤ {f['t_max']:g})",
                     fontsize=8)
        ax.legend(fontsize=7)
        fig.tight_layout()
        figs["fss"] = fig

    if e.get("defined") and e["sgd"]["n"]:
        fig, (ax, ax2) = new_figure((10, 4), 1, 2)
        ts = np.array([np.nan if v is None else v for v in e["sgd_times"]], float)
        to = np.array([np.nan if v is None else v for v in e["ode_times"]], float)
        bins = np.histogram_bin_edges(np.concatenate([ts[np.isfinite(ts)],
                                                      to[np.isfinite(to)]]), 20)
        ax.hist(ts[np.isfinite(ts)], bins, alpha=0.5, label="SGD")
        ax.hist(to[np.isfinite(to)], bins, alpha=0.5, label="ODE from realised start")
        ax.set_xlabel("escape time")
        ax.set_ylabel("replicas")
        ax.legend(fontsize=7)
        both = np.isfinite(ts) & np.isfinite(to)
        ax2.plot(to[both], ts[both], "o", ms=3)
        lim = [np.nanmin(bins), np.nanmax(bins)]
        ax2.plot(lim, lim, "k:", lw=1)
        ax2.set_xlabel("escape time, ODE from the replica's start")
        ax2.set_ylabel("escape time, SGD (same replica)")
        fig.tight_layout()
        figs["escape"] = fig
    return figs


# ---------------------------------------------------------------------------
# implicit bias
# ---------------------------------------------------------------------------
def plot_invariant_drift(study, path):
    """Write the drift-vs-N figure of :func:`symquad.studies.invariant_drift.invariant_drift_study`.

    Mean drift ``‖S(t_max) − S(t_ref)‖_F`` per protocol with standard errors,
    the fitted power law and a ``N^{-1/2}`` guide; returns `path`.
    """
    import matplotlib.ticker

    N = np.asarray(study["Ns"], float)
    fig, ax = new_figure((5.5, 4))
    ref = None
    for key, label, mk in (("random", "random start, from $t_{ref}$", "o"),
                           ("informed", "informed start, from $t=0$", "s")):
        if key not in study:
            continue
        proto = study[key]
        ref = proto["mean"][0] if ref is None else ref
        fit = proto["fit"]
        bars = ax.errorbar(N, proto["mean"], yerr=proto["sem"], fmt=mk, capsize=3,
                           label=f"{label}: slope {fit['exponent']:.2f}"
                                 f" ± {fit['exponent_se']:.2f}")
        if np.isfinite(fit["exponent"]):
            ax.plot(N, fit["prefactor"] * N ** fit["exponent"], "-", lw=1, alpha=0.7,
                    color=bars[0].get_color())
    if ref is not None and np.isfinite(ref):
        ax.plot(N, ref * (N / N[0]) ** -0.5, "k:", lw=1, label=r"$\propto N^{-1/2}$")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(N, [f"{int(n)}" for n in N])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("N")
    ax.set_ylabel(r"$\|S(t_{max}) - S(t_{ref})\|_F$")
    ax.set_title("drift of the polar factor S under SGD")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_S_components(t_ode, S_ode, t_sgd, S_sgd, path, title=None):
    """Plot the entries of ``S(t)`` for the ODE (lines) and SGD (dots); returns the path."""
    S_ode = np.asarray(S_ode)
    S_sgd = np.asarray(S_sgd)
    p, k = S_ode.shape[-2:]
    fig, ax = new_figure((6, 4))
    colors = _color_cycle()
    for n, (i, a) in enumerate((i, a) for i in range(p) for a in range(k)):
        c = colors[n % len(colors)]
        ax.plot(t_ode, S_ode[:, i, a], "-", color=c, lw=1.2)
        ax.plot(t_sgd, S_sgd[:, i, a], ".", color=c, ms=3)
    ax.set_xlabel("t = steps / N")
    ax.set_ylabel(r"$S_{ia}(t)$")
    ax.set_title(title or r"$S=\rho(\rho^T\rho)^{-1/2}$: ODE (lines) vs SGD (dots)")
    fig.tight_layout()
    return save_figure(fig, path)


# ---------------------------------------------------------------------------
# escape from the plateau (records of symquad.studies.escape_grid.records_from_sweep)
# ---------------------------------------------------------------------------
_P_STAR_COLORS = ((1, "C0"), (2, "C1"), (3, "C2"))


def _conv_title(conv, lr):
    return f"η = {lr[conv]}·p (lr_scaling='width')" if conv == "width" \
        else f"η = {lr[conv]} (fixed)"


def escape_rate_prefactor_figure(ode, sgd_fits, lr):
    """Rate κ and log-prefactor c of ``t_esc = log N/(2κ) + c/κ`` against p.

    `ode`: ODE records (:func:`symquad.studies.escape_grid.records_from_sweep`);
    `sgd_fits`: ``{(conv, p*, p): (κ, se, c, se, n_N)}``
    (:func:`symquad.studies.escape_grid.sgd_fits`); `lr`: ``{conv: lr}``.
    """
    fig, axes = new_figure((10, 7.5), 2, 2)
    for col, conv in enumerate(("width", "fixed")):
        ax_r, ax_c = axes[0, col], axes[1, col]
        for k, color in _P_STAR_COLORS:
            rows = [r for r in ode if r["conv"] == conv and r["p_star"] == k]
            if not rows:
                continue
            ps = [r["p"] for r in rows]
            ax_r.errorbar(ps, [r["fit_rate"] for r in rows],
                          [r["fit_rate_se"] for r in rows], fmt="o", color=color,
                          label=f"p*={k}: fit to ODE medians vs log N")
            ax_r.plot(ps, [r["rate"] for r in rows], "-", color=color,
                      label=f"p*={k}: plateau rate κ")
            sp_ = [p for p in ps if (conv, k, p) in sgd_fits and sgd_fits[(conv, k, p)][4] >= 3]
            if sp_:
                ax_r.errorbar(sp_, [sgd_fits[(conv, k, p)][0] for p in sp_],
                              [sgd_fits[(conv, k, p)][1] for p in sp_], fmt="s", mfc="none",
                              color=color, label=f"p*={k}: fit to SGD medians (N=1e2..1e4)")
                ax_c.errorbar(sp_, [sgd_fits[(conv, k, p)][2] for p in sp_],
                              [sgd_fits[(conv, k, p)][3] for p in sp_], fmt="s", mfc="none",
                              color=color, label=f"p*={k}: fit (SGD, N=1e2..1e4)")
            ax_r.plot(ps, [r["rate_gf"] for r in rows], ":", color=color)
            ax_c.errorbar(ps, [r["fit_logpref"] for r in rows],
                          [r["fit_logpref_se"] for r in rows], fmt="o", color=color,
                          label=f"p*={k}: fit (ODE)")
            ax_c.plot(ps, [r["pred_logpref"] for r in rows], "-", color=color,
                      label=f"p*={k}: prediction")
        title = _conv_title(conv, lr)
        ax_r.set_title(f"rate: {title}")
        ax_r.set_xlabel("p")
        ax_r.set_ylabel("κ  (t_esc ≈ log N /(2κ) + c/κ)")
        ax_c.set_title(f"log-prefactor c: {title}")
        ax_c.set_xlabel("p")
        ax_c.set_ylabel("c = κ t_esc − ½ log N")
        ax_r.legend(fontsize=7)
        ax_c.legend(fontsize=7)
    fig.suptitle("Escape from the plateau: which of rate and prefactor depends on p "
                 "(dotted: gradient-flow rate 4η/(p p*))", fontsize=10)
    fig.tight_layout()
    return fig


def escape_time_vs_N_figure(ode, sgd):
    """Median escape time against N (ODE and SGD records, with the predictions as lines)."""
    fig, axes = new_figure((10, 4), 1, 2)
    for ax, conv in zip(axes, ("width", "fixed")):
        for k, color in _P_STAR_COLORS:
            for p, mk in ((k, "o"), (8, "s")):
                rows = [r for r in ode if r["conv"] == conv and r["p_star"] == k
                        and r["p"] == p]
                for r in rows:
                    ax.errorbar(r["N"], r["ode"], r["ode_se"], fmt=mk, color=color,
                                mfc="none", label=f"ODE p*={k}, p={p}")
                    ax.plot(r["N"], r["pred_ode"], "-", color=color)
                srows = [s for s in sgd if s["conv"] == conv and s["p_star"] == k
                         and s["p"] == p]
                if srows:
                    ax.errorbar([s["N"] for s in srows], [s["sgd"] for s in srows],
                                [s["sgd_se"] for s in srows], fmt=mk, color=color,
                                label=f"SGD p*={k}, p={p}")
                    ax.plot([s["N"] for s in srows], [s["pred_sgd"] for s in srows],
                            "--", color=color)
        ax.set_xscale("log")
        ax.set_xlabel("N")
        ax.set_ylabel("median escape time")
        ax.set_title(f"lr_scaling={conv!r} (lines: prediction)")
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def escape_time_vs_p_figure(ode, sgd, N=1000):
    """Median escape time against p at one N (ODE and SGD records, predictions as lines)."""
    fig, axes = new_figure((10, 4), 1, 2)
    for ax, conv in zip(axes, ("width", "fixed")):
        for k, color in _P_STAR_COLORS:
            rows = [r for r in ode if r["conv"] == conv and r["p_star"] == k]
            if not rows:
                continue
            i = rows[0]["N"].index(N)
            ax.errorbar([r["p"] for r in rows], [r["ode"][i] for r in rows],
                        [r["ode_se"][i] for r in rows], fmt="o", color=color,
                        mfc="none", label=f"ODE p*={k}")
            ax.plot([r["p"] for r in rows], [r["pred_ode"][i] for r in rows], "-",
                    color=color, label=f"prediction p*={k}")
            srows = [s for s in sgd if s["conv"] == conv and s["p_star"] == k
                     and s["N"] == N]
            if srows:
                ax.errorbar([s["p"] for s in srows], [s["sgd"] for s in srows],
                            [s["sgd_se"] for s in srows], fmt="s", color=color,
                            label=f"SGD p*={k}")
                ax.plot([s["p"] for s in srows], [s["pred_sgd"] for s in srows], "--",
                        color=color)
        ax.set_xlabel("p")
        ax.set_ylabel(f"median escape time, N = {N}")
        ax.set_title(f"lr_scaling={conv!r}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------
# figures from a sweep table (symquad.sweep / symquad.load_sweep)
# ---------------------------------------------------------------------------
def _ok_rows(df):
    return df[df["status"] == "ok"] if "status" in df.columns else df


def _groups(df, group):
    """``[(label, sub-frame)]`` for the distinct values of the `group` column(s)."""
    if not group:
        return [("", df)]
    cols = [group] if isinstance(group, str) else list(group)
    for c in cols:
        if c not in df.columns:
            raise ValueError(f"group column {c!r} is not in the table ({list(df.columns)})")
    out = []
    for vals, sub in df.groupby(cols, sort=True):
        vals = vals if isinstance(vals, tuple) else (vals,)
        out.append((", ".join(f"{c}={v}" for c, v in zip(cols, vals)), sub))
    return out


def _check_columns(df, *names):
    for n in names:
        if n is not None and n not in df.columns:
            raise ValueError(f"column {n!r} is not in the sweep table; it has {list(df.columns)}")


def escape_sweep_figures(df, lr=None, N=1000) -> dict:
    """The figures of an ``escape`` sweep table (``examples/escape_sweep.py``).

    Groups the rows by configuration and fits ``t_esc = log N/(2κ) + c/κ``
    (:func:`symquad.studies.escape_grid.records_from_sweep`); returns
    ``{"escape_rate_prefactor_vs_p", "escape_time_vs_N", "escape_time_vs_p"}`` (when
    some configuration has >= 2 values of N) and ``"sweep_escape_time_vs_N"`` (SGD
    rows, width convention, straight from the table).  `lr`: ``{convention: lr}``
    for the titles (default: read from the table); `N`: the N of the vs-p figure.
    """
    from .studies.escape_grid import records_from_sweep, sgd_fits

    ode, sgd = records_from_sweep(df)
    if lr is None:
        lr = {conv: float(df.loc[df["lr_scaling"] == conv, "lr"].iloc[0])
              if (df["lr_scaling"] == conv).any() else float("nan")
              for conv in ("width", "fixed")}
    figs = {}
    if ode:
        figs["escape_rate_prefactor_vs_p"] = escape_rate_prefactor_figure(ode, sgd_fits(sgd),
                                                                          lr)
        figs["escape_time_vs_N"] = escape_time_vs_N_figure(ode, sgd)
        if all(N in r["N"] for r in ode):
            figs["escape_time_vs_p"] = escape_time_vs_p_figure(ode, sgd, N=N)
    ok = df[df["status"] == "ok"]
    if "sgd_median" in ok.columns:
        width = ok[ok["sgd_median"].notna() & (ok["lr_scaling"] == "width")]
        if len(width):
            figs["sweep_escape_time_vs_N"] = sweep_escape_figure(
                width, "N", group=["p_star", "p"],
                title=f"η = {lr['width']}·p: escape time vs N (markers measured, lines predicted)")
    return figs


def sweep_errorbar_figure(df, x, y, yerr=None, group=None, *, logx=None, logy=False,
                          ax=None, label=None, fmt="o-", title=None):
    """One curve of `y` (± `yerr`) against `x` per value of `group`, from a sweep table.

    Only rows with ``status == "ok"`` are drawn; rows of one group are sorted
    by `x`.  ``logx`` defaults to True when `x` spans at least a decade of
    positive values.  With `ax` the curves are added to that Axes (and its
    figure is returned), so several quantities can share one plot.
    """
    _check_columns(df, x, y, yerr)
    data = _ok_rows(df)
    if ax is None:
        fig, ax = new_figure((6, 4.2))
    else:
        fig = ax.figure
    for name, sub in _groups(data, group):
        sub = sub.sort_values(x)
        err = sub[yerr].to_numpy(float) if yerr else None
        lab = " ".join(s for s in (label, name) if s) or None
        ax.errorbar(sub[x].to_numpy(), sub[y].to_numpy(float), yerr=err, fmt=fmt, capsize=3,
                    ms=4, label=lab)
    xs = data[x].to_numpy()
    if logx is None:
        num = np.asarray(xs, float) if xs.dtype.kind in "iuf" else np.array([])
        logx = bool(num.size and num.min() > 0 and num.max() / num.min() >= 10)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if title:
        ax.set_title(title, fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def sweep_escape_figure(df, x, group=None, title=None):
    """Escape time against `x` (``"p"``, ``"N"``, ``"lr"``, ...) from an ``escape`` sweep.

    Per group: SGD median escape time ± standard error (filled markers), the
    ODE's from the realised random starts (open markers), and the predicted
    medians for SGD (solid line) and the ODE (dotted line).
    """
    _check_columns(df, x, "pred_sgd", "ode_median")
    fig, ax = new_figure((6.5, 4.5))
    colors = _color_cycle()
    data = _ok_rows(df)
    for i, (name, sub) in enumerate(_groups(data, group)):
        c = colors[i % len(colors)]
        sub = sub.sort_values(x)
        xv = sub[x].to_numpy()
        if "sgd_median" in sub.columns and sub["sgd_median"].notna().any():
            ax.errorbar(xv, sub["sgd_median"], sub["sgd_median_se"], fmt="o", color=c,
                        capsize=3, ms=4, label=f"SGD {name}".strip())
            ax.plot(xv, sub["pred_sgd"], "-", color=c, lw=1)
        ax.errorbar(xv, sub["ode_median"], sub["ode_median_se"], fmt="s", mfc="none",
                    color=c, capsize=3, ms=4, label=f"ODE {name}".strip())
        ax.plot(xv, sub["pred_ode"], ":", color=c, lw=1)
    num = np.asarray(data[x].to_numpy(), float) if data[x].dtype.kind in "iuf" else np.array([])
    if num.size and num.min() > 0 and num.max() / num.min() >= 10:
        ax.set_xscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel("median escape time (t = steps/N)")
    ax.set_title(title or "escape from the plateau: markers measured, lines predicted",
                 fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def sweep_heatmap_figure(df, x, y, value, *, reduce="mean", log=False, cmap=None,
                         center=None, title=None, annotate=True):
    """Heat map of `value` over two parameters `x` and `y` of a sweep.

    Cells are the distinct values of `x` (columns) and `y` (rows), equally
    spaced and labelled by value; several rows per cell (other parameters)
    are combined with `reduce` ("mean", "median", "min" or "max").  Error rows
    and missing cells are left blank; ``log=True`` colours ``log10(value)``.
    ``center`` (e.g. 0 for a growth rate) uses a diverging colour map centred
    there, so that the two phases read at a glance.
    """
    _check_columns(df, x, y, value)
    if reduce not in ("mean", "median", "min", "max"):
        raise ValueError(f"reduce must be 'mean', 'median', 'min' or 'max', got {reduce!r}")
    data = _ok_rows(df)
    table = data.pivot_table(index=y, columns=x, values=value, aggfunc=reduce)
    Z = table.to_numpy(float)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            Z = np.where(Z > 0, np.log10(Z), np.nan)
    fig, ax = new_figure((1.2 + 0.9 * max(Z.shape[1], 3), 1.2 + 0.6 * max(Z.shape[0], 3)))
    norm = None
    if center is not None:
        from matplotlib.colors import TwoSlopeNorm
        finite = Z[np.isfinite(Z)]
        lo = min(float(finite.min()), center - 1e-12) if finite.size else center - 1
        hi = max(float(finite.max()), center + 1e-12) if finite.size else center + 1
        norm = TwoSlopeNorm(vcenter=center, vmin=lo, vmax=hi)
    im = ax.imshow(np.ma.masked_invalid(Z), origin="lower", aspect="auto",
                   cmap=cmap or ("RdBu_r" if center is not None else "viridis"), norm=norm)
    ax.set_xticks(range(Z.shape[1]), [f"{v:g}" if isinstance(v, float) else str(v)
                                      for v in table.columns])
    ax.set_yticks(range(Z.shape[0]), [f"{v:g}" if isinstance(v, float) else str(v)
                                      for v in table.index])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if annotate and Z.size <= 150:
        finite = Z[np.isfinite(Z)]
        for (i, j), v in np.ndenumerate(Z):
            if np.isfinite(v):
                # text colour from the cell's luminance, readable on any colour map
                r, g, b, _ = im.cmap(im.norm(v))
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=6,
                        color="white" if dark else "black")
    fig.colorbar(im, ax=ax, label=f"log10 {value}" if log else value)
    ax.set_title(title or f"{value} ({reduce} over other parameters)", fontsize=9)
    fig.tight_layout()
    return fig

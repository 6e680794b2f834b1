"""All of symquad's figures, in one place, in one publication style.

Every function builds its figure with matplotlib's object-oriented API
(:class:`matplotlib.figure.Figure` attached to a ``FigureCanvasAgg``): the
global backend is never switched (no ``matplotlib.use``) and no figure is
registered with ``pyplot``, so nothing is left open and an interactive session
that imports symquad keeps its own backend.  Functions named ``*_figure(s)``
return :class:`~matplotlib.figure.Figure` objects; functions named ``plot_*``
write a file (atomically: a temporary file in the same folder, then
:func:`os.replace`) and return its path.

Style (:data:`PUBLICATION_STYLE`, applied to every figure built here and to
``with style(): ...`` blocks): serif STIX fonts at 8–9 pt, thin axes, a
colour-blind-safe cycle (Okabe–Ito), ticks inside on all four sides, constrained
layout, legends outside the data area, titles built from the model's fields
(:func:`symquad._describe.describe_model`).  :func:`save_figure` writes PNG
(300 dpi), PDF or SVG without time stamps or version strings, so the same
figure gives the same bytes.  :func:`layout_problems` lists overlapping or
clipped text and legends over data (the tests run it on every figure).

Contents
--------
* validation report: :func:`validation_figures` (risk band, overlaps,
  finite-size scaling, escape times);
* implicit bias: :func:`plot_invariant_drift`, :func:`plot_S_components`,
  :func:`S_trajectories_figure`, :func:`distance_strip_figure`;
* escape from the plateau: :func:`escape_rate_prefactor_figure`,
  :func:`escape_time_vs_N_figure`, :func:`escape_time_vs_p_figure`,
  :func:`escape_risk_curves_figure`, :func:`phases_figure`;
* landscape: :func:`hessian_spectra_figure`;
* sweeps (a table from :func:`symquad.sweep` / :func:`symquad.load_sweep`):
  :func:`sweep_errorbar_figure`, :func:`sweep_escape_figure`,
  :func:`sweep_heatmap_figure`, :func:`escape_sweep_figures`.
"""

from __future__ import annotations

import contextlib
import functools
import os

import numpy as np

from ._atomic import atomic_file
from ._describe_report import describe_config
from ._describe import describe_model
from .studies.escape_grid import records_from_sweep, sgd_fits
from .studies.tasks import get_task

__all__ = [
    "PUBLICATION_STYLE", "FORMATS", "style", "new_figure", "save_figure", "layout_problems",
    "validation_figures", "plot_invariant_drift", "plot_S_components",
    "S_trajectories_figure", "distance_strip_figure", "escape_rate_prefactor_figure",
    "escape_time_vs_N_figure", "escape_time_vs_p_figure", "escape_risk_curves_figure",
    "phases_figure", "hessian_spectra_figure", "sweep_errorbar_figure",
    "sweep_escape_figure", "sweep_heatmap_figure", "escape_sweep_figures",
    "power_law_figure", "power_law_escape_figure", "MAX_ENTRY_LINES", "MAX_FACETS",
]

#: Okabe & Ito's colour-blind-safe palette (yellow and black left out: too light / taken
#: by the ODE), then two greys.
COLORS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#7F7F7F",
          "#332288")
#: Width of a figure spanning a two-column page (inches); one column is about half.
FULL_WIDTH = 7.0

#: rcParams of every symquad figure.
PUBLICATION_STYLE = {
    "font.family": "serif",
    "font.serif": ["STIXGeneral", "DejaVu Serif"],
    "mathtext.fontset": "stix",
    "font.size": 9.0,
    "axes.titlesize": 9.0,
    "axes.labelsize": 9.0,
    "xtick.labelsize": 8.0,
    "ytick.labelsize": 8.0,
    "legend.fontsize": 7.5,
    "legend.title_fontsize": 8.0,
    "figure.titlesize": 9.5,
    "axes.linewidth": 0.7,
    "axes.titlepad": 4.0,
    "axes.labelpad": 3.0,
    "lines.linewidth": 1.3,
    "lines.markersize": 4.0,
    "patch.linewidth": 0.7,
    "errorbar.capsize": 2.0,
    "xtick.direction": "in",
    "ytick.direction": "in",
    "xtick.top": True,
    "ytick.right": True,
    "xtick.major.width": 0.7,
    "ytick.major.width": 0.7,
    "xtick.minor.width": 0.5,
    "ytick.minor.width": 0.5,
    "xtick.major.size": 3.0,
    "ytick.major.size": 3.0,
    "xtick.minor.size": 1.6,
    "ytick.minor.size": 1.6,
    "legend.frameon": False,
    "legend.handlelength": 1.8,
    "legend.borderaxespad": 0.3,
    "legend.columnspacing": 1.2,
    "axes.formatter.use_mathtext": True,
    "figure.dpi": 100.0,
    "savefig.dpi": 300.0,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "svg.fonttype": "path",
    "svg.hashsalt": "symquad",
    "image.cmap": "viridis",
}

#: Formats :func:`save_figure` writes.
FORMATS = ("png", "pdf", "svg")
#: Above this many entries per panel the overlap figure draws summaries.
MAX_ENTRY_LINES = 10
#: Most panels a sweep figure facets mixed slices into (beyond: ValueError).
MAX_FACETS = 6

# metadata that would change between runs or versions (None: not written)
_METADATA = {"png": {"Software": None},
             "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
             "svg": {"Creator": None, "Date": None}}


@contextlib.contextmanager
def style():
    """Context manager: matplotlib's rcParams set to :data:`PUBLICATION_STYLE`."""
    import matplotlib
    from cycler import cycler

    with matplotlib.rc_context({**PUBLICATION_STYLE, "axes.prop_cycle": cycler(color=COLORS)}):
        yield


def _styled(func):
    """Build the figure(s) of `func` inside :func:`style` (colours 'C0'... resolve there)."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from matplotlib.figure import Figure

        with style():
            result = func(*args, **kwargs)
            for fig in (result.values() if isinstance(result, dict) else (result,)):
                if isinstance(fig, Figure):
                    _finish(fig)
        return result
    return wrapper


def _finish(fig):
    """Make a figure look the same wherever it is drawn later (a notebook, ``savefig``).

    Tick labels are created while drawing, with the rcParams of that moment, and
    mathtext reads its font set at draw time: draw once inside the style, then pin
    the math font of every text.
    """
    from matplotlib.text import Text

    _tidy_log_axes(fig)
    fig.canvas.draw()
    for t in fig.findobj(Text):
        _math_symbols(t)
    _fit_titles(fig)
    for t in fig.findobj(Text):
        t.set_math_fontfamily(PUBLICATION_STYLE["mathtext.fontset"])


#: Plain-text symbols of the model descriptions that a figure's text font cannot show
#: (an underscore is literal outside math: "η_a" printed as such), as math.
_PLAIN_TO_MATH = {"η_a": r"$\eta_a$"}


def _math_symbols(text) -> None:
    """Replace :data:`_PLAIN_TO_MATH` symbols outside ``$…$`` spans of a Text by math."""
    value = text.get_text()
    if not any(sym in value for sym in _PLAIN_TO_MATH):
        return
    parts = value.split("$")
    for i in range(0, len(parts), 2):             # even parts lie outside math
        for sym, math in _PLAIN_TO_MATH.items():
            parts[i] = parts[i].replace(sym, math)
    text.set_text("$".join(parts))


def _titles(fig):
    """The figure's suptitle and every Axes title (centre, left, right) that has text."""
    out = [fig._suptitle] if fig._suptitle is not None else []
    for ax in fig.axes:
        out.extend((ax.title, ax._left_title, ax._right_title))
    return [t for t in out if t is not None and t.get_visible() and t.get_text().strip()]


def _wrap_outside_math(line: str, width: int) -> list:
    """`line` broken at spaces into lines of at most ~`width` characters, never inside ``$…$``."""
    words, merged = line.split(" "), []
    for word in words:
        # a word continues the previous one while that one has an open "$"
        if merged and merged[-1].count("$") % 2 == 1:
            merged[-1] += " " + word
        else:
            merged.append(word)
    lines, current = [], ""
    for word in merged:
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    lines.append(current)
    return lines


def _fit_titles(fig, passes=4):
    """Wrap every title that would stick out of the figure (a long model description).

    A title is one line of text centred over its Axes (or the figure); with
    many changed model fields it was wider than the figure and clipped at both
    sides.  After a draw, each title whose extent leaves the figure is wrapped
    at spaces (never inside a ``$…$`` math span) to the width that fits, and the
    figure is drawn again (constrained layout then makes room for the lines).
    """
    for _ in range(passes):
        renderer = fig.canvas.get_renderer()
        box_fig = fig.bbox
        changed = False
        for t in _titles(fig):
            box = t.get_window_extent(renderer)
            if box.width <= 0 or (box.x0 >= box_fig.x0 - 0.5 and box.x1 <= box_fig.x1 + 0.5):
                continue
            lines = t.get_text().split("\n")
            longest = max(len(line) for line in lines)
            width = max(12, int(longest * 0.92 * box_fig.width / box.width))
            text = "\n".join(part for line in lines for part in _wrap_outside_math(line, width))
            if text != t.get_text():
                t.set_text(text)
                changed = True
        if not changed:
            return
        fig.canvas.draw()


def _tidy_log_axes(fig):
    """Log axes: plain numbers at 1, 2, 5 × 10^k below 1.5 decades, no minor labels."""
    from matplotlib.ticker import (FixedFormatter, FixedLocator, FuncFormatter, LogLocator,
                                   NullFormatter)

    for ax in fig.axes:
        for axis, lim, scale in ((ax.xaxis, ax.get_xlim(), ax.get_xscale()),
                                 (ax.yaxis, ax.get_ylim(), ax.get_yscale())):
            if scale != "log" or isinstance(axis.get_major_formatter(), FixedFormatter) \
                    or isinstance(axis.get_major_locator(), FixedLocator):
                continue
            lo, hi = sorted(lim)
            if not lo > 0:
                continue
            if np.log10(hi / lo) < 1.5:
                axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())


# ---------------------------------------------------------------------------
# figure plumbing
# ---------------------------------------------------------------------------
def new_figure(figsize, nrows=1, ncols=1, layout="constrained", **subplot_kw):
    """A ``(Figure, axes)`` pair on an Agg canvas, outside pyplot's figure registry.

    ``axes`` is a single Axes for ``nrows = ncols = 1``, else an array (as
    :meth:`Figure.subplots` returns it).  The layout engine is matplotlib's
    constrained layout (labels, titles, colour bars and outside legends never
    overlap).  Call inside :func:`style` for symquad's look.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout=layout)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, **subplot_kw)
    return fig, axes


def _format_of(path, format):
    suffix = os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
    fmt = format if format is not None else (suffix or "png")
    if not isinstance(fmt, str) or fmt.lower() not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    return fmt.lower()


def save_figure(fig, path, dpi=None, format=None):
    """Write `fig` to `path` atomically; returns the path written.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    path : str or os.PathLike
        Destination.  With `format` given and a different (or no) suffix, the
        suffix is replaced by ``.<format>``.
    dpi : float, optional
        Raster resolution (PNG; default 300, :data:`PUBLICATION_STYLE`).
    format : {"png", "pdf", "svg"}, optional
        Default: from the suffix of `path` (``.png`` if none).

    The image goes to a temporary file in the destination folder, renamed over
    `path`: a reader never sees a half-written file.  No time stamp or
    software version is written, so the same figure gives the same bytes.
    """
    fmt = _format_of(path, format)
    text = os.fspath(path)
    root, suffix = os.path.splitext(text)
    if suffix.lstrip(".").lower() != fmt:
        text = f"{root if suffix.lstrip('.').lower() in FORMATS else text}.{fmt}"
    import matplotlib

    # only what the writers read (fonts embedded as TrueType or paths, fixed SVG ids):
    # a figure that was not built here keeps its own look
    writer = {k: PUBLICATION_STYLE[k] for k in ("pdf.fonttype", "ps.fonttype", "svg.fonttype",
                                                 "svg.hashsalt")}
    with matplotlib.rc_context(writer), atomic_file(text) as fh:
        fig.savefig(fh, format=fmt, dpi=dpi or PUBLICATION_STYLE["savefig.dpi"],
                    metadata=_METADATA[fmt])
    return type(path)(text) if isinstance(path, os.PathLike) else text


def _color_cycle():
    return list(COLORS)


#: Gap between an axes' bottom edge and a legend placed below it (room for the tick
#: labels and the x label).
_LEGEND_BELOW_PT = 26.0


def _outside_legend(ax, where="auto", ncol=1, handles=None, labels=None, **kw):
    """A legend beside (``"right"``) or below (``"below"``) `ax`, never over its data.

    ``"auto"``: beside for short labels, below (two columns) when a label is
    long enough to squeeze the axes.
    """
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    if where == "auto":
        long = max(len(str(lab)) for lab in labels) > 30
        where, ncol = ("below", 2 if len(handles) > 1 else 1) if long else ("right", ncol)
    if where == "right":
        return ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                         borderaxespad=0.0, ncol=ncol, **kw)
    # a fixed distance below the axes in points, not a fraction of its height: an axes
    # made shorter (a title wrapped onto more lines) would pull the legend onto the
    # x label
    from matplotlib.transforms import ScaledTranslation
    below = ax.transAxes + ScaledTranslation(0, -_LEGEND_BELOW_PT / 72, ax.figure.dpi_scale_trans)
    return ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                     bbox_transform=below, borderaxespad=0.0, ncol=ncol, **kw)


def _figure_legend(fig, handles, labels, ncol):
    """One legend for the whole figure, below the panels (constrained layout makes room)."""
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol)


def _key_legend(fig, colours, styles, max_columns=5):
    """A figure legend with the colour key in its first row and the line/marker key below.

    `colours`, `styles`: ``(handles, labels)``.  Matplotlib fills legend columns
    first, so the two keys are interleaved (with blank cells) into columns.
    """
    from matplotlib.patches import Rectangle

    ch, cl = colours
    sh, sl = styles
    ncol = min(max(len(ch), len(sh), 1), max_columns)
    rows_c, rows_s = -(-len(ch) // ncol), -(-len(sh) // ncol)

    def cells(h, lab, rows):
        padded = list(zip(h, lab)) + [(Rectangle((0, 0), 0, 0, visible=False), "")] * (
            rows * ncol - len(h))
        return [[padded[r * ncol + c] for r in range(rows)] for c in range(ncol)]

    c_cols, s_cols = cells(ch, cl, rows_c), cells(sh, sl, rows_s)
    order = [entry for c in range(ncol) for entry in c_cols[c] + s_cols[c]]
    _figure_legend(fig, [h for h, _ in order], [lab for _, lab in order], ncol)


def _proxy(**kw):
    from matplotlib.lines import Line2D

    kw.setdefault("color", "0.25")
    return Line2D([], [], **kw)


def layout_problems(fig, tol=0.5) -> list:
    """Overlapping or clipped text, and legends over data, in a drawn figure.

    Draws `fig`, then checks with the renderer's window extents that every
    visible non-empty text (titles, labels, tick labels, legend entries,
    annotations) lies inside the figure, that no two texts overlap (by more
    than `tol` pixels), and that no legend overlaps the data area of an Axes
    (legends go outside).  Returns a list of human-readable problems (empty
    when the figure is clean).
    """
    from matplotlib.legend import Legend
    from matplotlib.text import Text

    with style():
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    fig_box = fig.bbox
    texts = []
    for ax in fig.axes:
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = min(lim), max(lim)
            span = (hi - lo) * 1e-9
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not (lo - span <= tick.get_loc() <= hi + span):
                    continue
                for label in (tick.label1, tick.label2):
                    if label.get_visible() and label.get_text().strip():
                        texts.append(label)
        for t in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label,
                  ax.xaxis.get_offset_text(), ax.yaxis.get_offset_text(), *ax.texts):
            if t.get_visible() and t.get_text().strip():
                texts.append(t)
    legends = [a for a in fig.findobj(Legend)]
    for leg in legends:
        texts.extend(t for t in leg.get_texts() if t.get_visible() and t.get_text().strip())
        title = leg.get_title()
        if title.get_visible() and title.get_text().strip():
            texts.append(title)
    for t in fig.texts + ([fig._suptitle] if fig._suptitle is not None else []):
        if isinstance(t, Text) and t.get_visible() and t.get_text().strip():
            texts.append(t)
    problems = []
    boxes = []
    for t in dict.fromkeys(texts):
        box = t.get_window_extent(renderer)
        if box.width <= 0 or box.height <= 0:
            continue
        boxes.append((t, box))
        if (box.x0 < fig_box.x0 - tol or box.y0 < fig_box.y0 - tol
                or box.x1 > fig_box.x1 + tol or box.y1 > fig_box.y1 + tol):
            problems.append(f"text {t.get_text()!r} leaves the figure ({box} vs {fig_box})")
    for i, (t1, b1) in enumerate(boxes):
        for t2, b2 in boxes[i + 1:]:
            w = min(b1.x1, b2.x1) - max(b1.x0, b2.x0)
            h = min(b1.y1, b2.y1) - max(b1.y0, b2.y0)
            if w > tol and h > tol:
                problems.append(f"texts {t1.get_text()!r} and {t2.get_text()!r} overlap")
    data_axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    for leg in legends:
        lbox = leg.get_window_extent(renderer)
        for ax in data_axes:
            abox = ax.get_window_extent(renderer)
            w = min(lbox.x1, abox.x1) - max(lbox.x0, abox.x0)
            h = min(lbox.y1, abox.y1) - max(lbox.y0, abox.y0)
            if w > tol and h > tol:
                problems.append(f"a legend ({[t.get_text() for t in leg.get_texts()][:3]}...) "
                                f"lies over the data area of an Axes")
    return problems


# ---------------------------------------------------------------------------
# titles
# ---------------------------------------------------------------------------
def _report_title(config) -> str:

    return describe_config(config)


def _source_line(c) -> str:
    if c.get("source", "simulation") == "simulation":
        return f"N = {c['N']}, {c['replicas']} SGD replicas, {c['start']} start"
    return f"{c['source']}, {c['replicas']} replicas"


# ---------------------------------------------------------------------------
# validation report
# ---------------------------------------------------------------------------
@_styled
def validation_figures(report) -> dict:
    """Figures of a :class:`symquad.ValidationReport`: ``{"risk", "overlaps", "fss", "escape",
    "readout"}``.

    ``"fss"`` is present when the report has a finite-size scaling, ``"escape"``
    when escape times were measured, ``"readout"`` (the trajectory ``a_k(t)``)
    when the readout is trained.  The overlap figure draws every entry of
    ``Q`` and ``ρ`` of one replica while a panel has at most
    :data:`MAX_ENTRY_LINES` entries, and summaries above (diagonal of ``Q``:
    mean and min–max over ``k``; off-diagonal: RMS; ``ρ``: its largest singular
    values), so it stays readable at any width.
    """
    blocks = np.ndim(report.sgd_Q) == 5           # an input spectrum: (R, n, B, p, p)
    figs = {"risk": _risk_figure(report),
            "overlaps": (_block_overlaps_figure if blocks else _overlaps_figure)(report)}
    title = _report_title(report.config)
    f = report.numbers.get("finite_size_scaling")
    if f:
        figs["fss"] = _fss_figure(f, title)
    e = report.numbers["escape"]
    if e.get("defined") and e["sgd"]["n"]:
        figs["escape"] = _escape_times_figure(e, title)
    if getattr(report, "sgd_readout", None) is not None \
            and getattr(report, "ode_readout", None) is not None:
        figs["readout"] = _readout_figure(report)
    return figs


def _readout_figure(report):
    """The trained readout ``a_k(t)``: one replica's units, and the spread over replicas.

    Left: every ``a_k`` of the first replica that did not diverge (SGD solid, the
    ODE from its start dashed), or the mean and range over ``k`` above
    :data:`MAX_ENTRY_LINES` units.  Right: the mean over units of ``a_k`` over
    replicas (SGD band and mean, ODE median), where the readout's drift is seen
    against its noise.
    """
    import matplotlib

    c, n = report.config, report.numbers
    t = report.t
    lo, hi = n["band"]["percentiles"]
    ok = _ok_replicas(report)
    sa, oa = np.asarray(report.sgd_readout), np.asarray(report.ode_readout)
    p = sa.shape[-1]
    r0 = int(np.argmax(ok)) if ok.any() else 0
    tab10 = matplotlib.colormaps["tab10"].colors
    fig, axes = new_figure((FULL_WIDTH, 3.0), 1, 2)
    if p <= MAX_ENTRY_LINES:
        handles, labels = [], []
        for k in range(p):
            line, = axes[0].plot(t, sa[r0, :, k], color=tab10[k % len(tab10)])
            axes[0].plot(t, oa[r0, :, k], "--", color=tab10[k % len(tab10)])
            handles.append(line)
            labels.append(f"$a_{{{k + 1}}}$")
    else:
        axes[0].fill_between(t, sa[r0].min(1), sa[r0].max(1), color="C0", alpha=0.25, lw=0)
        line, = axes[0].plot(t, sa[r0].mean(1), color="C0")
        axes[0].plot(t, oa[r0].mean(1), "--", color="C0")
        handles, labels = [line], [r"$a_k$: mean and range over $k$"]
    axes[0].set_title(f"readout $a_k$, replica {r0}")
    axes[0].set_ylabel(r"$a_k$")
    _outside_legend(axes[0], "below", ncol=min(len(handles) + 2, 4),
                    handles=handles + [_proxy(color="0.2", ls="-"), _proxy(color="0.2", ls="--")],
                    labels=labels + ["SGD", "ODE from its start"])
    ms, mo = sa[ok].mean(-1), oa[ok].mean(-1)
    if ms.size:
        axes[1].fill_between(t, np.percentile(ms, lo, 0), np.percentile(ms, hi, 0), alpha=0.3,
                             color="C0", lw=0, label=f"SGD, {lo:g}–{hi:g}%")
        axes[1].plot(t, ms.mean(0), color="C0", label="SGD, mean")
        axes[1].plot(t, np.nanmedian(mo, 0), "k--", label="ODE, median")
    axes[1].set_title(r"mean over units of $a_k$, over replicas")
    axes[1].set_ylabel(r"$\frac{1}{p}\sum_k a_k$")
    _outside_legend(axes[1], "below")
    for ax in axes:
        ax.set_xlabel(r"$t$ = steps$/N$")
        ax.set_xlim(t[0], t[-1])
    fig.suptitle(_report_title(c))
    return fig


def _ok_replicas(report):
    return np.all(np.isfinite(report.sgd_risk), axis=1)


def _risk_figure(report):
    c, n = report.config, report.numbers
    t = report.t
    lo, hi = n["band"]["percentiles"]
    ok = _ok_replicas(report)
    sr, orisk = report.sgd_risk[ok], report.ode_risk[ok]
    fig, ax = new_figure((FULL_WIDTH, 3.0))
    if sr.size:
        ax.fill_between(t, np.percentile(sr, lo, axis=0), np.percentile(sr, hi, axis=0),
                        color="C0", alpha=0.3, lw=0, label=f"SGD, {lo:g}–{hi:g}% of replicas")
        ax.plot(t, sr.mean(0), color="C0", label="SGD, mean")
        if c["replicas_share_ode"]:
            ax.plot(t, orisk[0], "k--", label="ODE")
        else:
            for r in range(min(len(orisk), 20)):
                ax.plot(t, orisk[r], color="k", lw=0.4, alpha=0.25,
                        label="ODE from each replica's start" if r == 0 else None)
            ax.plot(t, np.nanmedian(orisk, 0), "k--", label="ODE, median")
    e = n["escape"]
    if e.get("defined"):
        ax.axhline(e["threshold"], color="C3", lw=0.8, ls=":", label="escape threshold")
    ax.set_xlabel(r"$t$ = steps$/N$")
    ax.set_ylabel(r"population risk $\varepsilon$")
    ax.set_yscale("log")
    ax.set_xlim(t[0], t[-1])
    ax.set_title(f"{_report_title(c)}\n{_source_line(c)}")
    _outside_legend(ax)
    return fig


def _entry_panel(ax, t, sgd, ode, pairs, symbol, colors):
    """One line per entry (SGD solid, ODE dashed), coloured by entry."""
    handles, labels = [], []
    for n, (i, j) in enumerate(pairs):
        color = colors[n % len(colors)]
        line, = ax.plot(t, sgd[:, i, j], color=color)
        ax.plot(t, ode[:, i, j], "--", color=color)
        handles.append(line)
        labels.append(f"${symbol}_{{{i + 1}{j + 1}}}$")
    return handles, labels


def _q_summary_panel(ax, t, sgd, ode):
    p = sgd.shape[-1]
    k = np.arange(p)
    dS, dO = sgd[:, k, k], ode[:, k, k]
    iu = np.triu_indices(p, 1)
    ax.fill_between(t, dS.min(1), dS.max(1), color="C0", alpha=0.25, lw=0)
    h1, = ax.plot(t, dS.mean(1), color="C0")
    ax.plot(t, dO.mean(1), "--", color="C0")
    ax.plot(t, dO.min(1), ":", color="C0", lw=0.8)
    ax.plot(t, dO.max(1), ":", color="C0", lw=0.8)
    off_S = np.sqrt(np.mean(sgd[:, iu[0], iu[1]] ** 2, axis=1))
    off_O = np.sqrt(np.mean(ode[:, iu[0], iu[1]] ** 2, axis=1))
    h2, = ax.plot(t, off_S, color="C1")
    ax.plot(t, off_O, "--", color="C1")
    return [h1, h2], [r"$Q_{kk}$: mean and range over $k$", r"RMS of $Q_{kl}$, $k \neq l$"]


def _rho_summary_panel(ax, t, sgd, ode, top):
    sS = np.linalg.svd(sgd, compute_uv=False)[:, :top]
    with np.errstate(invalid="ignore"):
        sO = np.linalg.svd(np.nan_to_num(ode), compute_uv=False)[:, :top]
    handles, labels = [], []
    for i in range(top):
        line, = ax.plot(t, sS[:, i], color=f"C{i}")
        ax.plot(t, sO[:, i], "--", color=f"C{i}")
        handles.append(line)
        labels.append(f"$s_{{{i + 1}}}(\\rho)$")
    return handles, labels


def _overlaps_figure(report):
    import matplotlib

    c, n = report.config, report.numbers
    t = report.t
    lo, hi = n["band"]["percentiles"]
    ok = _ok_replicas(report)
    p, ps = report.sgd_rho.shape[-2:]
    r0 = int(np.argmax(ok)) if ok.any() else 0
    tab10 = matplotlib.colormaps["tab10"].colors
    style_handles = [_proxy(color="0.2", ls="-"), _proxy(color="0.2", ls="--")]
    style_labels = ["SGD", "ODE from its start"]
    fig, axes = new_figure((FULL_WIDTH, 3.3), 1, 3)
    q_pairs = [(i, j) for i in range(p) for j in range(i, p)]
    if len(q_pairs) <= MAX_ENTRY_LINES:
        h, lab = _entry_panel(axes[0], t, report.sgd_Q[r0], report.ode_Q[r0], q_pairs, "Q",
                              tab10)
        axes[0].set_title(f"entries of $Q$, replica {r0}")
        axes[0].set_ylabel(r"$Q_{kl}$")
    else:
        h, lab = _q_summary_panel(axes[0], t, report.sgd_Q[r0], report.ode_Q[r0])
        axes[0].set_title(f"$Q$ ($p = {p}$), replica {r0}")
        axes[0].set_ylabel(r"overlaps $Q_{kl}$")
    _outside_legend(axes[0], "below", ncol=2 if len(h) > 2 else 1,
                    handles=h + style_handles, labels=lab + style_labels)
    r_pairs = [(i, j) for i in range(p) for j in range(ps)]
    if len(r_pairs) <= MAX_ENTRY_LINES:
        h, lab = _entry_panel(axes[1], t, report.sgd_rho[r0], report.ode_rho[r0], r_pairs,
                              r"\rho", tab10)
        axes[1].set_title(rf"entries of $\rho$, replica {r0}")
        axes[1].set_ylabel(r"$\rho_{km}$")
    else:
        top = min(ps, 4)
        h, lab = _rho_summary_panel(axes[1], t, report.sgd_rho[r0], report.ode_rho[r0], top)
        what = "singular values" if top == ps else f"top {top} of {ps} singular values"
        axes[1].set_title(rf"{what} of $\rho$, replica {r0}")
        axes[1].set_ylabel(r"$s_i(\rho)$")
    _outside_legend(axes[1], "below", ncol=2 if len(h) > 2 else 1,
                    handles=h + style_handles, labels=lab + style_labels)
    rn = np.sqrt(np.sum(report.sgd_rho[ok] ** 2, axis=(-2, -1)))
    on = np.sqrt(np.sum(report.ode_rho[ok] ** 2, axis=(-2, -1)))
    if rn.size:
        axes[2].fill_between(t, np.percentile(rn, lo, 0), np.percentile(rn, hi, 0),
                             alpha=0.3, color="C0", lw=0, label=f"SGD, {lo:g}–{hi:g}%")
        axes[2].plot(t, rn.mean(0), color="C0", label="SGD, mean")
        axes[2].plot(t, np.nanmedian(on, 0), "k--", label="ODE, median")
    axes[2].set_title(r"$\|\rho\|_F$ over replicas")
    axes[2].set_ylabel(r"$\|\rho\|_F$")
    _outside_legend(axes[2], "below")
    for ax in axes:
        ax.set_xlabel(r"$t$")
        ax.set_xlim(t[0], t[-1])
    fig.suptitle(_report_title(c))
    return fig


def _block_overlaps_figure(report):
    """Per-block statistics of a report with an input spectrum (docs/model.md §1a).

    Left ``tr Q^c`` (the student's squared norm in block ``c``), right ``‖ρ^c‖²_F`` (its
    squared overlap with the teacher there), one colour per block: the SGD replicas' band
    and mean (solid) and the ODE's median over the replicas' starts (dashed) — the
    statistics the mean-deviation criterion tests with the risk.
    """
    c, n = report.config, report.numbers
    t = report.t
    lo, hi = n["band"]["percentiles"]
    ok = _ok_replicas(report)
    stats = (("tr", r"$\mathrm{tr}\, Q^c$", "student norm per block"),
             ("rho", r"$\|\rho^c\|_F^2$", "teacher overlap per block"))
    fig, axes = new_figure((FULL_WIDTH, 3.3), 1, 2)
    B = np.shape(report.sgd_Q)[2]
    handles, labels = [], []
    for ax, (key, symbol, what) in zip(axes, stats):
        if key == "tr":
            sgd = np.trace(report.sgd_Q[ok], axis1=-2, axis2=-1)
            ode = np.trace(report.ode_Q[ok], axis1=-2, axis2=-1)
        else:
            sgd = np.sum(report.sgd_rho[ok] ** 2, axis=(-2, -1))
            ode = np.sum(report.ode_rho[ok] ** 2, axis=(-2, -1))
        for b in range(B):
            color = f"C{b % 10}"
            if sgd.size:
                ax.fill_between(t, np.percentile(sgd[..., b], lo, 0),
                                np.percentile(sgd[..., b], hi, 0), color=color, alpha=0.2,
                                lw=0)
                line, = ax.plot(t, sgd[..., b].mean(0), color=color)
                ax.plot(t, np.nanmedian(ode[..., b], 0), "--", color=color)
                if key == "tr":
                    handles.append(line)
                    labels.append(f"block {b + 1}")
        ax.set_title(f"{what}, {symbol}")
        ax.set_ylabel(symbol)
        ax.set_xlabel(r"$t$ = steps$/N$")
        # a small x margin: the first x tick label then never meets the lowest y tick label
        ax.margins(x=0.02)
    shown = min(B, MAX_ENTRY_LINES)
    _key_legend(fig, (handles[:shown], labels[:shown]),
                ([_proxy(color="0.2", ls="-"), _proxy(color="0.2", ls="--")],
                 [f"SGD mean, {lo:g}–{hi:g}% band", "ODE, median"]), max_columns=5)
    fig.suptitle(_report_title(c))
    return fig


def _fss_figure(f, model_title=""):
    fig, ax = new_figure((FULL_WIDTH * 0.75, 3.0))
    Ns, D, S = np.array(f["N"]), np.array(f["deviation"]), np.array(f["deviation_se"])
    ax.errorbar(Ns, D, yerr=S, fmt="o", label="SGD − ODE deviation")
    xx = np.geomspace(Ns.min(), Ns.max(), 50)
    ax.plot(xx, np.exp(f["intercept"]) * xx ** f["exponent"], "C1-",
            label=f"fit: $N^{{{f['exponent']:.3f} \\pm {f['exponent_se']:.3f}}}$")
    ax.plot(xx, D[0] * (xx / Ns[0]) ** -0.5, "k:", label=r"$\propto N^{-1/2}$")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"$N$")
    ax.set_ylabel("RMS overlap deviation")
    ax.set_title(f"{model_title}\nfinite-size scaling ({f['start']} start, "
                 f"$t \\leq {f['t_max']:g}$)".lstrip())
    _outside_legend(ax)
    return fig


def _escape_times_figure(e, model_title=""):
    from matplotlib.ticker import MaxNLocator

    fig, (ax, ax2) = new_figure((FULL_WIDTH, 3.0), 1, 2)
    ts = np.array([np.nan if v is None else v for v in e["sgd_times"]], float)
    to = np.array([np.nan if v is None else v for v in e["ode_times"]], float)
    finite = np.concatenate([ts[np.isfinite(ts)], to[np.isfinite(to)]])
    bins = np.histogram_bin_edges(finite, "auto")
    if len(bins) > 21:
        bins = np.histogram_bin_edges(finite, 20)
    ax.hist(ts[np.isfinite(ts)], bins, color="C0", alpha=0.35, label="SGD")
    ax.hist(ts[np.isfinite(ts)], bins, color="C0", histtype="step", lw=1.0)
    ax.hist(to[np.isfinite(to)], bins, color="k", histtype="step", lw=1.0, ls="--",
            label="ODE from the same start")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(r"escape time $t_{\mathrm{esc}}$")
    ax.set_ylabel("replicas")
    ax.set_title("distribution over replicas")
    _outside_legend(ax, "below", ncol=2)
    both = np.isfinite(ts) & np.isfinite(to)
    pad = 0.04 * (float(bins[-1]) - float(bins[0]) or 1.0)
    lim = [float(bins[0]) - pad, float(bins[-1]) + pad]
    ax2.plot(lim, lim, "k:", lw=0.8, label="equal times")
    ax2.plot(to[both], ts[both], "o", ms=3, color="C0", label="one replica")
    ax2.set_xlim(lim)
    ax2.set_ylim(lim)
    ax2.set_aspect("equal", adjustable="box")
    ax2.set_xlabel(r"$t_{\mathrm{esc}}$, ODE from the replica's start")
    ax2.set_ylabel(r"$t_{\mathrm{esc}}$, SGD")
    ax2.set_title("SGD against the ODE, replica by replica")
    _outside_legend(ax2, "below", ncol=2)
    if model_title:
        fig.suptitle(f"{model_title}: escape from the plateau")
    return fig


# ---------------------------------------------------------------------------
# implicit bias
# ---------------------------------------------------------------------------
@_styled
def _invariant_drift_figure(study, model_title=""):
    import matplotlib.ticker

    N = np.asarray(study["Ns"], float)
    fig, ax = new_figure((FULL_WIDTH * 0.75, 3.0))
    ref = None
    for key, label, mk in (("random", r"random start, from $t_{\mathrm{ref}}$", "o"),
                           ("informed", r"informed start, from $t = 0$", "s")):
        if key not in study:
            continue
        proto = study[key]
        ref = proto["mean"][0] if ref is None else ref
        fit = proto["fit"]
        bars = ax.errorbar(N, proto["mean"], yerr=proto["sem"], fmt=mk,
                           label=f"{label}: slope ${fit['exponent']:.2f}"
                                 f" \\pm {fit['exponent_se']:.2f}$")
        if np.isfinite(fit["exponent"]):
            ax.plot(N, fit["prefactor"] * N ** fit["exponent"], "-", lw=1, alpha=0.7,
                    color=bars[0].get_color())
    if ref is not None and np.isfinite(ref):
        ax.plot(N, ref * (N / N[0]) ** -0.5, "k:", lw=1, label=r"$\propto N^{-1/2}$")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(N, [f"{int(n)}" for n in N])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(r"$N$")
    ax.set_ylabel(r"$\|S(t_{\max}) - S(t_{\mathrm{ref}})\|_F$")
    ax.set_title((f"{model_title}\n" if model_title else "")
                 + r"drift of the polar factor $S = \rho(\rho^\top\rho)^{-1/2}$ under SGD")
    _outside_legend(ax)
    return fig


def plot_invariant_drift(study, path, model_title=""):
    """Write the drift-vs-N figure of :func:`symquad.studies.invariant_drift.invariant_drift_study`.

    Mean drift ``‖S(t_max) − S(t_ref)‖_F`` per protocol with standard errors,
    the fitted power law and a ``N^{-1/2}`` guide; the format follows the
    suffix of `path` (``.png``, ``.pdf``, ``.svg``); `model_title` (e.g.
    ``describe_model(model)``) heads the title; returns `path`.
    """
    return save_figure(_invariant_drift_figure(study, model_title), path)


def _S_panel(ax, t_ode, S_ode, t_sgd, S_sgd, title):
    p, k = S_ode.shape[-2:]
    pairs = [(i, a) for i in range(p) for a in range(k)]
    if len(pairs) > MAX_ENTRY_LINES:      # the largest entries of S(0): the ones that move
        order = np.argsort(-np.abs(S_ode[0].ravel()))[:MAX_ENTRY_LINES]
        pairs = [divmod(int(o), k) for o in sorted(order)]
    for n, (i, a) in enumerate(pairs):
        c = f"C{n % len(COLORS)}"
        ax.plot(t_ode, S_ode[:, i, a], "-", color=c, lw=1.1)
        ax.plot(t_sgd, S_sgd[:, i, a], ".", color=c, ms=2.5)
    ax.set_xlabel(r"$t$ = steps$/N$")
    ax.set_ylabel(r"$S_{im}(t)$")
    shown = "" if len(pairs) == p * k else f" ({len(pairs)} largest of {p * k} entries)"
    ax.set_title(title + shown)


@_styled
def S_trajectories_figure(panels, title=None):
    """Entries of ``S(t)``: ODE (lines) and one SGD run (dots), one panel per start.

    `panels`: ``[(t_ode, S_ode, t_sgd, S_sgd, panel_title)]``; at most
    :data:`MAX_ENTRY_LINES` entries are drawn per panel (the largest at ``t = 0``).
    """
    fig, axes = new_figure((FULL_WIDTH, 2.9), 1, len(panels), squeeze=False)
    for ax, (t_ode, S_ode, t_sgd, S_sgd, panel_title) in zip(axes[0], panels):
        _S_panel(ax, np.asarray(t_ode), np.asarray(S_ode), np.asarray(t_sgd),
                 np.asarray(S_sgd), panel_title)
    _figure_legend(fig, [_proxy(ls="-"), _proxy(ls="", marker=".", ms=5)],
                   ["ODE", "SGD (one run)"], 2)
    if title:
        fig.suptitle(title)
    return fig


def plot_S_components(t_ode, S_ode, t_sgd, S_sgd, path, title=None):
    """Plot the entries of ``S(t)`` for the ODE (lines) and SGD (dots); returns the path."""
    fig = S_trajectories_figure(
        [(t_ode, S_ode, t_sgd, S_sgd, title or r"$S = \rho(\rho^\top\rho)^{-1/2}$")])
    return save_figure(fig, path)


@_styled
def distance_strip_figure(groups, rng=None, title=None, xlabel="distance"):
    """One strip of jittered points per group, on a log axis: ``groups = [(label, values)]``."""
    rng = np.random.default_rng(0) if rng is None else rng
    fig, ax = new_figure((FULL_WIDTH, 0.5 + 0.45 * len(groups)))
    for y, (label, vals) in enumerate(groups):
        vals = np.asarray(vals, float)
        jitter = 0.16 * (rng.random(len(vals)) - 0.5)
        ax.scatter(vals, y + jitter, s=6, alpha=0.6, color=f"C{y % len(COLORS)}", lw=0)
    ax.set_yticks(range(len(groups)), [g[0] for g in groups])
    ax.set_ylim(-0.5, len(groups) - 0.5)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    if title:
        ax.set_title(title)
    return fig


# ---------------------------------------------------------------------------
# escape from the plateau (records of symquad.studies.escape_grid.records_from_sweep)
# ---------------------------------------------------------------------------
_P_STAR_COLORS = ((1, "C0"), (2, "C1"), (3, "C2"))


def _conv_title(conv, lr):
    return (f"η = {lr[conv]:g}·p (lr scaling 'width')" if conv == "width"
            else f"η = {lr[conv]:g} (lr scaling 'fixed')")


def _p_star_handles(records):
    present = sorted({r["p_star"] for r in records})
    return ([_proxy(color=c, lw=2) for k, c in _P_STAR_COLORS if k in present],
            [f"p* = {k}" for k, _ in _P_STAR_COLORS if k in present])


@_styled
def escape_rate_prefactor_figure(ode, sgd_fits, lr):
    """Rate κ and log-prefactor c of ``t_esc = log N/(2κ) + c/κ`` against p.

    `ode`: ODE records (:func:`symquad.studies.escape_grid.records_from_sweep`);
    `sgd_fits`: ``{(conv, p*, p): (κ, se, c, se, n_N)}``
    (:func:`symquad.studies.escape_grid.sgd_fits`); `lr`: ``{conv: lr}``.
    Colours are ``p*``; the marker and line styles are explained in one legend
    below the panels.
    """
    fig, axes = new_figure((FULL_WIDTH, 5.4), 2, 2)
    any_sgd = False
    for col, conv in enumerate(("width", "fixed")):
        ax_r, ax_c = axes[0, col], axes[1, col]
        for k, color in _P_STAR_COLORS:
            rows = [r for r in ode if r["conv"] == conv and r["p_star"] == k]
            if not rows:
                continue
            ps = [r["p"] for r in rows]
            ax_r.errorbar(ps, [r["fit_rate"] for r in rows],
                          [r["fit_rate_se"] for r in rows], fmt="o", color=color, ms=3.5)
            ax_r.plot(ps, [r["rate"] for r in rows], "-", color=color)
            ax_r.plot(ps, [r["rate_gf"] for r in rows], ":", color=color)
            sp_ = [p for p in ps if (conv, k, p) in sgd_fits and sgd_fits[(conv, k, p)][4] >= 3]
            if sp_:
                any_sgd = True
                ax_r.errorbar(sp_, [sgd_fits[(conv, k, p)][0] for p in sp_],
                              [sgd_fits[(conv, k, p)][1] for p in sp_], fmt="s", mfc="none",
                              color=color, ms=4.5)
                ax_c.errorbar(sp_, [sgd_fits[(conv, k, p)][2] for p in sp_],
                              [sgd_fits[(conv, k, p)][3] for p in sp_], fmt="s", mfc="none",
                              color=color, ms=4.5)
            ax_c.errorbar(ps, [r["fit_logpref"] for r in rows],
                          [r["fit_logpref_se"] for r in rows], fmt="o", color=color, ms=3.5)
            ax_c.plot(ps, [r["pred_logpref"] for r in rows], "-", color=color)
        title = _conv_title(conv, lr)
        ax_r.set_title(f"rate κ: {title}")
        ax_r.set_ylabel(r"rate $\kappa$")
        ax_c.set_title(f"log-prefactor c: {title}")
        ax_c.set_xlabel(r"student width $p$")
        ax_c.set_ylabel(r"$c = \kappa\, t_{\mathrm{esc}} - \frac{1}{2}\log N$")
        ax_r.set_xlabel(r"student width $p$")
    handles = [_proxy(ls="", marker="o", ms=3.5), _proxy(ls="-"), _proxy(ls=":")]
    labels = ["fit to ODE medians vs log N", "plateau rate κ / prediction",
              "gradient-flow rate 4η/(p p*)"]
    if any_sgd:
        handles.append(_proxy(ls="", marker="s", mfc="none", ms=4.5))
        labels.append("fit to SGD medians")
    _key_legend(fig, _p_star_handles(ode), (handles, labels), max_columns=4)
    fig.suptitle(r"Escape from the plateau, $t_{\mathrm{esc}} = \log N/(2\kappa) + c/\kappa$: "
                 "which of rate and prefactor depends on p")
    return fig


@_styled
def escape_time_vs_N_figure(ode, sgd):
    """Median escape time against N (ODE and SGD records, with the predictions as lines)."""
    fig, axes = new_figure((FULL_WIDTH, 3.3), 1, 2)
    widths = set()
    for ax, conv in zip(axes, ("width", "fixed")):
        for k, color in _P_STAR_COLORS:
            for p, mk in ((k, "o"), (8, "s")):
                rows = [r for r in ode if r["conv"] == conv and r["p_star"] == k
                        and r["p"] == p]
                for r in rows:
                    widths.add(("p = p*" if p == k else f"p = {p}", mk))
                    ax.errorbar(r["N"], r["ode"], r["ode_se"], fmt=mk, color=color,
                                mfc="none")
                    ax.plot(r["N"], r["pred_ode"], "-", color=color)
                srows = [s for s in sgd if s["conv"] == conv and s["p_star"] == k
                         and s["p"] == p]
                if srows:
                    ax.errorbar([s["N"] for s in srows], [s["sgd"] for s in srows],
                                [s["sgd_se"] for s in srows], fmt=mk, color=color)
                    ax.plot([s["N"] for s in srows], [s["pred_sgd"] for s in srows],
                            "--", color=color)
        ax.set_xscale("log")
        ax.set_xlabel(r"input dimension $N$")
        ax.set_ylabel(r"median escape time $t_{\mathrm{esc}}$")
        ax.set_title(f"lr scaling '{conv}'")
    ch, cl = _p_star_handles(ode)
    for label, mk in sorted(widths, key=lambda w: w[1]):
        ch.append(_proxy(ls="", marker=mk, mfc="none"))
        cl.append(label)
    handles = [_proxy(ls="", marker="o", mfc="none"), _proxy(ls="-")]
    labels = ["ODE (open)", "ODE prediction"]
    if sgd:
        handles += [_proxy(ls="", marker="o"), _proxy(ls="--")]
        labels += ["SGD (filled)", "SGD prediction"]
    _key_legend(fig, (ch, cl), (handles, labels))
    return fig


@_styled
def escape_time_vs_p_figure(ode, sgd, N=1000):
    """Median escape time against p at one N (ODE and SGD records, predictions as lines)."""
    fig, axes = new_figure((FULL_WIDTH, 3.1), 1, 2)
    for ax, conv in zip(axes, ("width", "fixed")):
        for k, color in _P_STAR_COLORS:
            rows = [r for r in ode if r["conv"] == conv and r["p_star"] == k]
            if not rows:
                continue
            i = rows[0]["N"].index(N)
            ax.errorbar([r["p"] for r in rows], [r["ode"][i] for r in rows],
                        [r["ode_se"][i] for r in rows], fmt="o", color=color, mfc="none")
            ax.plot([r["p"] for r in rows], [r["pred_ode"][i] for r in rows], "-",
                    color=color)
            srows = [s for s in sgd if s["conv"] == conv and s["p_star"] == k
                     and s["N"] == N]
            if srows:
                ax.errorbar([s["p"] for s in srows], [s["sgd"] for s in srows],
                            [s["sgd_se"] for s in srows], fmt="s", color=color)
                ax.plot([s["p"] for s in srows], [s["pred_sgd"] for s in srows], "--",
                        color=color)
        ax.set_xlabel(r"student width $p$")
        ax.set_ylabel(rf"median escape time, $N = {N}$")
        ax.set_title(f"lr scaling '{conv}'")
    handles = [_proxy(ls="", marker="o", mfc="none"), _proxy(ls="-")]
    labels = ["ODE", "ODE prediction"]
    if any(s["N"] == N for s in sgd):
        handles += [_proxy(ls="", marker="s"), _proxy(ls="--")]
        labels += ["SGD", "SGD prediction"]
    _key_legend(fig, _p_star_handles(ode), (handles, labels))
    return fig


@_styled
def escape_risk_curves_figure(panels, suptitle=None):
    """Risk against time for several widths: SGD median, ODE, plateau risk, predicted escape.

    `panels`: ``[(title, curves)]``, one panel each; ``curves`` is a list of
    dicts with ``p``, ``t``, ``sgd_median`` (SGD median risk), ``ode_t``,
    ``ode_risk``, ``plateau_risk`` and ``t_pred`` (predicted median escape
    time, drawn as an arrow onto the plateau line).
    """
    fig, axes = new_figure((FULL_WIDTH, 3.2), 1, len(panels), squeeze=False)
    widths = []
    for ax, (title, curves) in zip(axes[0], panels):
        for n, cv in enumerate(curves):
            color = f"C{n % len(COLORS)}"
            if cv["p"] not in [w for w, _ in widths]:
                widths.append((cv["p"], color))
            ax.plot(cv["t"], cv["sgd_median"], color=color, lw=2.4, alpha=0.45)
            ax.plot(cv["ode_t"], cv["ode_risk"], color=color, lw=1.0)
            ax.axhline(cv["plateau_risk"], color=color, ls=":", lw=0.8)
            ax.annotate("", xy=(cv["t_pred"], cv["plateau_risk"]),
                        xytext=(cv["t_pred"], 2.2 * cv["plateau_risk"]),
                        arrowprops=dict(arrowstyle="->", color=color, lw=1.0))
        ax.set_yscale("log")
        ax.set_xlabel(r"$t$ = steps$/N$")
        ax.set_ylabel(r"population risk $\varepsilon$")
        ax.set_title(title)
        top = max(3.0 * max(cv["plateau_risk"] for cv in curves),
                  max(float(np.nanmax(cv["sgd_median"])) for cv in curves) * 1.3)
        ax.set_ylim(top=top)
    colours = ([_proxy(color=c, lw=2) for _, c in widths], [f"p = {p}" for p, _ in widths])
    handles = [_proxy(lw=2.4, alpha=0.45), _proxy(lw=1.0), _proxy(ls=":", lw=0.8),
               _proxy(ls="", marker=r"$\downarrow$", ms=7)]
    labels = ["SGD, median over replicas", "ODE from replica 0's start", "plateau risk",
              "predicted median escape"]
    _key_legend(fig, colours, (handles, labels))
    if suptitle:
        fig.suptitle(suptitle)
    return fig


@_styled
def phases_figure(model, sol, plateau_risk, t_escape, N):
    """The three phases from a random start: risk, student norms, teacher overlaps.

    `sol`: an ODE solution (``t``, ``risk``, ``Q``, ``rho``); `plateau_risk`:
    risk of the plateau fixed point; `t_escape`: predicted median escape time.
    The norms ``Q_kk`` and overlaps ``|ρ_km|`` are drawn entry by entry up to
    :data:`MAX_ENTRY_LINES` entries, else as mean with the min–max band.
    """

    fig, axes = new_figure((FULL_WIDTH, 2.7), 1, 3)
    t = sol.t
    axes[0].semilogy(t, sol.risk, color="C0", label="ODE")
    axes[0].axhline(plateau_risk, ls=":", color="k", lw=0.8, label="plateau fixed point")
    axes[0].axvline(t_escape, ls="--", color="C3", lw=0.8,
                    label=f"predicted escape ({t_escape:.0f})")
    axes[0].set(xlabel=r"$t$ = steps$/N$", ylabel=r"risk $\varepsilon$", title="risk")
    _outside_legend(axes[0], "below")
    p, k = sol.rho.shape[-2:]
    diag = np.stack([sol.Q[:, i, i] for i in range(p)], axis=1)
    if p <= MAX_ENTRY_LINES:
        for i in range(p):
            axes[1].plot(t, diag[:, i], label=f"$Q_{{{i + 1}{i + 1}}}$")
        _outside_legend(axes[1], "below", ncol=min(p, 4))
    else:
        axes[1].fill_between(t, diag.min(1), diag.max(1), color="C0", alpha=0.3, lw=0)
        axes[1].plot(t, diag.mean(1), color="C0", label=r"mean of $Q_{kk}$, min–max")
        _outside_legend(axes[1], "below")
    axes[1].set(xlabel=r"$t$", ylabel=r"student norms $Q_{kk}$", title="norm learning")
    mags = np.abs(sol.rho.reshape(len(t), -1)) + 1e-16
    if mags.shape[1] <= MAX_ENTRY_LINES:
        for j in range(mags.shape[1]):
            axes[2].semilogy(t, mags[:, j], lw=1.0)
    else:
        axes[2].fill_between(t, mags.min(1), mags.max(1), color="C0", alpha=0.3, lw=0)
        axes[2].semilogy(t, np.sqrt((mags ** 2).mean(1)), color="C0")
    axes[2].set(xlabel=r"$t$", ylabel=r"$|\rho_{km}|$", title="teacher overlaps")
    for ax in axes:
        ax.set_xlim(t[0], t[-1])
    fig.suptitle(f"ODE from $Q(0) = I$, $\\rho(0) \\sim N^{{-1/2}}$ with ${_tex_number(N)}$; "
                 f"{describe_model(model)}")
    return fig


def _tex_number(N) -> str:
    """``N = 10^{6}`` for a power of ten, else ``N = 2000``."""
    e = np.log10(float(N))
    if float(N) >= 1e4 and abs(e - round(e)) < 1e-12:
        return f"N = 10^{{{int(round(e))}}}"
    return f"N = {float(N):g}"


# ---------------------------------------------------------------------------
# landscape
# ---------------------------------------------------------------------------
@_styled
def hessian_spectra_figure(rows, N):
    """Exact Hessian spectra (bars) against numeric eigenvalues (crosses).

    `rows`: one list per row of panels, each panel a dict with ``model``,
    ``point``, ``spec`` (a :func:`symquad.hessian_spectrum` result) and
    ``numeric`` (eigenvalues of the numeric ``pN × pN`` Hessian).
    """
    from matplotlib.ticker import MaxNLocator

    nrows, ncols = len(rows), max(len(r) for r in rows)
    fig, axes = new_figure((FULL_WIDTH, 1.75 * nrows + 0.5), nrows, ncols, squeeze=False)
    for i, row in enumerate(rows):
        for j, panel in enumerate(row):
            ax = axes[i, j]
            spec, m = panel["spec"], panel["model"]
            vals = np.array([float(v) for v in spec.exact]) * N
            mult = np.array(list(spec.exact.values()))
            u, c = np.unique(np.round(np.asarray(panel["numeric"]) * N, 8), return_counts=True)
            ax.vlines(vals, 0, mult, color="C0", lw=3, alpha=0.6)
            ax.plot(u, c, "x", color="C3", ms=4)
            ax.axvline(0, color="k", lw=0.5)
            neg, zero, pos = spec.counts
            ax.set_title(f"p = {m.p}, p* = {m.p_star}, {panel['point']}\n"
                         f"(−, 0, +) = ({neg}, {zero}, {pos}); zero modes "
                         f"{spec.tangent_zero_modes} + {spec.extra_zero_modes}", fontsize=7.5)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
            ax.margins(x=0.08)
            ax.set_ylim(0, max(mult.max(), c.max()) * 1.15)
            if i == nrows - 1:
                ax.set_xlabel(r"$N \times$ eigenvalue")
            if j == 0:
                ax.set_ylabel("multiplicity")
    _figure_legend(fig, [_proxy(color=COLORS[0], lw=3, alpha=0.6),
                         _proxy(ls="", marker="x", color=COLORS[3])],
                   ["exact (symbolic)", f"numeric Hessian of the risk (weights in N = {N} "
                                         "dimensions)"], 2)
    fig.suptitle(f"Weight-space Hessian of the population risk ($T = I$, $N = {N}$); "
                 "zero modes: tangent + extra")
    return fig


# ---------------------------------------------------------------------------
# figures from a sweep table (symquad.sweep / symquad.load_sweep)
# ---------------------------------------------------------------------------
#: Parameters that change how an estimate is made, not what is estimated.
_ESTIMATION_PARAMETERS = ("seed", "replicas", "sgd")
_COLUMN_SYMBOLS = {"p_star": "p*", "noise": "Δ", "lr_scaling": "lr scaling"}


def _ok_rows(df):
    return df[df["status"] == "ok"] if "status" in df.columns else df


def _cols(group):
    if not group:
        return []
    return [group] if isinstance(group, str) else list(group)


def _label(cols, vals):
    vals = vals if isinstance(vals, tuple) else (vals,)
    return ", ".join(f"{_COLUMN_SYMBOLS.get(c, c)} = {v:g}" if isinstance(v, float)
                     else f"{_COLUMN_SYMBOLS.get(c, c)} = {v}" for c, v in zip(cols, vals))


def _groups(df, group):
    """``[(label, sub-frame)]`` for the distinct values of the `group` column(s)."""
    cols = _cols(group)
    if not cols:
        return [("", df)]
    for c in cols:
        if c not in df.columns:
            raise ValueError(f"group column {c!r} is not in the table ({list(df.columns)})")
    return [(_label(cols, vals), sub) for vals, sub in df.groupby(cols, sort=True)]


def _check_columns(df, *names):
    for n in names:
        if n is not None and n not in df.columns:
            raise ValueError(f"column {n!r} is not in the sweep table; it has {list(df.columns)}")


def _parameter_columns(df) -> list:
    """The task's parameter columns of a sweep table (empty when the task is unknown)."""
    if "task" not in df.columns or df["task"].nunique() != 1:
        return []
    try:
        task = get_task(str(df["task"].iloc[0]))
    except (KeyError, ValueError, TypeError):
        return []
    return [c for c in task.defaults if c in df.columns]


def _slices(df, x, group, facet):
    """Facet columns: `facet`, or the parameters that vary apart from `x` and `group`."""
    if facet is not None:
        cols = _cols(facet)
        _check_columns(df, *cols)
        return cols
    used = {x, *_cols(group)}
    return [c for c in _parameter_columns(df) if c not in used
            and c not in _ESTIMATION_PARAMETERS and df[c].nunique(dropna=False) > 1]


def _facets(df, x, group, facet, max_facets):
    cols = _slices(df, x, group, facet)
    if not cols:
        return cols, [("", df)]
    panels = [(_label(cols, vals), sub) for vals, sub in df.groupby(cols, sort=True)]
    if len(panels) > max_facets:
        raise ValueError(
            f"the table mixes {len(panels)} slices of {cols} (beyond max_facets="
            f"{max_facets} panels); add them to group=, pass facet= explicitly, or select "
            f"rows first (e.g. df[df['{cols[0]}'] == ...])")
    return cols, panels


def _check_one_row_per_x(sub, x, where):
    dup = sub[x].duplicated(keep=False)
    if dup.any():
        rows = sub[dup]
        varying = sorted((c for c in rows.columns if c != x
                          and rows[c].nunique(dropna=False) > 1
                          and c not in ("key", "seconds", "finished_utc", "traceback", "arrays")),
                         key=lambda c: rows[c].nunique(dropna=False))   # parameters first
        value = rows[x].iloc[0]
        value = value.item() if hasattr(value, "item") else value
        raise ValueError(
            f"several rows share {x} = {value}{where}; they differ in "
            f"{varying[:6]}: pass those columns as group= or facet=, or select rows, instead of "
            f"joining them into one curve")


def _facet_axes(n, size_one, size_many):
    ncols = min(n, 3)
    nrows = -(-n // ncols)
    figsize = size_one if n == 1 else (size_many[0], size_many[1] * nrows)
    return new_figure(figsize, nrows, ncols, squeeze=False, sharey=True)


def _log_x(values):
    num = np.asarray(values, float) if values.dtype.kind in "iuf" else np.array([])
    return bool(num.size and num.min() > 0 and num.max() / num.min() >= 10)


@_styled
def escape_sweep_figures(df, lr=None, N=1000) -> dict:
    """The figures of an ``escape`` sweep table (``examples/escape_sweep.py``).

    Groups the rows by configuration and fits ``t_esc = log N/(2κ) + c/κ``
    (:func:`symquad.studies.escape_grid.records_from_sweep`); returns
    ``{"escape_rate_prefactor_vs_p", "escape_time_vs_N", "escape_time_vs_p"}`` (when
    some configuration has >= 2 values of N) and ``"sweep_escape_time_vs_N"`` (SGD
    rows, width convention, straight from the table).  `lr`: ``{convention: lr}``
    for the titles (default: read from the table); `N`: the N of the vs-p figure.
    """

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
                title=f"η = {lr['width']:g}·p: escape time vs N "
                      "(markers measured, lines predicted)")
    return figs


@_styled
def sweep_errorbar_figure(df, x, y, yerr=None, group=None, *, logx=None, logy=False,
                          ax=None, label=None, fmt="o-", title=None, facet=None,
                          max_facets=MAX_FACETS):
    """One curve of `y` (± `yerr`) against `x` per value of `group`, from a sweep table.

    Only rows with ``status == "ok"`` are drawn; rows of one group are sorted
    by `x`.  ``logx`` defaults to True when `x` spans at least a decade of
    positive values.  With `ax` the curves are added to that Axes (and its
    figure is returned), so several quantities can share one plot.

    A curve never joins rows of different slices: parameters of the table's
    task that vary apart from `x` and `group` (seeds and replica counts aside)
    get one panel each (``facet``: the columns to facet by, default those; at
    most `max_facets` panels), and two rows at the same `x` within one curve
    raise ValueError.  With `ax` a table that mixes slices is refused.
    """
    _check_columns(df, x, y, yerr)
    data = _ok_rows(df)
    if ax is not None:
        cols = _slices(data, x, group, facet)
        if cols:
            raise ValueError(f"the table mixes slices of {cols}; with ax= draw one slice "
                             f"(select rows) or pass them as group=")
        panels = [("", data)]
        fig = ax.figure
        axes = [ax]
    else:
        cols, panels = _facets(data, x, group, facet, max_facets)
        fig, grid = _facet_axes(len(panels), (FULL_WIDTH * 0.75, 3.0),
                                (FULL_WIDTH, 2.6))
        axes = list(grid.ravel())
        for extra in axes[len(panels):]:
            extra.set_visible(False)
    for a, (panel, sub_df) in zip(axes, panels):
        for name, sub in _groups(sub_df, group):
            _check_one_row_per_x(sub, x, f" in group {name!r}" if name else "")
            sub = sub.sort_values(x)
            err = sub[yerr].to_numpy(float) if yerr else None
            lab = " ".join(s for s in (label, name) if s) or None
            a.errorbar(sub[x].to_numpy(), sub[y].to_numpy(float), yerr=err, fmt=fmt,
                       ms=4, label=lab)
        if logx if logx is not None else _log_x(data[x].to_numpy()):
            a.set_xscale("log")
        if logy:
            a.set_yscale("log")
        a.set_xlabel(_COLUMN_SYMBOLS.get(x, x))
        if a.get_subplotspec() is None or a.get_subplotspec().is_first_col():
            a.set_ylabel(y)
        if panel:
            a.set_title(panel)
    if title and ax is None:
        fig.suptitle(title)
    elif title:
        ax.set_title(title)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        if ax is not None or len(panels) > 1:
            if ax is None:
                _figure_legend(fig, handles, labels, ncol=min(len(handles), 4))
            else:
                _outside_legend(ax)
        else:
            _outside_legend(axes[0])
    return fig


@_styled
def sweep_escape_figure(df, x, group=None, title=None, facet=None, max_facets=MAX_FACETS):
    """Escape time against `x` (``"p"``, ``"N"``, ``"lr"``, ...) from an ``escape`` sweep.

    Per group: SGD median escape time ± standard error (filled markers), the
    ODE's from the realised random starts (open markers), and the predicted
    medians for SGD (solid line) and the ODE (dotted line).

    Rows of different slices are never joined into one curve: parameters of
    the escape task that vary apart from `x` and `group` (e.g. ``p_star`` when
    only ``p`` is the group; seeds and replica counts aside) get one panel
    each (``facet`` names them explicitly; more than `max_facets` panels raise
    ValueError), and two rows at the same `x` within a curve raise ValueError.
    """
    _check_columns(df, x, "pred_sgd", "ode_median")
    data = _ok_rows(df)
    cols, panels = _facets(data, x, group, facet, max_facets)
    fig, grid = _facet_axes(len(panels), (FULL_WIDTH * 0.8, 3.3), (FULL_WIDTH, 2.7))
    axes = list(grid.ravel())
    for extra in axes[len(panels):]:
        extra.set_visible(False)
    names = []
    for a, (panel, sub_df) in zip(axes, panels):
        for name, sub in _groups(sub_df, group):
            _check_one_row_per_x(sub, x, f" in group {name!r}" if name else "")
            if name not in names:
                names.append(name)
            c = f"C{names.index(name) % len(COLORS)}"
            sub = sub.sort_values(x)
            xv = sub[x].to_numpy()
            if "sgd_median" in sub.columns and sub["sgd_median"].notna().any():
                a.errorbar(xv, sub["sgd_median"], sub["sgd_median_se"], fmt="o", color=c,
                           ms=4)
                a.plot(xv, sub["pred_sgd"], "-", color=c, lw=1)
            a.errorbar(xv, sub["ode_median"], sub["ode_median_se"], fmt="s", mfc="none",
                       color=c, ms=4)
            a.plot(xv, sub["pred_ode"], ":", color=c, lw=1)
        if _log_x(data[x].to_numpy()):
            a.set_xscale("log")
        a.set_xlabel(_COLUMN_SYMBOLS.get(x, x))
        if a.get_subplotspec().is_first_col():
            a.set_ylabel(r"median escape time $t_{\mathrm{esc}}$")
        if panel:
            a.set_title(panel)
    colours = ([_proxy(color=f"C{i % len(COLORS)}", lw=2) for i, n in enumerate(names) if n],
               [n for n in names if n])
    handles = [_proxy(ls="", marker="o"), _proxy(ls="", marker="s", mfc="none"),
               _proxy(ls="-", lw=1), _proxy(ls=":", lw=1)]
    labels = ["SGD median ± s.e.", "ODE median ± s.e.", "SGD prediction", "ODE prediction"]
    _key_legend(fig, colours, (handles, labels), max_columns=4)
    fig.suptitle(title or "escape from the plateau: markers measured, lines predicted")
    return fig


@_styled
def sweep_heatmap_figure(df, x, y, value, *, reduce="mean", log=False, cmap=None,
                         center=None, title=None, annotate=True):
    """Heat map of `value` over two parameters `x` and `y` of a sweep.

    Cells are the distinct values of `x` (columns) and `y` (rows), equally
    spaced and labelled by value; several rows per cell (other parameters)
    are combined with `reduce` ("mean", "median", "min" or "max").  Error rows
    and missing cells are left blank; ``log=True`` colours ``log10(value)``.
    ``center`` (e.g. 0 for a growth rate) uses a diverging colour map centred
    there, so that the two phases read at a glance.  Cell annotations are
    sized to fit their cells (and left out when they would be unreadable).
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
    width = min(FULL_WIDTH, 1.9 + 0.45 * max(Z.shape[1], 3))
    height = min(6.0, 1.3 + 0.3 * max(Z.shape[0], 3))
    fig, ax = new_figure((width, height))
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
    ax.tick_params(top=False, right=False)
    ax.set_xlabel(_COLUMN_SYMBOLS.get(x, x))
    ax.set_ylabel(_COLUMN_SYMBOLS.get(y, y))
    fig.colorbar(im, ax=ax, label=f"log10 {value}" if log else value)
    ax.set_title(title or f"{value} ({reduce} over other parameters)")
    fig.canvas.draw()
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    boxes = [t.get_window_extent() for t in labels]
    if any(a.x1 > b.x0 - 2 for a, b in zip(boxes, boxes[1:])):    # crowded: rotate
        ax.tick_params(axis="x", labelrotation=45)
    if annotate and Z.size <= 400:
        _annotate_cells(fig, ax, im, Z)
    return fig


def _annotate_cells(fig, ax, im, Z):
    finite = np.abs(Z[np.isfinite(Z)])
    if not finite.size:
        return
    tiny = 1e-9 * float(finite.max())      # round-off around 0 prints as 0
    labels = {(i, j): ("0" if abs(v) <= tiny else f"{v:.3g}")
              for (i, j), v in np.ndenumerate(Z) if np.isfinite(v)}
    fig.canvas.draw()          # the cell size is known once the layout is done
    box = ax.get_window_extent()
    cell_w = box.width / Z.shape[1] * 72.0 / fig.dpi
    cell_h = box.height / Z.shape[0] * 72.0 / fig.dpi
    longest = max(len(s) for s in labels.values())
    size = min(7.0, 0.9 * cell_w / (0.55 * longest), 0.7 * cell_h)
    if size < 4.5:
        return
    for (i, j), text in labels.items():
        # text colour from the cell's luminance, readable on any colour map
        r, g, b, _ = im.cmap(im.norm(Z[i, j]))
        dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
        ax.text(j, i, text, ha="center", va="center", fontsize=size,
                color="white" if dark else "black")


@_styled
def optimal_schedule_figure(result):
    """Two panels of a :class:`symquad.OptimalSchedule`: ``lr(t)`` and the risk ``ε(t)``.

    The optimal piecewise-constant learning rate (steps) on the left, the risk under it
    (log scale) on the right, with the constant-``lr`` start's final risk marked.
    """
    fig, (ax_lr, ax_risk) = new_figure((7.0, 2.8), 1, 2)
    t = np.asarray(result.t)
    ax_lr.step(t, np.append(result.lr, result.lr[-1]), where="post", color="C0")
    ax_lr.set_xlabel(r"$t$")
    ax_lr.set_ylabel(r"learning rate $\eta(t)$")
    ax_lr.set_title("optimal schedule")
    ax_risk.semilogy(result.t_curve, result.risk, color="C1", label="optimal schedule")
    ax_risk.axhline(result.risk_start, color="0.5", ls="--",
                    label=f"constant lr = {result.model.lr:g} at $t_f$")
    ax_risk.set_xlabel(r"$t$")
    ax_risk.set_ylabel(r"risk $\varepsilon(t)$")
    ax_risk.set_title(f"final risk {result.risk_final:.4g}")
    ax_risk.legend(loc="upper right")
    return fig


@_styled
def power_law_figure(curves, rows, window):
    r"""Learning curves on power-law spectra (:mod:`symquad.studies.power_law`), two panels.

    Left: ``ε(u)/ε(0)`` against ``u = 2η s_1 t`` for the results in `curves` (dicts of
    :func:`~symquad.studies.power_law.power_law_curve_study` with their ``L``), the fit
    window shaded, ``u = L^α`` marked on each curve (where the truncation to ``L`` blocks
    starts to matter) and ``u^{−γ_∞}`` dashed.  Right: the fitted exponent against ``L``
    for every ``(α, β)`` of `rows` (dicts with ``alpha``, ``teacher_exponent``, ``L``,
    ``exponent``, ``exponent_exact``, ``exponent_asymptotic``): the ODE (markers joined),
    the linear model's exact solution (crosses) and ``γ_∞ = (α + β − 1)/α`` (dotted).
    """
    fig, (ax_c, ax_e) = new_figure((FULL_WIDTH, 3.3), 1, 2)
    lo, hi = window
    ax_c.axvspan(lo, hi, color="0.9", lw=0, label="fit window")
    alpha = beta = None
    for i, (L, res) in enumerate(curves):
        u, risk = np.asarray(res["u"]), np.asarray(res["risk"])
        ok = (u > 0) & np.isfinite(risk) & (risk > 1e-6 * risk[0])
        color = f"C{i % 10}"
        ax_c.loglog(u[ok], risk[ok] / risk[0], color=color, label=f"L = {L}")
        cut = res["truncation_u"]
        if u[ok].min() <= cut <= u[ok].max():
            ax_c.plot([cut], [np.interp(cut, u[ok], risk[ok]) / risk[0]], "o", color=color,
                      ms=4)
        alpha, beta = res.get("alpha", alpha), res.get("teacher_exponent", beta)
        gamma = res["exponent_asymptotic"]
    if curves and np.isfinite(gamma):
        u_ref = np.geomspace(lo, hi, 10)
        top = max(np.interp(lo, np.asarray(r["u"]), np.asarray(r["risk"])) / r["risk"][0]
                  for _, r in curves)
        ax_c.loglog(u_ref, 1.5 * top * (u_ref / lo) ** -gamma, "k--", lw=1,
                    label=rf"$u^{{-\gamma_\infty}}$, $\gamma_\infty = {gamma:.3g}$")
    ax_c.set_xlabel(r"$u = 2\eta s_1 t$")
    ax_c.set_ylabel(r"$\varepsilon(u)/\varepsilon(0)$")
    ax_c.set_title(r"learning curves (dots: $u = L^\alpha$)" if alpha is None else
                   rf"learning curves, $\alpha = {alpha:g}$, $\beta = {beta:g}$ "
                   r"(dots: $u = L^\alpha$)")
    _outside_legend(ax_c, "below", ncol=3)
    groups = {}
    for r in rows:
        groups.setdefault((r["alpha"], r["teacher_exponent"]), []).append(r)
    for i, ((a, b), rs) in enumerate(sorted(groups.items())):
        rs = sorted(rs, key=lambda r: r["L"])
        color = f"C{i % 10}"
        Ls = [r["L"] for r in rs]
        ax_e.plot(Ls, [r["exponent"] for r in rs], "o-", color=color, ms=3.5,
                  label=rf"$\alpha = {a:g}$, $\beta = {b:g}$")
        exact = [r.get("exponent_exact", np.nan) for r in rs]
        if np.any(np.isfinite(exact)):
            ax_e.plot(Ls, exact, "x", color=color, ms=6)
        ax_e.axhline(rs[0]["exponent_asymptotic"], color=color, ls=":", lw=1)
    ax_e.set_xscale("log", base=2)
    ax_e.set_yscale("log")
    ax_e.set_xlabel(r"blocks $L$")
    ax_e.set_ylabel(r"fitted exponent $\gamma$ ($\varepsilon \propto t^{-\gamma}$)")
    ax_e.set_title(rf"exponent on $u \in [{lo:g}, {hi:g}]$ (dotted: $\gamma_\infty$)")
    handles, labels = ax_e.get_legend_handles_labels()
    handles += [_proxy(ls="", marker="x", ms=6)]
    labels += ["exact solution (linear)"]
    _outside_legend(ax_e, "below", ncol=2, handles=handles, labels=labels)
    return fig


@_styled
def power_law_escape_figure(rows, N):
    r"""Escape of the quadratic network on power-law spectra against ``α``, one line per ``L``.

    `rows`: dicts of :func:`~symquad.studies.power_law.power_law_escape_study` with ``alpha`` and
    ``L``.  Median escape time of the ODE from random starts (5–95 % bars), of SGD where
    run (squares), and the scale ``log(N)/(2κ)`` of the linearised growth of ``ρ``.
    """
    fig, ax = new_figure((FULL_WIDTH * 0.75, 3.2))
    groups = {}
    for r in rows:
        groups.setdefault(r["L"], []).append(r)
    for i, (L, rs) in enumerate(sorted(groups.items())):
        rs = sorted(rs, key=lambda r: r["alpha"])
        color = f"C{i % 10}"
        # a small offset per L keeps the bars of equal alpha apart
        a = np.array([r["alpha"] for r in rs]) + 0.03 * (i - (len(groups) - 1) / 2)
        med = np.array([r["ode_median"] for r in rs])
        err = np.array([[r["ode_median"] - r["ode_q05"], r["ode_q95"] - r["ode_median"]]
                        for r in rs]).T
        ax.errorbar(a, med, err, fmt="o-", color=color, ms=3.5, capsize=2, label=f"L = {L}")
        ax.plot(a, [r["escape_scale"] for r in rs], ":", color=color)
        s = [(x, r["sgd_median"]) for x, r in zip(a, rs)
             if np.isfinite(r.get("sgd_median", np.nan))]
        if s:
            ax.plot(*zip(*s), "s", color=color, mfc="none", ms=6)
    ax.set_xlabel(r"spectral exponent $\alpha$ ($s_j \propto j^{-\alpha}$)")
    ax.set_ylabel(r"escape time $t_{\mathrm{esc}}$")
    ax.set_title(rf"quadratic network, escape from the plateau, $N = {N}$")
    handles, labels = ax.get_legend_handles_labels()
    handles += [_proxy(ls="", marker="o"), _proxy(ls=":"),
                _proxy(ls="", marker="s", mfc="none", ms=6)]
    labels += ["ODE, median (5–95 %)", r"$\log N/(2\kappa)$", "SGD, median"]
    _outside_legend(ax, "right", handles=handles, labels=labels)
    return fig

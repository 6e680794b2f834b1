"""The :class:`ValidationReport` of :func:`symquad.studies.validation.validate` and
:func:`~symquad.studies.validation.compare`: numbers, verdict, JSON and report folders.

Split out of :mod:`symquad.studies.validation` (which re-exports its names).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from .._describe_report import describe_config
from .._safe_io import read_npz, read_regular
from ..numeric.persist import json_default, model_from_dict
from ..spec import Model
from .report_io import (REPORT_FORMAT, _as_path, decode_nonfinite, encode_nonfinite,
                        join_arrays, split_arrays, write_folder_atomically)
from .resolution import format_resolution
from .verdict import verdict_headline



# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------
_ARRAYS = ("t", "sgd_risk", "ode_risk", "sgd_Q", "ode_Q", "sgd_rho", "ode_rho", "T")

#: saved only for a trained readout
_READOUT_ARRAYS = ("sgd_readout", "ode_readout")

_FORMAT_VERSION = 1


@dataclass(repr=False)
class ValidationReport:
    """Result of :func:`validate` / :func:`compare`: configuration, numbers, verdict, trajectories.

    Attributes
    ----------
    config : dict
        Model and run parameters.
    numbers : dict
        All summary numbers (JSON-serialisable): deviations before/after the
        escape, band coverage, escape-time statistics, finite-size scaling and
        ``numbers["verdict"]`` (the criteria with their values).
    t : ndarray (n,)
    sgd_risk, ode_risk : ndarray (replicas, n)
    sgd_Q, ode_Q : ndarray (replicas, n, p, p)
    sgd_rho, ode_rho : ndarray (replicas, n, p, p*)
    T : ndarray (p*, p*)
        Teacher overlaps.  With an input spectrum (docs/model.md §1a) the overlaps carry
        the block axis: ``(replicas, n, B, p, p)``, ``(replicas, n, B, p, p*)``,
        ``T`` ``(B, p*, p*)``; the risks are ``ε(Ω)``.
    invariant_study : dict or None
        Raw data of the drift study of ``S`` (for its figure).
    sgd_readout, ode_readout : ndarray (replicas, n, p) or None
        The student readouts ``a(t)`` when the readout is trained, else None.
    """

    config: dict
    numbers: dict
    t: np.ndarray
    sgd_risk: np.ndarray
    ode_risk: np.ndarray
    sgd_Q: np.ndarray
    ode_Q: np.ndarray
    sgd_rho: np.ndarray
    ode_rho: np.ndarray
    T: np.ndarray | None = None
    invariant_study: dict | None = None
    sgd_readout: np.ndarray | None = None
    ode_readout: np.ndarray | None = None

    @property
    def model(self):
        """The :class:`~symquad.Model` of the report, every field included (from `config`)."""

        c = self.config
        spec = c.get("model_spec")
        if spec is None:        # reports written before the model specification
            spec = {k: c[k] for k in ("p", "p_star", "lr", "noise", "lr_scaling")}
            spec["activation"] = _activation_list(c["activation"])
        return model_from_dict(spec)

    # -- verdict --------------------------------------------------------------
    @property
    def verdict(self) -> str:
        """``"PASS"``, ``"FAIL"`` or ``"INCONCLUSIVE"`` (module docstring, Verdict)."""
        return self.numbers["verdict"]["verdict"]

    @property
    def passed(self) -> bool:
        """True when the verdict is PASS."""
        return bool(self.numbers["verdict"]["passed"])

    @property
    def reasons(self) -> list:
        """One line per criterion: ``"pass: …"``, ``"FAIL: …"`` or ``"not tested: …"``."""
        label = {"pass": "pass", "fail": "FAIL", "not tested": "not tested"}
        return [f"{label[c['status']]}: {c['text']}" for c in self.numbers["verdict"]["checks"]]

    @property
    def resolution(self) -> dict:
        """Parameter name → the smallest change this run's mean-deviation test detects
        (about 50 % power; :mod:`symquad.studies.resolution`); None: not detectable, e.g. a
        parameter the risk does not depend on (``numbers["resolution"]["not_detectable"]``
        says why).  Empty when not computed (``numbers["resolution"]["reason"]`` says why)."""
        return dict(self.numbers.get("resolution", {}).get("values", {}))

    def __repr__(self) -> str:
        c = self.config
        checks = self.numbers["verdict"]["checks"]
        npass = sum(ch["status"] == "pass" for ch in checks)
        size = f"N={c['N']}, " if c.get("N") is not None else ""
        return (f"ValidationReport({self.verdict}: {npass}/{len(checks)} criteria passed; "
                f"{c['model']}; {size}replicas={self.sgd_risk.shape[0]}, "
                f"times={self.t.shape[0]}, t_max={self.t[-1]:.4g}, source={c['source']})")

    # -- numbers --------------------------------------------------------------
    def to_dict(self) -> dict:
        """Configuration and numbers (a copy; no trajectories)."""
        return decode_nonfinite(json.loads(self.to_json()))

    def to_json(self, indent=2) -> str:
        """The configuration and all numbers as a JSON string (strict JSON: a non-finite
        number is written ``{"__float__": "inf"}``, see :func:`report_io.encode_nonfinite`)."""
        return json.dumps({"format": _report_format(), "format_version": _FORMAT_VERSION,
                           "config": encode_nonfinite(self.config),
                           "numbers": encode_nonfinite(self.numbers)}, indent=indent,
                          allow_nan=False, default=json_default)

    def summary(self) -> str:
        """Printable summary table, ending with the verdict and its reasons."""
        c, n = self.config, self.numbers
        lines = [f"symquad validate: {c['model']}"]
        if c.get("activation") in ("erf", "relu") or "erf" in c.get("model", "") \
                or "relu" in c.get("model", ""):
            # a named activation is printed with its convention (erf means erf(z/√2))
            lines.append(f"  model: {c.get('description') or c['model']}")
        if c["source"] == "simulation":
            lines.append(f"  N={c['N']}, replicas={c['replicas']}, t_max={c['t_max']:g}, "
                         f"start={c['start']}, method={c['method']}, seed={c['seed']}")
            if str(c.get("start_reason", "")).startswith("default: "):
                lines.append(f"  start: {c['start']} by default, since "
                             f"{c['start_reason'][len('default: '):]}")
        else:
            lines.append(f"  {c['source']}: replicas={c['replicas']}, {len(self.t)} times in "
                         f"[{self.t[0]:g}, {self.t[-1]:g}]")
        if n["diverged_replicas"] or n["ode_diverged_replicas"]:
            lines.append(f"  WARNING: SGD diverged in {n['diverged_replicas']} replicas, the ODE "
                         f"in {n['ode_diverged_replicas']} (excluded from the statistics)")
        lines.append("")
        lines.append(f"  {'quantity':44s} {'mean':>10s} {'5%':>10s} {'95%':>10s}")
        for phase in ("whole_run", "before_escape", "after_escape"):
            for key, label in (("risk_rms", "|risk SGD-ODE| (RMS in t)"),
                               ("overlap_rms", "overlap deviation (RMS in t)"),
                               ("readout_rms", "|a SGD-ODE| (RMS in t)")):
                d = n["deviation"].get(phase, {}).get(key)
                if d and d["n"]:
                    lines.append(f"  {label + ', ' + phase.replace('_', ' '):44s} "
                                 f"{d['mean']:10.3g} {d['q05']:10.3g} {d['q95']:10.3g}")
        b = n["band"]
        lines.append(f"  ODE risk inside the SGD {b['percentiles'][0]:g}-{b['percentiles'][1]:g}% "
                     f"band: {100 * b['ode_inside_fraction']:.1f}% of times")
        if b["max_mean_z"] is not None:
            lines.append(f"  max |mean SGD risk - ODE| / s.e., whole run: {b['max_mean_z']:.2f} "
                         f"(inside ±3 s.e. at {100 * b['mean_inside_3se_fraction']:.1f}% of "
                         f"times; the verdict tests the pre-escape window below)")
        bs = n.get("block_statistics")
        if bs and bs.get("max_z"):
            # an input spectrum: the per-block statistics of the mean-deviation criterion
            zs = ", ".join(f"{name} {'inf' if z is None else f'{z:.2f}'}"
                           for name, z in zip(bs["names"], bs["max_z"]))
            lines.append(f"  per-block statistics, max |mean SGD - ODE| / s.e. in the "
                         f"mean-deviation window: {zs}")
        fb = n.get("finite_n_bias")
        if fb and fb.get("applies") and fb["times"]:
            pairs = "; ".join(f"t={tt:.3g}: {m:.3g} ± {s:.2g} vs {c:.3g}" for tt, m, s, c in zip(
                fb["times"], fb["N_times_mean_deviation"], fb["N_times_se"], fb["predicted"]))
            lines.append(f"  finite-N bias, N·(mean SGD - ODE) vs the O(1/N) theory c: {pairs}")
            lines.append(f"  (the verdict compares SGD with ODE + c/N; against the ODE alone the "
                         f"largest deviation is {fb['max_z_against_ode'] or 0:.2f} s.e.)")
        elif fb:
            lines.append(f"  finite-N bias: no O(1/N) correction ({fb['reason']})")
        e = n["escape"]
        if e.get("defined"):
            s, o, dd = e["sgd"], e["ode"], e["difference"]
            lines.append(f"  plateau risk {e['plateau_risk']:.4g}, escape threshold "
                         f"{e['threshold']:.4g}, plateau rate {e['plateau_rate']:.4g}")
            if s["n"]:
                lines.append(f"  escape time SGD: mean {s['mean']:.4g} ± {s['std'] or 0:.3g} "
                             f"(5-95%: {s['q05']:.4g}-{s['q95']:.4g}), escaped "
                             f"{e['sgd_escaped']}/{e['replicas']}")
            if o["n"]:
                lines.append(f"  escape time ODE: mean {o['mean']:.4g} ± {o['std'] or 0:.3g}, "
                             f"escaped {e['ode_escaped']}/{e['replicas']}")
            if dd["n"]:
                lines.append(f"  t_esc(SGD) - t_esc(ODE), same replica: mean {dd['mean']:.3g} "
                             f"± {dd['se'] or 0:.2g} (s.e.), std {dd['std'] or 0:.3g}; "
                             f"predicted {e['predicted_difference']:.3g}")
                lines.append("  (SGD noise on the plateau is as large as rho(0) ~ N^-1/2: it "
                             "shifts the escape by O(1/kappa) at any N, earlier on average)")
            after = n["deviation"].get("after_escape", {}).get("overlap_rms", {})
            if after.get("n") and c["p"] > c["p_star"]:
                lines.append("  after the escape the overlaps differ by O(1) while the risks "
                             "agree: SGD and the ODE reach different points of the zero-risk "
                             "manifold (dimension p p* - p*(p*+1)/2 > 0 for p > p*)")
        else:
            lines.append(f"  escape: not analysed ({e.get('reason', '')})")
        f = n.get("finite_size_scaling")
        if f:
            lines.append(f"  finite-size scaling ({f['start']} start, N={f['N'][0]}..{f['N'][-1]}): "
                         f"deviation ~ N^({f['exponent']:.3f} ± {f['exponent_se']:.3f}) "
                         f"[theory -1/2], chi2/dof {f['chi2_per_dof']:.2f}")
        inv = n.get("invariant_drift")
        if inv:
            lines.append("  implicit bias: " + inv["text"].replace("\n", "\n  "))
        elif n.get("invariant_drift_skipped"):
            lines.append(f"  implicit bias: drift study skipped ({n['invariant_drift_skipped']})")
        if n.get("runtime_s") is not None:
            lines.append(f"  runtime: {n['runtime_s']:.1f} s")
        lines.append("")
        lines.append(f"  {verdict_headline(self.numbers['verdict'])}")
        lines.extend(f"    {r}" for r in self.reasons)
        res = n.get("resolution")
        if res and res["values"]:
            lines.append(f"  RESOLUTION (smallest change the mean-deviation test detects, about "
                         f"50% power): {format_resolution(res)}")
        elif res:
            lines.append(f"  resolution: not computed ({res['reason']})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    # -- figures and files ------------------------------------------------------
    def figures(self) -> dict:
        """Matplotlib figures ``{"risk", "overlaps", "fss", "escape"}`` of the report.

        Built with the object-oriented API: no global backend switch, nothing
        left open in pyplot.
        """
        # upward: plotting imports studies (tests/test_layering.py UPWARD)
        from ..plotting import validation_figures

        return validation_figures(self)

    def save(self, folder="symquad_report", figures=True, format="png") -> dict:
        """Write the report folder atomically; return ``{name: path}`` of the files written.

        Files: ``report.json`` (configuration, numbers, verdict), ``summary.txt``,
        ``trajectories.npz`` (all arrays), ``invariant_study.npz`` when the drift
        study ran, and the figures (``figures=False`` skips them) as ``format``:
        ``"png"`` (300 dpi), ``"pdf"`` or ``"svg"`` (vector, for a paper).  Everything
        is written into a temporary folder beside `folder`, which then replaces
        `folder` whole (one rename; see "Report folders" in docs/user-guide.md): an interrupted save
        leaves the previous folder untouched, and no figure of an older run
        survives next to a new report.  `folder` is checked first: an existing
        file, a non-empty folder that is not a symquad report, or an unwritable
        location raise ValueError.
        """
        # upward: plotting imports studies (tests/test_layering.py UPWARD)
        from ..plotting import FORMATS

        if not isinstance(format, str) or format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        names = {}

        def write(tmp):
            names.update(self._write_files(tmp, figures, format))

        dest = write_folder_atomically(folder, write, name="folder")
        return {key: os.path.join(dest, name) for key, name in names.items()}

    def _write_files(self, folder, figures, format="png") -> dict:
        # upward: plotting imports studies (tests/test_layering.py UPWARD)
        from ..plotting import plot_invariant_drift, save_figure

        names = {"json": "report.json", "summary": "summary.txt",
                 "trajectories": "trajectories.npz"}
        head = json.loads(self.to_json())
        study_arrays = {}
        if self.invariant_study is not None:
            head["invariant_study"] = split_arrays(self.invariant_study, study_arrays)
            names["invariant_study"] = "invariant_study.npz"
        with open(os.path.join(folder, names["json"]), "w", encoding="utf-8") as fh:
            json.dump(head, fh, indent=2, allow_nan=False)
        with open(os.path.join(folder, names["summary"]), "w", encoding="utf-8") as fh:
            fh.write(self.summary() + "\n")
        arrays = {k: getattr(self, k) for k in _ARRAYS + _READOUT_ARRAYS
                  if getattr(self, k) is not None}
        np.savez_compressed(os.path.join(folder, names["trajectories"]), **arrays)
        if study_arrays:
            np.savez_compressed(os.path.join(folder, names["invariant_study"]), **study_arrays)
        if figures:
            for name, fig in self.figures().items():
                names[name] = f"{name}.{format}"
                save_figure(fig, os.path.join(folder, names[name]))
            if self.invariant_study is not None:
                names["invariant_drift"] = f"invariant_drift.{format}"
                plot_invariant_drift(self.invariant_study,
                                     os.path.join(folder, names["invariant_drift"]),
                                     model_title=describe_config(self.config))
        return names

    @classmethod
    def load(cls, folder) -> "ValidationReport":
        """Read a report folder written by :meth:`save` (arrays loaded without pickle)."""


        path = _as_path(folder)
        try:
            head = json.loads(read_regular(os.path.join(path, "report.json"), "report.json",
                                           max_bytes=256 * 2**20).decode("utf-8"))
        except FileNotFoundError:
            raise ValueError(f"{folder!r} is not a report folder (no report.json)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{folder!r}: report.json is not valid JSON ({exc})") from None
        if not isinstance(head, dict) or head.get("format") != _report_format():
            raise ValueError(f"{folder!r}: report.json is not a symquad ValidationReport")
        if head.get("format_version", 0) > _FORMAT_VERSION:
            raise ValueError(f"{folder!r}: report format version {head['format_version']} is "
                             f"newer than this symquad reads ({_FORMAT_VERSION})")
        arrays, _ = read_npz(os.path.join(path, "trajectories.npz"),
                             f"{folder!r}: trajectories.npz", keys=_ARRAYS + _READOUT_ARRAYS)
        missing = [k for k in _ARRAYS[:-1] if k not in arrays]
        if missing:
            raise ValueError(f"{folder!r}: trajectories.npz lacks {missing}")
        study = None
        if "invariant_study" in head:
            data, _ = read_npz(os.path.join(path, "invariant_study.npz"),
                               f"{folder!r}: invariant_study.npz")
            study = join_arrays(head["invariant_study"], data)
        try:
            config, numbers = decode_nonfinite(head["config"]), decode_nonfinite(head["numbers"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{folder!r}: report.json is damaged ({type(exc).__name__}: "
                             f"{exc})") from None
        if not (isinstance(config, dict) and isinstance(numbers, dict)):
            raise ValueError(f"{folder!r}: report.json is damaged (config and numbers must be "
                             f"objects)")
        return cls(config=config, numbers=numbers, invariant_study=study,
                   **arrays)


def _activation_list(text):
    """Coefficients of an activation string as the rational strings of a saved model
    (a named activation, ``"erf"`` or ``"relu"``, stays its name)."""

    act = Model(1, 1, 1.0, activation=text).activation
    return act if isinstance(act, str) else [str(c) for c in act]


def _report_format():

    return REPORT_FORMAT


def _finite_or_none(values):
    return [float(v) if np.isfinite(v) else None for v in values]

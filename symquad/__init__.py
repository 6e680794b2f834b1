"""symquad: SymPy-derived high-dimensional theory of one-pass SGD for two-layer
quadratic networks, generated numpy kernels, and Monte Carlo validation.

>>> import symquad as sq
>>> m = sq.Model(p=3, p_star=2, lr=0.2)
>>> eq = sq.derive(m)           # SymPy equations (imports SymPy)
>>> k = sq.kernels(m)           # generated numpy kernels (no SymPy)

Attributes are imported lazily so that the numeric runtime (kernels,
integration, simulation, validation) never pulls in SymPy.
"""

from importlib import import_module

from .spec import DEFAULT_MODEL, LR_SCALINGS, Model

__version__ = "0.2.0"

# public name -> module that defines it (imported on first use); docs/api.md documents each
_LAZY = {
    "derive": "symquad.symbolic.derive",
    "Equations": "symquad.symbolic.derive",
    "kernels": "symquad.numeric.kernels",
    "Kernels": "symquad.numeric.kernels",
    "integrate": "symquad.numeric.integrate",
    "ODESolution": "symquad.numeric.integrate",
    "DivergenceError": "symquad.numeric.errors",
    "fluctuations": "symquad.numeric.fluctuations",
    "Fluctuations": "symquad.numeric.fluctuations",
    "StateLayout": "symquad.numeric.layout",
    "simulate": "symquad.numeric.simulate",
    "SimulationRun": "symquad.numeric.simulate",
    "validate": "symquad.studies.validation",
    "ValidationReport": "symquad.studies.validation",
    "compare": "symquad.studies.validation",
    "invariant_S": "symquad.numeric.invariants",
    "closest_solution": "symquad.numeric.invariants",
    "manifold_dimension": "symquad.numeric.invariants",
    "ZeroRiskPoint": "symquad.numeric.invariants",
    "zero_risk_point": "symquad.numeric.invariants",
    "random_manifold_points": "symquad.numeric.invariants",
    "invariant_set_point": "symquad.numeric.invariants",
    "invariant_set_defect": "symquad.numeric.invariants",
    "invariant_drift_study": "symquad.studies.invariant_drift",
    "plot_invariant_drift": "symquad.plotting",
    "hessian_spectrum": "symquad.symbolic.hessian",
    "plateau": "symquad.numeric.landscape",
    "escape_time": "symquad.numeric.landscape",
    "EscapePrediction": "symquad.numeric.landscape",
    "PlateauFixedPoint": "symquad.numeric.landscape",
    "critical_weights": "symquad.numeric.landscape",
    "weight_hessian": "symquad.numeric.landscape",
    "escape_threshold": "symquad.numeric.landscape",
    "escape_times": "symquad.numeric.landscape",
    "power_law_spectrum": "symquad.spectrum",
    "power_law_curve_study": "symquad.studies.power_law",
    "power_law_escape_study": "symquad.studies.power_law",
    "HessianSpectrum": "symquad.symbolic.hessian",
    "weight_objective": "symquad.numeric.landscape",
    "conservation_verdict": "symquad.symbolic.invariants",
    "survival_table": "symquad.survival",
    "tau_from_t": "symquad.conventions",
    "t_from_tau": "symquad.conventions",
    "rate_per_tau": "symquad.conventions",
    "from_unnormalised": "symquad.conventions",
    "to_unnormalised": "symquad.conventions",
    "overlaps_from_unnormalised": "symquad.conventions",
    "overlaps_to_unnormalised": "symquad.conventions",
    "sweep": "symquad.studies.sweep",
    "dask_client": "symquad.studies.sweep",
    "run_main": "symquad.entry",
    "ArgumentParser": "symquad.entry",
    "connect_scheduler": "symquad.studies.sweep",
    "load_sweep": "symquad.studies.store",
    "load_sweep_arrays": "symquad.studies.store",
    "register_task": "symquad.studies.tasks",
    "list_tasks": "symquad.studies.tasks",
    "escape_sweep_summary": "symquad.studies.escape_grid",
    "save_figure": "symquad.plotting",
    "sweep_errorbar_figure": "symquad.plotting",
    "sweep_escape_figure": "symquad.plotting",
    "sweep_heatmap_figure": "symquad.plotting",
    "escape_sweep_figures": "symquad.plotting",
    "escape_risk_curves_figure": "symquad.plotting",
    "phases_figure": "symquad.plotting",
    "hessian_spectra_figure": "symquad.plotting",
    "S_trajectories_figure": "symquad.plotting",
    "distance_strip_figure": "symquad.plotting",
    "optimal_schedule": "symquad.numeric.optimal",
    "OptimalSchedule": "symquad.numeric.optimal",
    "optimal_schedule_figure": "symquad.plotting",
    "power_law_figure": "symquad.plotting",
    "power_law_escape_figure": "symquad.plotting",
}

__all__ = ["Model", "DEFAULT_MODEL", "LR_SCALINGS", *_LAZY]


def __getattr__(name):
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'symquad' has no attribute {name!r}") from None
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

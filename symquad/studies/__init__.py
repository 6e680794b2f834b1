"""Studies: orchestration on top of :mod:`symquad.numeric` (which holds only the mathematics).

* :mod:`.validation` — SGD (or the user's trajectories) against the ODE theory, with a
  PASS/FAIL verdict (:func:`symquad.validate`, :func:`symquad.compare`);
* :mod:`.applicability` — which analyses derived for the classic model apply to a model
  (a changed field they do not handle is named in a stated skip or an error);
* :mod:`.report_io` — report folders written atomically, destinations checked first;
* :mod:`.invariant_drift` — drift of the invariant ``S`` along finite-N SGD;
* :mod:`.escape_grid` — fits and summaries of escape times over a grid of models;
* :mod:`.tasks` — every study as a task (a function of keyword parameters returning a
  flat dict), registered by name and version;
* :mod:`.sweep` — :func:`symquad.sweep`: a task over a parameter grid, serially or on Dask;
* :mod:`.store` — the resumable, atomic Parquet store of a sweep (:func:`symquad.load_sweep`).

Figures are drawn by :mod:`symquad.plotting`.
"""

"""Studies: orchestration on top of :mod:`symquad.numeric` (which holds only the mathematics).

* :mod:`.validation` — SGD (or the user's trajectories) against the ODE theory, with a
  PASS/FAIL verdict (:func:`symquad.validate`, :func:`symquad.compare`);
* :mod:`.report_io` — report folders written atomically, destinations checked first;
* :mod:`.invariant_drift` — drift of the invariant ``S`` along finite-N SGD;
* :mod:`.escape_grid` — escape times over a grid of models (prediction, ODE, SGD).

Figures are drawn by :mod:`symquad.plotting`.
"""

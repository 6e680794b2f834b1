"""Studies: orchestration on top of :mod:`symquad.numeric` (which holds only the mathematics).

* :mod:`.validation` — SGD against the ODE theory (:func:`symquad.validate`);
* :mod:`.invariant_drift` — drift of the invariant ``S`` along finite-N SGD;
* :mod:`.escape_grid` — escape times over a grid of models (prediction, ODE, SGD).

Figures are drawn by :mod:`symquad.plotting`.
"""

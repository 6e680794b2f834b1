"""Dask worker preload of the local clusters symquad starts: workers ignore Ctrl-C.

``LocalCluster(..., preload=["symquad._dask_preload"])`` imports this module in
every worker process and calls :func:`dask_setup` when the worker starts (in
the worker's main thread); see :func:`symquad.entry.ignore_sigint`.
"""

from symquad.entry import ignore_sigint


def dask_setup(worker):  # noqa: ARG001 - the signature distributed calls
    """Called by distributed in each worker process at start-up."""
    ignore_sigint()

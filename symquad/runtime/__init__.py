"""Hand-written numeric runtime that generated kernel modules import (numpy only).

Generated modules under ``symquad/_generated`` (and in the kernel cache) hold
data — contraction plans, vertex functions, straight-line expressions — and
import what they execute from here, the way SymForce's generated code imports
``sym``: :mod:`symquad.runtime.tensor_engine` evaluates the moment kinds of the
tensor route from a plan.  This package is linted and tested like any other
code and never imports SymPy.
"""

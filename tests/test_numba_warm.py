"""tests/numba_warm.py compiles what the tests' first calls would compile, at their types."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# in a fresh process: the engine group's warm-up, then a tensor_kinds call and a tensor D;
# the engine's compiled kernels (run, gather, the assembly's kind_term) must have their
# signatures after the warm-up alone, and the calls must add none (the warm-up compiled
# them at the types the engine passes)
PROBE = """
import sys
sys.path.insert(0, {tests!r})
import numba_warm
numba_warm.engine()
from symquad.runtime import contraction_vm as vm
from symquad.runtime import assembly_vm
def signatures():
    out = {{name: list(getattr(vm, name).signatures) for name in ("run", "gather")}}
    out["kind_term"] = list(assembly_vm.kind_term.signatures)
    return out
warm = signatures()
import numpy as np, symquad as sq
from symquad.numeric.kernels import _diffusion_tensor_module
from symquad.runtime import diffusion_engine as E
model = sq.Model(2, 1, 0.3, activation="z**3 - 3*z", lr_readout=0.2)
plan = _diffusion_tensor_module(model).PLAN
E.tensor_kinds(plan, 1.1 * np.eye(2), np.full((2, 1), 0.1), np.eye(1), np.ones(2),
               np.ones(1), 0.3, ("M001", "M110"))
sq.kernels(model, "tensor").diffusion(1.1 * np.eye(2), np.full((2, 1), 0.1), np.eye(1),
                                      np.ones(2))         # the assembly's kind_sum
after = signatures()
print(warm, after)
assert all(warm.values()), warm
assert after == warm, (warm, after)
"""


def test_the_engine_warm_up_compiles_the_engines_kernels():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    probe = PROBE.format(tests=os.path.join(ROOT, "tests"))
    proc = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

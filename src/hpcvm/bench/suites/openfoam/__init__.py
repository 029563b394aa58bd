"""OpenFOAM's icoFoam on the cavity tutorial (``suite.py``). No options of its own;
``--size`` picks the mesh and time steps (quick, small, medium).
"""

from hpcvm.bench.core.flags import SuiteFlag

FLAGS: tuple[SuiteFlag, ...] = ()

"""LAMMPS's Lennard-Jones benchmark (``suite.py``). No options of its own; ``--size``
picks the atoms (quick, small, medium).
"""

from hpcvm.bench.core.flags import SuiteFlag

FLAGS: tuple[SuiteFlag, ...] = ()

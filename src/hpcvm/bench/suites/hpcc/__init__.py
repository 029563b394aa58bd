"""HPC Challenge from the distribution: the suite in ``suite.py`` (its input sized from
memory and np, its summary read back). It has no options of its own; ``--size`` picks
the memory share (quick and small: small, medium, or a fraction of memory).
"""

from hpcvm.bench.core.flags import SuiteFlag

FLAGS: tuple[SuiteFlag, ...] = ()

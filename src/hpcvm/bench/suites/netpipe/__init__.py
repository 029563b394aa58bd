"""NetPIPE ping-pong between 2 MPI ranks (``suite.py``). No options of its own;
``--size`` picks the repetitions per message size (quick, small, medium).
"""

from hpcvm.bench.core.flags import SuiteFlag

FLAGS: tuple[SuiteFlag, ...] = ()

"""Your NAS Parallel Benchmarks MPI binaries (``suite.py``; ``kernels.py`` knows the
kernels and classes, ``report.py`` reads their output). Its options are declared here,
apart from the suite, so that ``hpcvm bench --help`` reads them without importing it
(bench/core/flags.py).
"""

from hpcvm.bench.core.flags import SuiteFlag

FLAGS = (
    SuiteFlag(
        "--npb-dir",
        "npb_dir",
        "NPB bin directory (for --suite npb).",
        selects=True,
    ),
    SuiteFlag("--npb-kernels", "npb_kernels", "NPB kernels, e.g. cg,ep.", selects=True),
)

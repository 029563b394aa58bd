"""hpcvm's bulk-synchronous microbenchmark (``suite.py``, csrc/bsp.c). Its options are
declared here, apart from the suite, so that ``hpcvm bench --help`` reads them without
importing it (bench/core/flags.py).
"""

from hpcvm.bench.core.flags import SuiteFlag

FLAGS = (
    SuiteFlag(
        "--bsp-grain-us",
        "bsp_grain_us",
        "bsp: work between allreduces (us), calibrated once per run natively.",
        kind=int,
        default=100,
        positive=True,
        show_default=True,
    ),
    SuiteFlag(
        "--bsp-steps",
        "bsp_steps",
        "bsp: steps per sample.",
        kind=int,
        default=2000,
        positive=True,
        show_default=True,
    ),
)

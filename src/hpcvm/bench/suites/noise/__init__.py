"""hpcvm's fixed-work-quantum noise benchmark (``suite.py``, csrc/noise.c). Its options
are declared here, apart from the suite, so that ``hpcvm bench --help`` reads them
without importing it (bench/core/flags.py).
"""

from hpcvm.bench.core.flags import SuiteFlag

FLAGS = (
    SuiteFlag(
        "--noise-quanta",
        "noise_quanta",
        "Noise: quanta per CPU (default: 5000 for --size quick, else 20000).",
        kind=int,
        positive=True,
    ),
    SuiteFlag(
        "--noise-quantum-us",
        "noise_quantum_us",
        "Noise: the work of one quantum, in microseconds (calibrated once per run).",
        kind=int,
        default=50,
        positive=True,
        show_default=True,
    ),
)

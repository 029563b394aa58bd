"""Any command and a regex (``suite.py``). Its options are declared here, apart from the
suite, so that ``hpcvm bench --help`` reads them without importing it
(bench/core/flags.py).
"""

from hpcvm.bench.core.flags import SuiteFlag

FLAGS = (
    SuiteFlag("--cmd", "cmd", "A command to benchmark (suite cmd).", selects=True),
    SuiteFlag("--metric", "metric", "Regex with one group around the number."),
    SuiteFlag("--lower-is-better", "higher_is_better", switch=False),
    SuiteFlag("--higher-is-better", "higher_is_better", switch=True),
    SuiteFlag("--unit", "unit", "Unit of the --cmd metric.", default=""),
    SuiteFlag("--metric-name", "metric_name", default="value", show_default=True),
    SuiteFlag(
        "--cmd-mpi",
        "cmd_mpi",
        "Run --cmd under mpirun with --np ranks.",
        switch=True,
        selects=True,
    ),
)

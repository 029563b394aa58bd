"""bench stage of the hpcvm pipeline (see DESIGN.md): benchmark suites that need no VM.

- ``suite``: the Suite protocol (validate, prepare -> argv, parse -> metric values) and
  the run contract the orchestrator follows natively and in guests.
- ``metrics``: Metric, MetricValue, ParseError (a failed sample).
- ``launch``: the one mpirun command line (``mpirun_argv``) and ``in_workdir``.
- ``hpcc``, ``noise``, ``npb``, ``cmd``: the suites; ``suites``: the name registry.
"""

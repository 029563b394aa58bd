"""bench stage of the hpcvm pipeline (see DESIGN.md): measure native against VMs and
containers on the same CPUs. Its rooms, each importing only those before it
(tests/unit/test_layers.py):

- ``core``: the Suite protocol and its run contract (``suite``), metrics and the failed
  sample (``metrics``), the one mpirun command line and the clean launch environment
  (``launch``).
- ``suites``: the benchmark suites (hpcc, noise, npb, netpipe, cmd, openfoam, lammps,
  bsp, and the native reference answers some check against) and their ``registry``.
- ``results``: what a run's database says (``results``, ``failures``), exported
  (``export``), and the results directory's checks (``outdir``).
- ``envs``: where a sample runs: the Environment interface, native, VMs, containers,
  the variants a user names, CPU sets and placement, the evidence taken around a run.
- ``run``: one bench run: the user's choices and config, the cells and the sampling
  loop (``runner``), and the session that prepares, runs and resumes it.
"""

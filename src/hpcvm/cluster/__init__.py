"""Tuned VMs on every node of a Slurm allocation, joined by a network, running MPI.

Slurm places the work; hpcvm adds no cluster manager of its own. ``cluster up`` runs
inside an allocation and starts one *holder step* (``srun``, one task per node): each
task plans and boots the VM for its own node, sets up the guest's MPI launcher, reports
on its standard output, and holds the VM until the step ends. Whatever ends the step
(``cluster down``, the end of the batch script, ``scancel``, a VM that dies, a node
that fails to boot) ends every VM of the job, on every node, through Slurm's own
signals.

The code is in rooms that import only the rooms before them (docs/architecture.md;
tests/unit/test_layers.py enforces it): job and batch, tasks, commands, benchnodes, and
above them internal.py, the roles' dispatcher.
"""

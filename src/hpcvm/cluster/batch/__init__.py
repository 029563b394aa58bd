"""The batch systems (their interface, Slurm, local, the registry) and the one command line
that starts an hpcvm role on a node."""

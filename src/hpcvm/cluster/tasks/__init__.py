"""What runs on each node as a task of the job's step: the node's VM, its reaper, address
claims and probe, the node's side of a checkpoint and of a migration, and the markers of
a move."""

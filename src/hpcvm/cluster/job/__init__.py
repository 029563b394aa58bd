"""What a job is and keeps: its spec and the nodes' events, its state directory, its
checkpoint manifests and series, its key pair and the guests' MPI scripts."""

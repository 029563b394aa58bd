"""bench --nodes: the environments across nodes, a container per node, the native PUs of
each node."""

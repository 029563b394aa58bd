"""runtime stage of the hpcvm pipeline (see DESIGN.md), in rooms that import only the
rooms before them (docs/architecture.md; tests/unit/test_layers.py enforces the order):
hostside, machine and oci, channels and net, backends, verify, vm, checkpoint,
migration."""

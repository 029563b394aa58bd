"""Checkpoint and restore of one VM: the steps, the directory it is kept in, its record,
and QEMU's side."""

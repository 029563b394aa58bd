"""The VM backends (QEMU driven directly over QMP, libvirt) and their registry."""

"""What hpcvm prepares on the host for a VM, before and beside QEMU: its private
directories (paths), QEMU's user and sandbox (confine), huge page files, pinning, staged
files, the directories it shares with the guest, and which accelerator works here."""

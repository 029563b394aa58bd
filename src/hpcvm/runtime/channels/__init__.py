"""The channels into a running VM: QEMU's QMP, the guest agent (and the processes it runs
in the guest), and the completion signal a guest command sends."""

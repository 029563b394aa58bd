"""``verify``: checks of a running VM against its plan, from inside the guest and outside
on the host."""

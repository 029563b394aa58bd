"""A VM's NICs on the host network: the network kinds (bridge, macvtap, VF; a plugin's),
their common base, the bridge helper grant and the address guard."""

"""One VM's life: its boot media, ``up``, commands in it, ``down``, and the listing of
every VM."""

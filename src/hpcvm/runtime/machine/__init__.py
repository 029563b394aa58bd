"""What a VM is to hpcvm once started: its record (model, state), the options it was booted
with, the light handle exec reads, the names taken, and the timeouts every command
shares."""

"""A STAND-IN for an NPB binary, for tests: NPB cannot be downloaded on the project's
machine, so this replays one real NPB run recorded in ``real/<case>/`` (see README.md).

Started under Open MPI's mpirun like the binary it stands for, it behaves as that run
did: rank 0 prints the recorded stdout and the program's own stderr
(``program_stderr``), then ends as the program did: exits with the recorded code, or,
when the run died of a signal (mpirun exits 128 + signal), kills itself with that
signal. Other ranks print nothing, as NPB's do. It refuses to replay a run recorded
with another process count (exit 99), so a test cannot pass by replaying the wrong run.

Usage (from a wrapper script named like the binary, e.g. ``cg.S.x``):
``python3 npb_standin.py real/<case>``
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

WRONG_START = 99


def main(argv: list[str]) -> int:
    case = Path(argv[1])
    meta = json.loads((case / "meta.json").read_text())
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if size != meta["np"]:
        sys.stderr.write(f"stand-in: {case.name} ran on {meta['np']} processes, not {size}\n")
        return WRONG_START
    if rank != 0:
        return 0
    sys.stdout.write((case / "stdout").read_text())
    sys.stdout.flush()
    program_stderr = case / "program_stderr"
    if program_stderr.exists():
        sys.stderr.write(program_stderr.read_text())
        sys.stderr.flush()
    code = int((case / "exit_code").read_text())
    if code > 128:
        os.kill(os.getpid(), code - 128)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""How long a guest stands still when ``cluster migrate`` moves it to a spare node while
an MPI program runs, as a ratio against stopping it for the whole copy (issue 26).

A 3-node job with one spare node (``cluster up --spare 1``) of disk-image VMs
(tests/image_builder.py's image: Open MPI, sshd and mpi_ring in it) is started with
hpcvm's ``local`` batch system in a network namespace made here (a bridge of its own;
nothing leaves it), and the MPI ring runs across both VMs for the whole benchmark
(``cluster exec --detach``). Then ``--reps`` times, node2's VM moves to the spare node
and back on the next repetition, and each move reports:

- the **stand-still**: QEMU's ``downtime`` (the last pass of RAM, vCPUs stopped) plus
  the copy of the disk overlay that follows while the guest is still stopped;
- the bytes moved (RAM and disk) and the whole migration's time.

Against it, in the same repetition, the **stop-and-copy** time of the same bytes over
the same path: a plain TCP copy from one node's address to the spare's (both on the
bridge), which is how long the guest would stand still if it were stopped for the whole
copy (as a checkpoint moved to another node stops it). The ratio stand-still /
stop-and-copy is per repetition, with its mean and a 97% Student-t interval; so is the
stand-still's share of the whole migration. Here the nodes are one machine, so the
"network" is memory: stop-and-copy is as fast as it gets, and the first ratio is an
upper bound of what a real network shows (a stop-and-copy grows with the VM's RAM over
the wire; the stand-still is the last pass and the disk overlay).

At the end the ring must still run (Open MPI's TCP transport aborts the program on a
broken connection), and ``cluster wait`` collects it: its counter is right only if no
message was lost or repeated across every move. Prints the conditions. Run as root (the
namespace); asserts nothing.

    .venv/bin/python benchmarks/cluster_migrate.py [--reps 6] [--memory 512M] [--image PATH]
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_common import (  # noqa: E402
    conditions,
    hpcvm,
    interval,
    reexec_in_namespace,
)

NAMESPACE = "hpcvm-bench-migrate"
PREFIX = "10.90.0"
NAME = "bench-mig"
MOVED = re.compile(
    r"stood still (\d+) ms \((\d+) ms QEMU's last pass, (\d+) ms its disk overlay\), "
    r"([\d.]+) s in all; ([\d.]+) MiB RAM and ([\d.]+) MiB disk sent"
)
CHUNK = 1 << 20


def migrate(source: str, target: str) -> dict[str, float]:
    said = hpcvm("cluster", "migrate", NAME, "--node", source, "--to", target).stderr
    found = MOVED.search(said)
    if found is None:
        sys.exit(f"no migration figures in: {said}")
    still, qemu, disk, total, ram_mib, disk_mib = (float(g) for g in found.groups())
    return {"still_ms": still, "qemu_ms": qemu, "disk_ms": disk, "total_s": total,
            "bytes": (ram_mib + disk_mib) * 2**20}  # fmt: skip


def tcp_copy(nbytes: int) -> float:
    """Seconds to send ``nbytes`` over TCP on the bridge's address (the path between
    the nodes' tasks here), received and counted on the other end."""
    server = socket.create_server((f"{PREFIX}.1", 0))
    port = server.getsockname()[1]
    got = [0]

    def receive() -> None:
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(CHUNK):
                got[0] += len(chunk)

    thread = threading.Thread(target=receive)
    thread.start()
    payload = bytes(CHUNK)
    begin = time.monotonic()
    with socket.create_connection((f"{PREFIX}.1", port)) as conn:
        left = nbytes
        while left > 0:
            conn.sendall(payload[: min(CHUNK, left)])
            left -= min(CHUNK, left)
    thread.join()
    server.close()
    if got[0] != nbytes:
        sys.exit(f"the TCP copy lost bytes: {got[0]} of {nbytes}")
    return time.monotonic() - begin


def ring_started(timeout: float = 180.0) -> None:
    """Until the ring's rank runs in the first VM: a move before that would measure
    mpirun's start, not a running program."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (
            hpcvm("cluster", "exec", NAME, "--", "pgrep", "-x", "mpi_ring", check=False).returncode
            == 0
        ):
            return
        time.sleep(1)
    sys.exit(f"the MPI ring did not start within {timeout:g} s")


def inside(args: argparse.Namespace) -> None:
    try:
        hpcvm("cluster", "up", "--batch", "local", "--nodes", "3", "--spare", "1", "--name",
              NAME, "--image", str(args.image), "--profile", "pinned", "--vcpus", "1",
              "--memory", args.memory, "--address", f"{PREFIX}.11/24", "--accel", "tcg",
              "--timeout", "900")  # fmt: skip
        hpcvm("cluster", "exec", "--detach", NAME, "--", "mpirun", "-np", "2", "--map-by",
              "node", "/usr/local/bin/mpi_ring", "1000000", "200")  # fmt: skip
        ring_started()  # mpirun starts ranks over ssh: seconds under TCG
        migrate("local2", "local3")  # warm-up: not counted
        where = ("local3", "local2")
        reps = []
        for rep in range(args.reps):
            moved = migrate(*where)
            moved["copy_s"] = tcp_copy(int(moved["bytes"]))
            reps.append(moved)
            where = (where[1], where[0])
            ratio = moved["still_ms"] / 1000 / moved["copy_s"]
            print(f"rep {rep}: stood still {moved['still_ms']:.0f} ms ({moved['qemu_ms']:.0f} "
                  f"QEMU + {moved['disk_ms']:.0f} disk), migration {moved['total_s']:.2f} s, "
                  f"{moved['bytes'] / 2**20:.0f} MiB; stop-and-copy {moved['copy_s']:.3f} s: "
                  f"ratio {ratio:.3f}", flush=True)  # fmt: skip
        time.sleep(5)  # the ring would abort on a connection the last move broke
        alive = hpcvm("cluster", "exec", NAME, "--", "pgrep", "-x", "mpi_ring", check=False)
        hpcvm("cluster", "exec", NAME, "--", "pkill", "-f", "mpi_ring", check=False)
        waited = hpcvm("cluster", "wait", NAME, check=False)
        counters = re.findall(r"^round=(\d+) counter=(\d+)", waited.stdout, re.M)
        intact = bool(counters) and all(int(c) == 2 * int(r) for r, c in counters)
        if not intact or alive.returncode != 0:  # say why, not only that
            said = (waited.stdout + waited.stderr).strip().splitlines()
            print(f"cluster wait: exit {waited.returncode}; the ring's output, last lines:",
                  *said[-15:], sep="\n  ")  # fmt: skip
        print()
        print(f"conditions: {conditions()}; 2 VMs of 1 vCPU, {args.memory}, TCG, local batch "
              "(the nodes are this machine: the path is the bridge, not a wire)")  # fmt: skip
        print("stand-still / stop-and-copy of the same bytes: "
              f"{interval([r['still_ms'] / 1000 / r['copy_s'] for r in reps], 3)}")  # fmt: skip
        print(f"stand-still, ms: {interval([r['still_ms'] for r in reps], 0)}; "
              f"of which QEMU's last pass {interval([r['qemu_ms'] for r in reps], 0)}, "
              f"the disk overlay {interval([r['disk_ms'] for r in reps], 0)}")  # fmt: skip
        print(f"whole migration, s: {interval([r['total_s'] for r in reps])}; stand-still / "
              f"whole migration: {interval([r['still_ms'] / 1000 / r['total_s'] for r in reps], 3)}"
              )  # fmt: skip
        print(
            f"the MPI ring across {args.reps + 1} moves: {len(counters)} rounds, counter "
            f"{'right' if intact else 'WRONG'} in every round; still running 5 s after the "
            f"last move: {'yes' if alive.returncode == 0 else 'NO'}"
        )
    finally:
        hpcvm("cluster", "down", NAME, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--memory", default="512M")
    parser.add_argument("--image", type=Path, default=None)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args)
        return
    options = ["--reps", str(args.reps), "--memory", args.memory]
    reexec_in_namespace(__file__, NAMESPACE, f"{PREFIX}.1/24", options, args.image)


if __name__ == "__main__":
    main()

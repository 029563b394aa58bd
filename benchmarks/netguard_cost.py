"""What hpcvm-netguard's job isolation costs a VM's start: one `guard` call, with
isolation off against on with 3, 65 and 1,023 peers, as ratios to the call without it.

In a network namespace of its own (a bridge, one tap, nothing else), as root with
`--ifname` (the call a root VM's start makes; a user's passes the tap's descriptor
instead, the same work). Each round times every setting once, in an order that rotates
each round, so all see the same machine load; each round's ratio is a setting's time
over that round's time with isolation off. Prints the medians and each ratio's mean
with its 97% Student-t interval, and the conditions. The data path (a frame's trip
through the rules) is not timed here: docs/site.md says how it was measured and what.

    .venv/bin/python benchmarks/netguard_cost.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import conditions, interval, require_root

HELPER = Path(__file__).resolve().parents[1] / "src" / "hpcvm" / "data" / "hpcvm-netguard"
NS, BRIDGE, TAP = f"hpcvm-ngcost-{os.getpid()}", "br0", "ngcost0"
VMS = "10.97.0.0/24"
ME, MAC = "10.97.0.10", "52:54:00:97:00:10"
SETTINGS = {"off": 0, "on, 3 peers": 3, "on, 65 peers": 65, "on, 1023 peers": 1023}


def ip(*argv: str) -> None:
    subprocess.run(["ip", "-n", NS, *argv], check=True)


def guard(config: Path, peers: int) -> float:
    """One guard call's wall time, in seconds."""
    argv = ["ip", "netns", "exec", NS, str(HELPER), "guard", "--config", str(config)]
    argv += ["--ifname", TAP, "--mac", MAC, "--ip", ME]
    for k in range(peers):
        argv += ["--peer", f"10.97.{1 + k // 250}.{1 + k % 250}"]
    begin = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    return time.monotonic() - begin


def configs(directory: Path) -> dict[str, Path]:
    """The admin's config per setting (root's files, as the helper demands)."""
    made = {}
    for name, peers in SETTINGS.items():
        path = directory / f"{peers}.conf"
        ranges = f"range {VMS}\nrange 10.97.0.0/16\n"
        path.write_text(f"bridge {BRIDGE}\n{ranges}job-isolation {'on' if peers else 'off'}\n")
        path.chmod(0o644)
        made[name] = path
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds
    require_root()
    if not HELPER.exists():
        sys.exit(f"{HELPER} is not built: make all")
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        ip("link", "add", BRIDGE, "type", "bridge")
        ip("addr", "add", "10.97.0.1/16", "dev", BRIDGE)
        ip("link", "set", BRIDGE, "up")
        ip("tuntap", "add", "dev", TAP, "mode", "tap")
        ip("link", "set", TAP, "master", BRIDGE)
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            os.chmod(tmp, 0o755)
            times = measure(configs(Path(tmp)), rounds)
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=False)
    report(times, rounds)


def measure(paths: dict[str, Path], rounds: int) -> dict[str, list[float]]:
    names = list(SETTINGS)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(guard(paths[name], SETTINGS[name]))
    return times


def report(times: dict[str, list[float]], rounds: int) -> None:
    print(f"netguard guard call, {rounds} rounds; {conditions()}")
    for name, values in times.items():
        ratios = [t / off for t, off in zip(values, times["off"], strict=True)]
        median_ms = statistics.median(values) * 1000
        print(f"  {name:16} median {median_ms:6.1f} ms   ratio to off {interval(ratios)}")


if __name__ == "__main__":
    main()

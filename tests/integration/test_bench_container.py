"""The container environment is what it claims, checked from sources independent of
hpcvm: the OCI runtime's own ``state``, and, for the benchmark's process seen from the
host, the kernel's ``/proc/PID/status`` (CPUs and memory nodes allowed), its
``/proc/PID/cgroup`` and the cpuset files of that cgroup, and its mount namespace.

One container for the module (real runc or crun, whichever runs here), confined to the
last PU this process may use and that PU's memory node (read from sysfs, as a native
baseline would be). Then an ``hpcvm bench`` run of native and container with a small
command, read back from SQLite and against ``RUNTIME --version``; and a container whose
holder is killed with SIGKILL leaves no process behind.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.bench.envs.container import ContainerEnvironment
from hpcvm.bench.envs.environments import RunOutput
from hpcvm.host import discover
from hpcvm.runtime.oci import runtime as oci
from tests.runtime_support import hpcvm

pytestmark = pytest.mark.integration

SYS_CPU = Path("/sys/devices/system/cpu")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _node_of(pu: int) -> int:
    nodes = [p.name for p in (SYS_CPU / f"cpu{pu}").iterdir() if re.fullmatch(r"node\d+", p.name)]
    return int(nodes[0][4:]) if nodes else 0


def _runtime_present() -> None:
    if not any(r.program() for r in oci.RUNTIMES.values()):
        pytest.skip("no OCI runtime installed (scripts/setup.sh installs crun and runc)")
    if os.geteuid() != 0:
        pytest.skip("confining a container to PUs needs root, as the native cpuset does")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerEnvironment]:
    _runtime_present()
    pu = max(os.sched_getaffinity(0))
    made = ContainerEnvironment(
        discover(),
        cpus=(pu,),
        mems=(_node_of(pu),),
        shares=(),
        out_dir=tmp_path_factory.mktemp("container"),
    )
    made.start()
    try:
        yield made
    finally:
        made.close()
    assert made.container is None


def _state(env: ContainerEnvironment) -> dict[str, object]:
    """``RUNTIME --root ROOT state ID``, run here (not through hpcvm's Container)."""
    c = env.container
    assert c is not None
    out = subprocess.run(
        [c.program, "--root", str(oci.state_root()), "state", c.id],
        capture_output=True,
        text=True,
        check=True,
    )
    state: dict[str, object] = json.loads(out.stdout)
    return state


def _pid_ns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def _members(init: int) -> list[int]:
    """Host pids of the processes in the container's PID namespace but its first."""
    ns = _pid_ns(init)
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != init:
            try:
                if _pid_ns(int(entry)) == ns:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _status(pid: int, key: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def test_the_runtime_reports_it_running_with_its_bundle(env: ContainerEnvironment) -> None:
    state = _state(env)
    assert state["status"] == "running"
    init = int(str(state["pid"]))
    assert Path(f"/proc/{init}/cmdline").read_bytes().split(b"\0")[:2] == [b"/bin/sh", b"-c"]
    bundle = Path(str(state["bundle"]))
    config = json.loads((bundle / "config.json").read_text())
    assert config["linux"]["resources"]["cpu"] == {
        "cpus": str(env.cpus[0]),  # type: ignore[index]
        "mems": str(env.mems[0]),
    }
    assert "network" not in {n["type"] for n in config["linux"]["namespaces"]}


def test_the_benchmark_process_is_confined_and_contained(
    env: ContainerEnvironment, tmp_path: Path
) -> None:
    """A sample sleeping in the container is looked at from the host while it runs."""
    state = _state(env)
    init = int(str(state["pid"]))
    done: list[RunOutput] = []
    workdir = env.work / "probe"
    runner = threading.Thread(
        target=lambda: done.append(env.run(["/bin/sleep", "20"], workdir, 60.0)), daemon=True
    )
    runner.start()
    deadline = time.monotonic() + 30
    sleeping: list[int] = []
    while time.monotonic() < deadline and not sleeping:
        sleeping = [
            p for p in _members(init) if Path(f"/proc/{p}/comm").read_text().strip() == "sleep"
        ]
        time.sleep(0.1)
    assert sleeping, "the sample's process never showed up in the container's PID namespace"
    pid = sleeping[0]
    assert _status(pid, "Cpus_allowed_list") == str(env.cpus[0])  # type: ignore[index]
    assert _status(pid, "Mems_allowed_list") == str(env.mems[0])
    cpuset = next(
        line.split(":", 2)[2]
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        if ":cpuset:" in line or line.startswith("0::")
    )
    assert env.container is not None and env.container.id in cpuset
    for file, want in (("cpuset.cpus", env.cpus[0]), ("cpuset.mems", env.mems[0])):  # type: ignore[index]
        hierarchy = CGROUP_ROOT / "cpuset" if (CGROUP_ROOT / "cpuset").is_dir() else CGROUP_ROOT
        assert (hierarchy / cpuset.lstrip("/") / file).read_text().strip() == str(want)
    assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    assert os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")  # the host's
    runner.join(timeout=60)
    assert done and done[0].exit_code == 0


def test_it_sees_the_host_binaries_but_not_its_secrets(env: ContainerEnvironment) -> None:
    out = env.run(
        ["/bin/sh", "-c", "ls /usr/bin/mpirun.openmpi; cat /etc/shadow; hostname; ls /root"],
        env.work / "look",
        60.0,
    )
    assert "/usr/bin/mpirun.openmpi" in out.stdout
    assert "root:" not in out.stdout  # /etc/shadow is covered
    assert "hpcvm-container" in out.stdout
    assert "No such file" in out.stderr  # the host's /root is not there


def test_a_bench_run_records_the_runtime_and_leaves_nothing(tmp_path: Path) -> None:
    _runtime_present()
    out = tmp_path / "results"
    bench = hpcvm(
        "bench", "--env", "native", "--env", "container", "--reps", "2",
        "--cmd", "/bin/sh -c 'echo took 1.5 s'", "--metric", r"took ([0-9.]+) s",
        "--lower-is-better", "--out", str(out), timeout=600,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    db = sqlite3.connect(out / "hpcvm.db")
    kind, versions = db.execute(
        "SELECT kind, versions_json FROM environments WHERE name = 'container'"
    ).fetchone()
    assert kind == "container"
    runtime, version = json.loads(versions)["container_runtime"].split(" ", 1)
    said = subprocess.run([runtime, "--version"], capture_output=True, text=True).stdout
    assert re.search(rf"version {re.escape(version)}\b", said), (version, said)
    ok = db.execute(
        "SELECT COUNT(*) FROM samples s JOIN environments e ON e.id = s.env_id "
        "WHERE e.name = 'container' AND s.ok = 1 AND s.warmup = 0"
    ).fetchone()
    assert ok == (2,)
    assert runtime in bench.stdout  # the conditions table's runtime column
    assert not _ours_left(out)


def _ours_left(out: Path) -> list[str]:
    """Containers or bundles of this run still there (their bundle names the run's work)."""
    left = []
    bundles = oci.containers_dir() / "bundles"
    for bundle in bundles.glob(f"{oci.ID_PREFIX}*") if bundles.is_dir() else []:
        config = bundle / "config.json"
        if config.is_file() and str(out) in config.read_text():
            left.append(bundle.name)
    return left


HOLDER = """
import sys
from pathlib import Path
from hpcvm.bench.envs.container import ContainerEnvironment
env = ContainerEnvironment(None, cpus=None, mems=(), shares=(), out_dir=Path(sys.argv[1]))
env.start()
print(env.container.id, env.container.program, flush=True)
sys.stdin.read()
"""


def test_a_killed_holder_takes_its_container_with_it(tmp_path: Path) -> None:
    _runtime_present()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    cid, program = holder.stdout.readline().split()
    root = str(oci.state_root())
    init = json.loads(
        subprocess.run(
            [program, "--root", root, "state", cid], capture_output=True, text=True
        ).stdout
    )["pid"]
    holder.kill()
    holder.wait(timeout=30)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{init}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{init}").exists(), "the container outlived its holder"
    oci.sweep()  # what the next container's start does
    state = subprocess.run([program, "--root", root, "state", cid], capture_output=True, text=True)
    assert state.returncode != 0  # deleted
    assert not (oci.containers_dir() / "bundles" / cid).exists()

"""A batch system, a network kind and a NIC model from outside hpcvm, one module and one
registry call each (tests/data/plugins/hpcvm_demo_batch.py, hpcvm_demo_net.py,
hpcvm_demo_nic.py), loaded through HPCVM_PLUGINS by the real ``hpcvm`` command, carry a
whole cluster job: ``cluster up`` (each node's task started by the plugin's step, each
VM's NIC made by the plugin's kind as the plugin's model), ``ps``, ``exec``, ``verify``
of a node's VM and ``down``.

The demo batch system is a stand-in for a second host (it runs every "node" on this
machine, which is all one machine can offer); the demo network kind is QEMU's real
user-mode network. Oracles independent of hpcvm: QEMU's own command line in /proc (the
``-netdev user`` the kind chose, the ``-device`` of the model), the guest's own ``ip``
output, its sysfs (the driver bound to the NIC, the PCI device id of the model), its
hostname, and /proc for what is left afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.runtime.hostside import paths

pytestmark = pytest.mark.integration

PLUGINS = Path(__file__).resolve().parent.parent / "data" / "plugins"
HPCVM = str(Path(sys.executable).with_name("hpcvm"))
NAME = f"pl{os.getpid()}"


@pytest.fixture(scope="module")
def job_dir() -> Iterator[Path]:
    """A directory QEMU's unprivileged user can read (the guests see the job's)."""
    path = Path(tempfile.mkdtemp(prefix="hpcvm-plugins-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def hpcvm(job_dir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        HPCVM_PLUGINS="hpcvm_demo_batch,hpcvm_demo_net,hpcvm_demo_nic",
        PYTHONPATH=str(PLUGINS),
        DEMO_NODES="a,b",
        HPCVM_READY_TIMEOUT="240",
    )
    return subprocess.run(
        [HPCVM, *args], capture_output=True, text=True, env=env, cwd=job_dir, timeout=timeout
    )


def qemu_cmdlines(name: str) -> dict[str, list[str]]:
    """Live QEMUs of cluster ``name``, by VM name: their argv as the kernel has it."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        for vm in (f"{name}-a", f"{name}-b"):
            if argv and "qemu-system" in argv[0] and f"guest={vm}," in " ".join(argv):
                found[vm] = argv
    return found


# The guest's one NIC: the driver bound to its virtio device, and the PCI device id of
# the function carrying it (0x1041: virtio-net without the legacy interface).
NIC_PROBE = (
    "for n in /sys/class/net/*; do [ -e $n/device/driver ] || continue; "
    "basename $(readlink $n/device/driver); cat $n/device/../device; done"
)


@pytest.fixture(scope="module")
def cluster(job_dir: Path) -> Iterator[str]:
    up = hpcvm(
        job_dir, "cluster", "up", "--batch", "demo", "--name", NAME, "--profile", "pinned",
        "--vcpus", "1", "--memory", "256M", "--accel", "tcg",
        "--network", "demo-user=slirp,model=virtio-modern", "--address", "10.0.2.101/24",
        timeout=600,
    )  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield NAME
    finally:
        hpcvm(job_dir, "cluster", "down", NAME)


def test_the_plugin_batch_system_starts_a_vm_per_node(cluster: str, job_dir: Path) -> None:
    ps = hpcvm(job_dir, "cluster", "ps", cluster, "--json")
    assert ps.returncode == 0, ps.stderr
    seen = json.loads(ps.stdout)
    assert seen["job"].startswith("demo") and seen["holder"]
    nodes = {row["node"]: (row["vm"], row["event"], row["address"]) for row in seen["nodes"]}
    assert nodes == {
        "a": (f"{cluster}-a", "ready", "10.0.2.101/24"),
        "b": (f"{cluster}-b", "ready", "10.0.2.102/24"),
    }


def test_the_plugin_network_kind_wires_each_vm(cluster: str, job_dir: Path) -> None:
    cmdlines = qemu_cmdlines(cluster)
    assert sorted(cmdlines) == [f"{cluster}-a", f"{cluster}-b"]
    for argv in cmdlines.values():
        netdevs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-netdev"]
        assert netdevs == ["user,id=net0,net=10.0.2.0/24"], argv
        devices = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-device"]
        nics = [d for d in devices if "netdev=net0" in d]
        assert len(nics) == 1 and nics[0].startswith("virtio-net-pci-non-transitional,"), argv
    out = hpcvm(job_dir, "cluster", "exec", cluster, "--", "sh", "-c", "hostname; ip -br addr")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == f"{cluster}-a"
    assert "10.0.2.101/24" in out.stdout
    seen = hpcvm(job_dir, "exec", f"{cluster}-b", "--", "sh", "-c", NIC_PROBE)
    assert seen.returncode == 0, seen.stderr
    # the plugin's model as the guest sees it: virtio_net bound, modern-only device id
    assert seen.stdout.split() == ["virtio_net", "0x1041"], seen.stdout
    verify = hpcvm(job_dir, "verify", f"{cluster}-b")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_down_through_the_plugins_leaves_nothing(cluster: str, job_dir: Path) -> None:
    """Last in the module: takes the module's cluster down (the fixture then finds it
    gone)."""
    down = hpcvm(job_dir, "cluster", "down", cluster)
    assert down.returncode == 0, down.stderr
    assert "a: " in down.stderr and "b: " in down.stderr
    assert qemu_cmdlines(cluster) == {}
    root = paths.runtime_root()
    assert sorted(p.name for p in root.glob(f"{cluster}-*")) == []
    assert not (root / ".clusters" / cluster).exists()

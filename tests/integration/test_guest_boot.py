"""The built-in guest booted by a real QEMU under TCG, driven through GuestAgent.

QEMU is started here with a minimal hand-written command line and share table (not the
renderer), so
these tests say whether the image and the agent client work, independently of the
rest of hpcvm. The image is the real one: ``build_guest()`` with the distribution
kernel package (downloaded once into hpcvm's cache).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcvm.bootspec import SHARE_TABLE_FWCFG
from hpcvm.errors import RuntimeFailure
from hpcvm.guest import GuestImage, build_guest
from hpcvm.runtime.channels.agent import GuestAgent

pytestmark = pytest.mark.integration

BOOT_TIMEOUT = 180.0  # shared, loaded machine under TCG; a boot takes ~6 s when idle
EXIT_TIMEOUT = 60.0
NO_AGENT_WAIT = 5.0  # a VM without the agent's port: any wait ends in the timeout tested
HOSTNAME = "guesttest"


@pytest.fixture(scope="session")
def guest_image() -> GuestImage:
    image = build_guest()
    print(f"\nguest image: {image.size_bytes} bytes, built in {image.build_seconds:.1f} s")
    return image


SYSTEM = ("/usr", "/etc")  # shared read-only; /bin, /lib... are links into /usr here


def share_table(shared: Path) -> str:
    """The share table, written by hand from the format in render/model.py: the host's
    top-level links, /usr and /etc read-only (shadow hidden), ``shared`` writable."""
    links = [p for p in ("/bin", "/sbin", "/lib", "/lib64") if os.path.islink(p)]
    lines = [f"link {os.readlink(p)} {p}" for p in links]
    lines += ["ro t0 /usr", "hide t1 shadow", "ro t1 /etc", f"rw t2 {shared}"]
    return "".join(f"{line}\n" for line in lines)


def qemu_argv(
    image: GuestImage, tmp: Path, *, agent: bool = True, share: bool = True, cpus: int = 2
) -> list[str]:
    argv = [
        "qemu-system-x86_64",
        "-accel", "tcg,thread=multi",
        "-cpu", "max",
        "-m", "1G",
        "-smp", str(cpus),
        "-nodefaults",
        "-display", "none",
        "-no-reboot",
        "-kernel", str(image.kernel),
        "-initrd", str(image.initrd),
        "-append", f"{image.cmdline} hpcvm.hostname={HOSTNAME}",
        "-serial", f"file:{tmp / 'console.log'}",
        # one NIC (no network behind it): its driver is loaded, other NICs' are not
        "-nic", "none", "-device", "e1000,id=nic0",
    ]  # fmt: skip
    if share:
        shared = tmp / "shared"
        shared.mkdir(exist_ok=True)
        exports = [(p, ",readonly=on") for p in SYSTEM] + [(str(shared), "")]
        for index, (path, mode) in enumerate(exports):
            fsdev = f"local,id=fs{index},path={path},security_model=none{mode},multidevs=remap"
            argv += [
                "-fsdev", fsdev,
                "-device", f"virtio-9p-pci,fsdev=fs{index},mount_tag=t{index}",
            ]  # fmt: skip
        table = share_table(shared).replace(",", ",,")
        argv += ["-fw_cfg", f"name={SHARE_TABLE_FWCFG},string={table}"]
    if agent:
        argv += [
            "-chardev", f"socket,id=qga,path={tmp / 'agent.sock'},server=on,wait=off",
            "-device", "virtio-serial-pci",
            "-device", f"virtserialport,chardev=qga,name={image.agent_port_name}",
        ]  # fmt: skip
    return argv


@dataclass
class Vm:
    proc: subprocess.Popen[bytes]
    tmp: Path
    started: float

    @property
    def socket(self) -> Path:
        return self.tmp / "agent.sock"

    @property
    def console(self) -> Path:
        return self.tmp / "console.log"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def agent(self) -> GuestAgent:
        return GuestAgent(self.socket, timeout=60.0, console_log=self.console)


def start_vm(image: GuestImage, tmp: Path, *, agent: bool = True) -> Vm:
    started = time.monotonic()
    proc = subprocess.Popen(
        qemu_argv(image, tmp, agent=agent),
        stdin=subprocess.DEVNULL,
        stdout=(tmp / "qemu.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    return Vm(proc, tmp, started)


def stop_vm(vm: Vm) -> None:
    if vm.alive():
        vm.proc.kill()
    vm.proc.wait(timeout=EXIT_TIMEOUT)
    with contextlib.suppress(FileNotFoundError):
        vm.socket.unlink()


def qemu_processes_using(path: Path) -> list[int]:
    """Live QEMU processes whose command line mentions ``path``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if b"qemu-system" in cmdline and str(path).encode() in cmdline and state != "Z":
                found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def vm(guest_image: GuestImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vm]:
    """One booted guest for the tests of this module; the last test shuts it down."""
    tmp = tmp_path_factory.mktemp("guestvm")
    machine = start_vm(guest_image, tmp)
    try:
        agent = machine.agent()
        try:
            agent.wait_ready(time.monotonic() + BOOT_TIMEOUT, machine.alive)
            first = agent.exec(["/usr/bin/nproc"])
        finally:
            agent.close()
        took = time.monotonic() - machine.started
        print(f"\nQEMU start to first exec answer: {took:.1f} s")
        assert took < 60.0
        assert first.stdout.strip() == "2"
        yield machine
    finally:
        stop_vm(machine)
        assert qemu_processes_using(tmp) == []


def run(vm: Vm, argv: list[str], **kwargs: object) -> tuple[int, str, str]:
    with vm.agent() as agent:
        result = agent.exec(argv, timeout=120.0, **kwargs)  # type: ignore[arg-type]
    return result.exit_code, result.stdout, result.stderr


def test_guest_sees_two_cpus(vm: Vm) -> None:
    assert run(vm, ["/usr/bin/nproc"]) == (0, "2\n", "")


def test_cmdline_is_the_images(vm: Vm, guest_image: GuestImage) -> None:
    code, out, _ = run(vm, ["cat", "/proc/cmdline"])
    assert code == 0
    assert out.split() == [*guest_image.cmdline.split(), f"hpcvm.hostname={HOSTNAME}"]


def test_guest_runs_the_images_kernel_and_hostname(vm: Vm, guest_image: GuestImage) -> None:
    assert run(vm, ["uname", "-r"])[1].strip() == guest_image.kernel_version
    assert run(vm, ["hostname"])[1].strip() == HOSTNAME


def test_root_is_tmpfs_and_read_only_shares_are_writable_overlays(vm: Vm) -> None:
    name = f"/usr/hpcvm-guest-test-{uuid.uuid4().hex}"
    code, out, err = run(vm, ["sh", "-c", f"echo written > {name} && cat {name}"])
    assert (code, out, err) == (0, "written\n", "")
    assert not Path(name).exists()  # the host's /usr did not get it
    code, out, _ = run(vm, ["sh", "-c", "awk '{print $2, $3}' /proc/mounts"])
    mounts = set(out.splitlines())
    assert {"/ tmpfs", "/usr overlay", "/etc overlay", f"{vm.tmp / 'shared'} 9p"} <= mounts


def test_only_the_table_is_there(vm: Vm) -> None:
    """What the table does not list is absent; what it hides is gone; links are the
    host's."""
    code, out, _ = run(vm, ["ls", "-A", "/"])
    assert code == 0
    expected = {"usr", "etc", "proc", "sys", "dev", "run", "tmp", "var", "root"}
    expected |= {p.strip("/") for p in ("/bin", "/sbin", "/lib", "/lib64") if os.path.islink(p)}
    expected.add(str(vm.tmp).split("/")[1])  # the shared directory's top level
    assert set(out.split()) == expected
    assert run(vm, ["ls", "-A", "/var", "/root"])[1].split() == ["/root:", "/var:", "tmp"]
    assert run(vm, ["test", "-e", "/etc/shadow"])[0] == 1
    assert run(vm, ["test", "-e", "/etc/passwd"])[0] == 0
    assert run(vm, ["readlink", "/bin"])[1].strip() == (
        os.readlink("/bin") if os.path.islink("/bin") else ""
    )


def test_writable_share_writes_through_to_the_host(vm: Vm) -> None:
    target = vm.tmp / "shared" / "from-guest.txt"
    assert run(vm, ["sh", "-c", f"echo hello > {target}"])[0] == 0
    assert target.read_text() == "hello\n"


def test_host_programs_run_in_the_guest(vm: Vm) -> None:
    code, out, _ = run(vm, ["numactl", "--hardware"])
    assert code == 0 and out.startswith("available: 1 nodes")
    code, out, _ = run(vm, ["python3", "-c", "import sys; print(sys.version_info[0])"])
    assert (code, out) == (0, "3\n")


def test_exit_code_stderr_and_stdin_pass_through(vm: Vm) -> None:
    assert run(vm, ["sh", "-c", "echo oops >&2; exit 42"]) == (42, "", "oops\n")
    assert run(vm, ["false"])[0] == 1
    assert run(vm, ["tr", "a-z", "A-Z"], input=b"hello\n") == (0, "HELLO\n", "")


def test_guest_has_loopback_and_pseudo_filesystems(vm: Vm) -> None:
    code, out, _ = run(vm, ["cat", "/sys/class/net/lo/operstate"])
    assert code == 0 and out.strip() in ("unknown", "up")
    code, out, _ = run(vm, ["sh", "-c", "awk '{print $2, $3}' /proc/mounts"])
    mounts = set(out.splitlines())
    for expected in ("/proc proc", "/sys sysfs", "/dev devtmpfs", "/dev/pts devpts"):
        assert expected in mounts
    assert run(vm, ["stat", "-c", "%a", "/tmp", "/var/tmp"])[1].split() == ["1777", "1777"]


def test_only_the_drivers_of_present_devices_are_loaded(vm: Vm) -> None:
    """The VM has virtio-9p, virtio-serial and an e1000 NIC, no disk and no virtio NIC:
    /proc/modules (the guest kernel's own list) holds e1000 and the virtio and 9p
    modules every guest needs, none of the other device drivers the image carries."""
    code, out, _ = run(vm, ["cat", "/proc/modules"])
    loaded = {line.split()[0] for line in out.splitlines()}
    assert code == 0
    assert {"virtio_pci", "virtio_console", "9p", "9pnet_virtio", "overlay", "e1000"} <= loaded
    absent = {"virtio_net", "net_failover", "failover", "virtio_blk", "iavf", "ixgbevf"}
    assert not absent & loaded


def test_unshared_host_directory_is_absent(vm: Vm, tmp_path: Path) -> None:
    """Only the table's directories are there: a host file outside them is not."""
    probe = tmp_path / "host-file.txt"
    probe.write_text("from the host\n")
    assert run(vm, ["cat", str(probe)])[0] != 0


def unread_replies(sock: socket.socket, count: int, timeout: float = 60.0) -> None:
    """Wait (a bounded poll, peeking: nothing is read) until ``count`` whole replies
    (qemu-ga ends each with a newline) wait in ``sock``."""
    deadline = time.monotonic() + timeout
    waiting = b""
    while waiting.count(b"\n") < count:
        assert time.monotonic() < deadline, f"{count} replies not there in {timeout} s: {waiting!r}"
        time.sleep(0.05)
        with contextlib.suppress(BlockingIOError):
            waiting = sock.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT)


def test_stale_replies_from_a_departed_client_are_skipped(vm: Vm) -> None:
    """Commands sent by a client that left without reading (and half a command) must
    not desynchronise the next client: this only happens over virtio-serial."""
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(str(vm.socket))
    for i in range(5):
        raw.sendall(json.dumps({"execute": "guest-sync", "arguments": {"id": i}}).encode())
    raw.sendall(b'{"execute": "guest-info"}\n{"execute": "guest-ping"')
    unread_replies(raw, 6)  # the five syncs' and guest-info's, left unread
    raw.close()
    assert run(vm, ["echo", "in step"]) == (0, "in step\n", "")


def test_zz_guest_shutdown_stops_qemu(vm: Vm) -> None:
    """Last in this module: powers the guest off through qemu-ga."""
    with vm.agent() as agent:
        agent.shutdown()
    vm.proc.wait(timeout=EXIT_TIMEOUT)
    assert vm.proc.returncode == 0
    vm.socket.unlink(missing_ok=True)  # QEMU removes it on a clean exit; make sure
    assert not vm.socket.exists()
    assert qemu_processes_using(vm.tmp) == []
    assert "Power down" in vm.console.read_text(errors="replace")


# -- failures -----------------------------------------------------------------------------


def test_agent_on_a_vm_without_agent_device_times_out_naming_the_log(
    guest_image: GuestImage, tmp_path: Path
) -> None:
    machine = start_vm(guest_image, tmp_path, agent=False)
    try:
        agent = machine.agent()
        begin = time.monotonic()
        with pytest.raises(RuntimeFailure) as info:
            agent.wait_ready(begin + NO_AGENT_WAIT, machine.alive)
        assert time.monotonic() - begin < NO_AGENT_WAIT + 10.0
        message = str(info.value)
        assert str(machine.console) in message and "\n" not in message
        assert machine.alive()  # it was the agent that was missing, not the VM
    finally:
        stop_vm(machine)
    assert qemu_processes_using(tmp_path) == []


def test_agent_on_a_vm_that_dies_fails_at_once(guest_image: GuestImage, tmp_path: Path) -> None:
    """A guest without its share table powers itself off; wait_ready sees QEMU go.

    One vCPU: what is tested is the host noticing QEMU's end, and in one CI run (of
    2481 tests) this guest, booted with two vCPUs under multi-threaded TCG on a loaded
    2-core machine, had neither powered off nor answered after 180 s; a hang like that
    now names the console's last line (runtime/channels/agent.py)."""
    proc = subprocess.Popen(
        qemu_argv(guest_image, tmp_path, share=False, cpus=1),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    machine = Vm(proc, tmp_path, time.monotonic())
    try:
        with pytest.raises(RuntimeFailure, match="before the VM stopped"):
            machine.agent().wait_ready(time.monotonic() + BOOT_TIMEOUT, machine.alive)
        log = machine.console.read_text(errors="replace")
        assert "no share table" in log
    finally:
        stop_vm(machine)
    assert qemu_processes_using(tmp_path) == []

"""The libvirt backend: the plan's domain defined and started through libvirt-python.

libvirt does the pinning itself (``cputune`` in the rendered XML), so the runtime only
reads the affinities back (``pins_itself``). The domain XML comes from
``render.libvirt.libvirt_xml``; this module adds only what depends on the libvirtd it
talks to, not on the plan (see ``domain_xml``):

- QEMU never runs as root. The domain keeps libvirt's own DAC label: QEMU runs as
  qemu.conf's ``user``/``group`` (``libvirt-qemu`` on Debian) and, with qemu.conf's
  ``dynamic_ownership`` (on by default), libvirt gives that user the kernel, initrd,
  logs and its own per-domain files for the guest's lifetime. ``qemu_user`` reads that
  user back from libvirt's capabilities and refuses to start a guest when it is root.
  libvirt also applies its seccomp sandbox (qemu.conf ``seccomp_sandbox``, on by
  default): ``-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,
  resourcecontrol=deny``. libvirt's QEMU opens the shared directories itself, as that
  user, so each must be reachable by it (checked before start, runtime/hostside/shares.py).
- Guest RAM on huge pages uses ``<source type='memfd'/>`` (memory-backend-memfd with
  hugetlb=on): libvirtd learns hugetlbfs mounts only when it starts, so a mount made by
  hpcvm after that (runtime/hostside/hugetlbfs.py) is invisible to it and the domain would be
  refused with "hugetlbfs filesystem is not mounted". memfd needs no mount at all.
- A ``<metadata>`` element records the VM's run directory: ``stop`` destroys only a
  domain that names this VM's directory, never another session's domain of the same name.

The agent channel: libvirtd itself connects to any virtio channel named
``org.qemu.guest_agent.0`` (for ``virsh qemu-agent-command``) and keeps that one-client
socket, so hpcvm's own agent client then waits forever (seen here: ``up`` got through
while the guest was still booting, every later ``exec`` timed out). The built-in guest
therefore gets a port of hpcvm's own name (``AGENT_PORT``, passed to its init as
``hpcvm.agent=``) which libvirtd leaves alone. The socket is created by libvirtd (root)
inside the 0700 run directory and made 0600 after start.

Domains are named ``hpcvm-<name>`` so they never collide with a user's own domains.
Under TCG (``type='qemu'``) libvirt passes ``-accel tcg``; QEMU 7.2 runs x86 guests on
x86 hosts with one thread per vCPU (MTTCG) by default, which is what makes per-vCPU
pinning meaningful (each vCPU shows as its own ``CPU n/TCG`` thread).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Literal

from hpcvm import procs
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.host.privilege import for_admin
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.hostside.confine import (
    QemuUser,
    blocking_parent,
    can_search,
    describe_mode,
    user_by_ids,
)
from hpcvm.runtime.machine import state
from hpcvm.runtime.machine.model import Machine
from hpcvm.runtime.net import network

DEFAULT_URI = "qemu:///system"
LIBVIRT_AGENT_PORT = "org.qemu.guest_agent.0"  # libvirtd connects to this one itself
AGENT_PORT = "org.hpcvm.guest_agent.0"  # not libvirt's agent name: libvirtd leaves it alone
BUILTIN_MARKER = "hpcvm.shares="  # the built-in guest's init reads hpcvm.* arguments
DOMAIN_PREFIX = "hpcvm-"
METADATA_NS = "https://hpcvm.invalid/libvirt/1"
SYSTEM_PID_DIR = Path("/run/libvirt/qemu")
SYSTEM_LOG_DIR = Path("/var/log/libvirt/qemu")
_POLL = 0.05


def domain_name(machine: Machine) -> str:
    """The libvirt domain of ``machine``: its name with hpcvm's prefix."""
    return f"{DOMAIN_PREFIX}{machine.name}"


def with_private_agent_port(machine: Machine) -> Machine:
    """``machine`` with the built-in guest's agent on ``AGENT_PORT`` (module doc).

    Only the built-in guest's init understands ``hpcvm.agent=``; a disk image's
    qemu-guest-agent insists on the standard name, so its boot spec is unchanged.
    """
    boot = machine.boot
    cmdline = boot.cmdline or ""
    if BUILTIN_MARKER not in cmdline or boot.agent_port_name == AGENT_PORT:
        return machine
    update = {"agent_port_name": AGENT_PORT, "cmdline": f"{cmdline} hpcvm.agent={AGENT_PORT}"}
    return machine.model_copy(update={"boot": boot.model_copy(update=update)})


def _refuse_grabbed_agent(machine: Machine) -> None:
    """A guest whose agent must keep libvirt's agent name (a disk image's qemu-ga) would
    only time out: libvirtd holds that channel. Say so before anything starts."""
    if machine.boot.agent_socket and machine.boot.agent_port_name == LIBVIRT_AGENT_PORT:
        raise UsageError(
            "--image with --backend libvirt is not supported yet: libvirtd takes the "
            f"image's guest agent channel ({LIBVIRT_AGENT_PORT}); use --backend qemu"
        )


def one_line(text: str) -> str:
    """libvirt messages span lines (QEMU's stderr is appended); keep them on one."""
    return " | ".join(part.strip() for part in text.splitlines() if part.strip())


def _libvirt() -> Any:
    """libvirt-python, with its default error printer silenced (we raise instead)."""
    try:
        import libvirt
    except ImportError as exc:  # pragma: no cover - installed with hpcvm
        raise RuntimeFailure(
            "libvirt-python is not installed: pip install libvirt-python (or use --backend qemu)"
        ) from exc
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    return libvirt


def _error_text(exc: Exception) -> str:
    message = exc.get_error_message() if hasattr(exc, "get_error_message") else None
    text = one_line(str(message or exc))
    if "virtlogd-sock" in text:
        text += f"; {_reach_virtlogd()}"
    return text


def _reach_virtlogd() -> str:
    """libvirtd answers but cannot start a domain without its log daemon (virtlogd),
    which may have died or never been started where there is no systemd."""
    if os.geteuid() == 0:
        return "start virtlogd (`virtlogd -d`, or `systemctl start virtlogd`)"
    return "ask your admin to start virtlogd (`systemctl start virtlogd`)"


# -- the domain XML ---------------------------------------------------------------------


def domain_xml(machine: Machine) -> str:
    """The rendered domain for ``machine``, adapted to libvirtd as the module doc says."""
    from hpcvm.render.libvirt import libvirt_xml  # the renderer owns the domain

    root = ET.fromstring(libvirt_xml(machine.plan, machine.boot))
    name = root.find("name")
    if name is None:
        raise RuntimeFailure("the rendered libvirt domain has no <name>")
    name.text = domain_name(machine)
    _add_metadata(root, machine)
    _use_memfd_for_hugepages(root)
    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def _add_metadata(root: ET.Element, machine: Machine) -> None:
    metadata = root.find("metadata")
    if metadata is None:
        metadata = ET.Element("metadata")
        after_name = [child.tag for child in root].index("name") + 1
        root.insert(after_name, metadata)
    ET.register_namespace("hpcvm", METADATA_NS)
    ET.SubElement(metadata, f"{{{METADATA_NS}}}machine", name=machine.name, run_dir=machine.run_dir)


def _use_memfd_for_hugepages(root: ET.Element) -> None:
    backing = root.find("memoryBacking")
    if backing is None or backing.find("hugepages") is None or backing.find("source") is not None:
        return
    source = ET.Element("source", type="memfd")
    # Schema order: hugepages, nosharepages, locked, source, access, allocation, discard.
    allocation = backing.find("allocation")
    index = list(backing).index(allocation) if allocation is not None else len(backing)
    backing.insert(index, source)


def dac_user(capabilities: str) -> QemuUser:
    """The user libvirt runs QEMU as: the DAC ``baselabel`` (``+uid:+gid``) in its
    capabilities XML. UsageError when it is root or libvirt has no DAC driver."""
    try:
        root = ET.fromstring(capabilities)
    except ET.ParseError as exc:
        raise RuntimeFailure(f"libvirt's capabilities are not XML: {exc}") from exc
    for model in root.iterfind("host/secmodel"):
        label = model.find("baselabel")
        if model.findtext("model") != "dac" or label is None or not label.text:
            continue
        uid_text, _, gid_text = label.text.partition(":")
        uid, gid = int(uid_text.lstrip("+")), int(gid_text.lstrip("+"))
        if uid == 0:
            break
        return user_by_ids(uid, gid, switch=True)
    fix = for_admin(
        'set user and group in /etc/libvirt/qemu.conf (Debian: user = "libvirt-qemu") and '
        "restart libvirtd"
    )
    raise UsageError(
        f"libvirt would run QEMU as root (no DAC user in its capabilities): {fix}, or use "
        "--backend qemu"
    )


def _reach_libvirt() -> str:
    """The fix for a libvirtd that does not answer: root starts it; a user asks the
    admin to start it or to let them use it (polkit or the socket's group)."""
    if os.geteuid() == 0:
        return "start libvirtd (`libvirtd -d`)"
    return (
        "ask your admin to start libvirtd or to let you use it (the libvirt group), "
        "or use --backend qemu"
    )


def let_qemu_reach(run_dir: Path, user: QemuUser) -> None:
    """A disk image boots through an overlay and a seed in the VM's run dir: libvirt
    gives both files to its QEMU user for the guest's lifetime (``dynamic_ownership``),
    but that user must also be able to search the run dir. Its group gets search, not
    read (mode 0710: no listing; the sockets stay 0600). UsageError, before anything
    starts, when a parent of the run dir keeps it out."""
    if not user.switch:
        return
    os.chown(run_dir, -1, user.gid)
    run_dir.chmod(0o710)
    if not can_search(str(run_dir), user):
        blocker = blocking_parent(str(run_dir), user)
        raise UsageError(
            f"libvirt's QEMU runs as {user.name}, which cannot reach the VM's run directory "
            f"{run_dir} ({blocker} is {describe_mode(blocker)}): set {paths.ENV_RUNTIME_DIR} "
            f"to a directory it can search, or use --backend qemu"
        )


def owner_run_dir(xml: str) -> str | None:
    """The run directory a domain's metadata names (None: not an hpcvm domain)."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return None
    found = root.find(f"metadata/{{{METADATA_NS}}}machine")
    return None if found is None else found.get("run_dir")


# -- host-side facts about libvirt's QEMU ----------------------------------------------


def read_pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def find_qemu_pid(domain: str) -> int | None:
    """The pid of the QEMU whose ``-name guest=<domain>`` matches (any URI's libvirtd)."""
    wanted = f"guest={domain},".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for i, arg in enumerate(argv[:-1]):
            if arg == b"-name" and argv[i + 1].startswith(wanted):
                return int(entry.name)
    return None


def libvirt_log(domain: str) -> Path:
    return SYSTEM_LOG_DIR / f"{domain}.log"


def log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(libvirt's log is not readable)"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) if kept else "(empty log)"


# -- the backend ------------------------------------------------------------------------


class LibvirtBackend:
    """Backend protocol implementation over a libvirt connection (runtime/machine/model.py)."""

    name: str = "libvirt"
    pins_itself = True  # cputune: libvirt pins; the runtime only reads affinities back
    opens_shares_as_root = False  # libvirt's QEMU opens shares as its DAC user
    confines_itself = True  # its DAC label and qemu.conf's seccomp_sandbox
    private_hugetlbfs = False  # libvirt makes (and removes) QEMU's hugetlbfs files itself
    nics_by_daemon = True  # libvirtd makes, enslaves and removes taps and macvtaps

    def __init__(self, uri: str | None = None) -> None:
        self.uri = uri or DEFAULT_URI
        self._conn: Any = None

    # -- connection -------------------------------------------------------------------

    def connection(self) -> Any:
        """The libvirt connection, opened on first use."""
        if self._conn is None:
            libvirt = _libvirt()
            try:
                self._conn = libvirt.open(self.uri)
            except libvirt.libvirtError as exc:
                raise RuntimeFailure(
                    f"cannot connect to libvirt at {self.uri}: {_error_text(exc)}; "
                    f"{_reach_libvirt()}, or pass another --connect URI"
                ) from exc
        return self._conn

    def _lookup(self, machine: Machine) -> Any | None:
        libvirt = _libvirt()
        try:
            return self.connection().lookupByName(domain_name(machine))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise RuntimeFailure(
                f"libvirt cannot look up domain {domain_name(machine)}: {_error_text(exc)}"
            ) from exc

    def _domain(self, machine: Machine) -> Any:
        dom = self._lookup(machine)
        if dom is None:
            raise RuntimeFailure(
                f"libvirt has no domain {domain_name(machine)} for VM {machine.name} "
                f"(at {self.uri}); `hpcvm ps` cleans stale records"
            )
        return dom

    def _call(self, what: str, func: Any, *args: Any) -> Any:
        """Run a libvirt call; a libvirtError becomes a one-line RuntimeFailure."""
        libvirt = _libvirt()
        try:
            return func(*args)
        except libvirt.libvirtError as exc:
            raise RuntimeFailure(f"libvirt could not {what}: {_error_text(exc)}") from exc

    def qemu_user(self) -> QemuUser:
        """Who libvirt's QEMU runs as (its DAC label); never root (see ``dac_user``)."""
        caps = self._call("read the host capabilities", self.connection().getCapabilities)
        return dac_user(str(caps))

    # -- start ------------------------------------------------------------------------

    def start(self, machine: Machine) -> Machine:
        """Define the domain and start it (paused when the boot spec says so); return
        ``machine`` with libvirt's QEMU pid. The definition is removed if start fails."""
        if not machine.plan.host_thp:
            raise UsageError(
                f"{machine.name}: guest RAM on the host's 4K pages needs QEMU started without "
                "transparent huge pages, which libvirt cannot do: use the qemu backend"
            )
        libvirt = _libvirt()
        name = domain_name(machine)
        machine = with_private_agent_port(machine)
        _refuse_grabbed_agent(machine)
        self._refuse_existing(machine)
        if machine.boot.disk_image or machine.boot.seed_image:
            let_qemu_reach(Path(machine.run_dir), self.qemu_user())
        xml = domain_xml(machine)
        conn = self.connection()
        dom = self._call(f"define domain {name}", conn.defineXML, xml)
        flags = libvirt.VIR_DOMAIN_START_PAUSED if machine.boot.paused else 0
        try:
            self._call(f"start domain {name}", dom.createWithFlags, flags)
            pid = self._pid(machine, dom)
            # libvirt makes and enslaves a bridge NIC's tap; what it does not (a VF's
            # MAC) is done here, while the guest is still paused.
            network.attach_nics(machine.boot.nics, by_daemon=True)
        except BaseException:
            self._remove(dom)
            raise
        for sock in (machine.boot.agent_socket, machine.boot.done_socket):
            if sock:
                paths.make_private(Path(sock))
        return machine.model_copy(update={"pid": pid, "connect_uri": self.uri})

    def _refuse_existing(self, machine: Machine) -> None:
        dom = self._lookup(machine)
        if dom is None:
            return
        owner = owner_run_dir(self._call("read a domain's XML", dom.XMLDesc, 0))
        whose = "this VM's stale definition" if owner == machine.run_dir else "not this VM's"
        raise RuntimeFailure(
            f"libvirt domain {domain_name(machine)} already exists ({whose}): choose another "
            f"--name, or remove it with `virsh -c {self.uri} destroy/undefine "
            f"{domain_name(machine)}`"
        )

    def _pid(self, machine: Machine, dom: Any) -> int:
        """libvirt's QEMU pid: its pid file for a local system daemon, else the process
        whose ``-name guest=`` is the domain."""
        name = domain_name(machine)
        pid = read_pidfile(SYSTEM_PID_DIR / f"{name}.pid") if self._system() else None
        if pid is None or not procs.pid_alive(pid, reap=True):
            pid = find_qemu_pid(name)
        if pid is None:
            raise RuntimeFailure(
                f"libvirt started domain {name} but its QEMU process was not found on this "
                f"host (is {self.uri} a remote libvirtd?)",
                cause="qemu",
            )
        return pid

    def _system(self) -> bool:
        return self.uri.startswith("qemu:///system")

    # -- queries ----------------------------------------------------------------------

    def vcpu_threads(self, machine: Machine) -> dict[int, int]:
        """vCPU index -> host thread id, from QEMU's query-cpus-fast through libvirt."""
        reply = self.monitor(machine, "query-cpus-fast")
        return {int(c["cpu-index"]): int(c["thread-id"]) for c in reply}

    def qmp(
        self, machine: Machine, command: str, arguments: dict[str, object] | None = None
    ) -> Any:
        return self.monitor(machine, command, arguments)

    def monitor(
        self, machine: Machine, command: str, arguments: dict[str, object] | None = None
    ) -> Any:
        """One QMP command through libvirt's monitor (libvirt owns the QMP socket)."""
        import libvirt_qemu  # type: ignore[import-untyped]

        dom = self._domain(machine)
        request: dict[str, object] = {"execute": command}
        if arguments:
            request["arguments"] = arguments
        text = self._call(
            f"run {command} on domain {domain_name(machine)}",
            libvirt_qemu.qemuMonitorCommand,
            dom,
            json.dumps(request),
            0,
        )
        reply = json.loads(text)
        if "return" not in reply:
            raise RuntimeFailure(
                f"QEMU refused {command}: {reply.get('error', reply)}", cause="qemu"
            )
        return reply["return"]

    def alive(self, machine: Machine) -> bool:
        """Whether the record's QEMU still runs (from /proc: works without libvirtd)."""
        return state.machine_process_alive(machine)[0]

    def status(self, machine: Machine) -> Literal["running", "paused"]:
        libvirt = _libvirt()
        dom = self._domain(machine)
        current, _reason = self._call("read the domain state", dom.state)
        return "paused" if current == libvirt.VIR_DOMAIN_PAUSED else "running"

    def exit_code(self, machine: Machine) -> int | None:
        return None  # libvirtd reaps its QEMU: the code is in its log, not here

    def death_message(self, machine: Machine) -> str:
        """One line for a QEMU that died under libvirt: its log's tail."""
        log = libvirt_log(domain_name(machine))
        return (
            f"QEMU (pid {machine.pid}) of libvirt domain {domain_name(machine)} exited: "
            f"{log_tail(log)} (log: {log})"
        )

    def pause(self, machine: Machine) -> None:
        dom = self._domain(machine)
        self._call(f"suspend domain {domain_name(machine)}", dom.suspend)

    def resume(self, machine: Machine) -> None:
        dom = self._domain(machine)
        self._call(f"resume domain {domain_name(machine)}", dom.resume)

    # -- stop -------------------------------------------------------------------------

    def stop(self, machine: Machine, *, timeout: float) -> None:
        """SIGTERM through libvirt (graceful destroy), a forced destroy after
        ``timeout``, then undefine (with NVRAM, managed save and snapshot metadata) and
        remove the agent socket. A same-named domain of another run dir is left alone."""
        dom = self._lookup(machine)
        if dom is not None:
            owner = owner_run_dir(self._call("read a domain's XML", dom.XMLDesc, 0))
            if owner != machine.run_dir:
                raise RuntimeFailure(
                    f"libvirt domain {domain_name(machine)} belongs to {owner or 'no hpcvm VM'}"
                    f", not to {machine.run_dir}: left alone"
                )
            self._destroy(dom, timeout)
            self._remove(dom)
        if machine.pid is not None and self.alive(machine):
            raise RuntimeFailure(
                f"QEMU pid {machine.pid} of VM {machine.name} still runs after libvirt "
                "destroyed its domain",
                cause="qemu",
            )
        for sock in (machine.boot.agent_socket, machine.boot.done_socket):
            if sock:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(sock)

    def _destroy(self, dom: Any, timeout: float) -> None:
        libvirt = _libvirt()
        if not self._call("read the domain state", dom.isActive):
            return
        with contextlib.suppress(libvirt.libvirtError):
            dom.destroyFlags(libvirt.VIR_DOMAIN_DESTROY_GRACEFUL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if not dom.isActive():
                    return
            except libvirt.libvirtError:
                return
            time.sleep(_POLL)
        with contextlib.suppress(libvirt.libvirtError):
            dom.destroy()
        if self._call("read the domain state", dom.isActive):
            raise RuntimeFailure(f"libvirt could not destroy domain {dom.name()}")

    def _remove(self, dom: Any) -> None:
        """Destroy if running and undefine, whatever state the domain is in."""
        libvirt = _libvirt()
        with contextlib.suppress(libvirt.libvirtError):
            if dom.isActive():
                dom.destroy()
        flags = (
            libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
            | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
            | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
        )
        try:
            dom.undefineFlags(flags)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise RuntimeFailure(
                    f"libvirt could not undefine domain {dom.name()}: {_error_text(exc)}"
                ) from exc

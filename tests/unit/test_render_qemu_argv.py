"""qemu_argv on hand-built plans: the argv, parsed back, says what the plan says."""

from __future__ import annotations

import shlex

import pytest

from hpcvm.bootspec import SHARE_TABLE_FWCFG, GuestLink, Share, share_table
from hpcvm.errors import UsageError
from hpcvm.plan.model import VMPlan
from hpcvm.render import BootSpec, qemu_argv, qemu_command_line
from tests import render_parse as rp
from tests import render_plans as plans

ALL = plans.all_plans()
IDS = sorted(ALL)


@pytest.fixture(params=IDS)
def plan(request: pytest.FixtureRequest) -> VMPlan:
    return ALL[str(request.param)]


def _single(argv: list[str], option: str) -> str:
    (value,) = rp.values(argv, option)
    return value


def test_argv_is_well_formed_and_deterministic(plan: VMPlan) -> None:
    argv = qemu_argv(plan, binary="/opt/qemu/bin/qemu-system-x86_64")
    assert argv[0] == "/opt/qemu/bin/qemu-system-x86_64"
    grouped = rp.group_argv(argv)  # fails on a stray word or a missing value
    assert len(grouped) > 5
    assert qemu_argv(plan, binary=argv[0]) == argv
    for option in ("-name", "-machine", "-accel", "-smp", "-m"):
        assert len(rp.values(argv, option)) == 1, option
    assert {"-nodefaults", "-no-user-config"} <= {o for o, _ in grouped}
    assert rp.parse_opts(_single(argv, "-name")).get("guest") == plan.name


def test_smp_matches_topology(plan: VMPlan) -> None:
    smp = rp.parse_opts(_single(qemu_argv(plan), "-smp"))
    assert smp.head == str(plan.vcpus)
    if plan.profile == "naive":
        assert smp.pairs == []  # QEMU's own default shape, as a naive user types it
        return
    shape = [int(smp.get(k) or 0) for k in ("sockets", "dies", "cores", "threads")]
    t = plan.topology
    assert shape == [t.sockets, t.dies, t.cores, t.threads]
    assert shape[0] * shape[1] * shape[2] * shape[3] == plan.vcpus


def test_accel_and_cpu(plan: VMPlan) -> None:
    argv = qemu_argv(plan)
    accel = rp.parse_opts(_single(argv, "-accel"))
    assert accel.head == plan.accel
    if plan.accel == "tcg":
        assert accel.get("thread") == "multi"
    cpu = rp.values(argv, "-cpu")
    if plan.cpu.model is None:
        assert cpu == []
    else:
        parts = rp.split_opts(cpu[0])
        assert parts[0] == plan.cpu.model
        assert parts[1:] == [f"+{f}" for f in plan.cpu.features]


def test_memory_total_equals_backends(plan: VMPlan) -> None:
    argv = qemu_argv(plan)
    total = rp.size(_single(argv, "-m"), default_unit="M")
    assert total == plan.memory_bytes
    backends = {**rp.objects(argv, "memory-backend-ram"), **rp.objects(argv, "memory-backend-file")}
    if backends:  # QEMU 7.2 refuses -m != sum of the backends
        assert sum(rp.size(o.get("size") or "") for o in backends.values()) == total


def test_every_backend_is_the_planned_region(plan: VMPlan) -> None:
    argv = qemu_argv(plan)
    files = rp.objects(argv, "memory-backend-file")
    rams = rp.objects(argv, "memory-backend-ram")
    plain_flat = plan.profile in ("naive", "pinned")  # anonymous, unbound: QEMU's default RAM
    expected = set() if plain_flat else {r.id for r in plan.memory}
    assert set(files) | set(rams) == expected
    for region in plan.memory:
        if region.id not in expected:
            continue
        o = files[region.id] if region.backend == "file" else rams[region.id]
        assert rp.size(o.get("size") or "") == region.size_bytes
        assert o.get("mem-path") == region.mem_path
        assert [int(n) for n in o.all("host-nodes")] == list(region.host_nodes)
        assert o.get("policy") == (region.policy if region.host_nodes else None)
        assert o.get("prealloc") == ("on" if region.prealloc else None)


def test_flat_backend_is_main_memory(plan: VMPlan) -> None:
    machine = rp.parse_opts(_single(qemu_argv(plan), "-machine"))
    assert machine.head == "q35"
    if plan.profile == "hugepages":
        assert machine.get("memory-backend") == plan.memory[0].id
    else:
        assert machine.get("memory-backend") is None


def test_numa_nodes_cpus_and_distances(plan: VMPlan) -> None:
    argv = qemu_argv(plan)
    nodes = rp.numa(argv, "node")
    cpus = rp.numa(argv, "cpu")
    if not plan.guest_nodes:
        assert nodes == cpus == rp.numa(argv, "dist") == []
        return
    memdev = {int(o.get("nodeid") or -1): o.get("memdev") for o in nodes}
    assert memdev == {r.guest_node: r.id for r in plan.memory}
    assert all(o.get("cpus") is None for o in nodes)  # no deprecated cpus= ranges
    seen = {}
    for o in cpus:
        key = (
            int(o.get("socket-id") or 0),
            int(o.get("core-id") or 0),
            int(o.get("thread-id") or 0),
        )
        assert key not in seen
        seen[key] = int(o.get("node-id") or -1)
    planned = {(p.socket, p.core, p.thread): p.guest_node for p in plan.placements}
    assert seen == planned
    matrix = rp.distance_matrix(argv, len(plan.guest_nodes))
    assert matrix == [list(row) for row in plan.guest_distances]
    dists = rp.numa(argv, "dist")
    assert all(o.get("src") != o.get("dst") for o in dists)  # local distance is QEMU's


def test_asymmetric_distances_give_both_directions() -> None:
    plan = plans.numa().model_copy(update={"guest_distances": ((10, 20), (30, 10))})
    argv = qemu_argv(plan)
    assert len(rp.numa(argv, "dist")) == 2
    assert rp.distance_matrix(argv, 2) == [[10, 20], [30, 10]]


def test_three_nodes_give_every_pair_once() -> None:
    """Build a 3-node variant by hand: each pair i<j appears exactly once."""
    base = plans.numa_4k()
    size = 128 * plans.MIB
    nodes = tuple(
        n.model_copy(update={"index": i, "vcpus": (i,), "memory_bytes": size})
        for i, n in enumerate((*base.guest_nodes, base.guest_nodes[0]))
    )
    regions = tuple(
        base.memory[0].model_copy(update={"id": f"m{i}", "guest_node": i, "size_bytes": size})
        for i in range(3)
    )
    placements = tuple(
        base.placements[0].model_copy(update={"vcpu": i, "core": i, "guest_node": i})
        for i in range(3)
    )
    plan = base.model_copy(
        update={
            "vcpus": 3,
            "memory_bytes": 3 * size,
            "topology": base.topology.model_copy(update={"cores": 3}),
            "placements": placements,
            "guest_nodes": nodes,
            "memory": regions,
            "guest_distances": ((10, 12, 20), (12, 10, 20), (20, 20, 10)),
        }
    )
    argv = qemu_argv(plan)
    pairs = [(o.get("src"), o.get("dst")) for o in rp.numa(argv, "dist")]
    assert pairs == [("0", "1"), ("0", "2"), ("1", "2")]
    assert rp.distance_matrix(argv, 3) == [[10, 12, 20], [12, 10, 20], [20, 20, 10]]


def test_numa_cpu_has_die_id_only_with_several_dies() -> None:
    plan = plans.numa_4k()
    assert all(o.get("die-id") is None for o in rp.numa(qemu_argv(plan), "cpu"))
    two_dies = plan.model_copy(
        update={
            "topology": plan.topology.model_copy(update={"dies": 2, "cores": 1}),
            "placements": tuple(
                p.model_copy(update={"die": p.vcpu, "core": 0}) for p in plan.placements
            ),
        }
    )
    cpus = rp.numa(qemu_argv(two_dies), "cpu")
    assert [o.get("die-id") for o in cpus] == ["0", "1"]
    assert [o.get("core-id") for o in cpus] == ["0", "0"]


def test_hpc_threads_devices_and_lock() -> None:
    kvm, tcg = plans.hpc_kvm(), plans.hpc_tcg()
    kvm_argv, tcg_argv = qemu_argv(kvm), qemu_argv(tcg)
    assert list(rp.objects(kvm_argv, "iothread")) == ["iothread1", "iothread2"]
    assert list(rp.objects(tcg_argv, "iothread")) == ["iothread1"]
    vfio = [rp.parse_opts(v) for v in rp.values(kvm_argv, "-device")]
    assert [(o.head, o.get("host")) for o in vfio] == [
        ("vfio-pci", "0000:3b:00.0"),
        ("vfio-pci", "0000:3b:00.1"),
    ]
    assert rp.values(kvm_argv, "-overcommit") == ["mem-lock=on"]
    assert rp.values(tcg_argv, "-overcommit") == []  # see qemu._mem_lock
    assert _single(kvm_argv, "-cpu") == "host,+invtsc"
    assert _single(tcg_argv, "-cpu") == "max"


def test_no_pinning_or_daemonize_on_the_line(plan: VMPlan) -> None:
    """Pinning is the runtime's (after start); the runtime supervises QEMU itself."""
    argv = qemu_argv(plan, BootSpec(paused=True))
    assert "-daemonize" not in argv
    assert argv.count("-S") == 1
    assert "-S" not in qemu_argv(plan)


NASTY = "/tmp/a dir, with 'quotes' and $vars"


def _full_boot(root: str = NASTY) -> BootSpec:
    return BootSpec(
        kernel=f"{root}/vmlinuz",
        initrd=f"{root}/initrd.img",
        cmdline="console=ttyS0 root=hpcvmroot rootfstype=9p quiet",
        shares=(
            Share(host_path="/usr", guest_path="/usr", tag="hpcvm0"),
            Share(host_path="/etc", guest_path="/etc", tag="hpcvm1", hide=("shadow", "ssh/k key")),
            Share(host_path=f"{root}/data", guest_path="/data", tag="hpcvm2", writable=True),
        ),
        links=(GuestLink(guest_path="/bin", target="usr/bin"),),
        share_table=True,
        agent_socket=f"{root}/qga.sock",
        serial_log=f"{root}/console.log",
        qmp_socket=f"{root}/qmp.sock",
        pidfile=f"{root}/qemu.pid",
        paused=True,
        run_as="hpcvm-qemu",
        sandbox=True,
    )


def test_command_line_round_trips_through_the_shell(plan: VMPlan) -> None:
    boot = _full_boot()
    line = qemu_command_line(plan, boot)
    assert shlex.split(line) == qemu_argv(plan, boot)
    # one line, except inside the quoted share table (one entry per line)
    no_table = boot.model_copy(update={"share_table": False})
    assert "\n" not in qemu_command_line(plan, no_table)


def test_boot_spec_kernel_share_agent_console_qmp() -> None:
    boot = _full_boot()
    argv = qemu_argv(plans.numa(), boot)
    assert _single(argv, "-kernel") == boot.kernel
    assert _single(argv, "-initrd") == boot.initrd
    assert _single(argv, "-append") == boot.cmdline
    assert _single(argv, "-pidfile") == boot.pidfile
    devices = {o.head: o for o in map(rp.parse_opts, rp.values(argv, "-device"))}
    assert "virtio-serial-pci" in devices
    chardevs = {o.get("id"): o for o in map(rp.parse_opts, rp.values(argv, "-chardev"))}
    port = devices["virtserialport"]
    assert port.get("name") == "org.qemu.guest_agent.0"
    agent = chardevs[port.get("chardev")]
    assert (agent.head, agent.get("path")) == ("socket", boot.agent_socket)  # comma unescaped
    assert (agent.get("server"), agent.get("wait")) == ("on", "off")
    serial = _single(argv, "-serial")
    assert serial.startswith("chardev:")
    log = chardevs[serial.removeprefix("chardev:")]
    assert (log.head, log.get("path")) == ("file", boot.serial_log)
    qmp = rp.parse_opts(_single(argv, "-qmp"))
    assert qmp.head == f"unix:{boot.qmp_socket}"
    assert (qmp.get("server"), qmp.get("wait")) == ("on", "off")


def test_each_share_is_a_9p_device_read_only_unless_writable() -> None:
    boot = _full_boot()
    argv = qemu_argv(plans.numa(), boot)
    fsdevs = [rp.parse_opts(v) for v in rp.values(argv, "-fsdev")]
    assert [(f.head, f.get("path"), f.get("readonly")) for f in fsdevs] == [
        ("local", s.host_path, None if s.writable else "on") for s in boot.shares
    ]
    assert {(f.get("security_model"), f.get("multidevs")) for f in fsdevs} == {("none", "remap")}
    nine_p = [
        o for o in map(rp.parse_opts, rp.values(argv, "-device")) if o.head == "virtio-9p-pci"
    ]
    assert [d.get("fsdev") for d in nine_p] == [f.get("id") for f in fsdevs]
    assert [d.get("mount_tag") for d in nine_p] == [s.tag for s in boot.shares]


def test_share_table_on_fw_cfg_in_mount_order() -> None:
    boot = _full_boot()
    (entry,) = rp.values(qemu_argv(plans.numa(), boot), "-fw_cfg")
    fw_cfg = rp.parse_opts(entry)
    assert fw_cfg.get("name") == SHARE_TABLE_FWCFG
    lines = fw_cfg.get("string").splitlines()
    assert lines == [
        "link usr/bin /bin",
        "rw hpcvm2 /data",
        "hide hpcvm1 shadow",
        "hide hpcvm1 ssh/k key",
        "ro hpcvm1 /etc",
        "ro hpcvm0 /usr",
    ]
    no_table = boot.model_copy(update={"share_table": False})
    assert rp.values(qemu_argv(plans.numa(), no_table), "-fw_cfg") == []


def test_nested_shares_are_mounted_after_their_parent() -> None:
    inner = Share(host_path="/w/a/b", guest_path="/w/a/b", tag="hpcvm0")
    outer = Share(host_path="/w/a", guest_path="/w/a", tag="hpcvm1")
    table = share_table(BootSpec(shares=(inner, outer)))
    assert table == "ro hpcvm1 /w/a\nro hpcvm0 /w/a/b\n"


def test_qemu_drops_to_its_user_under_the_sandbox() -> None:
    argv = qemu_argv(plans.numa(), _full_boot())
    assert _single(argv, "-runas") == "hpcvm-qemu"
    sandbox = rp.parse_opts(_single(argv, "-sandbox"))
    assert sandbox.head == "on"
    for key in ("obsolete", "spawn", "resourcecontrol"):
        assert sandbox.get(key) == "deny"
    # QEMU 7.2 installs its filter before -runas: denying setuid would kill it
    assert sandbox.get("elevateprivileges") is None


def test_disk_and_seed_on_iothreads() -> None:
    boot = BootSpec(disk_image="/img/guest.QCOW2", seed_image="/img/seed.img")
    argv = qemu_argv(plans.hpc_kvm(), boot)
    drives = [rp.parse_opts(v) for v in rp.values(argv, "-drive")]
    assert [(d.get("file"), d.get("format"), d.get("readonly")) for d in drives] == [
        ("/img/guest.QCOW2", "qcow2", None),
        ("/img/seed.img", "raw", "on"),
    ]
    # held read-write: a QEMU under -runas cannot reopen it when a checkpoint hands it over
    assert [d.get("auto-read-only") for d in drives] == ["off", None]
    blk = [o for o in map(rp.parse_opts, rp.values(argv, "-device")) if o.head == "virtio-blk-pci"]
    assert [b.get("drive") for b in blk] == [d.get("id") for d in drives]
    assert [b.get("id") for b in blk] == ["virtio-disk0", "virtio-seed0"]
    assert [b.get("iothread") for b in blk] == ["iothread1", "iothread2"]
    assert [b.get("bootindex") for b in blk] == ["0", None]
    raw = qemu_argv(plans.naive(), BootSpec(disk_image="/img/disk.raw"))
    (drive,) = rp.values(raw, "-drive")
    assert rp.parse_opts(drive).get("format") == "raw"
    assert all("iothread" not in v for v in rp.values(raw, "-device"))


def test_no_boot_spec_means_no_boot_media(plan: VMPlan) -> None:
    argv = qemu_argv(plan)
    for option in (
        "-kernel",
        "-drive",
        "-fsdev",
        "-fw_cfg",
        "-chardev",
        "-qmp",
        "-serial",
        "-pidfile",
        "-runas",
        "-sandbox",
    ):
        assert option not in argv


@pytest.mark.parametrize(
    ("update", "field"),
    [
        ({"guest_distances": ((12, 20), (20, 10))}, "itself"),
        ({"guest_distances": ((10, 9), (9, 10))}, "distance 0->1"),
        ({"memory_bytes": 1024 * plans.MIB}, "memory regions"),
        ({"vcpus": 3}, "topology"),
    ],
)
def test_inconsistent_plan_is_a_one_line_usage_error(update: dict[str, object], field: str) -> None:
    plan = plans.numa().model_copy(update=update)
    with pytest.raises(UsageError) as err:
        qemu_argv(plan)
    assert field in str(err.value)
    assert "\n" not in str(err.value)


def test_hugetlbfs_region_without_path_is_refused() -> None:
    plan = plans.hugepages()
    region = plan.memory[0].model_copy(update={"mem_path": None})
    with pytest.raises(UsageError, match="mem_path"):
        qemu_argv(plan.model_copy(update={"memory": (region,)}))


def test_the_completion_port_sits_beside_the_agent_on_one_bus() -> None:
    boot = _full_boot().model_copy(update={"done_socket": "/run/x/done.sock"})
    argv = qemu_argv(plans.numa(), boot)
    chardevs = {o.get("id"): o for o in map(rp.parse_opts, rp.values(argv, "-chardev"))}
    devices = [rp.parse_opts(v) for v in rp.values(argv, "-device")]
    assert [d.head for d in devices].count("virtio-serial-pci") == 1
    ports = {
        p.get("name"): chardevs[p.get("chardev")] for p in devices if p.head == "virtserialport"
    }
    assert set(ports) == {"org.qemu.guest_agent.0", "org.hpcvm.done.0"}
    done = ports["org.hpcvm.done.0"]
    assert (done.head, done.get("path"), done.get("server"), done.get("wait")) == (
        "socket",
        "/run/x/done.sock",
        "on",
        "off",
    )
    assert "org.hpcvm.done.0" not in " ".join(qemu_argv(plans.numa(), _full_boot()))

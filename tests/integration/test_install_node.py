"""scripts/install-node.sh: the node install's accounts and grants, and their undo.

The script runs for real (groupadd, useradd, dpkg-statoverride, mount, nft), but in a
sandbox: private mount and network namespaces, /etc, /usr, /var/lib and /opt overlays on
the host's, so every file it writes lands in a throwaway upper directory, its mount
lives only in the namespace and its nftables table in the sandbox's network; the host's
accounts, QEMU helper, mounts and firewall are never touched. Not sandboxed, and so not
run here: the packages step (apt), the kvm step (/dev/kvm is the host's), the hugepage
pool (a kernel-wide setting), venv and guest (the Slurm test cluster's fixture builds a
user's venv with the venv step).

Oracles independent of the script: the sandbox's own account database (getent, id),
QEMU's setuid bridge helper deciding its ACL as each user, dpkg-statoverride's list,
nft's own listing of the table, hpcvm-netguard itself run as a member (root's answer,
not a refusal to run), the kernel's mount table (findmnt) and file permissions (a member
creates a file on the hugetlbfs mount, another user cannot), and a snapshot of /etc and
the other touched paths before and after.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.integration.test_netguard import CHILD

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install-node.sh"
HELPER = "/usr/lib/qemu/qemu-bridge-helper"
NETGUARD = "/usr/local/lib/hpcvm/hpcvm-netguard"
UNSHARE = ("unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc")
UNSHARE += ("--propagation", "private")
BUILT_NETGUARD = REPO / "src" / "hpcvm" / "data" / "hpcvm-netguard"
OVERLAID = ("/etc", "/usr", "/var/lib", "/opt")
HUGETLBFS = "/opt/hugepages-hpcvm"  # inside the /opt overlay (the default is in /dev)
CLAIMS = "/var/lib/hpcvm-addresses"  # inside the /var/lib overlay (the default: /dev/shm)
GRANT_STEPS = "accounts,bridge,netguard,hugepages"
MEMBER, OTHER = "site-member", "site-other"
GID, QEMU_ID = 2300, 2301  # scripts/site-ids.sh's defaults
TOOLS = ("unshare", "nsenter", "runuser", "useradd", "dpkg-statoverride", "findmnt", "nft")


class Sandbox:
    """Mount, network and PID namespaces, the host's /etc, /usr, /var/lib and /opt under
    writable overlays; commands enter them with nsenter. It ends when its holder process (a shell
    waiting on our pipe) ends, and so with this test process at the latest.

    Its own PID namespace (and /proc): the uninstall's ``userdel hpcvm-qemu`` refuses a
    user that a process runs as, and the sandbox's hpcvm-qemu has the host's uid, so the
    host's VMs (another xdist worker's, QEMU as hpcvm-qemu) failed it (CI, 3 workers)."""

    def __init__(self, root: Path) -> None:
        mounts = []
        for i, target in enumerate(OVERLAID):
            upper, work = root / f"upper{i}", root / f"work{i}"
            upper.mkdir()
            work.mkdir()
            mounts.append(
                f"mount -t overlay overlay -o lowerdir={target},upperdir={upper},"
                f"workdir={work} {target}"
            )
        script = " && ".join(mounts) + " && echo ready && read _"
        self.holder = subprocess.Popen(
            [*UNSHARE, "--", "sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.holder.stdout is not None
        if self.holder.stdout.readline().strip() != "ready":
            self.close()
            pytest.skip(f"cannot make an overlay sandbox here: {self.holder.stderr}")
        # unshare forked: the namespaces' first process is its child, the shell
        children = Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children")
        self.inside = int(children.read_text().split()[0])

    def run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["nsenter", "-t", str(self.inside), "-m", "-n", "-p", "--", *argv],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=120,
            check=False,
        )
        if check and proc.returncode != 0:
            pytest.fail(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        return proc

    def sh(self, command: str, check: bool = True) -> str:
        return self.run(["sh", "-c", command], check=check).stdout

    def close(self) -> None:
        if self.holder.poll() is None:
            assert self.holder.stdin is not None
            self.holder.stdin.close()  # `read` returns, the namespace and its mounts go
            self.holder.wait(timeout=30)


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    """A sandbox where the site's accounts do not exist yet (whatever the host has),
    QEMU has no bridge ACL, and two users exist: one the install adds to the group, one
    it does not."""
    if os.geteuid() != 0:
        pytest.skip("install-node.sh runs as root")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing or not Path(HELPER).exists() or not BUILT_NETGUARD.exists():
        pytest.skip(
            f"needs {', '.join(missing) or HELPER + ' and ' + str(BUILT_NETGUARD)}; "
            "install with scripts/setup.sh"
        )
    box = Sandbox(tmp_path)
    try:
        box.sh(
            "userdel -f hpcvm-qemu 2>/dev/null; groupdel hpcvm-qemu 2>/dev/null;"
            " groupdel hpcvm 2>/dev/null; rm -f /etc/qemu/bridge.conf /etc/qemu/hpcvm-*;"
            " rm -rf /etc/hpcvm /usr/local/lib/hpcvm /etc/systemd/system/hpcvm-netguard.service"
            " /etc/tmpfiles.d/hpcvm-addresses.conf;"
            f" dpkg-statoverride --remove {NETGUARD};"
            " rm -rf /var/lib/hpcvm-node; true"
        )
        # The host's own install (scripts/setup.sh makes this machine a node) undone in
        # the sandbox only: its fstab lines, the helper's override and mode. Without this
        # the sandbox's uninstall would also undo the host's lines (and rmdir the host's
        # mount point in /dev, which is not overlaid: that detaches the host's mount).
        box.sh(
            'awk \'skip { skip = 0; next } index($0, "# hpcvm:") == 1 { skip = 1; next }'
            " { print }' /etc/fstab > /tmp/fstab.$$ && cat /tmp/fstab.$$ > /etc/fstab;"
            f" rm -f /tmp/fstab.$$; dpkg-statoverride --remove {HELPER} 2>/dev/null;"
            f" chmod 0755 {HELPER}; true"
        )
        for user in (MEMBER, OTHER):
            box.run(["useradd", "--no-create-home", "--shell", "/bin/sh", user])
        yield box
    finally:
        box.close()


def install(box: Sandbox, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {"HPCVM_HUGETLBFS": HUGETLBFS, "HPCVM_HUGEPAGES": "", "HPCVM_ADDRESS_CLAIMS": CLAIMS}
    return box.run(["bash", str(SCRIPT), *args], env=env, check=check)


def snapshot(box: Sandbox) -> str:
    """What the install may change: every file of /etc (type, mode, owner, content;
    shadow-utils' backup copies aside), dpkg's overrides, the helper's mode, the state
    directory, the hugetlbfs mounts and /opt's top level."""
    return box.sh(
        "cd /etc && find . \\( -name '*-' -o -name .pwd.lock \\) -prune -o"
        " -printf '%p %y %m %u:%g\\n' | sort;"
        " find . \\( -name '*-' -o -name .pwd.lock \\) -prune -o -type f -print0 | sort -z |"
        " xargs -0 sha256sum;"
        f" cat /var/lib/dpkg/statoverride; stat -c '%a %U:%G' {HELPER};"
        " ls -lA /usr/local/lib/hpcvm 2>&1; nft list tables;"
        " ls -A /var/lib/hpcvm-node 2>&1; findmnt -rn -t hugetlbfs -o TARGET,OPTIONS; ls -A /opt"
    )


def assert_unchanged(before: str, after: str) -> None:
    """The snapshots agree; else the lines that differ (the whole of /etc is too long
    for pytest's own diff)."""
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    assert before == after, "\n".join(diff)


def groups_of(box: Sandbox, user: str) -> set[str]:
    return set(box.run(["id", "-nG", user]).stdout.split())


def bridge_helper_as(box: Sandbox, user: str) -> str:
    """QEMU's helper asked, as ``user``, for a tap on br0, in a network namespace of its
    own (where br0 does not exist): its ACL answers first, the missing bridge after."""
    argv = ["unshare", "--net", "runuser", "-u", user, "--", HELPER, "--br=br0", "--fd=1"]
    return box.run(argv, check=False).stderr.strip()


def guard_as(box: Sandbox, user: str, address: str) -> dict[str, object]:
    """hpcvm-netguard asked, as ``user``, to guard a tap QEMU's bridge helper made in the
    sandbox's br0 for ``address`` (the child of test_netguard.py): its answer."""
    guard = [NETGUARD, "guard", "--fd", "{fd}", "--mac", "0a:00:00:00:00:11", "--ip", address]
    argv = ["runuser", "-u", user, "--", "/usr/bin/python3", "-c", CHILD, "user", "br0", "[]"]
    proc = box.run(["sh", "-c", '"$@" </dev/null', "sh", *argv, *guard])
    answer: dict[str, object] = json.loads(proc.stdout.splitlines()[0])
    return answer


def test_install_grants_what_a_member_needs_and_uninstall_restores_everything(
    sandbox: Sandbox,
) -> None:
    before = snapshot(sandbox)
    host_mounts = Path("/proc/self/mounts").read_text()
    install(sandbox, "--only", GRANT_STEPS, "--add-user", MEMBER)

    # Accounts with the fixed ids; only the added user is in the group (and in kvm).
    assert sandbox.run(["getent", "group", "hpcvm"]).stdout.split(":")[2] == str(GID)
    qemu = sandbox.run(["getent", "passwd", "hpcvm-qemu"]).stdout.strip().split(":")
    assert (qemu[2], qemu[3], qemu[6]) == (str(QEMU_ID), str(QEMU_ID), "/usr/sbin/nologin")
    assert {"hpcvm", "kvm"} <= groups_of(sandbox, MEMBER)
    assert not {"hpcvm", "kvm"} & groups_of(sandbox, OTHER)

    # The bridge helper: setuid root through dpkg, and its ACL readable by members only.
    assert sandbox.sh(f"stat -c '%a %U' {HELPER}").split() == ["4755", "root"]
    assert sandbox.sh(f"dpkg-statoverride --list {HELPER}").split() == [
        "root",
        "root",
        "4755",
        HELPER,
    ]
    assert bridge_helper_as(sandbox, OTHER) == "access denied by acl file"
    member = bridge_helper_as(sandbox, MEMBER)
    assert "br0" in member and "access denied" not in member, member

    # hpcvm-netguard: setuid root through dpkg, its table made, its config root's.
    assert sandbox.sh(f"stat -c '%a %U' {NETGUARD}").split() == ["4755", "root"]
    assert sandbox.sh(f"dpkg-statoverride --list {NETGUARD}").split()[:3] == [
        "root",
        "root",
        "4755",
    ]
    assert 'counter name "unguarded" drop' in sandbox.sh("nft list table bridge hpcvm_netguard")
    assert sandbox.sh("stat -c '%a %U' /etc/hpcvm/netguard.conf").split() == ["644", "root"]
    assert "bridge br0" in sandbox.sh("cat /etc/hpcvm/netguard.conf")
    # the address claims directory: root's and sticky, now and (tmpfiles.d) at every boot
    assert sandbox.sh(f"stat -c '%a %U:%G' {CLAIMS}").split() == ["1777", "root:root"]
    tmpfiles = sandbox.sh("cat /etc/tmpfiles.d/hpcvm-addresses.conf").splitlines()
    assert f"d {CLAIMS} 1777 root root -" in tmpfiles
    # run by a user it is root (a refusal about the descriptor, not about privilege),
    # and what only root may give is refused
    as_member = ["runuser", "-u", MEMBER, "--", NETGUARD]
    not_a_tap = sandbox.run([*as_member, "guard", "--fd", "0", "--mac", "0a:00:00:00:00:01"],
                            check=False)  # fmt: skip
    assert not_a_tap.returncode == 2
    assert not_a_tap.stderr.startswith("hpcvm-netguard: descriptor 0 is not a tap: give")
    by_name = sandbox.run([*as_member, "release", "--ifname", "tap0"], check=False)
    assert by_name.returncode == 2 and "--ifname is for root only" in by_name.stderr

    # Without 'range' lines a user's VM address must lie in the site's VM pool
    # (site.toml, where --address auto takes them from): a member's tap from QEMU's
    # bridge helper in the sandbox's own br0, guarded through the installed grant.
    sandbox.sh(
        "ip link add br0 type bridge && ip addr add 10.96.0.1/24 dev br0 && ip link set br0 up"
    )
    sandbox.sh("printf '[addresses]\\npool = \"10.96.0.128/25\"\\n' > /etc/hpcvm/site.toml")
    outside, inside = (
        guard_as(sandbox, MEMBER, "10.96.0.11"),
        guard_as(sandbox, MEMBER, "10.96.0.130"),
    )
    assert outside["rc"] == 2, outside
    assert "(the [addresses] pool of /etc/hpcvm/site.toml)" in outside["stderr"]
    assert inside["rc"] == 0, inside
    sandbox.sh("rm /etc/hpcvm/site.toml && ip link del br0")

    # The hugetlbfs mount: the group's, sticky; a member makes files there, others not.
    options = sandbox.sh(f"findmnt -rn -t hugetlbfs -o OPTIONS {HUGETLBFS}").strip().split(",")
    assert {f"gid={GID}", "mode=1770", "pagesize=2M"} <= set(options), options
    assert f"hugetlbfs {HUGETLBFS} hugetlbfs" in sandbox.sh("cat /etc/fstab")
    made = sandbox.run(["runuser", "-u", MEMBER, "--", "touch", f"{HUGETLBFS}/m"], check=False)
    refused = sandbox.run(["runuser", "-u", OTHER, "--", "touch", f"{HUGETLBFS}/o"], check=False)
    assert made.returncode == 0, made.stderr
    assert refused.returncode != 0 and "Permission denied" in refused.stderr
    sandbox.run(["rm", f"{HUGETLBFS}/m"])

    # Idempotent: a second run changes nothing (no command printed).
    again = install(sandbox, "--only", GRANT_STEPS, "--add-user", MEMBER).stdout
    assert "  + " not in again, again

    # Everything revertible.
    undo = install(sandbox, "--uninstall")
    assert "uninstall: done" in undo.stdout
    assert_unchanged(before, snapshot(sandbox))
    assert Path("/proc/self/mounts").read_text() == host_mounts  # the host's, untouched


def test_dry_run_prints_the_changes_and_makes_none(sandbox: Sandbox) -> None:
    before = snapshot(sandbox)
    out = install(sandbox, "--dry-run", "--only", GRANT_STEPS, "--add-user", MEMBER).stdout
    changes = ("groupadd --gid 2300 hpcvm", "dpkg-statoverride --update", "mount -t hugetlbfs",
               f"{NETGUARD} init")  # fmt: skip
    for change in changes:
        assert f"  + {change}" in out, out
    assert_unchanged(before, snapshot(sandbox))


def test_a_group_with_another_gid_is_refused_in_one_line_naming_the_fix(sandbox: Sandbox) -> None:
    sandbox.run(["groupadd", "--gid", "2399", "hpcvm"])
    before = snapshot(sandbox)
    proc = install(sandbox, "--only", GRANT_STEPS, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "install-node: group hpcvm exists with gid 2399, not 2300: set HPCVM_GID=2399 on every"
        " node, or remove the group"
    ]
    assert_unchanged(before, snapshot(sandbox))

"""Which host paths ``verify`` probes as absent from the guest (runtime/verify/shares.py),
on a real directory tree standing for the host's root."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hpcvm.bootspec import Share
from hpcvm.runtime.verify.shares import absent_probes, hidden_probes, leaked


def _tree(root: Path) -> None:
    for d in ("home/alice", "root", "var/lib", "work/proj/sub", "work/other", "usr/bin", "proc/1"):
        (root / d).mkdir(parents=True)
    (root / "root" / ".bashrc").write_text("x")
    (root / "top-file").write_text("x")


def test_probes_are_outside_every_share_and_exist(tmp_path: Path) -> None:
    _tree(tmp_path)
    shares = [
        Share(host_path=f"{tmp_path}/usr", guest_path=f"{tmp_path}/usr", tag="hpcvm0"),
        Share(host_path=f"{tmp_path}/work/proj", guest_path=f"{tmp_path}/work/proj", tag="t1"),
    ]
    probes = absent_probes(shares, root=str(tmp_path))
    assert probes[:3] == [f"{tmp_path}/home", f"{tmp_path}/root/.bashrc", f"{tmp_path}/var/lib"]
    assert f"{tmp_path}/work/other" in probes  # beside a share, inside its parent
    assert f"{tmp_path}/top-file" in probes
    for probe in probes:
        assert Path(probe).exists()
        assert not any(probe.startswith(s.guest_path) for s in shares)
        assert not probe.startswith(f"{tmp_path}/proc")
        assert not any(s.guest_path.startswith(probe + "/") for s in shares)


def test_hidden_probes_name_secrets_that_exist(tmp_path: Path) -> None:
    (tmp_path / "shadow").write_text("x")
    (tmp_path / ".lock").write_text("x")
    share = Share(
        host_path=str(tmp_path), guest_path="/etc", tag="t", hide=(".lock", "gone", "shadow")
    )
    probes = hidden_probes([share])
    assert list(probes) == ["/etc/shadow", "/etc/.lock"]  # named secrets first
    assert probes["/etc/shadow"] == str(tmp_path / "shadow")


def test_a_hidden_file_is_a_leak_only_with_the_hosts_bytes(tmp_path: Path) -> None:
    """The guest reports each path it has with its SHA-256 (hashlib is the oracle for
    the host's side): the host's bytes are a leak, a guest's own file of that name
    (a cluster guest's /etc/shadow for sshd) is not, and a probe outside /etc that is
    present at all is."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$host-hash:19000:0:99999:7:::\n")
    hosts = hashlib.sha256(secret.read_bytes()).hexdigest()
    own = hashlib.sha256(b"root:*:1::::::\n").hexdigest()
    hidden = {"/etc/shadow": str(secret)}
    probes = ["/home", "/etc/shadow"]
    assert leaked({"/etc/shadow": own}, probes, hidden) == []
    assert leaked({"/etc/shadow": hosts}, probes, hidden) == ["/etc/shadow"]
    assert leaked({"/etc/shadow": "-"}, probes, hidden) == ["/etc/shadow"]
    assert leaked({"/home": "-"}, probes, hidden) == ["/home"]

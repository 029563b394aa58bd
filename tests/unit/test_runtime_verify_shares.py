"""Which host paths ``verify`` probes as absent from the guest (runtime/verify_shares.py),
on a real directory tree standing for the host's root."""

from __future__ import annotations

from pathlib import Path

from hpcvm.bootspec import Share
from hpcvm.runtime.verify_shares import absent_probes, hidden_probes


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
    assert hidden_probes([share]) == ["/etc/shadow", "/etc/.lock"]  # named secrets first

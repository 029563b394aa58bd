"""Address claims (cluster/tasks/addresses.py) that only their holder can make: squatting
another user's slots is ignored, and that user cannot remove or replace a claim.

Real files in a real sticky 1777 directory (under /var/tmp: pytest's tmp_path is root's
0700), and real processes of real users: the squatter is ``nobody``, the claimer a
second unprivileged uid (``CLAIMER``, no passwd entry needed: the kernel only knows
uids), each a child forked from the test and dropped to that user (tests/users.py).
Oracles: the kernel's answers (errno of unlink, rename, open) and the files left in the
directory, not hpcvm's. Needs root (setuid).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import pwd
import signal
from pathlib import Path

import pytest

from hpcvm.cluster.tasks.addresses import AddressPool, candidates, claim
from tests.users import in_child_as, process_as
from tests.users import open_dir as open_dir  # a fixture

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setuid to other users: needs root")

NOBODY = pwd.getpwnam("nobody")
SQUATTER = (NOBODY.pw_uid, NOBODY.pw_gid)
CLAIMER = (2398, 2398)
POOL = AddressPool(ipaddress.IPv4Network("10.77.0.128/25"), 4)
NODE = ipaddress.IPv4Interface("10.77.0.3/24")


@pytest.fixture
def claims(open_dir: Path) -> Path:
    """A claims directory as the node install makes it: root's, mode 1777."""
    open_dir.chmod(0o1777)
    return open_dir


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def claim_as(user: tuple[int, int], address: ipaddress.IPv4Interface, where: Path) -> str:
    """``claim`` in a child running as ``user``: the claim file's name, "unguarded"
    (a claim without a file) or "refused". An alarm ends a child that hangs (on a FIFO,
    say): the test then fails on its empty answer."""

    def work() -> str:
        signal.alarm(20)
        got = claim(address, where)
        if got is None:
            return "refused"
        return got.path.name if got.path is not None else "unguarded"

    return str(in_child_as(*user, work))


def test_squatted_slots_hold_nothing_and_auto_still_finds_one(claims: Path) -> None:
    """Every slot of a node squatted by another user, each a different way: pid 1 (root's
    init), a live process of another user (this test's), the squatter's own live process
    with another start time (a reused pid), a symbolic link to a live claim, a FIFO, and
    the bare ``IP`` name older hpcvm wrote. Each slot is still claimed at once."""
    slots = [str(a.ip) for a in candidates(POOL, NODE)]
    mine = os.getpid()
    with process_as(*SQUATTER) as squatter_pid:
        genuine = claim(ipaddress.IPv4Interface("10.77.0.250/24"), claims)  # root's, live
        assert genuine is not None and genuine.path is not None

        def squat() -> None:
            (claims / f"{slots[0]}.a").write_text(f"1 {start_time(1)}\n")
            (claims / slots[0]).write_text("1\n")  # the older format
            (claims / f"{slots[1]}.b").write_text(f"{mine} {start_time(mine)}\n")
            (claims / f"{slots[2]}.c").write_text(f"{squatter_pid} 12345\n")
            (claims / f"{slots[2]}.d").symlink_to(genuine.path)  # type: ignore[arg-type]
            os.mkfifo(claims / f"{slots[3]}.e")

        assert in_child_as(*SQUATTER, squat) is None
        got = [claim_as(CLAIMER, ipaddress.IPv4Interface(f"{ip}/24"), claims) for ip in slots]
    for ip, name in zip(slots, got, strict=True):
        assert name.startswith(f"{ip}."), (ip, got)
        assert (claims / name).stat().st_uid == CLAIMER[0]
    squats = {f"{slots[0]}.a", slots[0], f"{slots[1]}.b", f"{slots[2]}.c", f"{slots[2]}.d"}
    assert squats | {f"{slots[3]}.e"} <= {p.name for p in claims.iterdir()}  # never removed


def test_a_live_claim_of_its_owner_holds_until_its_holder_dies(claims: Path) -> None:
    """The control that makes the squatting test mean something: the same other user's
    claim made by their own live process holds the slot; once it dies the slot is free."""
    address = ipaddress.IPv4Interface("10.77.0.141/24")
    with process_as(*SQUATTER, lambda: claim(address, claims)):
        (held,) = claims.iterdir()
        assert held.stat().st_uid == SQUATTER[0]
        assert claim_as(CLAIMER, address, claims) == "refused"
    assert claim_as(CLAIMER, address, claims).startswith("10.77.0.141.")


def test_another_user_cannot_remove_replace_or_rewrite_a_claim(claims: Path) -> None:
    address = ipaddress.IPv4Interface("10.77.0.142/24")
    with process_as(*CLAIMER, lambda: claim(address, claims)) as holder:
        (held,) = claims.iterdir()

        def attack() -> list[int]:
            decoy = claims / "decoy"
            decoy.write_text("1\n")
            answers = []
            for act in (
                lambda: held.unlink(),
                lambda: decoy.rename(held),
                lambda: held.open("w"),
            ):
                try:
                    act()
                    answers.append(0)
                except OSError as exc:
                    answers.append(exc.errno or 0)
            return answers

        assert in_child_as(*SQUATTER, attack) == [errno.EPERM, errno.EPERM, errno.EACCES]
        assert held.read_text().split()[0] == str(holder)
        assert claim_as(SQUATTER, address, claims) == "refused"


def test_a_claims_directory_another_user_owns_is_not_used(claims: Path) -> None:
    """Its owner could remove anyone's claims: the claimer does not trust it (the claim
    goes unguarded but for duplicate address detection) and writes nothing there; a
    symbolic link in its place is not followed."""
    theirs = claims / "theirs"
    in_child_as(*SQUATTER, lambda: theirs.mkdir(mode=0o1777))
    theirs.chmod(0o1777)
    address = ipaddress.IPv4Interface("10.77.0.143/24")
    assert claim_as(CLAIMER, address, theirs) == "unguarded"
    assert list(theirs.iterdir()) == []
    link = claims / "link"
    in_child_as(*SQUATTER, lambda: link.symlink_to(theirs))
    assert claim_as(CLAIMER, address, link) == "unguarded"
    assert list(theirs.iterdir()) == []


def test_root_makes_a_claims_directory_a_user_made_its_own(claims: Path) -> None:
    """What the node install would have made: root's hpcvm takes a sticky claims
    directory a user made (before any admin did) and keeps the claims in it, so every
    user trusts it from then on; a directory that is not sticky is left alone."""
    theirs = claims / "theirs"
    address = ipaddress.IPv4Interface("10.77.0.144/24")

    def make_and_claim() -> object:
        theirs.mkdir(mode=0o1777)  # 1755 under the usual umask: sticky, not writable
        return claim(address, theirs)

    with process_as(*SQUATTER, make_and_claim):
        assert theirs.stat().st_uid == SQUATTER[0] and len(list(theirs.iterdir())) == 1
        assert claim(ipaddress.IPv4Interface("10.77.0.145/24"), theirs) is not None
        assert theirs.stat().st_uid == 0 and theirs.stat().st_mode & 0o7777 == 0o1777
        assert claim_as(CLAIMER, address, theirs) == "refused"  # the user's claim holds
    plain = claims / "plain"
    in_child_as(*SQUATTER, lambda: plain.mkdir(mode=0o755))
    assert claim(address, plain) is not None and plain.stat().st_uid == SQUATTER[0]

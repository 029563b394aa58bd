"""The guest init's whiteouts: the archive its ``cpio_entry`` writes (busybox's own
printf, as in the guest) must unpack, with the very busybox the guest is made of, into
a character device 0:0 at each hidden path, parents made, which is what overlayfs reads
as "not there". The kernel's stat of the unpacked files is the oracle. Names of every
length modulo 4 cover the header's padding; a space and printf's own metacharacters
must pass through unchanged. Making device files needs root."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from hpcvm.guest import hosttools, scripts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of whiteouts needs root")

HIDDEN = [
    "shadow",
    "gshadow-",
    "a",
    "ab",
    "abc",
    "abcd",
    "ssh/ssh_host_rsa_key",
    "postgresql/15/main/pg_hba.conf",
    "with space/and more",
    r"odd%s\n%d",
]


def _function() -> str:
    found = re.search(r"^cpio_entry\(\) \{.*?^\}$", scripts.INIT, re.S | re.M)
    assert found, "the init defines no cpio_entry"
    return found.group(0)


def test_whiteout_archive_unpacks_to_char_devices(tmp_path: Path) -> None:
    busybox = hosttools.busybox().path
    archive = tmp_path / "hide.cpio"
    script = "\n".join(
        [
            _function(),
            'i=0; for p in "$@"; do i=$((i + 1)); cpio_entry "$i" 8630 "$p" >> "$ARCHIVE"; done',
            "cpio_entry 0 0 'TRAILER!!!' >> \"$ARCHIVE\"",
        ]
    )
    env = {"PATH": "/nonexistent", "ARCHIVE": str(archive)}
    subprocess.run([busybox, "sh", "-c", script, "sh", *HIDDEN], env=env, check=True)
    upper = tmp_path / "upper"
    upper.mkdir()
    with archive.open("rb") as source:
        subprocess.run([busybox, "cpio", "-i", "-d"], stdin=source, cwd=upper, check=True,
                       capture_output=True)  # fmt: skip
    made = sorted(
        str(p.relative_to(upper)) for p in upper.rglob("*") if not p.is_dir() or p.is_symlink()
    )
    assert made == sorted(HIDDEN)
    for rel in HIDDEN:
        st = (upper / rel).lstat()
        assert stat.S_ISCHR(st.st_mode), rel
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (0, 0), rel

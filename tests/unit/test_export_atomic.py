"""An export written atomically keeps the old file whole and leaves no temporary file
when the write fails: a real ENOSPC from a tiny tmpfs (mounted here, as root)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcvm.bench.results.export import write_atomic


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "tiny"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "none", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing(tiny_fs: Path) -> None:
    target = tiny_fs / "summary.json"
    write_atomic(target, "old\n")
    with pytest.raises(OSError) as caught:
        write_atomic(target, "x" * (1 << 20))  # 1 MiB into 64 KiB
    assert caught.value.errno == errno.ENOSPC
    assert target.read_text() == "old\n"
    assert sorted(os.listdir(tiny_fs)) == ["summary.json"]

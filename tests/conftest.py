"""Shared fixtures: the real machine topologies in ../shared/topologies/.

Snapshots are extracted once per test session (once per xdist worker) into its
temporary directory; tests get (name, kind, path) where kind is "sysfs" (a file-system
root for HWLOC_FSROOT) or "xml".
"""

from __future__ import annotations

import bz2
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
TOPOLOGIES = REPO.parent / "shared" / "topologies"


def pytest_configure(config: pytest.Config) -> None:
    """Every command a test starts reads an empty stdin unless the test gives it one:
    ``hpcvm exec`` and ``run`` pass a stdin that is not a terminal to the guest command,
    reading it to its end first, so a runner whose stdin is a pipe that stays open (a CI
    job, an editor) would otherwise hang them. Under ``--dist loadscope`` the controller
    also prints where the time went, by scope and worker (tests/scope_times.py)."""
    if not os.isatty(0):
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    signal.signal(signal.SIGTERM, _terminated)
    if config.getoption("dist", None) == "loadscope" and not hasattr(config, "workerinput"):
        from tests.scope_times import ScopeTimes

        config.pluginmanager.register(ScopeTimes(), "hpcvm-scope-times")


def _terminated(signum: int, frame: object) -> None:
    """A SIGTERM (a CI job cancelled, ``pkill`` of a run) ends the run as Ctrl-C does,
    so that pytest tears its fixtures down: the libvirtd and virtlogd a session fixture
    started, the test cluster, the guests. Python's default would end the process at
    once and leave them running (seen: a stopped fresh-clone run left both daemons)."""
    del signum, frame
    raise KeyboardInterrupt


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The test-cluster group's modules in tests/shared_state.py's GROUP_ORDER (those
    that mostly wait first, those whose guests compute last), every other test where
    pytest put it."""
    from tests.shared_state import in_group_order

    items[:] = [items[i] for i in in_group_order([item.nodeid for item in items])]


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: no error without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` schedules by tests/shared_state.py's scopes (scripts/test.sh's
    integration tests): a module, or the modules that share machine-wide state."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    from tests.shared_state import scope_of

    class SharedStateScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return SharedStateScheduling(config, log)


@dataclass(frozen=True)
class Snapshot:
    name: str
    kind: str  # "sysfs" or "xml"
    path: Path  # the extracted root (sysfs) or the XML file


def _sysfs_archives() -> list[Path]:
    return sorted((TOPOLOGIES / "sysfs").glob("*.tar.bz2"))


def _xml_files() -> list[Path]:
    return sorted((TOPOLOGIES / "xml").glob("*.xml"))


SNAPSHOT_IDS = [f"sysfs:{p.name.removesuffix('.tar.bz2')}" for p in _sysfs_archives()] + [
    f"xml:{p.stem}" for p in _xml_files()
]


@pytest.fixture(scope="session")
def snapshots_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All sysfs snapshots extracted into one session directory."""
    if not TOPOLOGIES.is_dir():
        pytest.fail(
            f"topology snapshots not found at {TOPOLOGIES} (expected ../shared beside the repo)"
        )
    out = tmp_path_factory.mktemp("topologies")
    for archive in _sysfs_archives():
        _extract(archive, out / _stem(archive))
    return out


def _extract(archive: Path, into: Path) -> None:
    """GNU tar unpacks the 28,000 files of the snapshots in about 1.5 s of CPU where
    Python's tarfile took 16 s (both give the same tree, modes and links; tarfile's
    "tar" filter refused nothing in them). The archive is decompressed here, so no
    bzip2 program is needed."""
    into.mkdir()
    subprocess.run(
        ["tar", "-x", "--no-same-owner", "--no-same-permissions", "-C", str(into)],
        input=bz2.decompress(archive.read_bytes()),
        capture_output=True,
        check=True,
    )


def _stem(archive: Path) -> str:
    return archive.name.removesuffix(".tar.bz2")


def sysfs_root(snapshots_dir: Path, name: str) -> Path:
    """The file-system root inside an extracted archive (its single top folder, whose
    name can differ from the archive's)."""
    (top,) = [p for p in (snapshots_dir / name).iterdir() if p.is_dir()]
    return top


@pytest.fixture(scope="session")
def all_snapshots(snapshots_dir: Path) -> list[Snapshot]:
    snaps = [
        Snapshot(_stem(p), "sysfs", sysfs_root(snapshots_dir, _stem(p))) for p in _sysfs_archives()
    ]
    snaps += [Snapshot(p.stem, "xml", p) for p in _xml_files()]
    return snaps


@pytest.fixture(params=SNAPSHOT_IDS)
def snapshot(request: pytest.FixtureRequest, snapshots_dir: Path) -> Snapshot:
    """Parametrised over every snapshot in ../shared/topologies/."""
    kind, name = str(request.param).split(":", 1)
    if kind == "sysfs":
        return Snapshot(name, kind, sysfs_root(snapshots_dir, name))
    return Snapshot(name, kind, TOPOLOGIES / "xml" / f"{name}.xml")

"""A message that suggests ``--share DIR`` suggests only what ``--share`` accepts: the
working directory's warning and ``cluster up``'s refusal used to suggest ``--share /tmp``
while ``/tmp`` held the runtime directory, which ``--share`` then refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpcvm.errors import UsageError
from hpcvm.runtime.hostside import paths
from hpcvm.runtime.hostside import shares as sh


def _suggested(hint: str) -> str | None:
    found = re.search(r"--share (\S+)", hint)
    return found.group(1) if found else None


@pytest.mark.parametrize("runtime_under", [True, False], ids=["runtime-inside", "runtime-outside"])
def test_the_suggested_share_is_accepted_as_suggested(
    runtime_under: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = tmp_path / "job"
    job.mkdir()
    outside = tmp_path / "elsewhere" / "rt"
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(job / "rt" if runtime_under else outside))
    hint = sh.share_hint(str(job))
    share = _suggested(hint)
    assert share == str(job), hint
    if runtime_under:
        with pytest.raises(UsageError):
            sh.parse_share(share)  # refused as things are: so the hint says what to change
        assert f"set {paths.ENV_RUNTIME_DIR} to a directory outside it" in hint
        monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(outside))
    assert sh.parse_share(share).host_path == str(job)


def test_the_whole_root_is_never_suggested() -> None:
    hint = sh.share_hint("/")
    assert _suggested(hint) is None and "a directory of the job's own" in hint


def test_the_working_directory_warning_suggests_what_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from a world-writable directory holding the runtime directory (/tmp with the
    default /tmp/hpcvm-UID): the warning names the change that makes --share work."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o1777)
    monkeypatch.setenv(paths.ENV_RUNTIME_DIR, str(scratch / "hpcvm-rt"))
    warned: list[str] = []
    requests, _ = sh.builtin_requests((), str(scratch), warn=warned.append)
    assert not [r for r in requests if r.origin == "working directory"]
    (line,) = warned
    assert "holds hpcvm's runtime directory" in line
    assert f"{paths.ENV_RUNTIME_DIR} to a directory outside it and --share {scratch}" in line

"""Boot once, restore many: a running disk-image guest from a checkpoint cached on disk.

Booting the test image (tests/image_builder.py) under TCG takes 60-100 s on the CI
machine; restoring a checkpoint of the same guest takes a fraction of that (figures in
docs/testing.md). ``running_image_guest`` gives a test a running guest of the image,
named as asked: restored from the cache when there is one, else booted with ``hpcvm up
--image`` and then saved into the cache with ``hpcvm checkpoint --resume`` (it runs on)
for the next session.

Only for tests that need *a running guest*: a test whose subject is the boot itself
(``up --image``, the seed, cloud-init; tests/integration/test_image_boot.py) still boots.

The cache lives beside the image, in ``booted/<key>``, where the key hashes what the
saved guest was booted from and what must not differ to load it: the image's path,
size and modification time, the ``up`` arguments and name, the QEMU version and the
checkpoint schema version. Older keys are not removed (a session beside this one may be
restoring one); there are few (a new QEMU, a rebuilt image), and a new image recipe
makes a new directory for the image and its checkpoints. hpcvm's own restore
checks (manifest, hashes, emulator, base image, guest ABI) stand behind the key: a
checkpoint it refuses as damaged (exit 2) or incompatible (exit 3) is removed and the
guest booted instead. hpcvm writes a checkpoint into a hidden partial directory and
renames it whole, so a session beside this one sees a complete one or none; two
sessions saving the same key at once leave the first (the second is told it exists).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from hpcvm.runtime.checkpoint.model import CHECKPOINT_SCHEMA_VERSION
from tests.runtime_support import HPCVM

CACHE_DIR = "booted"
REFUSED = (2, 3)  # damaged / incompatible checkpoint (src/hpcvm/errors.py)


def qemu_version() -> str:
    """The first line of ``qemu-system-x86_64 --version``: a saved state loads only
    into the QEMU version that saved it."""
    done = subprocess.run(
        ["qemu-system-x86_64", "--version"], capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()[0].strip()


def cache_key(image: Path, name: str, up_args: Sequence[str]) -> str:
    """What the saved guest was booted from, hashed (see the module docstring)."""
    stat = image.stat()
    fields = {
        "image": [str(image), stat.st_size, stat.st_mtime_ns],
        "name": name,
        "up": list(up_args),
        "qemu": qemu_version(),
        "schema": CHECKPOINT_SCHEMA_VERSION,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def cached_checkpoint(image: Path, name: str, up_args: Sequence[str]) -> Path:
    """Where the checkpoint of this guest is (or will be) cached."""
    return image.parent / CACHE_DIR / cache_key(image, name, up_args)


def _hpcvm(
    args: Sequence[str], wrap: Sequence[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*wrap, HPCVM, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def running_image_guest(
    name: str,
    image: Path,
    up_args: Sequence[str],
    *,
    wrap: Sequence[str] = (),
    timeout: float = 1200.0,
) -> str:
    """Start guest ``name`` of ``image`` in the current runtime directory; return
    "restored" or "booted" (which one ran). ``wrap`` prefixes the hpcvm command line
    (``taskset -c PU``, as a cpuset would confine it). Fails the test with hpcvm's
    output when neither way starts it."""
    saved = cached_checkpoint(image, name, up_args)
    if saved.is_dir():
        done = _hpcvm(["restore", str(saved), "--name", name], wrap, timeout)
        if done.returncode == 0:
            return "restored"
        assert done.returncode in REFUSED, (done.returncode, done.stdout, done.stderr)
        shutil.rmtree(saved, ignore_errors=True)  # refused: stale or damaged
    up = _hpcvm(["up", "--name", name, *up_args, "--image", str(image)], wrap, timeout)
    assert up.returncode == 0, up.stderr
    _save(name, saved, timeout)
    return "booted"


def _save(name: str, saved: Path, timeout: float) -> None:
    """Save the running guest into the cache (it runs on)."""
    saved.parent.mkdir(parents=True, exist_ok=True)
    done = _hpcvm(["checkpoint", name, str(saved), "--resume"], (), timeout)
    assert done.returncode == 0 or "already exists" in done.stderr, done.stderr

"""The guest image cache: what changes the key, what is rebuilt, what bad input leaves.

Builds use ``--kernel`` on the unpacked distribution kernel (no download); most keep
the bzImage (``pvh=False``, ~0.3 s) since unpacking the PVH kernel takes seconds. The
apt route is exercised by tests/integration/test_guest_boot.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hpcvm.bootspec import SHARE_TABLE_FWCFG
from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.guest import hosttools, image, scripts
from hpcvm.guest import kernel as kernels
from hpcvm.guest.image import build_guest, cached_guest, ensure_guest, guest_inputs
from hpcvm.guest.initramfs import read_initrd
from tests.guest_support import unpacked_kernel


@pytest.fixture(scope="module")
def tree() -> kernels.KernelTree:
    return unpacked_kernel()


def _inputs_key() -> str:
    return guest_inputs("deb:linux-image-x=1", hosttools.busybox(), hosttools.qemu_ga()).key()


# -- the key ------------------------------------------------------------------------------


def test_key_is_stable_when_nothing_changes() -> None:
    assert _inputs_key() == _inputs_key()


def test_key_changes_with_each_input(monkeypatch: pytest.MonkeyPatch) -> None:
    base = _inputs_key()
    bb, ga = hosttools.busybox(), hosttools.qemu_ga()
    variants = {
        "kernel": guest_inputs("deb:linux-image-x=2", bb, ga).key(),
        "busybox": guest_inputs(
            "deb:linux-image-x=1", hosttools.HostTool(bb.path, "v9", bb.sha256), ga
        ).key(),
        "qemu-ga": guest_inputs(
            "deb:linux-image-x=1", bb, hosttools.HostTool(ga.path, ga.version, "0" * 64)
        ).key(),
    }
    with monkeypatch.context() as m:
        text, executable = scripts.FILES["init"]
        m.setitem(scripts.FILES, "init", (text + "# changed\n", executable))
        variants["init script"] = _inputs_key()
    with monkeypatch.context() as m:
        m.setattr(image, "GUEST_MODULES", (*image.GUEST_MODULES, "virtio_net"))
        variants["modules"] = _inputs_key()
    variants["pvh"] = guest_inputs("deb:linux-image-x=1", bb, ga, pvh=False).key()
    with monkeypatch.context() as m:
        m.setattr(image, "CMDLINE", image.CMDLINE + " debug")
        variants["cmdline"] = _inputs_key()
    assert _inputs_key() == base  # the context managers restored everything
    for what, key in variants.items():
        assert key != base, f"changing the {what} did not change the key"
    assert len(set(variants.values())) == len(variants)


# -- building and the cache ---------------------------------------------------------------


def test_build_then_cache_then_force(tree: kernels.KernelTree, tmp_path: Path) -> None:
    first = build_guest(kernel=tree.vmlinuz, cache_dir=tmp_path)
    assert not first.cached
    assert first.kernel_version == tree.vmlinuz.name.removeprefix("vmlinuz-")
    assert first.kernel_format == "elf-pvh" and first.kernel.name == "vmlinux"
    assert first.kernel.read_bytes()[:4] == b"\x7fELF"
    assert first.size_bytes == first.kernel.stat().st_size + first.initrd.stat().st_size
    assert first.build_seconds > 0
    assert "hpcvm.shares=" + SHARE_TABLE_FWCFG in first.cmdline.split()
    assert first.boot_spec().share_table
    names = {e.name for e in read_initrd(first.initrd)}
    assert {"init", "bin/busybox"} <= names
    built_at = first.initrd.stat().st_mtime_ns

    again = ensure_guest(kernel=tree.vmlinuz, cache_dir=tmp_path)
    assert again.cached
    assert again.model_copy(update={"cached": False}) == first
    assert again.initrd.stat().st_mtime_ns == built_at  # not rewritten
    assert cached_guest(kernel=tree.vmlinuz, cache_dir=tmp_path) == again

    forced = build_guest(kernel=tree.vmlinuz, cache_dir=tmp_path, force=True)
    assert not forced.cached
    assert forced.initrd == first.initrd
    assert forced.initrd.stat().st_mtime_ns != built_at
    # Nothing but the image directory and the lock: no scratch directories left.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "images"]


def test_bzimage_on_request(tree: kernels.KernelTree, tmp_path: Path) -> None:
    built = build_guest(kernel=tree.vmlinuz, cache_dir=tmp_path, pvh=False)
    assert built.kernel_format == "bzimage"
    assert built.kernel.read_bytes() == tree.vmlinuz.read_bytes()
    pvh = build_guest(kernel=tree.vmlinuz, cache_dir=tmp_path)
    assert pvh.inputs_hash != built.inputs_hash and pvh.kernel_format == "elf-pvh"


def test_changed_input_builds_a_new_image(
    tree: kernels.KernelTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = build_guest(kernel=tree.vmlinuz, cache_dir=tmp_path, pvh=False)
    text, executable = scripts.FILES["hpcvm/rc"]
    monkeypatch.setitem(scripts.FILES, "hpcvm/rc", (text + "# changed\n", executable))
    assert cached_guest(kernel=tree.vmlinuz, cache_dir=tmp_path, pvh=False) is None
    second = build_guest(kernel=tree.vmlinuz, cache_dir=tmp_path, pvh=False)
    assert not second.cached
    assert second.inputs_hash != first.inputs_hash
    rc = {e.name: e.data for e in read_initrd(second.initrd)}["hpcvm/rc"]
    assert rc.decode().endswith("# changed\n")
    assert first.initrd.is_file()  # the previous image is kept (KEEP_IMAGES)


def test_damaged_cache_entry_is_rebuilt(tree: kernels.KernelTree, tmp_path: Path) -> None:
    first = build_guest(kernel=tree.vmlinuz, cache_dir=tmp_path, pvh=False)
    first.initrd.write_bytes(b"truncated")
    assert cached_guest(kernel=tree.vmlinuz, cache_dir=tmp_path, pvh=False) is None
    again = ensure_guest(kernel=tree.vmlinuz, cache_dir=tmp_path, pvh=False)
    assert not again.cached
    assert again.initrd.stat().st_size > 1000


def test_old_images_are_pruned(
    tree: kernels.KernelTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = []
    for i in range(image.KEEP_IMAGES + 2):
        monkeypatch.setattr(image, "CMDLINE", f"{image.CMDLINE} x{i}")
        keys.append(build_guest(kernel=tree.vmlinuz, cache_dir=tmp_path, pvh=False).inputs_hash)
    left = {p.name for p in (tmp_path / "images").iterdir()}
    assert len(left) == image.KEEP_IMAGES
    assert keys[-1] in left


# -- --kernel ---------------------------------------------------------------------------


def test_missing_kernel_is_one_line_and_builds_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(UsageError) as info:
        build_guest(kernel=tmp_path / "no-such-vmlinuz", cache_dir=cache)
    assert "no-such-vmlinuz" in str(info.value) and "\n" not in str(info.value)
    assert not cache.exists()


def test_not_a_kernel_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "vmlinuz"
    bogus.write_bytes(b"\0" * 4096)
    with pytest.raises(UsageError, match="not a Linux kernel"):
        build_guest(kernel=bogus, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_kernel_release_is_read_from_the_bzimage(tree: kernels.KernelTree) -> None:
    # Debian names the file after the release: an independent source of truth.
    assert kernels.kernel_release(tree.vmlinuz) == tree.vmlinuz.name.removeprefix("vmlinuz-")


def test_kernel_without_modules_is_refused(tree: kernels.KernelTree, tmp_path: Path) -> None:
    lone = tmp_path / "boot" / "vmlinuz"
    lone.parent.mkdir()
    shutil.copyfile(tree.vmlinuz, lone)
    with pytest.raises(UsageError) as info:
        build_guest(kernel=lone, cache_dir=tmp_path / "cache")
    assert tree.release in str(info.value) and "lib/modules" in str(info.value)


def test_modules_without_modules_dep_leave_the_users_tree_alone(
    tree: kernels.KernelTree, tmp_path: Path
) -> None:
    """An unpacked package as users have it: modules but no modules.dep."""
    root = tmp_path / "root"
    mods = root / "lib/modules" / tree.release
    mods.mkdir(parents=True)
    (mods / "kernel").symlink_to(tree.modules_dir / "kernel")
    for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        shutil.copyfile(tree.modules_dir / name, mods / name)
    (root / "boot").mkdir()
    vmlinuz = root / "boot" / tree.vmlinuz.name
    shutil.copyfile(tree.vmlinuz, vmlinuz)
    before = sorted(os.listdir(mods))
    built = build_guest(kernel=vmlinuz, cache_dir=tmp_path / "cache", pvh=False)
    assert sorted(os.listdir(mods)) == before  # no modules.dep written there
    assert set(image.GUEST_MODULES) <= set(built.modules)


def test_config_missing_numa_is_refused(tree: kernels.KernelTree, tmp_path: Path) -> None:
    assert tree.config is not None
    kernels.check_config(tree)  # the real config passes
    text = tree.config.read_text().replace("CONFIG_NUMA=y", "# CONFIG_NUMA is not set")
    (tmp_path / "config").write_text(text)
    crippled = kernels.KernelTree(
        tree.vmlinuz, tree.release, tree.modules_dir, tmp_path / "config", "test", "test"
    )
    with pytest.raises(RuntimeFailure, match="CONFIG_NUMA"):
        kernels.check_config(crippled)


# -- the distribution package -------------------------------------------------------------


def test_resolved_package_is_apts_candidate(tmp_path: Path) -> None:
    import subprocess

    package = kernels.resolve_package(tmp_path)
    policy = subprocess.run(
        ["apt-cache", "policy", package.name], capture_output=True, text=True, check=True
    ).stdout
    candidate = next(ln.split()[-1] for ln in policy.splitlines() if "Candidate:" in ln)
    assert package.name.startswith("linux-image-") and package.version == candidate


def test_resolution_is_remembered_and_works_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = kernels.resolve_package(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no apt-cache from here on
    assert kernels.resolve_package(tmp_path) == package  # remembered
    (tmp_path / "kernel-package.json").unlink()
    with pytest.raises(RuntimeFailure) as info:
        kernels.resolve_package(tmp_path)
    assert "apt-get update" in str(info.value) and "--kernel" in str(info.value)
    # A .deb fetched earlier is enough without apt.
    (tmp_path / f"{package.name}_{package.version}_amd64.deb").write_bytes(b"")
    assert kernels.resolve_package(tmp_path) == package


def test_failed_download_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    bogus = kernels.KernelPackage("linux-image-6.1.0-56-amd64", "0.0.0-no-such-version")
    with pytest.raises(RuntimeFailure) as info:
        kernels.fetch_package(bogus, tmp_path)
    message = str(info.value)
    assert "\n" not in message and "apt-get update" in message and "--kernel" in message
    assert list(tmp_path.iterdir()) == []


def test_an_image_in_the_system_cache_serves_every_user(
    tree: kernels.KernelTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's hpcvm takes the image the node install built in root's cache (when it
    has the user's key) instead of building its own; without it, the user's own cache."""
    system, mine = tmp_path / "system", tmp_path / "mine"
    built = build_guest(kernel=tree.vmlinuz, cache_dir=system, pvh=False)
    monkeypatch.setattr(image, "SYSTEM_CACHE", system)
    found = build_guest(kernel=tree.vmlinuz, cache_dir=mine, pvh=False)
    assert found.cached and found.kernel == built.kernel
    assert not (mine / "images").exists()  # nothing built or locked in the user's cache
    shutil.rmtree(system / "images")
    own = build_guest(kernel=tree.vmlinuz, cache_dir=mine, pvh=False)
    assert own.kernel.is_relative_to(mine)

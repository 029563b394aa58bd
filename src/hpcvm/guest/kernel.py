"""The guest kernel: the distribution's kernel package, or one the user points at.

The default is the package ``linux-image-amd64`` depends on, fetched with
``apt-get download`` into hpcvm's cache and unpacked with ``dpkg-deb -x``: nothing is
installed on the host and nothing but distribution packages is downloaded. Debian's
package ships its modules without ``modules.dep``, so ``depmod -b`` writes one into the
unpacked tree. With ``--kernel PATH`` the modules come from a ``lib/modules/<release>``
beside the kernel (an unpacked package) or from the host's ``/lib/modules/<release>``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from hpcvm.errors import RuntimeFailure, UsageError
from hpcvm.host.privilege import for_admin

KERNEL_META_PACKAGE = "linux-image-amd64"
APT_LISTS = Path("/var/lib/apt/lists")
_RESOLVED_FILE = "kernel-package.json"

# Kernel options the built-in guest relies on: an initramfs it can unpack, devtmpfs
# because there is no udev, and NUMA and hugetlbfs because the guest's topology and
# memory are what hpcvm checks. "m" is accepted where the initramfs loads a module.
REQUIRED_CONFIG: dict[str, tuple[str, ...]] = {
    "CONFIG_BLK_DEV_INITRD": ("y",),
    "CONFIG_RD_GZIP": ("y",),
    "CONFIG_DEVTMPFS": ("y",),
    "CONFIG_TMPFS": ("y",),
    "CONFIG_NUMA": ("y",),
    "CONFIG_HUGETLBFS": ("y",),
    "CONFIG_SERIAL_8250_CONSOLE": ("y",),
    "CONFIG_VIRTIO_PCI": ("y", "m"),
    "CONFIG_NET_9P_VIRTIO": ("y", "m"),
    "CONFIG_9P_FS": ("y", "m"),
    "CONFIG_VIRTIO_CONSOLE": ("y", "m"),
    "CONFIG_OVERLAY_FS": ("y", "m"),
}


@dataclass(frozen=True)
class KernelPackage:
    """One version of a Debian kernel image package."""

    name: str  # linux-image-6.1.0-56-amd64
    version: str  # 6.1.192-2

    @property
    def identity(self) -> str:
        """What the image cache key uses for this kernel."""
        return f"deb:{self.name}={self.version}"

    def matches(self, deb: Path) -> bool:
        """True when ``deb`` is this package's file (apt names it name_version_arch.deb,
        with ':' of an epoch written as %3a)."""
        parts = deb.name.removesuffix(".deb").split("_")
        return len(parts) == 3 and parts[0] == self.name and unquote(parts[1]) == self.version


@dataclass(frozen=True)
class KernelTree:
    """A kernel and its modules, ready for the initramfs builder."""

    vmlinuz: Path
    release: str  # 6.1.0-56-amd64 (the /lib/modules directory name)
    modules_dir: Path  # has modules.dep and the module files it names
    config: Path | None  # the kernel's .config, when known
    source: str  # for people: "linux-image-6.1.0-56-amd64 6.1.192-2 (apt)" or a path
    identity: str  # for the cache key: package and version, or the file's hash


# -- the distribution package -----------------------------------------------------------


def _apt_lists_stamp() -> float:
    """Changes whenever ``apt-get update`` ran: the newest package index file."""
    try:
        return max(
            (e.stat().st_mtime for e in os.scandir(APT_LISTS) if e.name.endswith("Packages")),
            default=0.0,
        )
    except OSError:
        return 0.0


def _apt_show(package: str) -> dict[str, str]:
    """Fields of the candidate version of ``package`` (apt-cache show), {} if unknown."""
    try:
        proc = subprocess.run(
            ["apt-cache", "show", "--no-all-versions", package],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        return {}
    if proc.returncode != 0:
        return {}
    fields: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition(": ")
        if sep and not line.startswith(" "):
            fields.setdefault(key, value.strip())
    return fields


def _resolve_with_apt(meta: str) -> KernelPackage | None:
    """The versioned kernel package the meta package depends on, from apt's index."""
    fields = _apt_show(meta)
    for dep in fields.get("Depends", "").split(","):
        words = dep.split("|")[0].split()
        if words and words[0].startswith("linux-image-"):
            name = words[0]
            if len(words) >= 3 and words[1] == "(=":
                return KernelPackage(name, words[2].rstrip(")"))
            version = _apt_show(name).get("Version")
            return KernelPackage(name, version) if version else None
    return None


def _newest_cached_deb(debs_dir: Path) -> KernelPackage | None:
    debs = sorted(debs_dir.glob("linux-image-*.deb"), key=lambda p: p.stat().st_mtime)
    for deb in reversed(debs):
        parts = deb.name.removesuffix(".deb").split("_")
        if len(parts) == 3:
            return KernelPackage(parts[0], unquote(parts[1]))
    return None


def resolve_package(
    debs_dir: Path, meta: str = KERNEL_META_PACKAGE, *, remember: bool = True
) -> KernelPackage:
    """The kernel package to use: apt's candidate, remembered until apt's index changes
    (``apt-cache`` takes most of a second, too long to pay on every ``hpcvm up``).
    ``remember=False`` writes nothing (``guest info``, a cache this user cannot write).

    Without a usable index, the newest package already in the cache is used, so a
    machine that built the guest once keeps working offline.
    """
    stamp = _apt_lists_stamp()
    memo = debs_dir / _RESOLVED_FILE
    try:
        saved = json.loads(memo.read_text())
        if saved.get("meta") == meta and saved.get("stamp") == stamp:
            return KernelPackage(saved["name"], saved["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    package = _resolve_with_apt(meta)
    if package is not None and not remember:
        return package
    if package is not None:
        debs_dir.mkdir(parents=True, exist_ok=True)
        record = {"meta": meta, "stamp": stamp, "name": package.name, "version": package.version}
        _write_atomic(memo, json.dumps(record))
        return package
    cached = _newest_cached_deb(debs_dir) if debs_dir.is_dir() else None
    if cached is not None:
        return cached
    raise RuntimeFailure(
        f"apt knows no package {meta} (no package index?): "
        + for_admin("run `apt-get update`")
        + ", or pass a kernel with --kernel PATH"
    )


def fetch_package(package: KernelPackage, debs_dir: Path) -> Path:
    """The package's .deb in ``debs_dir``, downloaded with ``apt-get download`` unless
    it is already there. Other kernel .debs there are removed (70 MB each)."""
    debs_dir.mkdir(parents=True, exist_ok=True)
    for deb in debs_dir.glob("*.deb"):
        if package.matches(deb):
            return deb
    with tempfile.TemporaryDirectory(prefix=".download-", dir=debs_dir) as tmp:
        # In a private directory so an interrupted download leaves no partial .deb
        # where the next run would take it for a good one.
        proc = subprocess.run(
            ["apt-get", "download", "-q", f"{package.name}={package.version}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
        got = sorted(Path(tmp).glob("*.deb"))
        if proc.returncode != 0 or len(got) != 1:
            lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("E:")]
            detail = lines[-1] if lines else f"exit code {proc.returncode}"
            raise RuntimeFailure(
                f"cannot download {package.name} {package.version} with apt-get ({detail}): "
                + for_admin("check the network and run `apt-get update`")
                + ", or pass --kernel PATH"
            )
        target = debs_dir / got[0].name
        os.replace(got[0], target)
    for deb in debs_dir.glob("linux-image-*.deb"):
        if deb != target:
            deb.unlink(missing_ok=True)
    return target


def unpack_package(deb: Path, package: KernelPackage, dest: Path) -> KernelTree:
    """Unpack ``deb`` into ``dest`` (a scratch directory) and run depmod there."""
    _run(["dpkg-deb", "-x", str(deb), str(dest)], f"cannot unpack {deb.name}")
    kernels = sorted((dest / "boot").glob("vmlinuz-*"))
    if len(kernels) != 1:
        raise RuntimeFailure(f"{deb.name} holds {len(kernels)} kernels in /boot, expected 1")
    release = kernels[0].name.removeprefix("vmlinuz-")
    modules_dir = _find_modules_dir(dest, release)
    if modules_dir is None:
        raise RuntimeFailure(f"{deb.name} has no lib/modules/{release}")
    _run(
        ["depmod", "-b", str(modules_dir.parent.parent.parent), release],
        f"depmod failed for {release}",
    )
    config = dest / "boot" / f"config-{release}"
    return KernelTree(
        vmlinuz=kernels[0],
        release=release,
        modules_dir=modules_dir,
        config=config if config.is_file() else None,
        source=f"{package.name} {package.version} (apt)",
        identity=package.identity,
    )


# -- a kernel file given with --kernel --------------------------------------------------


def kernel_release(vmlinuz: Path) -> str:
    """The release string (``uname -r``) written in a bzImage's setup header.

    The header holds a pointer (at 0x20E, relative to 0x200) to the version string
    "6.1.0-56-amd64 (builder) #1 SMP ..."; its first word is the release.
    """
    try:
        with vmlinuz.open("rb") as fh:
            head = fh.read(0x8000)
    except OSError as exc:
        raise UsageError(f"cannot read kernel {vmlinuz}: {exc.strerror}") from exc
    if len(head) < 0x210 or head[0x202:0x206] != b"HdrS":
        raise UsageError(f"{vmlinuz} is not a Linux kernel (bzImage): pass a vmlinuz file")
    offset = int.from_bytes(head[0x20E:0x210], "little") + 0x200
    text = head[offset : offset + 256].split(b"\0", 1)[0].decode("ascii", "replace")
    release = text.split(" ", 1)[0]
    if not release:
        raise UsageError(f"{vmlinuz} has no version string: pass a distribution vmlinuz file")
    return release


def _find_modules_dir(root: Path, release: str) -> Path | None:
    for candidate in (root / "lib/modules" / release, root / "usr/lib/modules" / release):
        if (candidate / "kernel").is_dir():
            return candidate
    return None


def tree_for_kernel_file(vmlinuz: Path, scratch: Path, sha256: str) -> KernelTree:
    """The modules that go with a kernel file, with a modules.dep.

    Looked for beside the kernel (``<root>/boot/vmlinuz-R`` -> ``<root>/lib/modules/R``)
    and then in the host's ``/lib/modules/R``. Without a modules.dep, depmod runs on a
    symlinked copy in ``scratch``, so the user's tree is never written to.
    """
    release = kernel_release(vmlinuz)
    roots = [vmlinuz.parent.parent, Path("/")]
    modules_dir = next((d for r in roots if (d := _find_modules_dir(r, release))), None)
    if modules_dir is None:
        looked = ", ".join(str(r / "lib/modules" / release) for r in roots)
        raise UsageError(
            f"no modules for kernel {release} (looked in {looked}): "
            + for_admin("install its linux-image package")
            + ", or unpack it (dpkg-deb -x) and pass the vmlinuz inside"
        )
    if not (modules_dir / "modules.dep").is_file():
        modules_dir = _depmod_copy(modules_dir, release, scratch)
    config = vmlinuz.parent / f"config-{release}"
    return KernelTree(
        vmlinuz=vmlinuz,
        release=release,
        modules_dir=modules_dir,
        config=config if config.is_file() else None,
        source=str(vmlinuz),
        identity=f"file:{sha256}",
    )


def _depmod_copy(modules_dir: Path, release: str, scratch: Path) -> Path:
    """A copy of ``modules_dir`` made of symlinks, with the modules.dep depmod writes."""
    copy = scratch / "lib/modules" / release
    copy.mkdir(parents=True)
    for entry in modules_dir.iterdir():
        if entry.is_dir():
            (copy / entry.name).symlink_to(entry)
        elif entry.name.startswith("modules.builtin") or entry.name == "modules.order":
            shutil.copy2(entry, copy / entry.name)
    _run(["depmod", "-b", str(scratch), release], f"depmod failed for {release}")
    return copy


# -- checks -----------------------------------------------------------------------------


def check_config(tree: KernelTree) -> None:
    """Refuse a kernel whose .config lacks what the guest needs (when the config is
    known): better one clear line now than a guest that hangs or shows one NUMA node."""
    if tree.config is None:
        return
    values: dict[str, str] = {}
    for line in tree.config.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("CONFIG_"):
            values[key] = value
    missing = [
        f"{key}={'/'.join(ok)}" for key, ok in REQUIRED_CONFIG.items() if values.get(key) not in ok
    ]
    if missing:
        raise RuntimeFailure(
            f"kernel {tree.release} lacks {', '.join(missing)} (from {tree.config}): "
            "use a distribution kernel"
        )


# -- helpers ----------------------------------------------------------------------------


def _run(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise RuntimeFailure(
            f"{what}: {cmd[0]} is not installed ("
            + for_admin("install dpkg and kmod (scripts/install-node.sh)")
            + ")"
        ) from exc
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeFailure(f"{what}: {lines[-1] if lines else f'exit {proc.returncode}'}")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

"""The built-in guest image and its cache.

An image is a kernel and an initramfs in ``<cache>/images/<key>/``, where ``key`` hashes
everything that goes into it: the kernel (package and version, or the file's hash),
the module list, the boot scripts, busybox, qemu-ga and the command line. Asking for
the image again returns the cached one unless an input changed, so ``hpcvm up`` pays
for a build once (a few seconds, plus one download of the kernel package).

Cache location: ``$HPCVM_CACHE/guest`` if set; else ``/var/cache/hpcvm/guest`` for
root and ``~/.cache/hpcvm/guest`` (or ``$XDG_CACHE_HOME/hpcvm/guest``) for other
users. Root's default is outside /root on purpose: libvirt's QEMU may run as another
user (libvirt-qemu) and must be able to read the kernel and initramfs. A user first
looks in root's cache, where the node install built the image once for everyone
(scripts/install-node.sh), and builds one of their own only when it lacks it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from hpcvm.bootspec import SHARE_TABLE_FWCFG, BootSpec
from hpcvm.errors import UsageError
from hpcvm.guest import hosttools, scripts
from hpcvm.guest import kernel as kernels
from hpcvm.guest.initramfs import build_entries, write_initrd
from hpcvm.guest.modules import GUEST_MODULES, ModuleIndex
from hpcvm.guest.vmlinux import extract_pvh_vmlinux
from hpcvm.model import Frozen

ENV_CACHE = "HPCVM_CACHE"
BUILDER_VERSION = 3  # bump when the builder itself changes what it writes
AGENT_PORT = "org.qemu.guest_agent.0"
# hpcvm.shares= names the fw_cfg entry of the share table (and marks the built-in guest)
CMDLINE = f"console=ttyS0 quiet panic=-1 hpcvm.shares={SHARE_TABLE_FWCFG}"
KEEP_IMAGES = 3  # older images beyond this many are removed after a build

IMAGE_FILE = "image.json"
KERNEL_FILE = "vmlinuz"  # the bzImage as packaged
VMLINUX_FILE = "vmlinux"  # uncompressed, booted through PVH (see vmlinux.py)
INITRD_FILE = "initrd.img"


class GuestImage(Frozen):
    """A built guest: what the runtime passes to QEMU (``-kernel``, ``-initrd``,
    ``-append``); the runtime adds the shares and their table (runtime/hostside/shares.py)."""

    kernel: Path  # an uncompressed PVH vmlinux (kernel_format "elf-pvh") or the bzImage
    initrd: Path
    kernel_version: str  # uname -r in the guest, e.g. 6.1.0-56-amd64
    kernel_source: str  # "linux-image-6.1.0-56-amd64 6.1.192-2 (apt)" or the --kernel path
    kernel_format: str = "bzimage"  # "elf-pvh": boots without decompressing under TCG
    cmdline: str
    agent_port_name: str = AGENT_PORT
    modules: tuple[str, ...]  # in load order
    busybox_version: str
    qemu_ga_version: str
    inputs_hash: str
    build_seconds: float
    size_bytes: int  # kernel + initramfs
    cached: bool = False  # True when this call found it in the cache

    def boot_spec(self, **endpoints: str | None) -> BootSpec:
        """A BootSpec booting this image; ``endpoints`` adds the runtime's sockets and
        logs (agent_socket, serial_log, qmp_socket, pidfile)."""
        return BootSpec(
            kernel=str(self.kernel),
            initrd=str(self.initrd),
            cmdline=self.cmdline,
            share_table=True,
            agent_port_name=self.agent_port_name,
            **endpoints,
        )


class GuestInputs(Frozen):
    """Everything an image is made of; its hash names the image in the cache."""

    builder: int = BUILDER_VERSION
    kernel: str  # KernelPackage.identity or "file:<sha256>"
    modules: tuple[str, ...]
    pvh: bool  # ship the uncompressed kernel when it has a PVH entry
    scripts_sha256: str
    busybox: str  # version and hash
    qemu_ga: str
    cmdline: str

    def key(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:20]


SYSTEM_CACHE = Path("/var/cache/hpcvm/guest")  # root's, readable by all (install-node.sh)


def default_cache_dir() -> Path:
    """Where images are kept (see the module docstring)."""
    explicit = os.environ.get(ENV_CACHE)
    if explicit:
        return Path(explicit).expanduser().absolute() / "guest"
    if os.geteuid() == 0:
        return SYSTEM_CACHE
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "hpcvm" / "guest"


def scripts_sha256() -> str:
    digest = hashlib.sha256()
    for name, (text, executable) in sorted(scripts.FILES.items()):
        digest.update(f"{name}\0{executable}\0{text}\0".encode())
    return digest.hexdigest()


def guest_inputs(
    kernel_identity: str,
    busybox: hosttools.HostTool,
    qemu_ga: hosttools.HostTool,
    *,
    pvh: bool = True,
) -> GuestInputs:
    return GuestInputs(
        kernel=kernel_identity,
        modules=GUEST_MODULES,
        pvh=pvh,
        scripts_sha256=scripts_sha256(),
        busybox=f"{busybox.version} {busybox.sha256}",
        qemu_ga=f"{qemu_ga.version} {qemu_ga.sha256}",
        cmdline=CMDLINE,
    )


# -- the cache --------------------------------------------------------------------------


def readable_dir(path: Path) -> Path:
    """``path`` made (with its parents) and 0755 whatever this process's umask is: QEMU
    runs as another user (hpcvm-qemu, libvirt-qemu) that must read the kernel and
    initramfs, and a process started with umask 077 (a batch system's task) would
    otherwise make the cache unreadable to it for every later VM."""
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != 0o755 and path.stat().st_uid == os.geteuid():
        path.chmod(0o755)
    return path


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One builder at a time per cache (concurrent ``hpcvm up`` would race)."""
    readable_dir(cache)
    fd = os.open(cache / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load_cached(cache: Path, key: str) -> GuestImage | None:
    """The image stored under ``key`` if it is complete and intact, else None."""
    directory = cache / "images" / key
    try:
        image = GuestImage.model_validate_json((directory / IMAGE_FILE).read_text())
    except (OSError, ValidationError):
        return None
    try:
        size = image.kernel.stat().st_size + image.initrd.stat().st_size
    except OSError:
        return None
    if image.inputs_hash != key or size != image.size_bytes:
        return None
    return image.model_copy(update={"cached": True})


def _prune(images: Path, keep: str) -> None:
    """Keep the ``KEEP_IMAGES`` most recently used images (``keep`` always)."""
    dirs = [d for d in images.iterdir() if d.is_dir() and not d.name.startswith(".")]
    dirs.sort(key=lambda d: (d.name == keep, _mtime(d / IMAGE_FILE)), reverse=True)
    for old in dirs[KEEP_IMAGES:]:
        shutil.rmtree(old, ignore_errors=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# -- building ---------------------------------------------------------------------------


def _check_kernel_arg(path: Path) -> Path:
    path = path.expanduser().absolute()
    try:
        found = stat.S_ISREG(path.stat().st_mode)
    except FileNotFoundError:
        found = False
    except OSError as exc:
        raise UsageError(
            f"--kernel {path}: cannot be reached ({os.strerror(exc.errno or 0)}); pass a "
            "vmlinuz file you may read"
        ) from None
    if not found:
        raise UsageError(f"kernel not found: {path} (pass the path of a vmlinuz file)")
    kernels.kernel_release(path)  # refuses a file that is not a bzImage
    return path


def _cache_label(cache_dir: Path | None, cache: Path) -> str:
    """How a message names the cache, and so what to change: the option, the variable,
    or the default."""
    if cache_dir is not None:
        return f"--cache-dir {cache}"
    source = f"${ENV_CACHE}" if os.environ.get(ENV_CACHE) else "the default"
    return f"the guest cache {cache} ({source}; --cache-dir or {ENV_CACHE} picks another)"


def _cache_problem(cache: Path, *, write: bool) -> str | None:
    """Why this user cannot read (``write``: make and write) ``cache``, or None. A
    missing cache can be read (it holds nothing) and written when its nearest existing
    parent is a directory this user may write."""
    try:
        mode = cache.stat().st_mode
    except FileNotFoundError:
        if not write:
            return None
        parent = cache.parent
        while not os.path.lexists(parent) and parent != parent.parent:
            parent = parent.parent
        if not os.path.isdir(parent):
            return f"it cannot be made: {parent} is not a directory"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"it cannot be made: {parent} is not writable by you"
        return None
    except OSError as exc:
        return f"it cannot be reached ({os.strerror(exc.errno or 0)})"
    if not stat.S_ISDIR(mode):
        return "it is not a directory"
    need = os.R_OK | os.X_OK | (os.W_OK if write else 0)
    if not os.access(cache, need):
        return f"it is not {'writable' if write else 'readable'} by you"
    return None


def _check_cache(cache_dir: Path | None, cache: Path, *, write: bool) -> None:
    """UsageError, before anything is read or made, for a cache this user cannot use."""
    problem = _cache_problem(cache, write=write)
    if problem is not None:
        raise UsageError(
            f"{_cache_label(cache_dir, cache)}: {problem}; give a directory of your own"
        )


def build_guest(
    *,
    kernel: Path | None = None,
    cache_dir: Path | None = None,
    force: bool = False,
    pvh: bool = True,
) -> GuestImage:
    """The guest image for this host: from the cache when its inputs are unchanged
    (unless ``force``), else built now.

    ``kernel`` is a vmlinuz file to use instead of the distribution package; its
    modules must be beside it or in /lib/modules. ``pvh=False`` keeps the compressed
    bzImage instead of the faster-booting uncompressed kernel. Bad input (a missing
    kernel) fails before anything is created.
    """
    kernel_file = _check_kernel_arg(kernel) if kernel is not None else None
    cache = (cache_dir or default_cache_dir()).expanduser().absolute()
    _check_cache(cache_dir, cache, write=False)
    busybox = hosttools.busybox()
    qemu_ga = hosttools.qemu_ga()
    debs = cache / "debs"
    if kernel_file is not None:
        kernel_sha = hosttools.file_sha256(kernel_file)
        identity = f"file:{kernel_sha}"
        package = None
    else:
        writable = _cache_problem(cache, write=True) is None
        package = kernels.resolve_package(debs, remember=writable)
        identity = package.identity
    inputs = guest_inputs(identity, busybox, qemu_ga, pvh=pvh)
    key = inputs.key()
    if not force and cache != SYSTEM_CACHE and (shared := load_cached(SYSTEM_CACHE, key)):
        return shared  # the node install built it once for every user (read-only here)
    _check_cache(cache_dir, cache, write=True)
    with _locked(cache):
        images = readable_dir(cache / "images")
        if not force and (image := load_cached(cache, key)) is not None:
            os.utime(cache / "images" / key / IMAGE_FILE)
            return image
        begin = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=".build-", dir=cache) as scratch:
            work = Path(scratch)
            if package is not None:
                deb = kernels.fetch_package(package, debs)
                tree = kernels.unpack_package(deb, package, work / "root")
            else:
                assert kernel_file is not None
                tree = kernels.tree_for_kernel_file(kernel_file, work / "depmod", kernel_sha)
            out = work / "out"
            image = _assemble(tree, busybox, qemu_ga, images / key, out, key, begin, pvh)
        _prune(images, key)
        return image


def _assemble(
    tree: kernels.KernelTree,
    busybox: hosttools.HostTool,
    qemu_ga: hosttools.HostTool,
    final: Path,
    out: Path,
    key: str,
    begin: float,
    pvh: bool,
) -> GuestImage:
    """Write kernel, initramfs and record into ``out`` and move it to ``final``."""
    kernels.check_config(tree)
    index = ModuleIndex.load(tree.modules_dir)
    plan = index.load_plan(GUEST_MODULES)
    order = [name for name, _ in plan]
    out.mkdir()
    elf = extract_pvh_vmlinux(tree.vmlinuz) if pvh else None
    kernel_file = KERNEL_FILE if elf is None else VMLINUX_FILE
    if elf is None:
        shutil.copyfile(tree.vmlinuz, out / kernel_file)
    else:
        (out / kernel_file).write_bytes(elf)
    modules = [(name, tree.modules_dir / index.paths[name]) for name in order]
    devices = {name: patterns for name, patterns in plan if patterns}
    write_initrd(build_entries(busybox.path, modules, devices), out / INITRD_FILE)
    for path in (out, out / kernel_file, out / INITRD_FILE):
        path.chmod(0o755 if path.is_dir() else 0o644)
    image = GuestImage(
        kernel=final / kernel_file,
        initrd=final / INITRD_FILE,
        kernel_version=tree.release,
        kernel_source=tree.source,
        kernel_format="bzimage" if elf is None else "elf-pvh",
        cmdline=CMDLINE,
        modules=tuple(order),
        busybox_version=busybox.version,
        qemu_ga_version=qemu_ga.version,
        inputs_hash=key,
        build_seconds=round(time.monotonic() - begin, 3),
        size_bytes=(out / kernel_file).stat().st_size + (out / INITRD_FILE).stat().st_size,
    )
    (out / IMAGE_FILE).write_text(image.model_dump_json(indent=2))
    (out / IMAGE_FILE).chmod(0o644)
    if final.exists():
        shutil.rmtree(final)
    os.replace(out, final)
    return image


def ensure_guest(
    *, kernel: Path | None = None, cache_dir: Path | None = None, pvh: bool = True
) -> GuestImage:
    """The cached image, built first if missing or out of date (what ``hpcvm up`` calls)."""
    return build_guest(kernel=kernel, cache_dir=cache_dir, force=False, pvh=pvh)


def cached_guest(
    *, kernel: Path | None = None, cache_dir: Path | None = None, pvh: bool = True
) -> GuestImage | None:
    """The up-to-date cached image, or None when it would have to be built (never builds,
    never downloads and writes nothing: for ``hpcvm guest info``). Where ``build_guest``
    would take it from: the site's cache (``SYSTEM_CACHE``, built by the node install)
    first, then ``cache_dir`` or the default."""
    kernel_file = _check_kernel_arg(kernel) if kernel is not None else None
    cache = (cache_dir or default_cache_dir()).expanduser().absolute()
    _check_cache(cache_dir, cache, write=False)
    if kernel_file is not None:
        identity = f"file:{hosttools.file_sha256(kernel_file)}"
    else:
        identity = kernels.resolve_package(cache / "debs", remember=False).identity
    key = guest_inputs(identity, hosttools.busybox(), hosttools.qemu_ga(), pvh=pvh).key()
    if cache != SYSTEM_CACHE and (shared := load_cached(SYSTEM_CACHE, key)):
        return shared
    return load_cached(cache, key)

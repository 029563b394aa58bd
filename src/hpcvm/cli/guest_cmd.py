"""`hpcvm guest build|info`: the built-in guest image (kernel + initramfs) in the cache.

``hpcvm up`` builds it on first use anyway; these commands build it ahead of time
(``--force`` to rebuild) and show what is cached, with its build time and size.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpcvm.cli.common import console
from hpcvm.units import human_size

if TYPE_CHECKING:  # imported where a command runs, so that --help imports no guest code
    from hpcvm.guest.image import GuestImage

_kernel_option = click.option(
    "--kernel",
    "kernel",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A vmlinuz to use instead of the distribution's kernel package; its modules "
    "must be in a lib/modules/<release> beside it or in /lib/modules.",
)
_bzimage_option = click.option(
    "--bzimage",
    is_flag=True,
    help="Keep the compressed bzImage instead of the uncompressed PVH kernel "
    "(which boots seconds faster under TCG).",
)
_cache_option = click.option(
    "--cache-dir",
    "cache_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where images are kept (default: $HPCVM_CACHE/guest, /var/cache/hpcvm/guest "
    "for root, else ~/.cache/hpcvm/guest).",
)


@click.group("guest")
def guest_group() -> None:
    """The built-in guest: the distribution kernel, an initramfs hpcvm generates, and
    a list of host directories shared read-only under a tmpfs overlay."""


def _print(image: GuestImage) -> None:
    from hpcvm.runtime.hostside.shares import SHARES_SUMMARY

    rows = (
        ("kernel", f"{image.kernel_version} ({image.kernel_source})"),
        ("boot file", f"{image.kernel} ({image.kernel_format})"),
        ("initrd", str(image.initrd)),
        ("cmdline", image.cmdline),
        ("shares", SHARES_SUMMARY),
        ("modules", " ".join(image.modules)),
        ("busybox", image.busybox_version),
        ("qemu-ga", image.qemu_ga_version),
        ("size", human_size(image.size_bytes)),
        ("built in", f"{image.build_seconds:.1f} s"),
        ("inputs", image.inputs_hash),
    )
    for key, value in rows:
        console.print(f"[bold]{key:<11}[/bold] {value}", highlight=False, soft_wrap=True)


@guest_group.command("build")
@_kernel_option
@_cache_option
@_bzimage_option
@click.option("--force", is_flag=True, help="Rebuild even if the cached image is current.")
@click.option("--json", "as_json", is_flag=True, help="Print the GuestImage as JSON.")
def build_command(
    kernel: Path | None, cache_dir: Path | None, bzimage: bool, force: bool, as_json: bool
) -> None:
    """Build the guest image (or find it in the cache) and print its build time and size."""
    from hpcvm.guest.image import build_guest

    image = build_guest(kernel=kernel, cache_dir=cache_dir, force=force, pvh=not bzimage)
    if as_json:
        click.echo(image.model_dump_json(indent=2))
        return
    state = "cached (inputs unchanged)" if image.cached else "built"
    console.print(
        f"guest image {state}: kernel {image.kernel_version}, "
        f"{human_size(image.size_bytes)}, build time {image.build_seconds:.1f} s",
        highlight=False,
        soft_wrap=True,
    )
    _print(image)


@guest_group.command("info")
@_kernel_option
@_cache_option
@_bzimage_option
@click.option("--json", "as_json", is_flag=True, help="Print the GuestImage as JSON.")
def info_command(kernel: Path | None, cache_dir: Path | None, bzimage: bool, as_json: bool) -> int:
    """Show the cached guest image, without building or downloading anything."""
    from hpcvm.guest.image import SYSTEM_CACHE, cached_guest, default_cache_dir

    image = cached_guest(kernel=kernel, cache_dir=cache_dir, pvh=not bzimage)
    if image is None:  # README: exit 1, nothing to show (not an error)
        where = (cache_dir or default_cache_dir()).expanduser().absolute()
        site = "" if where == SYSTEM_CACHE else f" nor in the site's {SYSTEM_CACHE}"
        click.echo(f"no current guest image in {where}{site}: run `hpcvm guest build`", err=True)
        return 1
    if as_json:
        click.echo(image.model_dump_json(indent=2))
    else:
        _print(image)
    return 0


def register(group: click.Group) -> None:
    """Add this module's commands to the CLI group."""
    group.add_command(guest_group)

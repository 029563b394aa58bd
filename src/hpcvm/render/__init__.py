"""render stage of the hpcvm pipeline (see DESIGN.md): one plan, many target formats.

Pure functions, no I/O: ``qemu_argv``/``qemu_command_line`` for the QEMU backend and
``hpcvm plan --format qemu``, ``libvirt_xml`` for the libvirt backend and
``--format libvirt``. A ``BootSpec`` adds what the runtime needs to boot the plan.
"""

from typing import TYPE_CHECKING

from hpcvm.lazy import lazy_exports

if TYPE_CHECKING:
    from hpcvm.bootspec import BootSpec
    from hpcvm.render.libvirt import libvirt_xml
    from hpcvm.render.qemu import qemu_argv, qemu_command_line

__all__ = [
    "BootSpec",
    "libvirt_xml",
    "qemu_argv",
    "qemu_command_line",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "hpcvm.bootspec": ("BootSpec",),
        "hpcvm.render.libvirt": ("libvirt_xml",),
        "hpcvm.render.qemu": ("qemu_argv", "qemu_command_line"),
    },
)

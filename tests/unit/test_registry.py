"""The shared registry shape: registered order, no silent override, a one-line refusal
naming the known entries for an unknown name (exit 2, a usage error)."""

from __future__ import annotations

import pytest

from hpcvm.errors import UsageError
from hpcvm.registry import Registry
from hpcvm.render.targets import TARGETS
from hpcvm.report.formats import FORMATS
from hpcvm.runtime.backends.qemu_backend import QemuBackend
from hpcvm.runtime.backends.registry import BACKENDS, get_backend, own_process
from hpcvm.tune.registry import REGISTRY as SETTINGS
from hpcvm.tune.registry import get_setting


def test_order_override_and_unknown_names() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("b", 2)
    reg.register("a", 1)
    assert list(reg) == ["b", "a"] and reg["a"] == 1 and "b" in reg and len(reg) == 2
    with pytest.raises(UsageError, match="widget 'a' is registered twice"):
        reg.register("a", 3)
    with pytest.raises(UsageError) as refused:
        reg.get_or_refuse("c")
    assert str(refused.value) == "unknown widget 'c': use one of b, a"
    assert refused.value.exit_code == 2


def test_hpcvms_own_entries() -> None:
    assert list(TARGETS) == ["json", "qemu", "libvirt", "openstack", "kubevirt"]
    assert list(FORMATS) == ["html", "md", "json"]
    assert list(BACKENDS) == ["qemu", "libvirt"]
    assert isinstance(BACKENDS, Registry) and isinstance(SETTINGS, Registry)


def test_only_hpcvm_s_qemu_backend_is_its_own_process() -> None:
    """The light commands trust /proc and QMP for hpcvm's own QEMU only: its backend
    object agrees (it asks its own process), libvirt's daemon owns its QEMU."""
    from hpcvm.runtime.backends.qemu_backend import QemuBackend

    assert [name for name in BACKENDS if own_process(name)] == ["qemu"]
    assert isinstance(get_backend("qemu"), QemuBackend)
    assert not own_process("no-such-backend")


def test_backends_and_tuning_settings_refuse_like_every_registry() -> None:
    """The same one-line refusal as render targets and report formats, and a known
    name gives the real thing."""
    with pytest.raises(UsageError) as backend:
        get_backend("xen")
    assert str(backend.value) == "unknown backend 'xen': use one of qemu, libvirt"
    with pytest.raises(UsageError) as setting:
        get_setting("nmi_watchdogg")
    assert str(setting.value) == (
        f"unknown tuning setting 'nmi_watchdogg': use one of {', '.join(SETTINGS)}"
    )
    assert isinstance(get_backend("qemu"), QemuBackend)
    assert all(get_setting(name) is SETTINGS[name] for name in SETTINGS)

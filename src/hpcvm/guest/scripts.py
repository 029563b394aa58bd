"""The built-in guest's boot scripts (busybox sh), kept here as text so that their hash
is part of the image's cache key and a change to any of them rebuilds the image.

Two stages. ``/init`` in the initramfs loads the modules, mounts the host's root
read-only over virtio-9p with a tmpfs overlay on top, copies busybox and the stage-two
files into the new root's ``/run/hpcvm`` (a tmpfs) and switches root to busybox
``init``. That init is a real PID 1 (it reaps orphans); its inittab sets up the
pseudo-file systems and starts the host's qemu-guest-agent. ``/sbin/shutdown`` and
friends are replaced, in the overlay only, by a script that powers off at once:
Debian's are systemctl, which cannot work without systemd, and qemu-ga's
``guest-shutdown`` runs ``/sbin/shutdown``.

Kernel command line words they read:
  hpcvm.root=TAG       9p mount tag of the host root (default hpcvmroot)
  hpcvm.hostname=NAME  guest host name (default hpcvm)
  hpcvm.agent=NAME     virtio-serial port name of the agent (default org.qemu.guest_agent.0)

9p options: ``msize=512000`` is the largest the 6.1 virtio transport takes (larger is
clamped with a warning). ``cache=loose`` caches metadata and data in the guest, which
makes running the host's programs much faster; the overlay freezes the guest's view of
the host root at boot anyway (overlayfs does not support changes to a lower layer while
mounted), so a file created on the host after boot may not appear in the guest.
"""

from __future__ import annotations

# The initramfs layout the scripts rely on (initramfs.py builds it).
MODULES_DIR = "lib/modules"
MODULE_ORDER_FILE = "lib/modules/order"
STAGE2_DIR = "hpcvm"  # copied to /run/hpcvm in the new root

INIT = r"""#!/bin/busybox sh
# hpcvm guest, stage 1 (initramfs): mount the host's root read-only over virtio-9p,
# put a tmpfs overlay on it so the guest can write, and switch into it.
export PATH=/bin
bb=/bin/busybox

fail() {
    echo "hpcvm-guest: error: $*"
    $bb poweroff -f
}

$bb mount -t proc -o nosuid,nodev,noexec proc /proc
$bb mount -t sysfs -o nosuid,nodev,noexec sysfs /sys
$bb mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev

tag=hpcvmroot
for arg in $($bb cat /proc/cmdline); do
    case "$arg" in
        hpcvm.root=*) tag="${arg#*=}" ;;
    esac
done

while read -r mod; do
    $bb insmod "/lib/modules/$mod" || fail "cannot load kernel module $mod"
done < /lib/modules/order

opts=ro,trans=virtio,version=9p2000.L,msize=512000,cache=loose
i=0
until $bb mount -t 9p -o "$opts" "$tag" /mnt/lower 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 50 ] || fail "cannot mount the host root: no virtio-9p share with mount_tag=$tag"
    $bb sleep 0.1
done
$bb mount -t tmpfs -o mode=0755 hpcvm-rw /mnt/rw
$bb mkdir -p /mnt/rw/upper /mnt/rw/work
$bb mount -t overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work \
    hpcvm-root /newroot || fail "cannot mount the overlay root"

# Our own files live in the new root's /run (a tmpfs), so the host needs none of them
# and nothing of ours shows up elsewhere in the guest's file system.
$bb mount -t tmpfs -o mode=0755,nosuid,nodev hpcvm-run /newroot/run
$bb mkdir -p /newroot/run/hpcvm
$bb cp /bin/busybox /hpcvm/* /newroot/run/hpcvm/
$bb ln -s busybox /newroot/run/hpcvm/init
$bb rm -f /newroot/etc/inittab
$bb cp /hpcvm/inittab /newroot/etc/inittab

for m in dev proc sys; do $bb mount --move /$m /newroot/$m; done
exec $bb switch_root /newroot /run/hpcvm/init
fail "switch_root failed"
"""

INITTAB = r"""::sysinit:/run/hpcvm/busybox sh /run/hpcvm/rc
::once:/run/hpcvm/busybox sh /run/hpcvm/agent
::ctrlaltdel:/run/hpcvm/busybox poweroff -f
::shutdown:/run/hpcvm/busybox sync
"""

RC = r"""# hpcvm guest, stage 2 (PID 1 is busybox init in the overlay root): the usual
# pseudo-file systems, a host name, loopback, and shutdown commands that work
# without systemd (qemu-ga's guest-shutdown runs /sbin/shutdown).
bb=/run/hpcvm/busybox
$bb mkdir -p /dev/pts /dev/shm
$bb mount -t devpts -o nosuid,noexec,gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts
$bb mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /dev/shm
# No tmpfs on /tmp: the guest sees the host's /tmp through the overlay (writes stay in
# the guest), so programs and data under the host's /tmp run in the guest as natively.
$bb ln -sf /proc/self/fd /dev/fd
$bb ln -sf /proc/self/fd/0 /dev/stdin
$bb ln -sf /proc/self/fd/1 /dev/stdout
$bb ln -sf /proc/self/fd/2 /dev/stderr

name=hpcvm
for arg in $($bb cat /proc/cmdline); do
    case "$arg" in
        hpcvm.hostname=*) name="${arg#*=}" ;;
    esac
done
$bb hostname "$name"
$bb ip link set lo up

for cmd in shutdown poweroff reboot halt; do
    $bb rm -f "/sbin/$cmd"
    $bb ln -s /run/hpcvm/shutdown "/sbin/$cmd"
done
"""

AGENT = r"""# hpcvm guest: start the host's qemu-guest-agent on its virtio-serial port. Without
# udev nothing names the ports, so make the /dev/virtio-ports/ links qemu-ga expects.
bb=/run/hpcvm/busybox
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
port=org.qemu.guest_agent.0
for arg in $($bb cat /proc/cmdline); do
    case "$arg" in
        hpcvm.agent=*) port="${arg#*=}" ;;
    esac
done
$bb mkdir -p /dev/virtio-ports
i=0
while [ ! -e "/dev/virtio-ports/$port" ] && [ $i -lt 600 ]; do
    for dir in /sys/class/virtio-ports/vport*; do
        [ -r "$dir/name" ] || continue
        n=$($bb cat "$dir/name")
        [ -n "$n" ] && $bb ln -sf "../${dir##*/}" "/dev/virtio-ports/$n"
    done
    [ -e "/dev/virtio-ports/$port" ] || $bb sleep 0.05
    i=$((i + 1))
done
if [ ! -e "/dev/virtio-ports/$port" ]; then
    echo "hpcvm-guest: no virtio-serial port named $port: the guest agent is not started"
    exit 0
fi
$bb mkdir -p /run/qemu-ga
while :; do
    /usr/sbin/qemu-ga -m virtio-serial -p "/dev/virtio-ports/$port" -t /run/qemu-ga
    echo "hpcvm-guest: qemu-ga exited with status $?; restarting it"
    $bb sleep 1
done
"""

SHUTDOWN = r"""#!/run/hpcvm/busybox sh
# shutdown/poweroff/reboot/halt for the hpcvm guest: nothing on disk to flush (the
# root is a read-only share under tmpfs), so act at once. qemu-ga's guest-shutdown
# runs "shutdown -h -P|-H|-r +0 MESSAGE".
action=poweroff
case "${0##*/}" in
    reboot) action=reboot ;;
    halt) action=halt ;;
esac
for arg in "$@"; do
    case "$arg" in
        -r) action=reboot ;;
        -H) action=halt ;;
    esac
done
/run/hpcvm/busybox sync
exec /run/hpcvm/busybox "$action" -f
"""

# Path in the initramfs -> (text, executable).
FILES: dict[str, tuple[str, bool]] = {
    "init": (INIT, True),
    f"{STAGE2_DIR}/inittab": (INITTAB, False),
    f"{STAGE2_DIR}/rc": (RC, False),
    f"{STAGE2_DIR}/agent": (AGENT, False),
    f"{STAGE2_DIR}/shutdown": (SHUTDOWN, True),
}

"""The built-in guest's boot scripts (busybox sh), kept here as text so that their hash
is part of the image's cache key and a change to any of them rebuilds the image.

Two stages. ``/init`` in the initramfs loads the modules (a device's driver only when
the VM has such a device: modules.py ``DEVICE_MODULES``), reads the share table that
hpcvm passes on fw_cfg (render/model.py ``share_table``) and builds the guest's root
from it: a tmpfs with the listed host directories mounted at their paths over
virtio-9p, each read-only one under its own tmpfs overlay (writes stay in the guest)
with the entries the table hides whited out, each ``rw`` one mounted as it is. Nothing
else of the host is there: no /root, /home, /var, /srv or host /proc. It copies
busybox and the stage-two files into the new root's ``/run/hpcvm`` (a tmpfs) and
switches root to busybox ``init``. That init is a real PID 1 (it reaps orphans); its
inittab sets up the pseudo-file systems and starts the host's qemu-guest-agent.
``/sbin/shutdown`` and friends are replaced, in the overlay only, by a script that
powers off at once: Debian's are systemctl, which cannot work without systemd, and
qemu-ga's ``guest-shutdown`` runs ``/sbin/shutdown``.

Kernel command line words they read:
  hpcvm.shares=NAME    fw_cfg entry of the share table (default opt/org.hpcvm/shares)
  hpcvm.hostname=NAME  guest host name (default hpcvm)
  hpcvm.agent=NAME     virtio-serial port name of the agent (default org.qemu.guest_agent.0)
  hpcvm.net=MAC,ADDR,MTU  one per NIC (bootspec.py ``nic_kernel_arg``): the interface
                       with that MAC gets that MTU, is brought up and gets the IPv4
                       address/prefix (none when ADDR is empty) unless someone on the
                       segment answers an ARP probe for it (then /run/hpcvm/
                       address-in-use names it); in the background of the boot (the
                       probe waits a second for an answer, and the agent need not),
                       /run/hpcvm/network-done marking its end, which ``up`` waits for;
                       no DHCP, no gateway (the VMs share the host's segment)

9p options: ``msize=512000`` is the largest the 6.1 virtio transport takes (larger is
clamped with a warning). Read-only shares use ``cache=loose``, which caches metadata
and data in the guest and makes running the host's programs much faster; the overlay
freezes the guest's view of them at boot anyway (overlayfs does not support changes to
a lower layer while mounted), so a file created on the host after boot may not appear
in the guest. Writable shares use ``cache=mmap``: writes reach the host at once and
programs can still mmap files there.
"""

from __future__ import annotations

# The initramfs layout the scripts rely on (initramfs.py builds it).
MODULES_DIR = "lib/modules"
MODULE_ORDER_FILE = "lib/modules/order"
STAGE2_DIR = "hpcvm"  # copied to /run/hpcvm in the new root
GUEST_BUSYBOX = "/run/hpcvm/busybox"  # the static busybox every built-in guest runs

INIT = r"""#!/bin/busybox sh
# hpcvm guest, stage 1 (initramfs): build the root from the share table on fw_cfg
# (host directories over virtio-9p, read-only ones under a tmpfs overlay) and switch
# into it.
export PATH=/bin
bb=/bin/busybox

fail() {
    echo "hpcvm-guest: error: $*"
    $bb poweroff -f
}

# "$bb name" until /proc is there: busybox's sh runs an applet that is not built into
# the shell by exec'ing /proc/self/exe (and again once /proc has moved, at the end).
$bb mount -t proc -o nosuid,nodev,noexec proc /proc
$bb mount -t sysfs -o nosuid,nodev,noexec sysfs /sys
$bb mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev

table=opt/org.hpcvm/shares
read -r cmdline < /proc/cmdline
for arg in $cmdline; do
    case "$arg" in
        hpcvm.shares=*) table="${arg#*=}" ;;
    esac
done

# A line with alias patterns after the module is a device driver: loaded only when a
# PCI or virtio device matches one (as udev would), read once the bus modules before it
# are in. Globbing is off while patterns are words.
set -f
aliases=
while read -r mod patterns; do
    if [ -n "$patterns" ]; then
        if [ -z "$aliases" ]; then
            set +f
            aliases=$(cat /sys/bus/pci/devices/*/modalias /sys/bus/virtio/devices/*/modalias \
                2>/dev/null)
            set -f
        fi
        found=
        for alias in $aliases; do
            for pattern in $patterns; do
                case "$alias" in $pattern) found=1; break 2 ;; esac
            done
        done
        [ -n "$found" ] || continue
    fi
    insmod "/lib/modules/$mod" || fail "cannot load kernel module $mod"
done < /lib/modules/order
set +f

raw="/sys/firmware/qemu_fw_cfg/by_name/$table/raw"
cat "$raw" > /shares 2>/dev/null || fail "no share table: no fw_cfg entry $table"

mount9p() {  # TAG OPTIONS DIR: the 9p devices may still be probing, so retry a while
    i=0
    until mount -t 9p -o "$2,trans=virtio,version=9p2000.L,msize=512000" "$1" "$3" \
        2>/dev/null; do
        i=$((i + 1))
        [ $i -lt 50 ] || fail "cannot mount host share $1 (no virtio-9p with mount_tag=$1)"
        sleep 0.1
    done
}

# Applets by name, not "$bb name": busybox's shell runs them without exec'ing busybox
# again (a fork at most), which under TCG is what a boot with many shares spends.
# A share's whiteouts are one cpio archive, written with the shell's own printf and
# unpacked by one cpio, not a mkdir and a mknod each: a fork costs about 5 ms under
# TCG, and /etc hides twenty entries or more.
cpio_entry() {  # INO MODE NAME: a newc member without data (a whiteout, or the trailer)
    n=$((${#3} + 1))
    printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%s\0' \
        "$1" "$2" 0 0 1 0 0 0 0 0 0 "$n" 0 "$3"
    pad=$(((4 - (110 + n) % 4) % 4))  # the header (110 bytes) and name fill 4-byte units
    while [ $pad -gt 0 ]; do
        printf '\0'
        pad=$((pad - 1))
    done
}
hidden=0
mount -t tmpfs -o mode=0755 hpcvm-root /newroot
mount -t tmpfs -o mode=0755 hpcvm-rw /mnt/rw
while read -r kind tag path; do
    case "$kind" in
        link)
            mkdir -p "/newroot${path%/*}"
            ln -s "$tag" "/newroot$path" || fail "cannot make the link $path"
            ;;
        hide)  # a whiteout (char device 0:0) in the share's upper layer hides the entry
            hidden=$((hidden + 1))
            cpio_entry "$hidden" 8630 "$path" >> "/hide-$tag"  # 8630: 020666, a char device
            ;;
        ro)
            mkdir -p "/mnt/9p/$tag" "/mnt/rw/$tag/upper" "/mnt/rw/$tag/work" "/newroot$path"
            if [ -f "/hide-$tag" ]; then
                cpio_entry 0 0 'TRAILER!!!' >> "/hide-$tag"
                cd "/mnt/rw/$tag/upper" && cpio -i -d < "/hide-$tag" 2>/dev/null ||
                    fail "cannot write the whiteouts that hide $path's secrets"
                cd /
            fi
            mount9p "$tag" ro,cache=loose "/mnt/9p/$tag"
            mount -t overlay -o \
                "lowerdir=/mnt/9p/$tag,upperdir=/mnt/rw/$tag/upper,workdir=/mnt/rw/$tag/work" \
                "hpcvm-$tag" "/newroot$path" || fail "cannot mount the overlay on $path"
            ;;
        rw)
            mkdir -p "/newroot$path"
            mount9p "$tag" cache=mmap "/newroot$path"
            ;;
        *) fail "bad share table line: $kind $tag $path" ;;
    esac
done < /shares
[ -d /newroot/etc ] || fail "the share table gives the guest no /etc"
mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/run /newroot/tmp \
    /newroot/var/tmp /newroot/root
chmod 1777 /newroot/tmp /newroot/var/tmp
chmod 0700 /newroot/root

# Our own files live in the new root's /run (a tmpfs), so the host needs none of them
# and nothing of ours shows up elsewhere in the guest's file system.
mount -t tmpfs -o mode=0755,nosuid,nodev hpcvm-run /newroot/run
mkdir -p /newroot/run/hpcvm
cp /bin/busybox /hpcvm/* /newroot/run/hpcvm/
ln -s busybox /newroot/run/hpcvm/init
rm -f /newroot/etc/inittab
cp /hpcvm/inittab /newroot/etc/inittab

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
# pseudo-file systems, a host name, loopback, the NICs, and shutdown commands that work
# without systemd (qemu-ga's guest-shutdown runs /sbin/shutdown). Applets by name: this
# is busybox's sh, which runs them without exec'ing busybox again (see /init).
mkdir -p /dev/pts /dev/shm
mount -t devpts -o nosuid,noexec,gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /dev/shm
# /tmp and /var/tmp are the guest's own (in its root tmpfs): the host's are not shared;
# a directory under them that is shared (the working directory, --share) is mounted there.
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr

name=hpcvm
read -r cmdline < /proc/cmdline
for arg in $cmdline; do
    case "$arg" in
        hpcvm.hostname=*) name="${arg#*=}" ;;
    esac
done
hostname "$name"
ip link set lo up

# hpcvm.net=MAC,ADDR,MTU: the NIC is found by its MAC (names depend on the PCI slot),
# waiting a little in case its driver is still probing.
netdev_by_mac() {
    i=0
    while [ $i -lt 100 ]; do
        for f in /sys/class/net/*/address; do
            read -r address < "$f" || continue
            if [ "$address" = "$1" ]; then
                f="${f%/address}"
                echo "${f##*/}"
                return 0
            fi
        done
        sleep 0.05
        i=$((i + 1))
    done
    return 1
}
# The NICs in the background: the address probe waits a whole second for an answer,
# idle, and the agent need not wait for it; up waits for network-done instead.
net_up() {
    for arg in $cmdline; do
        case "$arg" in
            hpcvm.net=*)
                spec="${arg#*=}"
                mac="${spec%%,*}"
                rest="${spec#*,}"
                addr="${rest%%,*}"
                mtu="${rest#*,}"
                if ! dev=$(netdev_by_mac "$mac"); then
                    echo "hpcvm-guest: error: no network interface with MAC $mac"
                    continue
                fi
                ip link set dev "$dev" mtu "$mtu" ||
                    echo "hpcvm-guest: error: cannot set MTU $mtu on $dev"
                ip link set dev "$dev" up || echo "hpcvm-guest: error: cannot bring $dev up"
                # Duplicate address detection first (RFC 5227's probe): an address someone
                # on the segment answers for is left off and reported (hpcvm up fails).
                if [ -n "$addr" ]; then
                    if arping -D -q -I "$dev" -c 1 -w 1 "${addr%/*}"; then
                        ip addr add "$addr" dev "$dev" ||
                            echo "hpcvm-guest: error: cannot give $dev the address $addr"
                    else
                        echo "hpcvm-guest: error: ${addr%/*} is in use on the segment already"
                        echo "${addr%/*}" >> /run/hpcvm/address-in-use
                    fi
                fi
                ;;
        esac
    done
}
(net_up; : > /run/hpcvm/network-done) &

for cmd in shutdown poweroff reboot halt; do
    rm -f "/sbin/$cmd"
    ln -s /run/hpcvm/shutdown "/sbin/$cmd"
done
"""

AGENT = r"""# hpcvm guest: start the host's qemu-guest-agent on its virtio-serial port. Without
# udev nothing names the ports, so make the /dev/virtio-ports/ links qemu-ga expects.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
port=org.qemu.guest_agent.0
read -r cmdline < /proc/cmdline
for arg in $cmdline; do
    case "$arg" in
        hpcvm.agent=*) port="${arg#*=}" ;;
    esac
done
mkdir -p /dev/virtio-ports
i=0
while [ ! -e "/dev/virtio-ports/$port" ] && [ $i -lt 600 ]; do
    for dir in /sys/class/virtio-ports/vport*; do
        [ -r "$dir/name" ] || continue
        read -r n < "$dir/name" || n=
        [ -n "$n" ] && ln -sf "../${dir##*/}" "/dev/virtio-ports/$n"
    done
    [ -e "/dev/virtio-ports/$port" ] || sleep 0.05
    i=$((i + 1))
done
if [ ! -e "/dev/virtio-ports/$port" ]; then
    echo "hpcvm-guest: no virtio-serial port named $port: the guest agent is not started"
    exit 0
fi
mkdir -p /run/qemu-ga
while :; do
    /usr/sbin/qemu-ga -m virtio-serial -p "/dev/virtio-ports/$port" -t /run/qemu-ga
    echo "hpcvm-guest: qemu-ga exited with status $?; restarting it"
    sleep 1
done
"""

SHUTDOWN = r"""#!/run/hpcvm/busybox sh
# shutdown/poweroff/reboot/halt for the hpcvm guest: nothing on disk to flush (the
# root is tmpfs and read-only shares; sync flushes writable ones), so act at once.
# qemu-ga's guest-shutdown runs "shutdown -h -P|-H|-r +0 MESSAGE".
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

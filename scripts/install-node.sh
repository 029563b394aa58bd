#!/usr/bin/env bash
# Install hpcvm on one compute node, as root: what a node needs to run hpcvm for its
# users, and the grants that let users who are not root start VMs. Run it once per node
# (from a checkout of hpcvm that root can read); running it again changes nothing that is
# already as it should be. Every step prints what it did.
#
#   scripts/install-node.sh [--dry-run] [--only STEP,...] [--add-user USER]...
#   scripts/install-node.sh --uninstall [--dry-run]   undo what earlier runs did
#
# Steps, in order (all by default):
#   packages   Debian packages a node needs (QEMU, hwloc, the guest's parts, Open MPI,
#              sshd for the guests, Python for the venv); no browsers, test oracles or
#              compilers (scripts/setup.sh installs those for development)
#   accounts   group $HPCVM_GROUP (gid $HPCVM_GID): its members may use the grants; user
#              $HPCVM_QEMU_USER (uid $HPCVM_QEMU_UID) QEMU drops to when hpcvm runs as root
#   kvm        /dev/kvm root:kvm 0660 (udev's rule; members get it through group kvm)
#   bridge     QEMU's bridge helper setuid root (dpkg-statoverride, kept by upgrades),
#              /etc/qemu/bridge.conf including an ACL only the group can read that allows
#              $HPCVM_BRIDGES, and /dev/net/tun 0666 (udev's rule; the helper opens it
#              as the calling user)
#   netguard   hpcvm-netguard (built by `make all` into the checkout) installed setuid
#              root as /usr/local/lib/hpcvm/hpcvm-netguard (dpkg-statoverride), its
#              config /etc/hpcvm/netguard.conf (the bridges of $HPCVM_BRIDGES, the
#              ranges of $HPCVM_NETGUARD_RANGES), a boot unit that makes its nftables
#              table before any VM runs, and the table now: each VM's tap then sends
#              only from its own MAC and address (docs/site.md "What separates users")
#              and the address claims directory, root's 1777 (/etc/tmpfiles.d)
#   hugepages  a hugetlbfs mount for the group at $HPCVM_HUGETLBFS (an /etc/fstab line),
#              and the 2M pool raised to $HPCVM_HUGEPAGES pages if set (/etc/sysctl.d)
#   venv       hpcvm in a virtualenv at $HPCVM_PREFIX built with $HPCVM_PYTHON (Debian's
#              own, readable by every user), linked as $HPCVM_BIN_LINK
#   guest      the built-in guest built once into $HPCVM_CACHE/guest (readable by all)
#
# --add-user USER  adds USER to the group and to kvm (repeatable; also alone:
#                  --only accounts --add-user alice).
# --editable       (venv) install the checkout in development mode: the venv follows it.
# --prefix DIR     (venv) same as HPCVM_PREFIX=DIR.
#
# Settings (environment; ids must be the same on every node): HPCVM_GROUP, HPCVM_GID,
# HPCVM_QEMU_USER, HPCVM_QEMU_UID, HPCVM_QEMU_GID (defaults in scripts/site-ids.sh),
# HPCVM_BRIDGES (br0), HPCVM_NETGUARD_RANGES (CIDRs VMs' addresses may lie in, space
# separated; unset: each bridge's own subnets), HPCVM_JOB_ISOLATION (off; on: a job's VMs
# reach only each other and the hosts), HPCVM_HUGETLBFS (/dev/hugepages-hpcvm), HPCVM_HUGEPAGES (unset:
# the pool is left as it is), HPCVM_PREFIX (/opt/hpcvm), HPCVM_BIN_LINK
# (/usr/local/bin/hpcvm; empty: none), HPCVM_CACHE (/var/cache/hpcvm), HPCVM_PYTHON
# (/usr/bin/python3), HPCVM_NODE_STATE (/var/lib/hpcvm-node: what was done, for
# --uninstall). docs/site.md explains each grant.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/site-ids.sh
. "$REPO/scripts/site-ids.sh"
HPCVM_BRIDGES=${HPCVM_BRIDGES:-br0}
HPCVM_NETGUARD_RANGES=${HPCVM_NETGUARD_RANGES:-}
HPCVM_JOB_ISOLATION=${HPCVM_JOB_ISOLATION:-off}
HPCVM_HUGETLBFS=${HPCVM_HUGETLBFS:-/dev/hugepages-hpcvm}
HPCVM_HUGEPAGES=${HPCVM_HUGEPAGES:-}
HPCVM_PREFIX=${HPCVM_PREFIX:-/opt/hpcvm}
HPCVM_BIN_LINK=${HPCVM_BIN_LINK-/usr/local/bin/hpcvm}
HPCVM_CACHE=${HPCVM_CACHE:-/var/cache/hpcvm}
HPCVM_PYTHON=${HPCVM_PYTHON:-/usr/bin/python3}
STATE=${HPCVM_NODE_STATE:-/var/lib/hpcvm-node}

HELPER=/usr/lib/qemu/qemu-bridge-helper
BRIDGE_CONF=/etc/qemu/bridge.conf
BRIDGE_ACL=/etc/qemu/hpcvm-bridges.conf
NETGUARD_BUILT=$REPO/src/hpcvm/data/hpcvm-netguard
NETGUARD=/usr/local/lib/hpcvm/hpcvm-netguard
NETGUARD_CONF=/etc/hpcvm/netguard.conf
NETGUARD_UNIT=/etc/systemd/system/hpcvm-netguard.service
CLAIMS_DIR=${HPCVM_ADDRESS_CLAIMS:-/dev/shm/hpcvm-addresses}
CLAIMS_TMPFILES=/etc/tmpfiles.d/hpcvm-addresses.conf
SYSCTL_FILE=/etc/sysctl.d/80-hpcvm-hugepages.conf
FSTAB=/etc/fstab
MARK="# hpcvm: scripts/install-node.sh"
ALL_STEPS=(packages accounts kvm bridge netguard hugepages venv guest)

# What a compute node runs: QEMU and its helpers, hwloc for the host's topology, the
# built-in guest's parts (the kernel comes from apt at the guest step), Open MPI and sshd
# (guests run the host's binaries, and MPI starts ranks over the guests' sshd), numactl,
# and Python with Debian's libvirt binding (the venv sees it: no compiler needed).
NODE_PACKAGES=(
  qemu-system-x86 qemu-utils hwloc numactl
  qemu-guest-agent busybox-static kmod cpio zstd xz-utils
  openmpi-bin openssh-server openssh-client
  python3 python3-venv python3-libvirt
  nftables # hpcvm-netguard's libnftables; nft for the admin
)

DRY_RUN=0
UNINSTALL=0
EDITABLE=0
STEPS=("${ALL_STEPS[@]}")
ADD_USERS=()

say() { echo "install-node: $*"; }
die() {
  echo "install-node: $*" >&2
  exit 1
}
usage() {
  sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

run() {
  # Print a command that changes the node, then run it (not with --dry-run).
  echo "  + $*"
  [ "$DRY_RUN" -eq 1 ] || "$@"
}

write_file() {
  # write_file PATH MODE OWNER:GROUP: stdin becomes PATH, unless it already holds exactly
  # that with that mode and owner.
  local path=$1 mode=$2 owner=$3 text
  text=$(cat)
  if [ -f "$path" ] && [ "$(cat "$path")" = "$text" ] &&
    [ "$(stat -c '%a %U:%G' "$path")" = "$mode $owner" ]; then
    return 0
  fi
  echo "  + write $path ($mode $owner)"
  if [ "$DRY_RUN" -eq 0 ]; then
    printf '%s\n' "$text" >"$path.hpcvm-new"
    chown "$owner" "$path.hpcvm-new"
    chmod "$mode" "$path.hpcvm-new"
    mv -f "$path.hpcvm-new" "$path"
  fi
}

remember() {
  # remember KEY VALUE: what this run did, for --uninstall (first value wins: it is
  # the state before hpcvm touched anything).
  [ "$DRY_RUN" -eq 0 ] || return 0
  mkdir -p "$STATE"
  [ -e "$STATE/$1" ] || printf '%s\n' "$2" >"$STATE/$1"
}

recall() { cat "$STATE/$1" 2>/dev/null || true; }
forget() { [ "$DRY_RUN" -eq 1 ] || rm -f "$STATE/$1"; }

wants() {
  local s
  for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done
  return 1
}

# --- packages -----------------------------------------------------------------------

step_packages() {
  local p missing=()
  for p in "${NODE_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    say "packages: all ${#NODE_PACKAGES[@]} installed"
    return 0
  fi
  say "packages: installing ${missing[*]}"
  run apt-get update -q
  run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  [ "$DRY_RUN" -eq 1 ] || printf '%s\n' "${missing[@]}" >>"$(mkdir -p "$STATE" && echo "$STATE/packages")"
}

# --- accounts -----------------------------------------------------------------------

ensure_group() {
  # ensure_group NAME VARIABLE: the group exists with the gid in VARIABLE; an existing
  # one with another gid is an error (changing it would orphan its files), named with
  # the fix.
  local name=$1 var=$2 gid=${!2} have
  have=$(getent group "$name" | cut -d: -f3 || true)
  if [ -n "$have" ]; then
    [ "$have" = "$gid" ] || die "group $name exists with gid $have, not $gid: set $var=$have on every node, or remove the group"
    say "accounts: group $name ($gid) exists"
    return 0
  fi
  if getent group "$gid" >/dev/null; then
    die "gid $gid is taken by group $(getent group "$gid" | cut -d: -f1): set $var to a free gid for $name"
  fi
  run groupadd --gid "$gid" "$name"
  remember "created-group-$name" "$gid"
}

step_accounts() {
  local have
  ensure_group "$HPCVM_GROUP" HPCVM_GID
  ensure_group "$HPCVM_QEMU_USER" HPCVM_QEMU_GID
  have=$(getent passwd "$HPCVM_QEMU_USER" | cut -d: -f3 || true)
  if [ -n "$have" ]; then
    [ "$have" = "$HPCVM_QEMU_UID" ] || die "user $HPCVM_QEMU_USER exists with uid $have, not $HPCVM_QEMU_UID: set HPCVM_QEMU_UID=$have on every node, or remove the user"
    say "accounts: user $HPCVM_QEMU_USER ($have) exists"
  else
    getent passwd "$HPCVM_QEMU_UID" >/dev/null &&
      die "uid $HPCVM_QEMU_UID is taken by $(getent passwd "$HPCVM_QEMU_UID" | cut -d: -f1): set HPCVM_QEMU_UID to a free uid"
    # No home, no shell, a group of its own, in no other group: it can read only what
    # every user may, so a guest reaches none of root's files whatever is shared.
    run useradd --system --uid "$HPCVM_QEMU_UID" --gid "$HPCVM_QEMU_GID" --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin --comment "hpcvm unprivileged QEMU" \
      "$HPCVM_QEMU_USER"
    remember created-qemu-user "$HPCVM_QEMU_UID"
  fi
}

add_user() {
  # Members of the group get the bridge and hugetlbfs grants, members of kvm /dev/kvm.
  local user=$1 group
  getent passwd "$user" >/dev/null || die "no user '$user' to add (create the account first)"
  for group in "$HPCVM_GROUP" kvm; do
    # (A dry run has not made the group it would make.)
    getent group "$group" >/dev/null || [ "$DRY_RUN" -eq 1 ] ||
      die "no group $group yet: run the accounts step first"
    if id -nG "$user" | tr ' ' '\n' | grep -qx "$group"; then
      say "accounts: $user is in $group"
    else
      run gpasswd -a "$user" "$group" >/dev/null
      [ "$DRY_RUN" -eq 1 ] || echo "$user $group" >>"$(mkdir -p "$STATE" && echo "$STATE/added-members")"
    fi
  done
}

# --- kvm ----------------------------------------------------------------------------

step_kvm() {
  if [ ! -c /dev/kvm ]; then
    say "kvm: no /dev/kvm on this node (no KVM: guests run under TCG, much slower)"
    return 0
  fi
  getent group kvm >/dev/null || {
    run groupadd --system kvm
    remember created-group-kvm yes
  }
  local have
  have=$(stat -c '%U:%G %a' /dev/kvm)
  if [ "$have" = "root:kvm 660" ]; then
    say "kvm: /dev/kvm is root:kvm 0660"
    return 0
  fi
  # udev's rule makes it so at boot; a node without udev (a container) needs it now.
  remember kvm-mode "$have"
  run chown root:kvm /dev/kvm
  run chmod 0660 /dev/kvm
}

# --- bridge -------------------------------------------------------------------------

step_bridge() {
  [ -x "$HELPER" ] || die "$HELPER is missing: install qemu-system-common (packages step)"
  # The helper drops to the calling user before it opens the tun device: udev's rule
  # makes /dev/net/tun 0666 at boot; a node without udev (a container) needs it now.
  local tun
  tun=$(stat -c '%a' /dev/net/tun 2>/dev/null || echo none)
  if [ "$tun" != 666 ] && [ "$tun" != none ]; then
    remember tun-mode "$tun"
    run chmod 0666 /dev/net/tun
  fi
  local override
  override=$(dpkg-statoverride --list "$HELPER" 2>/dev/null || true)
  if [ "$override" = "root root 4755 $HELPER" ]; then
    say "bridge: $HELPER is setuid root (dpkg-statoverride)"
  elif [ -n "$override" ]; then
    die "dpkg-statoverride already has '$override': remove it (dpkg-statoverride --remove $HELPER) or make it 'root root 4755'"
  else
    remember helper-mode "$(stat -c '%a' "$HELPER")"
    # dpkg keeps the override through upgrades of qemu-system-common.
    run dpkg-statoverride --update --add root root 4755 "$HELPER"
    remember helper-override yes
  fi
  # The ACL only members of the group can read: the helper reads included files as the
  # user who runs it, so for anyone else the allow lines do not exist.
  local bridge acl=""
  for bridge in $HPCVM_BRIDGES; do acl+="allow $bridge"$'\n'; done
  write_file "$BRIDGE_ACL" 640 "root:$HPCVM_GROUP" <<EOF
$MARK
# Bridges members of $HPCVM_GROUP may put a VM's tap in (qemu-bridge-helper).
${acl%$'\n'}
EOF
  if [ ! -e "$BRIDGE_CONF" ]; then
    remember created-bridge-conf yes
    run mkdir -p "$(dirname "$BRIDGE_CONF")"
  fi
  if ! grep -qx "include $BRIDGE_ACL" "$BRIDGE_CONF" 2>/dev/null; then
    echo "  + append 'include $BRIDGE_ACL' to $BRIDGE_CONF"
    [ "$DRY_RUN" -eq 1 ] || printf 'include %s\n' "$BRIDGE_ACL" >>"$BRIDGE_CONF"
    [ "$DRY_RUN" -eq 1 ] || chmod 644 "$BRIDGE_CONF"
  fi
  say "bridge: members of $HPCVM_GROUP may use $HPCVM_BRIDGES ($BRIDGE_CONF includes $BRIDGE_ACL)"
  local others
  others=$(grep -E '^[[:space:]]*allow' "$BRIDGE_CONF" 2>/dev/null || true)
  [ -z "$others" ] || say "bridge: note: $BRIDGE_CONF itself has '$(echo "$others" | paste -sd' ' -)', which every user gets"
}

# --- netguard -----------------------------------------------------------------------

step_netguard() {
  [ -x "$NETGUARD_BUILT" ] || die "$NETGUARD_BUILT is not built: run 'make all' in $REPO (needs libnftables-dev and libjansson-dev: scripts/setup.sh)"
  if ! cmp -s "$NETGUARD_BUILT" "$NETGUARD"; then
    [ -e "$NETGUARD" ] || remember created-netguard yes
    [ -d "$(dirname "$NETGUARD")" ] || {
      remember created-netguard-dir "$(dirname "$NETGUARD")"
      run mkdir -p "$(dirname "$NETGUARD")"
    }
    run install -m 0755 -o root -g root "$NETGUARD_BUILT" "$NETGUARD"
  fi
  local override
  override=$(dpkg-statoverride --list "$NETGUARD" 2>/dev/null || true)
  if [ -z "$override" ]; then
    run dpkg-statoverride --update --add root root 4755 "$NETGUARD"
    remember netguard-override yes
  elif [ "$override" != "root root 4755 $NETGUARD" ]; then
    die "dpkg-statoverride already has '$override': remove it (dpkg-statoverride --remove $NETGUARD) or make it 'root root 4755'"
  elif [ "$(stat -c '%a %U' "$NETGUARD")" != "4755 root" ]; then
    run chmod 4755 "$NETGUARD" # a new build was installed: the override's mode again
  fi
  local bridge range conf=""
  for bridge in $HPCVM_BRIDGES; do conf+="bridge $bridge"$'\n'; done
  for range in $HPCVM_NETGUARD_RANGES; do conf+="range $range"$'\n'; done
  case $HPCVM_JOB_ISOLATION in
    on) conf+="job-isolation on"$'\n' ;;
    off | "") ;;
    *) die "HPCVM_JOB_ISOLATION must be on or off, not '$HPCVM_JOB_ISOLATION'" ;;
  esac
  [ -d "$(dirname "$NETGUARD_CONF")" ] || {
    remember created-netguard-conf-dir "$(dirname "$NETGUARD_CONF")"
    run mkdir -p "$(dirname "$NETGUARD_CONF")"
  }
  write_file "$NETGUARD_CONF" 644 root:root <<EOF
$MARK
# hpcvm-netguard (docs/site.md): the bridges users' VMs may be guarded in, the ranges
# their addresses must lie in (none: each bridge's own subnets); 'unguarded-taps accept'
# lets taps no VM guards carry traffic (default drop: a tap made by hand is dead).
${conf%$'\n'}
EOF
  # The table, and with it the drop of unguarded taps, exists from boot, before any tap.
  write_file "$NETGUARD_UNIT" 644 root:root <<EOF
$MARK
[Unit]
Description=hpcvm-netguard: anti-spoofing table for VM taps (docs/site.md)
Before=network-pre.target
Wants=network-pre.target

[Service]
Type=oneshot
ExecStart=$NETGUARD init

[Install]
WantedBy=multi-user.target
EOF
  if [ -d /run/systemd/system ] && ! systemctl is-enabled --quiet hpcvm-netguard 2>/dev/null; then
    run systemctl --no-reload enable hpcvm-netguard
  fi
  # made once here; each later call of the helper keeps its base chain as the config says
  nft list table bridge hpcvm_netguard >/dev/null 2>&1 || run "$NETGUARD" init
  say "netguard: each VM's tap sends only from its own MAC and address (nft list table bridge hpcvm_netguard)"
  claims_dir
}

# The directory `--address auto` claims slots in: root's and sticky (1777), now and at
# every boot (/dev/shm is a tmpfs). One a user made first is trusted by no other user
# (cluster/tasks/addresses.py), so the node makes it before any job can.
claims_dir() {
  write_file "$CLAIMS_TMPFILES" 644 root:root <<EOF
$MARK
d $CLAIMS_DIR 1777 root root -
EOF
  if [ -L "$CLAIMS_DIR" ] || { [ -e "$CLAIMS_DIR" ] && [ ! -d "$CLAIMS_DIR" ]; }; then
    die "$CLAIMS_DIR is not a directory: remove it (address claims are kept there)"
  fi
  if [ "$(stat -c '%a %U:%G' "$CLAIMS_DIR" 2>/dev/null)" != "1777 root:root" ]; then
    run install -d -m 1777 -o root -g root "$CLAIMS_DIR"
  fi
  say "netguard: address claims in $CLAIMS_DIR (root's, 1777, made at boot by $CLAIMS_TMPFILES)"
}

# --- hugepages ----------------------------------------------------------------------

fstab_line() {
  echo "hugetlbfs $HPCVM_HUGETLBFS hugetlbfs pagesize=2M,gid=$HPCVM_GID,mode=1770 0 0"
}

step_hugepages() {
  # The mount as an /etc/fstab line (after a line with the mark, so --uninstall finds
  # both): an admin keeps it, or moves it into a systemd mount unit.
  if ! grep -qxF "$(fstab_line)" "$FSTAB" 2>/dev/null; then
    grep -qE "^[^#]*[[:space:]]$HPCVM_HUGETLBFS[[:space:]]" "$FSTAB" 2>/dev/null &&
      die "$FSTAB already mounts $HPCVM_HUGETLBFS otherwise: remove that line or set HPCVM_HUGETLBFS"
    echo "  + append to $FSTAB: $(fstab_line)"
    [ "$DRY_RUN" -eq 1 ] || printf '%s\n%s\n' "$MARK (hugetlbfs for group $HPCVM_GROUP)" "$(fstab_line)" >>"$FSTAB"
  fi
  if findmnt -n -t hugetlbfs "$HPCVM_HUGETLBFS" >/dev/null; then
    say "hugepages: $HPCVM_HUGETLBFS is mounted"
  else
    [ -d "$HPCVM_HUGETLBFS" ] || {
      run mkdir -p "$HPCVM_HUGETLBFS"
      remember created-hugetlbfs-dir "$HPCVM_HUGETLBFS"
    }
    run mount -t hugetlbfs -o "pagesize=2M,gid=$HPCVM_GID,mode=1770" hugetlbfs "$HPCVM_HUGETLBFS"
  fi
  # Sticky and group-writable: members make their VMs' files, none removes another's.
  say "hugepages: members of $HPCVM_GROUP may back guests with 2M pages in $HPCVM_HUGETLBFS"
  [ -n "$HPCVM_HUGEPAGES" ] || {
    say "hugepages: pool left at $(cat /proc/sys/vm/nr_hugepages) pages (set HPCVM_HUGEPAGES to reserve)"
    return 0
  }
  [[ "$HPCVM_HUGEPAGES" =~ ^[0-9]+$ ]] || die "HPCVM_HUGEPAGES must be a number of 2M pages, got '$HPCVM_HUGEPAGES'"
  write_file "$SYSCTL_FILE" 644 root:root <<EOF
$MARK
vm.nr_hugepages = $HPCVM_HUGEPAGES
EOF
  local have
  have=$(cat /proc/sys/vm/nr_hugepages)
  if [ "$have" -lt "$HPCVM_HUGEPAGES" ]; then
    remember hugepages-before "$have"
    echo "  + echo $HPCVM_HUGEPAGES >/proc/sys/vm/nr_hugepages"
    [ "$DRY_RUN" -eq 1 ] || echo "$HPCVM_HUGEPAGES" >/proc/sys/vm/nr_hugepages
  fi
  say "hugepages: pool of $(cat /proc/sys/vm/nr_hugepages) 2M pages (wanted $HPCVM_HUGEPAGES; only ever raised)"
}

# --- venv ---------------------------------------------------------------------------

source_stamp() {
  # What the venv was built from: the checkout, the mode, the Python and the
  # dependencies (an editable install follows the checkout's code by itself).
  local what=$REPO
  [ "$EDITABLE" -eq 1 ] || what="$REPO@$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$REPO" status --porcelain 2>/dev/null | sha256sum | cut -c1-12)"
  echo "$what editable=$EDITABLE python=$HPCVM_PYTHON deps=$(sha256sum <"$REPO/pyproject.toml" | cut -c1-16)"
}

step_venv() {
  [ -x "$HPCVM_PYTHON" ] || die "$HPCVM_PYTHON is missing: install python3 and python3-venv (packages step)"
  local stamp=$HPCVM_PREFIX/.hpcvm-install
  if [ -x "$HPCVM_PREFIX/bin/hpcvm" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$(source_stamp)" ]; then
    say "venv: $HPCVM_PREFIX is up to date ($("$HPCVM_PREFIX/bin/hpcvm" --version))"
  else
    [ -e "$HPCVM_PREFIX" ] || remember "created-prefix" "$HPCVM_PREFIX"
    # Debian's python (every user can read it) and its libvirt binding (no compiler on
    # the node): the venv sees the system's packages, its own come first.
    run "$HPCVM_PYTHON" -m venv --system-site-packages "$HPCVM_PREFIX"
    local target=("$REPO")
    [ "$EDITABLE" -eq 0 ] || target=(-e "$REPO")
    run "$HPCVM_PREFIX/bin/pip" install -q --upgrade pip
    run "$HPCVM_PREFIX/bin/pip" install -q "${target[@]}"
    run chmod -R a+rX "$HPCVM_PREFIX"
    [ "$DRY_RUN" -eq 1 ] || source_stamp >"$stamp"
    [ "$DRY_RUN" -eq 1 ] || say "venv: $HPCVM_PREFIX has $("$HPCVM_PREFIX/bin/hpcvm" --version)"
  fi
  if [ -n "$HPCVM_BIN_LINK" ] && [ "$(readlink "$HPCVM_BIN_LINK" 2>/dev/null)" != "$HPCVM_PREFIX/bin/hpcvm" ]; then
    [ ! -e "$HPCVM_BIN_LINK" ] || [ -L "$HPCVM_BIN_LINK" ] || die "$HPCVM_BIN_LINK exists and is not a link: remove it or set HPCVM_BIN_LINK"
    run ln -sfn "$HPCVM_PREFIX/bin/hpcvm" "$HPCVM_BIN_LINK"
    remember bin-link "$HPCVM_BIN_LINK"
  fi
}

# --- guest --------------------------------------------------------------------------

step_guest() {
  local hpcvm=$HPCVM_PREFIX/bin/hpcvm
  [ -x "$hpcvm" ] || [ "$DRY_RUN" -eq 1 ] || die "$hpcvm is missing: run the venv step first"
  [ -d "$HPCVM_CACHE" ] || remember created-cache "$HPCVM_CACHE"
  # Built once as root (the kernel comes from apt), kept where every user can read it.
  run env HPCVM_CACHE="$HPCVM_CACHE" "$hpcvm" guest build
  run chmod -R a+rX "$HPCVM_CACHE"
}

# --- uninstall ----------------------------------------------------------------------

uninstall() {
  say "uninstall: undoing what $STATE records"
  [ -d "$STATE" ] || {
    say "uninstall: nothing recorded in $STATE: nothing to undo"
    return 0
  }
  local link prefix before mode user group
  link=$(recall bin-link)
  if [ -n "$link" ] && [ -L "$link" ]; then run rm -f "$link"; fi
  forget bin-link
  prefix=$(recall created-prefix)
  if [ -n "$prefix" ] && [ -f "$prefix/.hpcvm-install" ]; then run rm -rf "$prefix"; fi
  forget created-prefix
  prefix=$(recall created-cache)
  if [ -n "$prefix" ] && [ -d "$prefix" ]; then run rm -rf "$prefix"; fi
  forget created-cache

  before=$(recall hugepages-before)
  if [ -n "$before" ]; then
    echo "  + echo $before >/proc/sys/vm/nr_hugepages"
    [ "$DRY_RUN" -eq 1 ] || echo "$before" >/proc/sys/vm/nr_hugepages
  fi
  forget hugepages-before
  if grep -qF "$MARK" "$SYSCTL_FILE" 2>/dev/null; then run rm -f "$SYSCTL_FILE"; fi
  if grep -qF "$MARK" "$FSTAB" 2>/dev/null; then
    local mnt created
    created=$(recall created-hugetlbfs-dir)
    # The line after each mark is ours. Only the directory this install made is removed
    # (never another one: rmdir of a mount point in /dev detaches it in every namespace).
    for mnt in $(awk -v mark="$MARK" 'found { print $2; found = 0 } index($0, mark) == 1 { found = 1 }' "$FSTAB"); do
      if findmnt -n -t hugetlbfs "$mnt" >/dev/null; then run umount "$mnt"; fi
      if [ "$created" = "$mnt" ] && [ -d "$mnt" ]; then run rmdir "$mnt"; fi
    done
    echo "  + remove the marked lines from $FSTAB"
    if [ "$DRY_RUN" -eq 0 ]; then
      awk -v mark="$MARK" 'skip { skip = 0; next } index($0, mark) == 1 { skip = 1; next } { print }' \
        "$FSTAB" >"$FSTAB.hpcvm-new"
      chmod --reference="$FSTAB" "$FSTAB.hpcvm-new"
      mv -f "$FSTAB.hpcvm-new" "$FSTAB"
    fi
  fi
  forget created-hugetlbfs-dir

  if grep -qx "include $BRIDGE_ACL" "$BRIDGE_CONF" 2>/dev/null; then
    echo "  + remove 'include $BRIDGE_ACL' from $BRIDGE_CONF"
    if [ "$DRY_RUN" -eq 0 ]; then
      grep -vx "include $BRIDGE_ACL" "$BRIDGE_CONF" >"$BRIDGE_CONF.hpcvm-new" || true
      chmod 644 "$BRIDGE_CONF.hpcvm-new"
      mv -f "$BRIDGE_CONF.hpcvm-new" "$BRIDGE_CONF"
    fi
  fi
  if [ -n "$(recall created-bridge-conf)" ] && [ -f "$BRIDGE_CONF" ] && [ ! -s "$BRIDGE_CONF" ]; then
    run rm -f "$BRIDGE_CONF"
  fi
  forget created-bridge-conf
  if grep -qF "$MARK" "$BRIDGE_ACL" 2>/dev/null; then run rm -f "$BRIDGE_ACL"; fi
  if [ -d /run/systemd/system ] && systemctl is-enabled --quiet hpcvm-netguard 2>/dev/null; then
    run systemctl --no-reload disable hpcvm-netguard
  fi
  if grep -qF "$MARK" "$NETGUARD_UNIT" 2>/dev/null; then run rm -f "$NETGUARD_UNIT"; fi
  # the claims directory itself stays until the next boot: jobs may hold claims in it
  if grep -qF "$MARK" "$CLAIMS_TMPFILES" 2>/dev/null; then run rm -f "$CLAIMS_TMPFILES"; fi
  if grep -qF "$MARK" "$NETGUARD_CONF" 2>/dev/null; then run rm -f "$NETGUARD_CONF"; fi
  before=$(recall created-netguard-conf-dir)
  if [ -n "$before" ] && [ -d "$before" ]; then run rmdir "$before"; fi
  forget created-netguard-conf-dir
  if [ -n "$(recall netguard-override)" ]; then run dpkg-statoverride --remove "$NETGUARD"; fi
  forget netguard-override
  if [ -n "$(recall created-netguard)" ] && [ -f "$NETGUARD" ]; then run rm -f "$NETGUARD"; fi
  forget created-netguard
  before=$(recall created-netguard-dir)
  if [ -n "$before" ] && [ -d "$before" ]; then run rmdir "$before"; fi
  forget created-netguard-dir
  # Its table goes too, with the rules of any VM still running (stop them first).
  if command -v nft >/dev/null && nft list table bridge hpcvm_netguard >/dev/null 2>&1; then
    run nft delete table bridge hpcvm_netguard
  fi
  if [ -n "$(recall helper-override)" ]; then
    run dpkg-statoverride --remove "$HELPER"
    mode=$(recall helper-mode)
    run chmod "${mode:-755}" "$HELPER"
  fi
  forget helper-override
  forget helper-mode
  mode=$(recall tun-mode)
  if [ -n "$mode" ] && [ -c /dev/net/tun ]; then run chmod "$mode" /dev/net/tun; fi
  forget tun-mode

  mode=$(recall kvm-mode)
  if [ -n "$mode" ] && [ -c /dev/kvm ]; then
    run chown "${mode% *}" /dev/kvm
    run chmod "${mode#* }" /dev/kvm
  fi
  forget kvm-mode

  if [ -f "$STATE/added-members" ]; then
    while read -r user group; do
      if id -nG "$user" 2>/dev/null | tr ' ' '\n' | grep -qx "$group"; then
        run gpasswd -d "$user" "$group" >/dev/null
      fi
    done <"$STATE/added-members"
  fi
  forget added-members
  if [ -n "$(recall created-qemu-user)" ] && getent passwd "$HPCVM_QEMU_USER" >/dev/null; then
    run userdel "$HPCVM_QEMU_USER"
  fi
  forget created-qemu-user
  for group in "$HPCVM_QEMU_USER" "$HPCVM_GROUP" kvm; do
    if [ -n "$(recall "created-group-$group")" ] && getent group "$group" >/dev/null; then
      run groupdel "$group"
    fi
    forget "created-group-$group"
  done

  if [ -f "$STATE/packages" ]; then
    say "uninstall: packages stay installed; to remove those this script installed:"
    say "  apt-get purge $(sort -u "$STATE/packages" | paste -sd' ' -)"
    forget packages
  fi
  [ "$DRY_RUN" -eq 1 ] || rmdir "$STATE" 2>/dev/null || say "uninstall: left in $STATE: $(ls "$STATE")"
  say "uninstall: done"
}

# --- main ---------------------------------------------------------------------------

while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --uninstall) UNINSTALL=1; shift ;;
    --editable) EDITABLE=1; shift ;;
    --prefix) HPCVM_PREFIX=${2:?--prefix needs a directory}; shift 2 ;;
    --only)
      IFS=, read -r -a STEPS <<<"${2:?--only needs steps, e.g. accounts,bridge}"
      for s in "${STEPS[@]}"; do
        [[ " ${ALL_STEPS[*]} " == *" $s "* ]] || die "unknown step '$s' (steps: ${ALL_STEPS[*]})"
      done
      shift 2
      ;;
    --add-user) ADD_USERS+=("${2:?--add-user needs a user name}"); shift 2 ;;
    -h | --help) usage ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[ "$(id -u)" -eq 0 ] || die "must run as root (accounts, setuid helper, mounts); try: sudo $0 $*"
[ "$DRY_RUN" -eq 0 ] || say "dry run: printing what would be done, changing nothing"

if [ "$UNINSTALL" -eq 1 ]; then
  uninstall
  exit 0
fi
for s in "${ALL_STEPS[@]}"; do
  if wants "$s"; then "step_$s"; fi
done
for u in "${ADD_USERS[@]}"; do add_user "$u"; done
say "done (steps: ${STEPS[*]}); undo with: $0 --uninstall"

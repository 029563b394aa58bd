#!/usr/bin/env bash
# Install everything hpcvm needs on a fresh Debian 12 machine, as root (or with sudo):
# distribution packages, a virtualenv in .venv with hpcvm and its dev tools, and the
# C helpers. Safe to run again; prints what it did.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

APT_PACKAGES=(
  python3 python3-venv python3-dev gcc make pkg-config
  nftables libnftables-dev libjansson-dev # hpcvm-netguard (csrc/hpcvm-netguard.c) and nft
  hwloc                                   # lstopo: host topology
  qemu-system-x86 qemu-utils              # the hypervisor (KVM or TCG)
  libvirt-daemon-system libvirt-clients libvirt-dev libxml2-utils  # libvirt backend, virt-xml-validate
  qemu-guest-agent busybox-static kmod cpio zstd xz-utils binutils  # the built-in guest (xz, readelf: its tests)
  genisoimage                             # --image: the cloud-init NoCloud seed
  mmdebstrap syslinux syslinux-common mtools dosfstools fdisk e2fsprogs  # tests: build a Debian disk image
  numactl
  hpcc openmpi-bin libopenmpi-dev netpipe-openmpi  # benchmarks
  openfoam openfoam-examples lammps       # application suites (the cavity tutorial, the LJ benchmark)
  chromium qemu-user                      # report tests: headless browser; TCG-emulated samples
  crun runc                               # bench --env container: OCI runtimes (crun first; runc
                                          # where crun refuses the host's cgroups)
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: Debian packages already installed"
fi

# Slurm, munge and Open MPI for the one-machine Slurm test cluster (docs/cluster-testing.md).
bash scripts/setup-cluster.sh

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[dev]'
# Test-only: Nova 34 in its own .venv-nova, the oracle of `plan --format openstack`.
bash scripts/setup-nova.sh
echo "setup: hpcvm installed in .venv ($(.venv/bin/hpcvm --version))"

if [ -f Makefile ]; then
  make -s all
fi

# Huge pages for the tuned profiles (hugepages, numa, hpc back guest RAM with 2M pages).
# Only ever raises the pool; set HPCVM_HUGEPAGES=0 to skip.
want=${HPCVM_HUGEPAGES:-1280}
have=$(cat /proc/sys/vm/nr_hugepages)
if [ "$want" -gt "$have" ]; then
  echo "$want" | $SUDO tee /proc/sys/vm/nr_hugepages >/dev/null
  echo "setup: reserved 2M huge pages: $have -> $(cat /proc/sys/vm/nr_hugepages) (HPCVM_HUGEPAGES=$want)"
else
  echo "setup: $have 2M huge pages reserved (>= $want wanted)"
fi

# This machine is a node too: the node install's accounts and grants (docs/site.md):
# the group hpcvm and QEMU's user hpcvm-qemu (fixed ids), /dev/kvm root:kvm 0660 (libvirt
# checks that its QEMU user, libvirt-qemu in group kvm, can open it, and re-probes QEMU
# on every call while that disagrees with its cached capabilities; without udev it stays
# root:root 0600), QEMU's bridge helper setuid with an ACL for the group, hpcvm-netguard
# setuid (its table in this network namespace: taps no VM guards carry nothing), and a
# hugetlbfs mount for the group. An hpcvm-qemu made by an earlier setup keeps its ids (fixed ids
# matter across a cluster's nodes); the pool above stays this script's (not persisted).
node_env=(HPCVM_HUGEPAGES=)
if getent passwd hpcvm-qemu >/dev/null; then
  node_env+=("HPCVM_QEMU_UID=$(id -u hpcvm-qemu)" "HPCVM_QEMU_GID=$(id -g hpcvm-qemu)")
fi
$SUDO env "${node_env[@]}" bash scripts/install-node.sh --only packages,accounts,kvm,bridge,netguard,hugepages

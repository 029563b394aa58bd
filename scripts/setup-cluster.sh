#!/usr/bin/env bash
# Install what the one-machine test cluster (scripts/test-cluster.sh) needs on Debian 12,
# as root (or with sudo): Slurm's controller, node daemon and client, munge for its
# authentication, Open MPI, iproute2 for the network namespaces, and OpenSSH (the
# guests of `hpcvm cluster` run the host's sshd to start MPI ranks). Safe to run again:
# installs only what is missing and prints what it did. The packages' own services are
# not started here (Debian would start them under systemd); the test cluster starts its
# own daemons with its own configuration and stops them again.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

APT_PACKAGES=(
  slurmctld slurmd slurm-client   # real Slurm: controller, one slurmd per simulated node, sinfo/sbatch/srun
  munge                           # Slurm's authentication (one munged for the test cluster)
  openmpi-bin libopenmpi-dev      # MPI across the simulated nodes
  iproute2                        # ip netns, veth, bridges
  hwloc                           # hwloc-calc: Slurm's CPU numbering of each node's PUs
  openssh-server openssh-client   # hpcvm cluster: guests run the host's sshd to start MPI ranks
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup-cluster: installing ${#missing[@]} Debian packages: ${missing[*]}"
  $SUDO apt-get update -q
  # policy-rc.d 101: keep the packages' init scripts from starting munge/slurmd services
  # on a machine without systemd; the test cluster runs its own daemons.
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    made_policy=1
  fi
  status=0
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" \
    || status=$?
  if [ "$made_policy" -eq 1 ]; then $SUDO rm -f "$policy"; fi
  [ "$status" -eq 0 ] || exit "$status"
else
  echo "setup-cluster: Debian packages already installed"
fi
echo "setup-cluster: done"

#!/usr/bin/env bash
# A Slurm test cluster on one machine, made of real parts (run as root):
#
#   scripts/test-cluster.sh up [--nodes N]     start N simulated nodes (default 2)
#   scripts/test-cluster.sh status             nodes as Slurm sees them, and the namespaces
#   scripts/test-cluster.sh exec [--node nodeK] [--user USER] -- CMD...
#                                              run CMD where Slurm is reachable (the login
#                                              namespace, or node K's) with SLURM_CONF set,
#                                              as root or as USER (e.g. hpcvm-test)
#   scripts/test-cluster.sh down               stop everything and remove every trace
#
# Each node is a network namespace hpcvm-nK with its own address (10.77.0.K/24) on its own
# bridge br0 (later the bridge for that node's VMs' taps), its own hostname (a UTS
# namespace) and its own slurmd (`slurmd -N nodeK`). A switch namespace hpcvm-sw holds
# the switch bridge sw0 that every node's uplink veth joins, and is also the cluster's
# "login node": slurmctld, munged and client commands (sinfo, sbatch) run there, at
# 10.77.0.254. The host's own interfaces, routes and firewall are never touched: every
# link is created directly inside a namespace made here. All state (slurm.conf, spool,
# logs, munge key and socket) lives under $HPCVM_TEST_CLUSTER_DIR
# (default /run/hpcvm-test-cluster). Jobs are confined as on a production site: Slurm's
# cgroup plugins (proctrack/cgroup, task/cgroup with ConstrainCores, ConstrainRAMSpace,
# ConstrainDevices; cgroup v1, each slurmd its own slurm_nodeK subtree), and an
# unprivileged test user (hpcvm-test, in the site's group hpcvm and in kvm) that `up`
# creates to submit them. `down` kills every process in the namespaces, deletes the
# namespaces (and with them the veths and bridges), Slurm's cgroups, the test user and
# the state directory; a failing `up` runs `down` itself. Why each choice:
# docs/cluster-testing.md.
set -euo pipefail

DIR=${HPCVM_TEST_CLUSTER_DIR:-/run/hpcvm-test-cluster}
MARKER=.hpcvm-test-cluster   # in $DIR: `down` removes only a directory that has it
NET=${HPCVM_TEST_CLUSTER_NET:-10.77.0}   # the /24 used inside the namespaces only
SW_NS=hpcvm-sw
NODE_NS_PREFIX=hpcvm-n
CTL_ADDR=$NET.254
CTL_NAME=ctl
READY_TIMEOUT=${HPCVM_TEST_CLUSTER_TIMEOUT:-90}   # seconds; the machine may be loaded
IDLE_TIMEOUT=30   # seconds a running cluster's nodes get to serve again (idle or running jobs)
CG_NAME=hpcvm-test-cluster   # the cpuset cgroup holding one child per node
MEM_MB=${HPCVM_TEST_CLUSTER_MEM:-4096}   # each node's RealMemory (MB); jobs get half by default
GRES_DEVICE=/dev/full   # the one GRES device (nic): ConstrainDevices denies it to other jobs
# The unprivileged user jobs are submitted as (fixed ids: files it leaves are recognisable).
TEST_USER=${HPCVM_TEST_USER:-hpcvm-test}
TEST_UID=${HPCVM_TEST_UID:-2390}
TEST_MARK="hpcvm test cluster user (scripts/test-cluster.sh)"   # its GECOS: down removes only it
# The site's group (scripts/site-ids.sh, shared with scripts/install-node.sh).
# shellcheck source=scripts/site-ids.sh
. "$(dirname "$0")/site-ids.sh"
REPO=$(cd "$(dirname "$0")/.." && pwd)

die() {
  echo "test-cluster: $*" >&2
  exit 1
}
say() { echo "test-cluster: $*"; }

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# --- helpers ------------------------------------------------------------------------

node_namespaces() {
  # Every namespace this script may have made (also after a crash lost the state dir).
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^(${SW_NS}|${NODE_NS_PREFIX}[0-9]+)\$" || true
}

# Run a command in namespace $1 with hostname $2 and the cluster's /etc/hosts, in a private
# mount namespace so the bind mount stays in there. Not `ip netns exec`: it mounts a fresh
# /sys, which hides /sys/fs/cgroup (slurmd refuses to start without it) and which QEMU
# and hwloc would later read too; /sys/class/net therefore shows the host's devices, while
# every socket and netlink call sees the node's own network.
in_ns() {
  local ns=$1 name=$2
  shift 2
  HPCVM_CG_PROCS=$(node_cgroup "$name")/cgroup.procs \
    nsenter --net="/run/netns/$ns" -- unshare --mount --uts --propagation slave -- sh -c \
    'if [ -f "$HPCVM_CG_PROCS" ]; then echo $$ >"$HPCVM_CG_PROCS"; fi
     unset HPCVM_CG_PROCS
     hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"' \
    sh "$name" "$DIR/etc/hosts" "$@" 9<&-
}

# Start daemon $3... in namespace $1 as host $2. Its stdio goes to a log file, never to
# our caller's pipes (a caller that captures output would wait for the daemon's exit),
# and it must not inherit fd 9, the lock held by this script.
start_daemon() {
  local ns=$1 name=$2 log
  log="$DIR/log/start-${3##*/}-$name.log"
  shift 2
  SLURM_CONF=$DIR/etc/slurm.conf in_ns "$ns" "$name" "$@" </dev/null >>"$log" 2>&1
}

client() {
  # Slurm client commands from the login (switch) namespace.
  SLURM_CONF=$DIR/etc/slurm.conf in_ns "$SW_NS" "$CTL_NAME" "$@"
}

wait_for() {
  # wait_for WHAT CMD...: retry CMD once a second until it succeeds or READY_TIMEOUT.
  local what=$1 t=0
  shift
  until "$@" >/dev/null 2>&1; do
    t=$((t + 1))
    [ "$t" -lt "$READY_TIMEOUT" ] || die "timed out after ${READY_TIMEOUT}s waiting for $what (logs: $DIR/log)"
    sleep 1
  done
}

# --- cpusets: each node its own PUs ------------------------------------------------
# A real node's slurmd, jobs and VMs see that node's CPUs only. Here every node is the
# same machine, so each gets its own share of the PUs as a cpuset cgroup that its slurmd
# (and so every job step, mpirun rank and QEMU it starts) is in: hwloc, and so hpcvm's
# plan, then sees that node's PUs only, and two nodes' VMs are pinned apart. Without a
# cpuset controller (or where one cannot be made) the nodes share every PU, as before.

cpuset_base() {
  # cgroup v1's cpuset hierarchy, or the v2 root when it offers cpuset; else nothing.
  if [ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]; then
    echo /sys/fs/cgroup/cpuset
  elif grep -qw cpuset /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    echo /sys/fs/cgroup
  fi
}

node_cgroup() {
  # Node $1's cgroup directory (nothing for the login node, or without cpusets).
  local base
  base=$(cpuset_base)
  [ -n "$base" ] && [ -d "$base/$CG_NAME/$1" ] && echo "$base/$CG_NAME/$1"
  return 0
}

expand_list() {
  # "0-2,5" -> "0 1 2 5"
  local part out=()
  for part in ${1//,/ }; do
    if [[ "$part" == *-* ]]; then out+=($(seq "${part%-*}" "${part#*-}")); else out+=("$part"); fi
  done
  echo "${out[@]}"
}

pu_nodes() {
  # The NUMA nodes of the PUs in $@, as a cpuset.mems list ("0" where sysfs has none).
  local pu link nodes=()
  for pu in "$@"; do
    for link in /sys/devices/system/cpu/cpu"$pu"/node[0-9]*; do
      [ -e "$link" ] && nodes+=("${link##*/node}")
    done
  done
  [ "${#nodes[@]}" -gt 0 ] || nodes=(0)
  printf '%s\n' "${nodes[@]}" | sort -nu | paste -sd, -
}

make_cpusets() {
  # One cpuset per node: node K gets PUs ((K-1)*c .. K*c-1) mod P, c = max(1, P/n).
  # Prints c, the CPUs each node has (slurm.conf's CPUs=); all of them without cpusets.
  local n=$1 base parent pus per k i mine list=/sys/devices/system/cpu/online
  base=$(cpuset_base)
  if [ -f "$base/cpuset.effective_cpus" ]; then list=$base/cpuset.effective_cpus
  elif [ -f "$base/cpuset.cpus.effective" ]; then list=$base/cpuset.cpus.effective; fi
  read -r -a pus <<<"$(expand_list "$(cat "$list")")"
  if [ -z "$base" ] || [ "${#pus[@]}" -lt 2 ]; then
    echo "test-cluster: no cpuset cgroups here: every node shares all ${#pus[@]} CPUs" >&2
    echo "${#pus[@]}"
    return 0
  fi
  parent=$base/$CG_NAME
  per=$(( ${#pus[@]} / n ))
  [ "$per" -ge 1 ] || per=1
  if ! {
    if [ "$base" = /sys/fs/cgroup ]; then   # v2: the controller must reach the children
      echo +cpuset >"$base/cgroup.subtree_control" && mkdir "$parent" &&
        echo +cpuset >"$parent/cgroup.subtree_control"
    else
      mkdir "$parent" && cat "$base/cpuset.cpus" >"$parent/cpuset.cpus" &&
        cat "$base/cpuset.mems" >"$parent/cpuset.mems"
    fi
  } 2>/dev/null; then
    rmdir "$parent" 2>/dev/null || true
    echo "test-cluster: cannot make cpuset cgroups under $base: every node shares all ${#pus[@]} CPUs" >&2
    echo "${#pus[@]}"
    return 0
  fi
  for k in $(seq 1 "$n"); do
    mine=()
    for i in $(seq 0 $((per - 1))); do mine+=("${pus[$(( ((k - 1) * per + i) % ${#pus[@]} ))]}"); done
    mkdir "$parent/node$k"
    (IFS=,; echo "${mine[*]}") >"$parent/node$k/cpuset.cpus"
    pu_nodes "${mine[@]}" >"$parent/node$k/cpuset.mems"
  done
  echo "$per"
}

remove_cpusets() {
  # After every process is gone: the node cgroups, then their parent (found without
  # the state directory too, the name is fixed).
  local base parent
  base=$(cpuset_base)
  [ -n "$base" ] || return 0
  parent=$base/$CG_NAME
  [ -d "$parent" ] || return 0
  rmdir "$parent"/node* 2>/dev/null || true
  rmdir "$parent" 2>/dev/null || echo "test-cluster: could not remove $parent (processes left?)" >&2
}

# --- Slurm's own confinement -------------------------------------------------------
# Slurm's task/cgroup confines each job to the CPUs it allocated, and Slurm counts a
# node's CPUs from 0 (its hwloc view is the whole machine, and an abstract CPU maps to
# the machine CPU of the same rank). So every node is declared with the whole machine's
# CPUs, and the PUs that are not the node's own are its CpuSpecList: reserved, never
# given to a job. A job on node K then gets node K's PUs (its cpuset) from Slurm itself,
# and TaskPluginParam=SlurmdOffSpec keeps slurmd on them too.

confinement() {
  # "cgroup" where Slurm 22.05's cgroup/v1 plugin has every controller it uses mounted
  # (freezer: proctrack; cpuset, memory, devices: task), else "none": the cluster then
  # runs without Slurm's cgroups (proctrack/pgid, task/none, CPUs= each node's share),
  # as on a cgroup v2 host, which this script does not configure Slurm for.
  # HPCVM_TEST_CLUSTER_CGROUPS=no chooses "none" anywhere.
  local c
  [ "${HPCVM_TEST_CLUSTER_CGROUPS:-yes}" != no ] || { echo none; return 0; }
  for c in freezer cpuset memory devices; do
    [ -f "/sys/fs/cgroup/$c/tasks" ] || { echo none; return 0; }
  done
  echo cgroup
}

machine_pus() {
  # Every online PU's OS index, in order.
  expand_list "$(cat /sys/devices/system/cpu/online)"
}

spec_list() {
  # Node $1's CpuSpecList: Slurm's abstract ids (hwloc's logical PU index, the order
  # Slurm numbers CPUs in) of the PUs outside the node's cpuset; nothing without one.
  local cg pu mine spec=()
  cg=$(node_cgroup "$1")
  [ -n "$cg" ] || return 0
  read -r -a mine <<<"$(expand_list "$(cat "$cg/cpuset.cpus")")"
  for pu in $(machine_pus); do
    if [[ " ${mine[*]} " != *" $pu "* ]]; then
      spec+=("$(hwloc-calc --whole-system --physical-input "pu:$pu" --logical-output --intersect pu)")
    fi
  done
  [ "${#spec[@]}" -eq 0 ] || (IFS=,; echo "${spec[*]}")
}

node_hardware() {
  # The machine as slurmd itself counts it: CPUs, boards, sockets, cores, threads.
  slurmd -C | head -n 1 | tr ' ' '\n' |
    grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | paste -sd' ' -
}

remove_slurm_cgroups() {
  # The cgroups each slurmd made (cgroup v1: <controller>/slurm_nodeK/...), deepest
  # first, once no process is left in them. slurmd never removes its own top level.
  local dir
  for dir in /sys/fs/cgroup/*/slurm_node[0-9]*; do
    [ -d "$dir" ] || continue
    find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [ ! -d "$dir" ] || echo "test-cluster: could not remove $dir (processes left?)" >&2
  done
}

# --- the test user ------------------------------------------------------------------
# Jobs are submitted as an unprivileged user, as on a real site. The user (fixed uid,
# its own group of the same id, a home under /home) is a member of the site's group
# and of kvm, as install-node.sh's --add-user makes a site's users. `up` creates it,
# and the site's group if missing; `down` removes what `up` created: the user only if it
# carries the test cluster's mark, the group only if the state says `up` made it.

ensure_test_user() {
  if ! getent group "$HPCVM_GROUP" >/dev/null; then
    groupadd --gid "$HPCVM_GID" "$HPCVM_GROUP"
    touch "$DIR/created-group"
  fi
  local groups=$HPCVM_GROUP
  getent group kvm >/dev/null && groups=$groups,kvm
  if getent passwd "$TEST_USER" >/dev/null; then
    [ "$(getent passwd "$TEST_USER" | cut -d: -f5)" = "$TEST_MARK" ] ||
      die "a user $TEST_USER exists that the test cluster did not make; set HPCVM_TEST_USER to another name"
    usermod -a -G "$groups" "$TEST_USER"
    return 0
  fi
  getent group "$TEST_UID" >/dev/null || groupadd --gid "$TEST_UID" "$TEST_USER"
  useradd --uid "$TEST_UID" --gid "$TEST_UID" --groups "$groups" --create-home \
    --home-dir "/home/$TEST_USER" --shell /bin/sh --comment "$TEST_MARK" "$TEST_USER"
}

# The address claims directory as a node install makes it (root's, 1777): one that a job
# of the test user made first would be trusted by no other user (docs/site.md). Claims
# in it are left as they are; it stays after `down`, as a node's would.
make_claims_dir() {
  local d=${HPCVM_ADDRESS_CLAIMS:-/dev/shm/hpcvm-addresses}
  if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then
    die "$d is not a directory; remove it (it is where --address auto claims its slots)"
  fi
  mkdir -p "$d"
  chown root:root "$d"
  chmod 1777 "$d"
}

remove_test_user() {
  if [ "$(getent passwd "$TEST_USER" | cut -d: -f5)" = "$TEST_MARK" ]; then
    userdel --remove "$TEST_USER" 2>/dev/null || userdel "$TEST_USER" ||
      echo "test-cluster: could not remove user $TEST_USER" >&2
    rm -rf "/tmp/hpcvm-$TEST_UID"  # its hpcvm runtime directory (userdel knows not of it)
    # userdel removes the user's own group with it (USERGROUPS_ENAB); an older one not.
    if getent group "$TEST_USER" >/dev/null && [ -z "$(getent group "$TEST_USER" | cut -d: -f4)" ]; then
      groupdel "$TEST_USER" 2>/dev/null || true
    fi
  fi
  # The group stays if the node install has run since (its grants name the group).
  if [ -f "$DIR/created-group" ] && getent group "$HPCVM_GROUP" >/dev/null &&
    [ -z "$(getent group "$HPCVM_GROUP" | cut -d: -f4)" ] && [ ! -d /var/lib/hpcvm-node ]; then
    groupdel "$HPCVM_GROUP" || true
  fi
}

# --- down ---------------------------------------------------------------------------

ns_pids() {
  # Every process in the namespaces named in $@.
  local ns
  for ns in "$@"; do ip netns pids "$ns" 2>/dev/null || true; done
}

kill_ns_processes() {
  # SIGTERM to every process in the namespaces $@ at once, SIGKILL to what is left after
  # 5 s (a job step that ignores SIGTERM), then wait until they are all gone.
  local sig pids i
  for sig in TERM KILL; do
    pids=$(ns_pids "$@")
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086
    kill -s "$sig" $pids 2>/dev/null || true
    for i in $(seq 1 25); do
      pids=$(ns_pids "$@")
      [ -n "$pids" ] || return 0
      sleep 0.2
    done
  done
  echo "test-cluster: processes left in $*: $pids" >&2
}

do_down() {
  local ns created_run_netns=0
  [ -f "$DIR/created-run-netns" ] && created_run_netns=1
  local all
  all=$(node_namespaces)
  # shellcheck disable=SC2086
  kill_ns_processes $all
  for ns in $all; do ip netns del "$ns" 2>/dev/null || true; done
  remove_slurm_cgroups
  remove_cpusets
  remove_test_user
  # Only a directory this script made (it carries the marker) is ever removed, and
  # what a test mounted under its shared mount point goes first.
  if [ -f "$DIR/$MARKER" ]; then
    if mountpoint -q "$DIR/mnt"; then umount -R "$DIR/mnt" || umount -R -l "$DIR/mnt"; fi
    rm -rf "$DIR"
  fi
  # `ip netns add` turned /run/netns into a mount point; undo that if it was ours and
  # nothing else lives there now.
  if [ "$created_run_netns" -eq 1 ] && [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then
    umount /run/netns 2>/dev/null || true
    rmdir /run/netns 2>/dev/null || true
  fi
  local left
  left=$(node_namespaces)
  [ -z "$left" ] || die "namespaces left after down: $left"
}

# --- up -----------------------------------------------------------------------------

check_tools() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (namespaces, bridges); try: sudo $0 $*"
  local t missing=()
  for t in ip nsenter unshare munged slurmctld slurmd sinfo hwloc-calc useradd runuser; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  [ "${#missing[@]}" -eq 0 ] || die "missing ${missing[*]}; install with: scripts/setup-cluster.sh"
}

# $DIR/mnt: a mount point the host shares with every node. The nodes' mount namespaces
# are its slaves (in_ns: --propagation slave; every other mount stays private, so a
# node's own mounts, its /etc/hosts, never reach the host): a file system a test mounts
# under it later appears on every node at the same path, as a site's shared file system
# does (tests/cluster_support.py small_fs: a small tmpfs that fills during a save).
make_shared_mount() {
  mkdir -p "$DIR/mnt"
  chmod 755 "$DIR/mnt"
  mount --bind "$DIR/mnt" "$DIR/mnt"
  mount --make-shared "$DIR/mnt"
}

make_network() {
  local n=$1 k ns
  [ -d /run/netns ] || touch "$DIR/created-run-netns"
  ip netns add "$SW_NS"
  ip -n "$SW_NS" link set lo up
  ip -n "$SW_NS" link add sw0 type bridge
  ip -n "$SW_NS" addr add "$CTL_ADDR/24" dev sw0
  ip -n "$SW_NS" link set sw0 up
  for k in $(seq 1 "$n"); do
    ns=$NODE_NS_PREFIX$k
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # The veth pair is born in the switch namespace with its node end moved at once:
    # nothing ever appears in the host's namespace.
    ip -n "$SW_NS" link add "n$k" type veth peer name up0 netns "$ns"
    ip -n "$SW_NS" link set "n$k" master sw0 up
    # The node's address sits on its bridge with the uplink enslaved, as on a real host
    # whose NIC is in br0: VMs' taps added to br0 later share the cluster's segment.
    ip -n "$ns" link add br0 type bridge
    ip -n "$ns" link set up0 master br0 up
    ip -n "$ns" addr add "$NET.$k/24" dev br0
    ip -n "$ns" link set br0 up
  done
}

# The site's epilog, with the hpcvm the tests' jobs run (written by the tests into
# etc/epilog-hpcvm once they built it); nothing to do before that. Written again by an
# `up` that finds the cluster running: it runs this tree's epilog script, not that of the
# tree that started the cluster, which may be gone (a removed fresh clone's cluster,
# reused: every node drained at its first job's end, "epilog failed: rc:127").
write_epilog() {
  cat >"$DIR/etc/epilog.sh.new" <<EPILOG
#!/bin/sh
HPCVM=\$(cat "$DIR/etc/epilog-hpcvm" 2>/dev/null) || exit 0
export HPCVM
exec /bin/bash "$REPO/docs/examples/slurm-epilog.sh"
EPILOG
  chmod 755 "$DIR/etc/epilog.sh.new"
  mv -f "$DIR/etc/epilog.sh.new" "$DIR/etc/epilog.sh"
}

write_config() {
  local n=$1 mode=$2 k spec="" tracking nodes
  mkdir -p "$DIR"/{etc,log,run,munge,ctld}
  if [ "$mode" = cgroup ]; then
    tracking="# Slurm's cgroups, as a production site has them (cgroup.conf: cgroup v1, each slurmd
# in its own slurm_nodeK subtree): a job's processes are tracked by its cgroup, so
# scancel ends whatever it started, setsid or not; each job gets only its CPUs, memory
# and (GRES) devices. A node's PUs outside its cpuset are its CpuSpecList (below), and
# SlurmdOffSpec keeps slurmd itself off them: docs/cluster-testing.md.
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
TaskPluginParam=SlurmdOffSpec"
    nodes=$(node_hardware)
  else
    tracking="# No Slurm cgroups here (no cgroup v1 controllers): processes tracked by process
# group, each slurmd put in its node's cpuset by this script: docs/cluster-testing.md.
ProctrackType=proctrack/pgid
TaskPlugin=task/none"
    nodes="CPUs=$(cat "$DIR/node-cpus")"
  fi
  # Clients of every user reach munged's socket here; the key in it is root's alone (0400).
  chmod 755 "$DIR/munge"
  {
    echo "127.0.0.1 localhost"
    echo "$CTL_ADDR $CTL_NAME"
    for k in $(seq 1 "$n"); do echo "$NET.$k node$k"; done
  } >"$DIR/etc/hosts"
  cat >"$DIR/etc/slurm.conf" <<EOF
# Written by scripts/test-cluster.sh; removed by its \`down\`. See docs/cluster-testing.md.
ClusterName=hpcvmtest
SlurmctldHost=$CTL_NAME($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$DIR/ctld
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmdParameters=config_overrides
# Per node: the nodes share one /tmp, and PMIx names its directories by job and step only.
TmpFS=$DIR/tmp/%n
$tracking
JobAcctGatherType=jobacct_gather/none
# A stand-in for a passthrough device a job must ask for (gres.conf): ConstrainDevices
# denies it to every other job.
GresTypes=nic
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerNode=$((MEM_MB / 2))
ReturnToService=2
# A loaded 2-core machine answers slowly; be patient rather than mark nodes down.
MessageTimeout=30
SlurmdTimeout=120
SlurmctldTimeout=120
InactiveLimit=0
KillWait=30
MinJobAge=30
# hpcvm's epilog (docs/site.md): cleans what a node task killed outright left behind.
Epilog=$DIR/etc/epilog.sh
NodeName=DEFAULT $nodes RealMemory=$MEM_MB Gres=nic:1 State=UNKNOWN
EOF
  for k in $(seq 1 "$n"); do
    [ "$mode" != cgroup ] || spec=$(spec_list "node$k")
    echo "NodeName=node$k NodeAddr=$NET.$k NodeHostname=node$k${spec:+ CpuSpecList=$spec}" \
      >>"$DIR/etc/slurm.conf"
    mkdir -p "$DIR/spool/node$k" "$DIR/tmp/node$k"
    chmod 1777 "$DIR/tmp/node$k"   # jobs of every user make their PMIx directories here
  done
  echo "PartitionName=test Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP" >>"$DIR/etc/slurm.conf"
  write_epilog
  # /dev/full stands in for a passthrough NIC's /dev/vfio/N (none exists here): a device
  # every job is denied unless it was given the GRES (--gres=nic:1). Nothing hpcvm or
  # a test job needs opens it.
  echo "Name=nic File=$GRES_DEVICE" >"$DIR/etc/gres.conf"
  echo "$mode" >"$DIR/confinement"
  [ "$mode" = cgroup ] || return 0
  cat >"$DIR/etc/cgroup.conf" <<EOF
# Written by scripts/test-cluster.sh. Slurm 22.05 names each slurmd's subtree
# /slurm_<node name> (built with multiple-slurmd support), so the nodes never share one.
CgroupPlugin=cgroup/v1
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=yes
EOF
}

start_daemons() {
  local n=$1 k
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$DIR/munge/munge.key"
  start_daemon "$SW_NS" "$CTL_NAME" munged --force \
    --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munge.seed"
  wait_for munged test -S "$DIR/munge/munge.socket"
  start_daemon "$SW_NS" "$CTL_NAME" slurmctld -i
  wait_for slurmctld client scontrol ping
  for k in $(seq 1 "$n"); do
    start_daemon "$NODE_NS_PREFIX$k" "node$k" slurmd -N "node$k"
  done
  wait_for "$n idle nodes" all_idle "$n"
}

all_idle() {
  local n=$1 idle
  idle=$(client sinfo -h -N -t idle -o '%N' | sort -u | wc -l)
  [ "$idle" -eq "$n" ]
}

# Every node up and serving: idle, or running (or just ending) a job. The cluster is
# shared by concurrent test sessions, so a node busy with another session's job is a
# healthy one; a node down, drained or not responding is not.
all_serving() {
  local n=$1 serving
  serving=$(client sinfo -h -N -t idle,alloc,mix,comp -o '%N' | sort -u | wc -l)
  [ "$serving" -eq "$n" ]
}

up_failed() {
  trap - EXIT
  echo "test-cluster: up failed (exit $1); removing what was made" >&2
  # The logs go with the state directory: show their ends first.
  local log
  for log in "$DIR"/log/*.log; do
    [ -s "$log" ] || continue
    echo "--- last lines of ${log##*/}:" >&2
    tail -n 8 "$log" >&2
  done
  do_down || true
  exit "$1"
}

do_up() {
  local n=$1
  [[ "$n" =~ ^[1-9][0-9]?$ ]] || die "--nodes must be a number from 1 to 99, got '$n'"
  check_tools
  if [ -f "$DIR/nodes" ]; then
    local have
    have=$(cat "$DIR/nodes")
    if [ -z "$(ns_pids "$SW_NS")" ]; then
      # The state outlived its daemons (a restart, a killed container): nothing runs
      # there, so removing it loses nothing and the caller gets the cluster it asked for.
      say "removing a stale test cluster (state in $DIR, no daemon running)"
      do_down
    else
      [ "$have" = "$n" ] || die "a test cluster with $have nodes is up; run '$0 down' first"
      # Other sessions' jobs may hold nodes: up means serving (idle or busy), not idle.
      if (READY_TIMEOUT=$IDLE_TIMEOUT && wait_for "$n serving nodes" all_serving "$n") 2>/dev/null; then
        say "already up: $n nodes"
        write_epilog
        return 0
      fi
      die "a test cluster is up but not all $n nodes are serving (idle or running jobs) after ${IDLE_TIMEOUT}s; see '$0 status', or '$0 down'"
    fi
  fi
  [ -z "$(node_namespaces)" ] || die "namespaces from an earlier test cluster exist; run '$0 down' first"
  if [ -e "$DIR" ] && [ -n "$(ls -A "$DIR" 2>/dev/null)" ] && [ ! -f "$DIR/$MARKER" ]; then
    die "$DIR exists and is not a test cluster's directory; set HPCVM_TEST_CLUSTER_DIR to a new path"
  fi
  # Any failure from here on (an error, die's exit, Ctrl-C) removes what was made.
  trap 'up_failed $?' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  mkdir -p "$DIR"
  chmod 755 "$DIR"
  touch "$DIR/$MARKER"
  make_shared_mount
  make_cpusets "$n" >"$DIR/node-cpus"
  ensure_test_user
  make_claims_dir
  write_config "$n" "$(confinement)"
  [ "$(cat "$DIR/confinement")" = cgroup ] ||
    say "no cgroup v1 controllers here: Slurm's cgroup plugins are off (docs/cluster-testing.md)"
  echo "$n" >"$DIR/nodes"
  make_network "$n"
  start_daemons "$n"
  trap - EXIT INT TERM
  say "up: $n nodes (SLURM_CONF=$DIR/etc/slurm.conf; run Slurm commands with '$0 exec -- CMD')"
}

do_status() {
  if [ ! -f "$DIR/nodes" ]; then
    say "down"
    local ns
    ns=$(node_namespaces)
    [ -z "$ns" ] || say "but namespaces exist: $ns (run '$0 down')"
    return 3
  fi
  say "state in $DIR; namespaces:"
  node_namespaces | sed 's/^/  /'
  client sinfo -N -o '%N %T %c %o'
}

do_exec() {
  local ns=$SW_NS name=$CTL_NAME user=""
  while [ "$#" -gt 0 ]; do
    case "$1" in
      --node)
        name=${2:?--node needs a node name, e.g. node1}
        [[ "$name" =~ ^node([0-9]+)$ ]] || die "unknown node '$name' (nodes are node1, node2, ...)"
        ns=$NODE_NS_PREFIX${BASH_REMATCH[1]}
        shift 2
        ;;
      --user)
        user=${2:?--user needs a user name, e.g. $TEST_USER}
        getent passwd "$user" >/dev/null || die "no user '$user' (the test cluster's is $TEST_USER)"
        shift 2
        ;;
      *) break ;;
    esac
  done
  [ "${1:-}" = "--" ] && shift
  [ "$#" -gt 0 ] || die "exec needs a command after --"
  [ -f "$DIR/nodes" ] || die "no test cluster is up; run '$0 up' first"
  ip netns list | awk '{print $1}' | grep -qx "$ns" || die "no namespace $ns; is $name part of the cluster?"
  if [ -n "$user" ]; then
    # runuser keeps the environment but sets HOME, USER, LOGNAME and SHELL to the user's
    # (and PATH from login.defs); SLURM_CONF is passed on by env.
    set -- runuser -u "$user" -- env "SLURM_CONF=$DIR/etc/slurm.conf" "$@"
  fi
  SLURM_CONF=$DIR/etc/slurm.conf in_ns "$ns" "$name" "$@"
}

# --- main ---------------------------------------------------------------------------

cmd=${1:-}
[ -n "$cmd" ] || usage
shift
nodes=2
case "$cmd" in
  up)
    while [ "$#" -gt 0 ]; do
      case "$1" in
        --nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
        --nodes=*) nodes=${1#--nodes=}; shift ;;
        *) die "unknown option '$1' for up (known: --nodes N)" ;;
      esac
    done
    ;;
  down | status) [ "$#" -eq 0 ] || die "$cmd takes no arguments" ;;
  exec) ;;
  *) usage ;;
esac
[ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces); try: sudo $0 $cmd"

# One test cluster per machine (namespace names are global): serialise callers on a lock
# held on this script file itself, so no lock file is left behind.
if [ "$cmd" = up ] || [ "$cmd" = down ]; then
  exec 9<"$0"
  flock 9
fi

case "$cmd" in
  up) do_up "$nodes" ;;
  down) do_down && say "down" ;;
  status) do_status ;;
  exec) do_exec "$@" ;;
esac

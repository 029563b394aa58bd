#!/bin/bash
# Slurm Epilog for nodes that run hpcvm (slurm.conf: Epilog=/etc/slurm/hpcvm-epilog.sh;
# Slurm runs it as root on every node of a job once the job has ended).
#
# With proctrack/cgroup, Slurm ends a job by killing every process in its cgroup at
# once. A node's hpcvm task stops its VM when Slurm asks it to (SIGTERM); but a task
# killed outright (KillWait ran out, the OOM killer) dies together with its QEMU and
# with the reaper that would have cleaned up, and the VM's run directory (and its empty
# hugetlbfs directory) stay behind: no process, no memory, but state. Likewise on the
# batch node a cluster's state directory, when its holder was killed before it could
# remove it (scancel while the batch script's `cluster down` trap had begun). This runs
# the job user's own `hpcvm ps` and `hpcvm cluster ps`, which remove the records of VMs
# whose QEMU is gone and of clusters whose holder is gone, in the runtime directories
# that user's hpcvm uses. It never touches a VM or cluster that still runs.
#
# Settings: HPCVM (the hpcvm every user can run; default the node install's).
set -u
hpcvm=${HPCVM:-/opt/hpcvm/bin/hpcvm}
user=${SLURM_JOB_USER:-}
uid=${SLURM_JOB_UID:-}
[ -n "$user" ] && [ -n "$uid" ] && [ -x "$hpcvm" ] || exit 0
if [ "$uid" = 0 ]; then
    dirs=(/run/hpcvm)
else
    dirs=("/run/user/$uid/hpcvm" "/tmp/hpcvm-$uid")
fi
for dir in "${dirs[@]}"; do
    [ -d "$dir" ] || continue
    runuser -u "$user" -- env HPCVM_RUNTIME_DIR="$dir" "$hpcvm" ps >/dev/null 2>&1 || true
    runuser -u "$user" -- env HPCVM_RUNTIME_DIR="$dir" "$hpcvm" cluster ps >/dev/null 2>&1 || true
done
exit 0

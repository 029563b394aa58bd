#!/bin/bash
# A batch job that saves itself before its time limit and goes on after a requeue, where
# it was, on whichever nodes Slurm gives it next: the usual Slurm pattern, with the whole
# job's VMs as the checkpoint (nothing asked of the MPI program).
#
#   HPCVM_IMAGE=$PWD/guest.qcow2 sbatch -N 2 --time=12:00:00 \
#       docs/examples/hpcvm-checkpoint-job.sh PROGRAM ARGS...
#
# PROGRAM is a path inside the image (the guests see no host files: a mounted share
# would block the checkpoint). The image needs openssh-server, Open MPI, iproute2 and
# qemu-guest-agent with cloud-init (docs/checkpoint.md). What happens:
#
# 1. First start: cluster up boots one VM per node from the image, and the MPI program
#    starts detached in the first VM (its output waits in the guest).
# 2. Slurm sends SIGUSR1 to this script (--signal=B:USR1@600: 600 s before the time
#    limit). The trap pauses every VM, saves them all into $HPCVM_CHECKPOINT, takes them
#    down and requeues the job (--requeue). A checkpoint replaces the previous one only
#    once it is complete.
# 3. Next start: the checkpoint exists, so cluster up --restore starts the saved VMs,
#    re-planned for the new nodes, and they run on together; cluster wait then gets the
#    program's output and exit status as if nothing had happened.
#
# The settings are environment variables, as in hpcvm-job.sh; the test of this script
# (tests/integration/test_cluster_checkpoint.py) sends the signal by hand
# (scancel --signal=USR1 --batch JOB), which is what Slurm does at the time limit.
#SBATCH --job-name=hpcvm-ckpt
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@600
set -uo pipefail

hpcvm=${HPCVM:-hpcvm}
name=${HPCVM_NAME:-job${SLURM_JOB_ID}}
image=${HPCVM_IMAGE:?set HPCVM_IMAGE to the guests disk image}
checkpoint=${HPCVM_CHECKPOINT:-$PWD/hpcvm-checkpoint-$SLURM_JOB_ID}   # a shared file system
nodes=${SLURM_JOB_NUM_NODES:-1}
vcpus=${HPCVM_VCPUS:-1}
memory=${HPCVM_MEMORY:-1G}
profile=${HPCVM_PROFILE:-hpc}
address=${HPCVM_ADDRESS:-auto}
extra=${HPCVM_UP_OPTIONS:-}                    # e.g. --accel tcg
waiter=

say() { echo "hpcvm-checkpoint-job: $*"; }

# A new checkpoint replaces the last one only once it is complete, by renames: if the
# job is killed in between, the next start finds one of the two whole.
promote() {
    [ -d "$checkpoint" ] && mv "$checkpoint" "$checkpoint.old"
    mv "$checkpoint.next" "$checkpoint" && rm -rf "$checkpoint.old"
}

checkpoint_and_requeue() {
    say "signalled: saving cluster $name into $checkpoint"
    if [ -n "$waiter" ]; then kill "$waiter" 2>/dev/null; wait "$waiter"; fi
    rm -rf "$checkpoint.next"
    "$hpcvm" cluster checkpoint "$name" "$checkpoint.next"
    if [ ! -f "$checkpoint.next/job.json" ]; then   # not written: the VMs run on
        say "the checkpoint failed: the job ends here (the last complete one, if any, stays in $checkpoint)" >&2
        "$hpcvm" cluster down "$name"
        exit 1
    fi
    promote
    say "saved; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
}
trap checkpoint_and_requeue USR1

# A start after a kill between the two renames above
if [ ! -d "$checkpoint" ] && [ -f "$checkpoint.next/job.json" ]; then promote; fi
[ -d "$checkpoint.old" ] && [ -d "$checkpoint" ] && rm -rf "$checkpoint.old"
[ ! -d "$checkpoint" ] && [ -d "$checkpoint.old" ] && mv "$checkpoint.old" "$checkpoint"

if [ -d "$checkpoint" ]; then
    say "restoring cluster $name from $checkpoint (restart ${SLURM_RESTART_COUNT:-0})"
    "$hpcvm" cluster up --name "$name" --restore "$checkpoint" || exit 1
else
    # shellcheck disable=SC2086  # $extra is a list of options
    "$hpcvm" cluster up --name "$name" --image "$image" --profile "$profile" --vcpus "$vcpus" \
        --memory "$memory" --address "$address" $extra || exit 1
    "$hpcvm" cluster exec --detach "$name" -- mpirun -np $((vcpus * nodes)) --map-by node "$@" ||
        { "$hpcvm" cluster down "$name"; exit 1; }
fi
"$hpcvm" cluster ps "$name"

# In the background, so that the trap runs as soon as the signal comes (bash runs a
# trap only between commands, and `wait` is one it interrupts).
"$hpcvm" cluster wait "$name" &
waiter=$!
wait "$waiter"
status=$?
trap - USR1   # the program has ended: nothing left to save
"$hpcvm" cluster down "$name"
rm -rf "$checkpoint"
say "the program ended with exit status $status"
exit "$status"

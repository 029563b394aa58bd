#!/bin/bash
# A batch job that saves itself before its time limit and goes on after a requeue, where
# it was, on whichever nodes Slurm gives it next: the usual Slurm pattern, with the whole
# job's VMs as the checkpoint (nothing asked of the MPI program). With
# HPCVM_CHECKPOINT_EVERY it also saves itself at that interval, so that a node that
# dies without warning costs only the work since the last checkpoint.
#
#   HPCVM_IMAGE=$PWD/guest.qcow2 [HPCVM_CHECKPOINT_EVERY=30m] sbatch -N 2 \
#       --time=12:00:00 docs/examples/hpcvm-checkpoint-job.sh PROGRAM ARGS...
#
# PROGRAM is a path inside the image (the guests see no host files: a mounted share
# would block the checkpoint). The image needs openssh-server, Open MPI, iproute2 and
# qemu-guest-agent with cloud-init (docs/checkpoint.md). What happens:
#
# 1. First start: cluster up boots one VM per node from the image, and the MPI program
#    starts detached in the first VM (its output waits in the guest). With
#    HPCVM_CHECKPOINT_EVERY, a keeper saves the running job every that often into the
#    next directory of the series $HPCVM_CHECKPOINT (checkpoint-000001, ...), keeping the
#    newest HPCVM_CHECKPOINT_KEEP (1).
# 2. Slurm sends SIGUSR1 to this script (--signal=B:USR1@600: 600 s before the time
#    limit). The trap pauses every VM, saves them all as the series' next checkpoint,
#    takes them down and requeues the job (--requeue). A checkpoint is complete or
#    absent (written aside, then renamed): a job killed meanwhile keeps the last one.
#    The keeper also watches the job's nodes: one the admin drains has its VM moved to
#    a spare node (HPCVM_SPARE=K keeps the allocation's last K nodes free for that), or
#    without a spare the keeper sends this script SIGUSR1, as in 2 (HPCVM_ON_DRAIN:
#    migrate with spares, checkpoint without; none to leave drains alone).
# 3. A node's VM dies meanwhile (the node crashed, the VM was killed): cluster wait ends
#    with exit 11 naming it. With a complete checkpoint the job requeues itself; without
#    one it ends. (Where Slurm itself requeues a job whose node failed, the next start
#    is the same.)
# 4. Next start: the series holds a complete checkpoint, so cluster up --restore starts
#    the newest one's VMs, re-planned for the new nodes, and they run on together;
#    cluster wait then gets the program's output and exit status as if nothing had
#    happened (from the checkpoint on: work after it is done again).
#
# The settings are environment variables, as in hpcvm-job.sh; the test of this script
# (tests/integration/test_cluster_checkpoint.py) sends the signal by hand
# (scancel --signal=USR1 --batch JOB), which is what Slurm does at the time limit, and
# kills a node's QEMU as a crash would.
#SBATCH --job-name=hpcvm-ckpt
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@600
set -uo pipefail

hpcvm=${HPCVM:-hpcvm}
name=${HPCVM_NAME:-job${SLURM_JOB_ID}}
image=${HPCVM_IMAGE:?set HPCVM_IMAGE to the guests disk image}
series=${HPCVM_CHECKPOINT:-$PWD/hpcvm-checkpoint-$SLURM_JOB_ID}   # a shared file system
every=${HPCVM_CHECKPOINT_EVERY:-}              # e.g. 30m; empty: only at the signal
keep=${HPCVM_CHECKPOINT_KEEP:-1}
spare=${HPCVM_SPARE:-0}                        # nodes kept free for a VM to move to
if [ "$spare" -gt 0 ]; then on_drain=${HPCVM_ON_DRAIN:-migrate}; else on_drain=${HPCVM_ON_DRAIN:-checkpoint}; fi
nodes=$(( ${SLURM_JOB_NUM_NODES:-1} - spare ))
vcpus=${HPCVM_VCPUS:-1}
memory=${HPCVM_MEMORY:-1G}
profile=${HPCVM_PROFILE:-hpc}
address=${HPCVM_ADDRESS:-auto}
extra=${HPCVM_UP_OPTIONS:-}                    # e.g. --accel tcg
waiter=
keeper=(--spare "$spare" --on-drain "$on_drain")
if [ -n "$every" ]; then
    keeper+=(--checkpoint-every "$every" --checkpoint-dir "$series" --checkpoint-keep "$keep")
fi

say() { echo "hpcvm-checkpoint-job: $*"; }
saved() { compgen -G "$series/checkpoint-*/job.json" >/dev/null; }

requeue() {
    say "requeueing job $SLURM_JOB_ID: $*"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
}

checkpoint_and_requeue() {
    say "signalled: saving cluster $name into $series"
    if [ -n "$waiter" ]; then kill "$waiter" 2>/dev/null; wait "$waiter"; fi
    if ! "$hpcvm" cluster checkpoint "$name" "$series" --series; then   # the VMs run on
        say "the checkpoint failed: the job ends here (the last complete one, if any, stays in $series)" >&2
        "$hpcvm" cluster down "$name"
        exit 1
    fi
    requeue "saved"
}
trap checkpoint_and_requeue USR1

if saved; then
    say "restoring cluster $name from $series (restart ${SLURM_RESTART_COUNT:-0})"
    "$hpcvm" cluster up --name "$name" --restore "$series" "${keeper[@]}" || exit 1
else
    # shellcheck disable=SC2086  # $extra is a list of options
    "$hpcvm" cluster up --name "$name" --image "$image" --profile "$profile" --vcpus "$vcpus" \
        --memory "$memory" --address "$address" "${keeper[@]}" $extra || exit 1
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
trap - USR1   # the program has ended (or cannot go on): nothing left to save
"$hpcvm" cluster ps "$name"
"$hpcvm" cluster down "$name"
if [ "$status" -eq 11 ]; then   # a node's VM was lost
    if saved; then requeue "a node's VM was lost; the next start restores the newest checkpoint"; fi
    say "a node's VM was lost and no checkpoint was complete: the job ends here" >&2
    exit 1
fi
rm -rf "$series"
say "the program ended with exit status $status"
exit "$status"

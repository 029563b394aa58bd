#!/bin/bash
# A batch job that runs an MPI program in tuned VMs, one VM per allocated node.
#
#   sbatch -N 2 docs/examples/hpcvm-job.sh [PROGRAM ARGS...]
#   HPCVM_BATCH=local HPCVM_NODES=2 docs/examples/hpcvm-job.sh [PROGRAM ARGS...]  # one machine
#
# Each node's VM is planned for that node (hpcvm's hpc profile: vCPUs pinned 1:1, huge
# pages, virtual NUMA mirroring the node) and joined to the others through a tap in the
# node's bridge. The settings below are environment variables so that the same script
# serves a real cluster, hpcvm's one-machine test cluster and one workstation without a
# batch system (tests/integration/test_cluster_job.py runs it all three ways).
#SBATCH --job-name=hpcvm-mpi
#SBATCH --exclusive
set -euo pipefail

hpcvm=${HPCVM:-hpcvm}
batch=${HPCVM_BATCH:-slurm}                    # slurm, or local: this machine as N nodes
nodes=${HPCVM_NODES:-${SLURM_JOB_NUM_NODES:-1}}
name=${HPCVM_NAME:-job${SLURM_JOB_ID:-$$}}
vcpus=${HPCVM_VCPUS:-1}                        # per VM; the job runs vcpus x nodes ranks
memory=${HPCVM_MEMORY:-512M}
network=${HPCVM_NETWORK:-bridge=br0}           # each node's bridge holding its address
address=${HPCVM_ADDRESS:-auto}                 # auto: each VM an address of the site's pool
extra=${HPCVM_UP_OPTIONS:-}                    # e.g. --accel tcg
ranks=$((vcpus * nodes))

# shellcheck disable=SC2086  # $extra is a list of options
"$hpcvm" cluster up --name "$name" --batch "$batch" --nodes "$nodes" --profile hpc \
    --vcpus "$vcpus" --memory "$memory" --network "$network" --address "$address" $extra
trap '"$hpcvm" cluster down "$name"' EXIT      # also ended by scancel or the job's end
"$hpcvm" cluster ps "$name"

if [ $# -gt 0 ]; then
    "$hpcvm" cluster exec "$name" -- mpirun -np "$ranks" "$@"
else
    "$hpcvm" cluster exec "$name" -- mpirun -np "$ranks" hostname
fi

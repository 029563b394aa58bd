#!/bin/bash
# A Slurm batch job that measures what tuned VMs cost an MPI job across nodes: the same
# HPC Challenge and NetPIPE runs natively across the allocated nodes and across one
# vm:hpc VM per node, interleaved, into a results database and an HTML report.
#
#   sbatch -N 2 docs/examples/hpcvm-bench-job.sh
#
# Settings are environment variables so that the same script serves a real cluster and
# hpcvm's one-machine test cluster (tests/integration/test_cluster_bench.py submits it).
#SBATCH --job-name=hpcvm-bench
#SBATCH --exclusive
set -euo pipefail

hpcvm=${HPCVM:-hpcvm}
out=${HPCVM_OUT:-results-$SLURM_JOB_ID}
np=${HPCVM_NP:-$SLURM_JOB_NUM_NODES}            # ranks: one per node by default
network=${HPCVM_NETWORK:-bridge=br0}
address=${HPCVM_ADDRESS:-auto}                  # auto: each VM an address of the site's pool
reps=${HPCVM_REPS:-auto}
suites=${HPCVM_SUITES:-hpcc netpipe}
envs=${HPCVM_ENVS:-native vm:hpc}                # e.g. native container vm:hpc vm:hpc+e1000
extra=${HPCVM_BENCH_OPTIONS:-}                  # e.g. --size quick --max-time 20m

suite_options=()
for s in $suites; do suite_options+=(--suite "$s"); done
env_options=()
for e in $envs; do env_options+=(--env "$e"); done

# shellcheck disable=SC2086  # $extra is a list of options
"$hpcvm" bench --nodes "$SLURM_JOB_NUM_NODES" "${env_options[@]}" \
    "${suite_options[@]}" --np "$np" --reps "$reps" \
    --network "$network" --address "$address" --out "$out" $extra
"$hpcvm" report "$out"

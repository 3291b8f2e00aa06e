#!/usr/bin/env bash
# One command on a fresh Debian 12 machine: installs the dependencies, builds mtxcomm, and runs
# the main job — the allreduce benchmark on 2 ranks under Open MPI's mpirun, checking every
# result (-c) and timing Open MPI's own MPI_Allreduce in the same run (--vs-mpi).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
# Open MPI refuses to run as root unless told it is intended.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mpirun -np 2 --oversubscribe build/bench/mtxcomm_bench allreduce -c --vs-mpi "$@"

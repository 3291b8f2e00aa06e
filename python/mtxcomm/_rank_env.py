"""Sets a rank's torch.distributed variables from Open MPI's, then runs the rank's program.

mtxrun starts every rank through this file (``python _rank_env.py PROGRAM ARGS...``) so that a
script calling ``torch.distributed.init_process_group`` with ``env://`` (the default) finds
what torchrun would give it: RANK, LOCAL_RANK and LOCAL_WORLD_SIZE from mpirun's
OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK and OMPI_COMM_WORLD_LOCAL_SIZE (WORLD_SIZE,
MASTER_ADDR and MASTER_PORT are the same on every rank and set by mtxrun itself), and, where
MTXCOMM_STORE is set (mtxrun sets it under MTXCOMM_TRANSPORT=tcp), mtxcomm's MTXCOMM_RANK and
MTXCOMM_SIZE. A variable already set is kept. Run as a file, not as ``-m mtxcomm...``: it
imports nothing of mtxcomm (nor NumPy), so a rank's start costs one short interpreter start,
and it replaces itself with the program (os.execvp), which keeps the rank's pid, signals and
exit status.
"""

import os
import sys

_FROM = (
    ("RANK", "OMPI_COMM_WORLD_RANK"),
    ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
)
# mtxcomm's TCP bootstrap (MTXCOMM_STORE, which mtxrun sets under MTXCOMM_TRANSPORT=tcp).
_FROM_FOR_STORE = (
    ("MTXCOMM_RANK", "OMPI_COMM_WORLD_RANK"),
    ("MTXCOMM_SIZE", "OMPI_COMM_WORLD_SIZE"),
)


def main(argv):
    if not argv:
        sys.stderr.write("mtxrun: no program to run\n")
        return 2
    pairs = _FROM + (_FROM_FOR_STORE if os.environ.get("MTXCOMM_STORE") else ())
    for var, src in pairs:
        if not os.environ.get(var) and os.environ.get(src):
            os.environ[var] = os.environ[src]
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.stderr.write("mtxrun: cannot run %s: %s\n" % (argv[0], e))
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

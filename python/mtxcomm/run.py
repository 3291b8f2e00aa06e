"""mtxrun: launch N ranks through Open MPI's mpirun, optionally making an unmodified Keras
script data-parallel (--transparent).

    mtxrun -np 2 python train.py                 # the script uses mtxcomm.tensorflow itself
    mtxrun -np 2 --transparent python train.py   # a plain Keras script, unchanged
    mtxrun -np 8 -H node1:4,node2:4 --transparent python train.py

mtxrun is a thin wrapper: it builds one mpirun command line (shown with --dry-run) and runs it.
Beyond -np, -H/--host and --hostfile it adds: --bind-to none (TensorFlow uses many threads per
rank), --oversubscribe when -np exceeds this machine's cores and no host is given,
--allow-run-as-root when run by root, -x for PYTHONPATH and every MTXCOMM_* variable. Options
for mpirun itself go after --mpi-args.
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys


def _parser():
    p = argparse.ArgumentParser(
        prog="mtxrun",
        description="Launch a (TensorFlow/Keras) program on N ranks through Open MPI's mpirun.",
        epilog="Example: mtxrun -np 2 --transparent python examples/keras_digits.py")
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True,
                   help="number of ranks (processes) to start")
    p.add_argument("-H", "--host", "--hosts", dest="hosts",
                   help="hosts and slots, e.g. node1:4,node2:4 (mpirun's --host)")
    p.add_argument("--hostfile", help="mpirun hostfile")
    p.add_argument("--transparent", action="store_true",
                   help="make an unmodified Keras script data-parallel (see README)")
    p.add_argument("--all-ranks-output", action="store_true",
                   help="with --transparent: keep the standard output of every rank (default: "
                        "rank 0 only)")
    p.add_argument("--mpi-args", default="",
                   help="extra arguments for mpirun, one string (e.g. \"--mca btl tcp,self\")")
    p.add_argument("--dry-run", action="store_true", help="print the mpirun command, run nothing")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the program and its arguments (e.g. python train.py --epochs 3)")
    return p


def build_command(args, environ=None):
    """The mpirun argv and the environment for it."""
    env = dict(os.environ if environ is None else environ)
    if args.np < 1:
        raise SystemExit("mtxrun: -np must be >= 1, got %d" % args.np)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SystemExit("mtxrun: no program given (e.g. mtxrun -np 2 python train.py)")
    mpirun = shutil.which("mpirun", path=env.get("PATH"))
    if mpirun is None:
        raise SystemExit("mtxrun: Open MPI's mpirun is not on PATH (Debian/Ubuntu: "
                         "apt install openmpi-bin)")
    if args.hostfile and not os.path.isfile(args.hostfile):
        raise SystemExit("mtxrun: --hostfile %s does not exist" % args.hostfile)
    argv = [mpirun, "-np", str(args.np), "--bind-to", "none"]
    if args.hosts:
        argv += ["--host", args.hosts]
    if args.hostfile:
        argv += ["--hostfile", args.hostfile]
    if not args.hosts and not args.hostfile and args.np > (os.cpu_count() or 1):
        argv.append("--oversubscribe")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if args.all_ranks_output and not args.transparent:
        sys.stderr.write("mtxrun: --all-ranks-output has no effect without --transparent "
                         "(every rank's output is kept)\n")
    if args.transparent:
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_transparent")
        parts = [here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(parts)
        env["MTXCOMM_TRANSPARENT"] = "1"
        if args.all_ranks_output:
            env["MTXCOMM_TRANSPARENT_OUTPUT"] = "all"
    exported = ["PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV"]
    exported += sorted(k for k in env if k.startswith("MTXCOMM_"))
    for k in exported:
        if k in env:
            argv += ["-x", k]
    try:
        argv += shlex.split(args.mpi_args)
    except ValueError as e:
        raise SystemExit("mtxrun: --mpi-args %r: %s" % (args.mpi_args, e))
    argv += command
    return argv, env


def main(argv=None):
    args = _parser().parse_args(argv)
    cmd, env = build_command(args)
    if args.dry_run:
        print(" ".join(shlex.quote(c) for c in cmd))
        return 0
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

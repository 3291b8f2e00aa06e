"""mtxrun: launch N ranks through Open MPI's mpirun, optionally making an unmodified Keras
script data-parallel (--transparent).

    mtxrun -np 2 python train.py                 # the script uses mtxcomm.tensorflow itself
    mtxrun -np 2 --transparent python train.py   # a plain Keras script, unchanged
    mtxrun -np 8 -H node1:4,node2:4 --transparent python train.py

mtxrun is a thin wrapper: it builds one mpirun command line (shown with --dry-run) and runs it.
Beyond -np, -H/--host and --hostfile it adds:
  - placement: each rank gets its share of the node's cores, cores // ranks (at least 1, or
    --threads-per-rank N). On this machine (no -H/--hostfile) the ranks are bound to their cores
    through Open MPI's own options (--map-by slot:PE=N --bind-to core) and the thread pools are
    sized before TensorFlow starts (TF_NUM_INTRAOP_THREADS, TF_NUM_INTEROP_THREADS,
    OMP_NUM_THREADS = N); a variable the user set is passed on as it is. More ranks than cores:
    the ranks share the cores (--bind-to none --oversubscribe, one thread each; one warning).
    With -H/--hostfile mpirun binds nothing (--bind-to none): mtxcomm binds every rank to its
    share at init and the TensorFlow binding sizes its pools from it (MTXCOMM_PLACEMENT).
  - --allow-run-as-root when run by root, -x for PATH, PYTHONPATH, LD_LIBRARY_PATH, VIRTUAL_ENV
    and every MTXCOMM_* variable, --timeline PATH (MTXCOMM_TIMELINE).
--dry-run prints the command, and on stderr the placement and why. Options for mpirun itself go
after --mpi-args.
"""

import argparse
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys


def _parser():
    p = argparse.ArgumentParser(
        prog="mtxrun",
        description="Launch a (TensorFlow/Keras) program on N ranks through Open MPI's mpirun.",
        epilog="Example: mtxrun -np 2 --transparent python examples/keras_digits.py",
    )
    p.add_argument(
        "-np",
        "--num-proc",
        dest="np",
        type=int,
        required=True,
        help="number of ranks (processes) to start",
    )
    p.add_argument(
        "-H",
        "--host",
        "--hosts",
        dest="hosts",
        help="hosts and slots, e.g. node1:4,node2:4 (mpirun's --host)",
    )
    p.add_argument("--hostfile", help="mpirun hostfile")
    p.add_argument(
        "--transparent",
        action="store_true",
        help="make an unmodified Keras script data-parallel (see README)",
    )
    p.add_argument(
        "--all-ranks-output",
        action="store_true",
        help="with --transparent: keep the standard output of every rank (default: rank 0 only)",
    )
    p.add_argument(
        "--threads-per-rank",
        type=int,
        default=None,
        metavar="N",
        help="threads (and cores) per rank instead of this machine's cores // ranks",
    )
    p.add_argument(
        "--timeline",
        metavar="PATH",
        help='write a Chrome trace per rank (MTXCOMM_TIMELINE; "{rank}" in PATH '
        "is replaced by the rank, else rank r writes PATH.r)",
    )
    p.add_argument(
        "--mpi-args",
        default="",
        help='extra arguments for mpirun, one string (e.g. "--mca btl tcp,self")',
    )
    p.add_argument("--dry-run", action="store_true", help="print the mpirun command, run nothing")
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="the program and its arguments (e.g. python train.py --epochs 3)",
    )
    return p


def physical_cores():
    """This machine's physical cores that this process may use (hardware threads of one core
    count once), from /sys; os.cpu_count() where /sys has no topology."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
    cores = set()
    for cpu in allowed:
        path = "/sys/devices/system/cpu/cpu%d/topology/core_cpus_list" % cpu
        if not os.path.exists(path):
            path = "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list" % cpu
        try:
            with open(path) as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


_THREAD_VARS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


def placement(args, env):
    """(mpirun arguments, {variable: value} to set, [lines saying why])."""
    if args.threads_per_rank is not None and args.threads_per_rank < 1:
        raise SystemExit("mtxrun: --threads-per-rank must be >= 1, got %d" % args.threads_per_rank)
    mode = env.get("MTXCOMM_PLACEMENT") or "auto"
    if mode not in ("auto", "off"):
        raise SystemExit(
            "mtxrun: MTXCOMM_PLACEMENT must be auto or off, got %r" % env["MTXCOMM_PLACEMENT"]
        )
    why = []
    if args.hosts or args.hostfile:
        why.append(
            "hosts given: mpirun binds nothing; mtxcomm binds each rank to its share of "
            "its node's cores at init and sizes TensorFlow's pools from it"
        )
        threads = {}
        if args.threads_per_rank:
            threads = {v: str(args.threads_per_rank) for v in _THREAD_VARS}
        return ["--bind-to", "none"], threads, why
    cores = physical_cores()
    if args.np > cores:
        share = args.threads_per_rank or 1
        why.append(
            "%d ranks on %d cores: the ranks share the cores (not bound), %d thread(s) "
            "each" % (args.np, cores, share)
        )
        # (mtxcomm itself warns once, on the node's first rank, at init.)
        mpi = ["--bind-to", "none", "--oversubscribe"]
    else:
        share = args.threads_per_rank or max(1, cores // args.np)
        if mode == "off":
            mpi = ["--bind-to", "none"]
            why.append(
                "MTXCOMM_PLACEMENT=off: not bound (--bind-to none); %d thread(s) per rank "
                "for %d rank(s) on %d cores" % (share, args.np, cores)
            )
        elif args.np * share <= cores:
            mpi = ["--map-by", "slot:PE=%d" % share, "--bind-to", "core"]
            why.append(
                "%d rank(s) on %d cores: %d core(s) per rank, bound by mpirun (%s)"
                % (args.np, cores, share, " ".join(mpi))
            )
        else:
            mpi = ["--bind-to", "none"]
            why.append(
                "--threads-per-rank %d x %d ranks exceeds the %d cores: not bound"
                % (share, args.np, cores)
            )
    threads = {v: str(share) for v in _THREAD_VARS}
    return mpi, threads, why


def _first_host(args):
    """The host of rank 0 (torch's MASTER_ADDR): the first of --host/--hostfile, else this
    machine (127.0.0.1)."""
    if args.hosts:
        return args.hosts.split(",")[0].split(":")[0]
    if args.hostfile:
        with open(args.hostfile) as f:
            for line in f:
                line = line.split("#")[0].strip()
                if line:
                    return line.split()[0]
    return "127.0.0.1"


def _free_port():
    """A TCP port free on this machine now (torch's MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


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
        raise SystemExit(
            "mtxrun: Open MPI's mpirun is not on PATH (Debian/Ubuntu: apt install openmpi-bin)"
        )
    if args.hostfile and not os.path.isfile(args.hostfile):
        raise SystemExit("mtxrun: --hostfile %s does not exist" % args.hostfile)
    mpi_placement, threads, why = placement(args, env)
    argv = [mpirun, "-np", str(args.np)] + mpi_placement
    if args.hosts:
        argv += ["--host", args.hosts]
    if args.hostfile:
        argv += ["--hostfile", args.hostfile]
    for var, value in threads.items():
        if env.get(var):
            why.append("%s=%s kept as you set it" % (var, env[var]))
        else:
            env[var] = value
    if threads:
        why.append("thread pools: " + ", ".join("%s=%s" % (v, env[v]) for v in threads))
    if args.timeline:
        # "mtxrun --timeline python train.py" (PATH forgotten): argparse took the program for
        # the PATH and would run train.py as the program.
        if not os.path.dirname(args.timeline) and shutil.which(args.timeline):
            raise SystemExit(
                "mtxrun: --timeline takes a PATH for the trace, got %r, which is a "
                "program on PATH; write e.g. mtxrun -np %d --timeline trace.json "
                "%s" % (args.timeline, args.np, " ".join([args.timeline] + list(args.command)))
            )
        env["MTXCOMM_TIMELINE"] = os.path.abspath(args.timeline)
    if not env.get("MTXCOMM_JOB_SECRET") and not env.get("MTXCOMM_JOB_SECRET_FILE"):
        # The job's secret (256 random bits): what every bootstrap connection between its ranks
        # proves when they meet over TCP (MTXCOMM_STORE=tcp:); mpirun carries it to the ranks.
        env["MTXCOMM_JOB_SECRET"] = secrets.token_hex(32)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if args.all_ranks_output and not args.transparent:
        sys.stderr.write(
            "mtxrun: --all-ranks-output has no effect without --transparent "
            "(every rank's output is kept)\n"
        )
    if args.transparent:
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_transparent")
        parts = [here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(parts)
        env["MTXCOMM_TRANSPARENT"] = "1"
        if args.all_ranks_output:
            env["MTXCOMM_TRANSPARENT_OUTPUT"] = "all"
    # torch.distributed's env:// rendezvous (what torchrun gives a rank): the same on every
    # rank here, RANK, LOCAL_RANK and LOCAL_WORLD_SIZE per rank from _rank_env.py.
    torch_vars = {"MASTER_ADDR": _first_host(args), "WORLD_SIZE": str(args.np)}
    for var, value in torch_vars.items():
        env.setdefault(var, value)
    if not env.get("MASTER_PORT"):
        env["MASTER_PORT"] = str(_free_port())
    if env.get("MTXCOMM_TRANSPORT") == "tcp" and not env.get("MTXCOMM_STORE"):
        # The TCP bootstrap meets at a store, not over MPI: rank 0 serves it on the first host;
        # _rank_env.py gives each rank MTXCOMM_RANK and MTXCOMM_SIZE from mpirun's.
        env["MTXCOMM_STORE"] = "tcp:%s:%d" % (env["MASTER_ADDR"], _free_port())
        why.append("MTXCOMM_TRANSPORT=tcp: the ranks meet at MTXCOMM_STORE=" + env["MTXCOMM_STORE"])
    exported = ["PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV"] + list(threads)
    exported += ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"]
    exported += sorted(k for k in env if k.startswith("MTXCOMM_"))
    for k in exported:
        if k in env:
            argv += ["-x", k]
    try:
        argv += shlex.split(args.mpi_args)
    except ValueError as e:
        raise SystemExit("mtxrun: --mpi-args %r: %s" % (args.mpi_args, e)) from None
    rank_env = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_rank_env.py")
    argv += [sys.executable, rank_env] + command
    build_command.why = why
    return argv, env


def main(argv=None):
    args = _parser().parse_args(argv)
    cmd, env = build_command(args)
    if args.dry_run:
        for line in getattr(build_command, "why", []):
            sys.stderr.write("# placement: %s\n" % line)
        print(" ".join(shlex.quote(c) for c in cmd))
        return 0
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The `hpcckpt run` and `hpcckpt scavenge` subcommands.

- ``hpcckpt run [--max-restarts N] [--exclude-failed-node] [--timeout T] [--delay T] -- COMMAND ...``
  (local, no MPI): the restart loop of hpcckpt.launcher; exit status of the last attempt.
- ``hpcckpt scavenge [--config run.toml] [--name ...] [--cache-dir ...] [--pfs-dir ...]``
  (collective: an MPI job with the application's number of ranks, e.g.
  ``srun -n $SLURM_NTASKS hpcckpt scavenge ...`` or ``mpiexec -n N python -m hpcckpt scavenge ...``):
  copies the newest restorable cache checkpoint to pfs unless pfs has it already.

add_subcommands(subparsers) registers both; each sets ``func(args) -> exit status``. Bad input
prints one line on stderr and returns 2.
"""
import argparse
import sys

from .errors import HpcCkptError
from .units import parse_duration

MPI_COMMANDS = ("scavenge",)       # run as an MPI job: MPI is initialized in the command's process


def add_subcommands(subparsers):
    """Register `run` and `scavenge` on the main parser's subparsers."""
    p = subparsers.add_parser(
        "run", help="rerun a launch command when it fails, up to N times (the in-allocation restart loop)",
        description="Run COMMAND; when it exits non-zero, run it again (the application restarts from "
                    "its newest checkpoint), up to --max-restarts times. Signals (TERM, INT, HUP, USR1, "
                    "USR2) are forwarded to COMMAND's process group and stop further attempts. Exit "
                    "status: that of the last attempt (128+N when killed by signal N); 2 on bad input.",
        usage="hpcckpt run [--max-restarts N] [--exclude-failed-node] [--timeout T] [--delay T] -- COMMAND ...")
    p.add_argument("--max-restarts", type=int, default=2, metavar="N",
                   help="relaunch at most N times (default 2)")
    p.add_argument("--exclude-failed-node", action="store_true",
                   help="after a failure, exclude the nodes srun reports failed tasks on and nodes SLURM "
                        "marks down/drained (srun commands get --exclude=NODES; every command gets "
                        "CKPT_FAILED_NODES)")
    p.add_argument("--timeout", default=None, metavar="T",
                   help="time limit per attempt (e.g. 300, 10min, 1:00:00); over it: SIGTERM, then SIGKILL")
    p.add_argument("--delay", default="0", metavar="T", help="wait this long before each relaunch (default 0)")
    p.add_argument("launch", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    p.set_defaults(func=cmd_run)

    p = subparsers.add_parser(
        "scavenge", help="copy the newest cache checkpoint to pfs if it is not there (run as an MPI job)",
        description="Collective: run with the application's number of ranks (srun -n $SLURM_NTASKS "
                    "hpcckpt scavenge ..., or mpiexec -n N python -m hpcckpt scavenge ...) and the same "
                    "configuration. Copies the newest checkpoint every rank can verify in its node-local "
                    "cache to pfs_dir, unless pfs has that step already. Exit status 0 (copied or nothing "
                    "to copy), 2 on bad input or failure.")
    p.add_argument("--config", default=None, help="the application's TOML configuration")
    p.add_argument("--name", default=None, help="the job name (config key name)")
    p.add_argument("--cache-dir", default=None, help="config key cache_dir")
    p.add_argument("--pfs-dir", default=None, help="config key pfs_dir")
    p.add_argument("--ranks-per-node", default=None, help="config key ranks_per_node ('auto' or an int)")
    p.set_defaults(func=cmd_scavenge)


def cmd_run(args):
    """`hpcckpt run`: the restart loop (local)."""
    from .launcher import run_with_restarts
    command = list(args.launch)
    if command and command[0] == "--":
        command = command[1:]
    try:
        timeout = parse_duration(args.timeout, "--timeout") if args.timeout is not None else None
        delay = parse_duration(args.delay, "--delay")
        return run_with_restarts(command, args.max_restarts, exclude_failed_node=args.exclude_failed_node,
                                 timeout=timeout, delay=delay)
    except HpcCkptError as e:
        print(f"hpcckpt run: error: {e}", file=sys.stderr)
        return 2


def cmd_scavenge(args):
    """`hpcckpt scavenge` (collective): copy the newest cache checkpoint to pfs."""
    overrides = {key: value for key, value in (("name", args.name), ("cache_dir", args.cache_dir),
                                                ("pfs_dir", args.pfs_dir)) if value is not None}
    if args.ranks_per_node is not None:
        rpn = args.ranks_per_node.strip()
        if rpn != "auto" and not rpn.isdigit():
            print(f"hpcckpt scavenge: error: --ranks-per-node must be 'auto' or an integer, got {rpn!r}",
                  file=sys.stderr)
            return 2
        overrides["ranks_per_node"] = rpn if rpn == "auto" else int(rpn)
    from mpi4py import MPI

    from .checkpointer import Checkpointer
    comm = MPI.COMM_WORLD
    try:
        with Checkpointer(comm, config=args.config, **overrides) as ckpt:
            if not hasattr(ckpt, "scavenge"):
                raise HpcCkptError("scavenge is not available in this version of hpcckpt")
            step = ckpt.scavenge()
            pfs_dir = ckpt.config.pfs_dir
    except HpcCkptError as e:      # raised on every rank (collective errors): report once
        if comm.rank == 0:
            print(f"hpcckpt scavenge: error: {e}", file=sys.stderr)
        return 2
    if comm.rank == 0:
        if step is None:
            print(f"hpcckpt scavenge: nothing to copy (no restorable cache checkpoint newer than {pfs_dir})")
        else:
            print(f"hpcckpt scavenge: copied step {step} to {pfs_dir}")
    return 0

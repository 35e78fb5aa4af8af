"""The ``hpcckpt`` command: list, verify and inspect checkpoints, run the demo, and more."""
import argparse
import collections
import datetime
import sys

from . import __version__, catalog
from .errors import HpcCkptError


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def cmd_list(args):
    found = [f for f in catalog.find(args.dir) if f.kind == "rank"]
    pending = catalog.uncommitted_steps(args.dir)
    if not found and not pending:
        print(f"no checkpoints under {args.dir}")
        return 0
    by_step = collections.defaultdict(list)
    for f in found:
        by_step[f.step].append(f)
    print(f"{'step':>10}  {'level':<8} {'job':<16} {'ranks':>9}  {'bytes':>10}  {'written':<19}  state")
    for step in sorted(set(by_step) | set(pending)):
        items = by_step.get(step, [])
        good = [f for f in items if f.manifest and not f.error]
        bad = [f for f in items if f.error]
        if good:
            m0 = good[0].manifest
            ranks = {f.rank for f in good}
            ids = {f.manifest.ckpt_id for f in good}
            nbytes = sum(f.manifest.data_size for f in good)
            when = datetime.datetime.fromtimestamp(m0.created).strftime("%Y-%m-%d %H:%M:%S")
            if len(ids) > 1:
                state = "MIXED (pieces of different runs)"
            elif len(ranks) == m0.world_size:
                state = "committed"
            else:
                state = f"committed on {len(ranks)} of {m0.world_size} ranks here"
            if bad:
                state += f"; {len(bad)} unreadable manifest(s)"
            if step in pending:
                state += f"; uncommitted data of rank(s) {sorted(pending[step])[:8]}"
            print(f"{step:>10}  {m0.level:<8} {m0.name:<16} {len(ranks):>4}/{m0.world_size:<4}  "
                  f"{_size(nbytes):>10}  {when:<19}  {state}")
        else:
            state = "uncommitted (no manifest)" if not bad else f"{len(bad)} unreadable manifest(s)"
            print(f"{step:>10}  {'-':<8} {'-':<16} {'-':>9}  {'-':>10}  {'-':<19}  {state}")
    return 0


def cmd_verify(args):
    found = [f for f in catalog.find(args.dir) if args.step is None or f.step == args.step]
    if not found:
        what = f"step {args.step}" if args.step is not None else "checkpoints"
        print(f"hpcckpt verify: no {what} under {args.dir}", file=sys.stderr)
        return 2
    damaged = 0
    for f in found:
        problem = catalog.verify(f)
        if problem:
            damaged += 1
            print(f"DAMAGED {f.label}: {problem}")
        elif args.verbose:
            print(f"ok      {f.label}: {f.data_path}")
    print(f"{len(found) - damaged} of {len(found)} files intact" + (f", {damaged} DAMAGED" if damaged else ""))
    return 1 if damaged else 0


def cmd_inspect(args):
    found = [f for f in catalog.find(args.dir) if f.step == args.step and f.kind == "rank"]
    if not found:
        print(f"hpcckpt inspect: no step {args.step} under {args.dir}", file=sys.stderr)
        return 2
    good = [f for f in found if not f.error]
    for f in found:
        if f.error:
            print(f"rank {f.rank}: unreadable manifest: {f.error}")
    if not good:
        return 1
    m0 = good[0].manifest
    print(f"job {m0.name!r}, step {m0.step}, level {m0.level}, written by {m0.world_size} ranks; "
          f"{len(good)} rank manifest(s) here")
    print(f"{'rank':>5} {'node':>5}  {'array':<20} {'dtype':<6} {'shape':<20} {'bytes':>10}  global layout")
    for f in good:
        for a in f.manifest.arrays:
            layout = f"{tuple(a.global_shape)} at {tuple(a.global_offset)}" if a.global_shape is not None else "-"
            print(f"{f.rank:>5} {f.manifest.node:>5}  {a.name:<20} {a.dtype:<6} {str(tuple(a.shape)):<20} "
                  f"{a.nbytes:>10}  {layout}")
    return 0


def cmd_demo(args):
    from . import demo
    return demo.run_demo(args)


def build_parser():
    parser = argparse.ArgumentParser(prog="hpcckpt", description="Multilevel checkpointing for MPI + NumPy applications.")
    parser.add_argument("--version", action="version", version=f"hpcckpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="list the checkpoints under a directory")
    p.add_argument("dir", help="a cache directory (or any directory above checkpoints)")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("verify", help="re-check every checksum; exit 1 naming any damaged file")
    p.add_argument("dir")
    p.add_argument("--step", type=int, default=None, help="only this step")
    p.add_argument("-v", "--verbose", action="store_true", help="also list intact files")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("inspect", help="arrays, shapes, dtypes and ranks of one step")
    p.add_argument("dir")
    p.add_argument("step", type=int)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("demo", help="run the 2-D heat equation demo: crash, restart, compare bit for bit")
    from .demo import add_arguments
    add_arguments(p)
    p.set_defaults(func=cmd_demo)

    from . import cli_interval, cli_slurm
    cli_interval.add_subcommands(sub)
    cli_slurm.add_subcommands(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except HpcCkptError as e:
        print(f"hpcckpt {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The ``hpcckpt`` command: list, verify and inspect checkpoints, run the demo, and more."""
import argparse
import collections
import datetime
import os
import re
import sys

from . import __version__, catalog, catalog_inspect, catalog_verify, lock
from .errors import HpcCkptError
from .levels.files import rank_ranges as _ranks
from .state import STATE_ENTRY
from .units import format_size as _size


def _when(t):
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _warn_problems(cat, command):
    for p in cat.problems:
        print(f"hpcckpt {command}: {p}", file=sys.stderr)


def _list_rows(cat):
    """(sort key, row text) for every cache step of a catalog and every step a level keeps in its
    own directories (pfs; its row as the level's files say). Rows of the same job, step and place
    (cache, or the level's) from separate trees under the directory end in the tree's path."""
    rows = []                  # (sort key, row text, the tree the checkpoint is in); key: (job, epoch, step, "" or level)
    for cs in catalog.cache_steps(cat):
        bad = [f for f in cs.ranks if f.error]
        if cs.reference:
            m0 = cs.manifest
            ranks = {f.rank for f in cs.reference}
            nbytes = sum(f.manifest.data_size for f in cs.reference)
            if len(ranks) == m0.world_size:
                state = "committed"
            else:
                state = f"committed on {len(ranks)} of {m0.world_size} ranks here"
            if cs.stale:
                state += (f"; MIXED: rank(s) {sorted(f.rank for f in cs.stale)[:8]} of another checkpoint "
                          "in its directories")
            if bad:
                state += f"; {len(bad)} unreadable manifest(s)"
            if cs.pending:
                state += f"; uncommitted data of rank(s) {cs.pending[:8]}"
            text = (f"{cs.step:>10}  {m0.level:<8} {m0.epoch:>5}  {'cache':<5}  {m0.name:<16} "
                    f"{len(ranks):>4}/{m0.world_size:<4}  {_size(nbytes):>10}  {_when(m0.created):<19}  {state}")
            key = (cs.job, m0.epoch, cs.step, "")
        else:
            state = f"{len(bad)} unreadable manifest(s)" if bad else "uncommitted (no manifest)"
            text = (f"{cs.step:>10}  {'-':<8} {'-':>5}  {'cache':<5}  {cs.job:<16} {'-':>9}  {'-':>10}  "
                    f"{'-':<19}  {state}")
            key = (cs.job, 0, cs.step, "")
        found = cs.reference or cs.ranks          # job dirs: <tree>/<node dir>/<job>
        rows.append((key, text, os.path.commonpath([os.path.dirname(os.path.dirname(f.job_dir)) for f in found])
                     if found else None))
    for s in cat.stored:
        r = s.files.row(s)
        tree = os.path.dirname(s.job_dir)          # <level dir>/<job>
        ranks = f"{r.ranks:>4}/{r.world_size:<4}" if r.world_size is not None else f"{'-':>9}"
        text = (f"{s.step:>10}  {s.level:<8} {'-' if r.epoch is None else r.epoch:>5}  {s.level:<5}  {s.job:<16} "
                f"{ranks}  {'-' if r.nbytes is None else _size(r.nbytes):>10}  "
                f"{'-' if r.created is None else _when(r.created):<19}  {r.state}")
        rows.append(((s.job, r.epoch or 0, s.step, s.level), text, tree))
    same = collections.Counter((job, step, where) for (job, _, step, where), _, _ in rows)
    rows = [(key, text + (f"; in {os.path.relpath(tree, cat.root)}" if tree and same[(key[0], key[2], key[3])] > 1
                          else "")) for key, text, tree in rows]
    newest = collections.defaultdict(int)       # a row without a known epoch sorts with its job's newest
    for key, _ in rows:
        newest[key[0]] = max(newest[key[0]], key[1] or 0)
    return sorted(((job, epoch or newest[job], step, where), text) for (job, epoch, step, where), text in rows)


def cmd_list(args):
    cat = catalog.scan(args.dir)
    _warn_problems(cat, "list")
    rows = _list_rows(cat)
    if not rows:
        print(f"no checkpoints under {args.dir}")
        return 0
    print(f"{'step':>10}  {'level':<8} {'epoch':>5}  {'in':<5}  {'job':<16} {'ranks':>9}  {'bytes':>10}  "
          f"{'written':<19}  state")
    for _, text in rows:
        print(text)
    epochs = collections.defaultdict(set)
    for key, _ in rows:
        if key[1]:
            epochs[key[0]].add(key[1])     # (rows of unknown epoch were given their job's newest)
    for job, es in sorted(epochs.items()):
        if len(es) > 1:
            print(f"job {job!r}: checkpoints of epochs {', '.join(map(str, sorted(es)))}; restart() considers only "
                  f"the newest epoch ({max(es)})")
    return 0


def cmd_verify(args):
    cat = catalog.scan(args.dir)
    if args.step is not None:
        cat = cat.only_step(args.step)
    if cat.empty():
        what = f"step {args.step}" if args.step is not None else "checkpoints"
        print(f"hpcckpt verify: no {what} under {args.dir}", file=sys.stderr)
        return 2
    findings, counts = catalog_verify.check(cat, partial=args.partial, verbose=args.verbose)
    for f in findings:
        print(f)
    running = lock.running_jobs([f.job_dir for f in cat.found] + [s.job_dir for s in cat.stored])
    if running:
        print(f"note: a job is running here ({running[0]}{f' and {len(running) - 1} more' if len(running) > 1 else ''}):"
              " steps it is writing or retiring now may show as MISSING or DAMAGED; verify again once it has ended")
    parts = []
    if counts["files"]:
        parts.append(f"cache: {counts['intact']} of {counts['files']} files intact")
    for level in sorted({key[1] for key in counts if isinstance(key, tuple)}):
        parts.append(f"{level}: {counts[('intact', level)]} of {counts[('steps', level)]} steps intact")
    if counts["missing"]:
        parts.append(f"{counts['missing']} rank part(s) MISSING")
    if counts["damaged"]:
        parts.append(f"{counts['damaged']} DAMAGED")
    if not parts:         # only notes: data that never committed, a level's steps being written
        print(f"hpcckpt verify: no committed checkpoint under {args.dir}", file=sys.stderr)
        return 2
    print("; ".join(parts))
    return 1 if counts["damaged"] or counts["missing"] else 0


def _state_rows(docs):
    """{key: (layout, value description, [ranks])} from {rank: state document}."""
    keys = {}
    for rank, doc in sorted(docs.items()):
        for key, enc in doc["items"].items():
            layout = doc["layouts"].get(key, {}).get("kind", "rank")
            row = keys.setdefault(key, [layout, catalog_inspect.describe_value(enc), []])
            row[2].append(rank)
    return keys


def _inspect_cache(cs, step):
    """Print one cache step of one job; return True when damage was seen."""
    damaged = False
    for f in cs.ranks:
        if f.error:
            damaged = True
            print(f"rank {f.rank}: unreadable manifest: {f.error}")
    if not cs.reference:
        return True
    m0 = cs.manifest
    good = cs.reference
    print(f"job {m0.name!r}, step {m0.step}, epoch {m0.epoch}, level {m0.level} (cache), written by "
          f"{m0.world_size} ranks; {len(good)} rank manifest(s) here")
    if cs.stale:
        damaged = True
        print(f"rank(s) {sorted(f.rank for f in cs.stale)}: manifests of another checkpoint in its directories "
              "(not shown)")
    print(f"{'rank':>5} {'node':>5}  {'array':<20} {'dtype':<6} {'layout':<11} {'shape':<20} {'bytes':>10}  "
          "global layout")
    for f in good:
        for a in f.manifest.arrays:
            if a.name == STATE_ENTRY:       # the state dict's document: its keys are listed below
                continue
            layout = f"{tuple(a.global_shape)} at {tuple(a.global_offset)}" if a.global_shape is not None else "-"
            print(f"{f.rank:>5} {f.manifest.node:>5}  {a.name:<20} {a.dtype:<6} {a.layout:<11} "
                  f"{str(tuple(a.shape)):<20} {a.nbytes:>10}  {layout}")
    docs = {}
    for f in good:
        try:
            doc = catalog_inspect.state_document(f)
        except HpcCkptError as e:
            damaged = True
            print(f"rank {f.rank}: state document unreadable: {e}")
            continue
        if doc is not None:
            docs[f.rank] = doc
    if docs:
        everyone = sorted(docs)
        print(f"state dict keys (the state documents of {len(docs)} rank(s)):")
        print(f"  {'key':<20} {'layout':<11} {'value':<24} ranks")
        for key, (layout, value, ranks) in _state_rows(docs).items():
            who = "all" if ranks == everyone and len(everyone) == m0.world_size else _ranks(ranks)
            print(f"  {key:<20} {layout:<11} {value:<24} {who}")
    return damaged


def cmd_inspect(args):
    cat = catalog.scan(args.dir).only_step(args.step)
    _warn_problems(cat, "inspect")
    steps = [cs for cs in catalog.cache_steps(cat) if cs.ranks]
    stored = [shown for s in cat.stored if (shown := s.files.inspect(s)) is not None]
    if not steps and not stored:
        print(f"hpcckpt inspect: no step {args.step} under {args.dir}", file=sys.stderr)
        return 2
    damaged = bool(cat.problems)
    first = True
    for cs in steps:
        if not first:
            print()
        first = False
        damaged |= _inspect_cache(cs, args.step)
    for lines, bad in stored:
        if not first:
            print()
        first = False
        print("\n".join(lines))
        damaged |= bad
    return 1 if damaged else 0


def cmd_demo(args):
    from . import demo
    return demo.run_demo(args)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (exit 2), not a usage block and a line."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


CATALOG_COMMANDS = ("list", "verify", "inspect")
READING_COMMANDS = CATALOG_COMMANDS + ("report",)     # they read whatever is on disk: no traceback


def build_parser():
    parser = _Parser(prog="hpcckpt", description="Multilevel checkpointing for MPI + NumPy applications.")
    parser.add_argument("--version", action="version", version=f"hpcckpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="list the checkpoints (cache and pfs) under a directory")
    p.add_argument("dir", help="a cache or pfs directory, or any directory above them")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("verify", help="re-check every checksum, cache and pfs; exit 1 naming each damaged or "
                                      "missing part")
    p.add_argument("dir", help="a cache or pfs directory, or any directory above them (every node's cache)")
    p.add_argument("--step", type=int, default=None, help="only this step")
    p.add_argument("--partial", action="store_true",
                   help="DIR holds only some ranks (one node's cache): do not require every rank")
    p.add_argument("-v", "--verbose", action="store_true", help="also list intact files")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("inspect", help="arrays, shapes, dtypes, layouts, ranks and state keys of one step")
    p.add_argument("dir", help="a cache or pfs directory, or any directory above them")
    p.add_argument("step", type=int)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("demo", help="run the 2-D heat equation demo: crash, restart, compare bit for bit")
    from .demo import add_arguments
    add_arguments(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("warmup", help="compile every Numba kernel once into the Numba cache (once per "
                                      "installation, on the compute nodes' CPU type)")
    p.set_defaults(func=cmd_warmup)

    from . import cli_interval, cli_slurm, report
    cli_interval.add_subcommands(sub)
    cli_slurm.add_subcommands(sub)
    report.add_subcommands(sub)
    return parser


def cmd_warmup(args):
    from .warmup import cmd_warmup as run
    return run(args)


def _negative_values_joined(argv):
    """``--mtbf -1h`` as ``--mtbf=-1h``: argparse takes a value that starts with ``-`` and a digit
    (but is not a plain number) for an option and says only "expected one argument"; joined, the
    value reaches the check that says what is wrong with it."""
    out = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"-\d", arg):
            out[-1] += "=" + arg
        else:
            out.append(arg)
    return out


def _without_mpi_init(argv):
    """The commands ask the registered levels (their names; list/verify/inspect their files,
    levels/files.py), and the level modules import mpi4py: a command that is a process of its own
    (on a login node) and not an MPI job (cli_slurm.MPI_COMMANDS) imports mpi4py.MPI without
    MPI_Init (which may need a launcher there) nor MPI_Finalize."""
    from .cli_slurm import MPI_COMMANDS
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in MPI_COMMANDS or "mpi4py.MPI" in sys.modules:
        return
    try:
        import mpi4py
    except ImportError:
        return          # the registry says which level module cannot be imported
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False


def main(argv=None):
    """The command. ``argv`` None: this process is the command (the ``hpcckpt`` script,
    ``python -m hpcckpt``), its arguments in sys.argv; it then never initializes MPI, unless it
    is an MPI job (scavenge). Called with ``argv`` from a program, MPI is the program's:
    initialized on first use, as mpi4py does by default."""
    if argv is None:
        _without_mpi_init(sys.argv[1:])
    parser = build_parser()
    args = parser.parse_args(_negative_values_joined(sys.argv[1:] if argv is None else list(argv)))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except HpcCkptError as e:
        print(f"hpcckpt {args.command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if isinstance(e, BrokenPipeError):          # `hpcckpt list DIR | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        where = f"{e.filename}: " if e.filename is not None else ""
        print(f"hpcckpt {args.command}: {where}{catalog.why(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:   # noqa: BLE001 - list/verify/inspect/report read what is on disk: one line, never a traceback
        if args.command not in READING_COMMANDS:
            raise
        print(f"hpcckpt {args.command}: unexpected error ({type(e).__name__}: {e})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

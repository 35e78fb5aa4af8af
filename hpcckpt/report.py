"""`hpcckpt report EVENTS... [--plot out.png]`: what a run's checkpoints and restarts cost (local; no MPI).

Reads event files (hpcckpt/events.py, docs/EVENTS.md) and prints a summary: per level the
checkpoints' count, bytes and seconds the application waited; the restarts and where their data
came from; fallbacks and failures; and the interval of compute observed between the checkpoints
covering each level beside the interval the policy had in force and Daly's interval of the
measured mean cost and the MTBF the run was configured with. ``--plot`` draws the same as a
timeline (hpcckpt/report_plot.py, needs matplotlib: the ``plot`` extra).

``summarize(events)`` is pure and returns what the table and the plot show.
"""
import dataclasses
import statistics
import sys

from .errors import HpcCkptError
from .events import read
from .interval import daly
from .levels.registry import LEVELS
from .units import format_duration, format_size


@dataclasses.dataclass
class LevelCost:
    """The checkpoints of one level: their costs (seconds waited, slowest rank) and background times."""
    level: str
    seconds: list
    bytes: int
    background: list
    interval: float = None       # the policy's period in force at the last checkpoint (s of compute), if any
    observed: list = None        # compute seconds between consecutive checkpoints covering the level
    mtbf: float = None           # the MTBF the run's policy sized this level with, if any
    cost: float = None           # the mean cost used for Daly (each run's first checkpoint left out)

    @property
    def daly(self):
        return daly(max(self.cost, 1e-3), self.mtbf) if self.cost is not None and self.mtbf else None


@dataclasses.dataclass
class Summary:
    events: list
    t0: float
    runs: list                   # run ids in order of their first event
    starts: dict                 # run id: its start event
    levels: dict                 # level: LevelCost, in LEVELS order
    restarts: list
    problems: list               # fallback and failure events


def _covers(a, b):
    """A checkpoint of level ``a`` covers level ``b`` (it survives every failure ``b`` survives)."""
    return LEVELS.index(a) >= LEVELS.index(b)


def summarize(events):
    """Pure: the Summary of ``events`` (any order; sorted by time here)."""
    events = sorted(events, key=lambda e: e["t"])
    runs, starts = [], {}
    for e in events:
        if e["run"] not in runs:
            runs.append(e["run"])
        if e["event"] == "start":
            starts[e["run"]] = e
    ckpts = [e for e in events if e["event"] == "checkpoint"]
    background = {(e["run"], e["step"]): e["seconds"] for e in events if e["event"] == "background"}
    levels = {}
    for lv in LEVELS:
        mine = [e for e in ckpts if e["level"] == lv]
        if not mine:
            continue
        lc = LevelCost(lv, [e["seconds"] for e in mine], sum(e["bytes"] for e in mine),
                       [background[(e["run"], e["step"])] for e in mine if (e["run"], e["step"]) in background])
        in_force = [e["interval"].get(lv) for e in mine if e.get("interval")]
        lc.interval = in_force[-1] if in_force else None
        lc.observed = observed_intervals(ckpts, lv)
        lc.mtbf = level_mtbf(starts, lv)
        lc.cost = _mean_cost(mine)
        levels[lv] = lc
    return Summary(events, events[0]["t"] if events else 0.0, runs, starts, levels,
                   [e for e in events if e["event"] == "restart"],
                   [e for e in events if e["event"] in ("fallback", "failure")])


def _mean_cost(ckpts):
    """Mean seconds of one level's checkpoints, each run's first left out when the run has more
    (it pays one-time costs: the policy does the same)."""
    by_run = {}
    for e in ckpts:
        by_run.setdefault(e["run"], []).append(e["seconds"])
    values = [s for v in by_run.values() for s in (v[1:] if len(v) > 1 else v)]
    return statistics.fmean(values) if values else None


def running_costs(ckpts, level):
    """[(checkpoint event, the mean cost of ``level`` as _mean_cost counts it up to that event)]
    for each checkpoint of ``level`` (in one pass: the Daly line of the plot)."""
    total, count, firsts, runs, out = 0.0, 0, {}, {}, []
    for e in ckpts:
        if e["level"] != level:
            continue
        total, count = total + e["seconds"], count + 1
        firsts.setdefault(e["run"], e["seconds"])
        runs[e["run"]] = runs.get(e["run"], 0) + 1
        left = [firsts[r] for r, n in runs.items() if n > 1]        # each run's first, when it has more
        out.append((e, (total - sum(left)) / (count - len(left))))
    return out


def level_mtbf(starts, level):
    """The MTBF (s) the newest run's policy sized ``level`` with: its own, else the system MTBF."""
    for e in reversed(list(starts.values())):
        m = (e.get("mtbf") or {}).get(level) or e.get("system_mtbf")
        if m:
            return m
    return None


def observed_intervals(ckpts, level, with_times=False):
    """Compute seconds between consecutive checkpoints covering ``level`` within each run: from the
    end of one to the start of the next, less the checkpoints of lower levels in between (what the
    policy counts as compute). ``with_times``: [(t of the later checkpoint, seconds)]."""
    out, last = [], {}
    spent = {}
    for e in ckpts:
        run, wait = e["run"], e.get("call_seconds") or e["seconds"]
        if not _covers(e["level"], level):
            spent[run] = spent.get(run, 0.0) + wait
            continue
        if run in last:
            gap = max(0.0, e["t"] - wait - last[run] - spent.get(run, 0.0))
            out.append((e["t"], gap) if with_times else gap)
        last[run], spent[run] = e["t"], 0.0
    return out


# ---------------------------------------------------------------------- the table
def _s(x):
    return "-" if x is None else f"{x:.3f}"


def _d(x):
    return "-" if x is None else format_duration(x)


def print_table(s, out):
    """Print the summary ``s`` (Summary) as text."""
    jobs = sorted({e["job"] for e in s.events if isinstance(e.get("job"), str)})
    ranks = sorted({e["ranks"] for e in s.events})
    span = s.events[-1]["t"] - s.t0
    print(f"{len(s.events)} events of {len(s.runs)} run(s) of job {', '.join(map(repr, jobs)) or '?'} on "
          f"{', '.join(map(str, ranks))} ranks, {format_duration(span)} from the first to the last", file=out)
    kinds = sorted({e["policy"] for e in s.starts.values()})
    if kinds:
        print(f"policy: {', '.join(kinds)}", file=out)
    print(file=out)
    if s.levels:
        print(f"{'checkpoints':<12} {'count':>5} {'bytes':>11} {'median s':>9} {'max s':>9} {'total s':>9}  "
              f"{'background median s':>19}", file=out)
        for lc in s.levels.values():
            print(f"  {lc.level:<10} {len(lc.seconds):>5} {format_size(lc.bytes):>11} "
                  f"{_s(statistics.median(lc.seconds)):>9} {_s(max(lc.seconds)):>9} {_s(sum(lc.seconds)):>9}  "
                  f"{_s(statistics.median(lc.background)) if lc.background else '-':>19}", file=out)
        every = [x for lc in s.levels.values() for x in lc.seconds]
        print(f"  {'all':<10} {len(every):>5} {format_size(sum(lc.bytes for lc in s.levels.values())):>11} "
              f"{_s(statistics.median(every)):>9} {_s(max(every)):>9} {_s(sum(every)):>9}", file=out)
    else:
        print("checkpoints: none", file=out)
    print(file=out)
    if s.restarts:
        print(f"{'restarts':<12} {'step':>8}  {'level':<8} {'source':<8} {'own cache':>9} {'rebuilt':>7} "
              f"{'seconds':>8}  at", file=out)
        for e in s.restarts:
            print(f"  {'':<10} {e['step']:>8}  {str(e.get('level') or '-'):<8} {e['source']:<8} {e['own']:>9} "
                  f"{e['rebuilt']:>7} {_s(e['seconds']):>8}  +{format_duration(e['t'] - s.t0)}", file=out)
    else:
        print("restarts: none", file=out)
    if s.problems:
        print(f"fallbacks and failures ({len(s.problems)}):", file=out)
        for e in s.problems:
            at = f"+{format_duration(e['t'] - s.t0)}"
            if e["event"] == "fallback":
                print(f"  {at:>10}  fallback: step {e['step']} not restored from {e['source']}: {e['reason']}",
                      file=out)
            else:
                step = f" {e['step']}" if e.get("step") is not None else ""
                print(f"  {at:>10}  failure: {e['op']}{step} raised {e['error']}: {e['message']}", file=out)
    else:
        print("fallbacks and failures: none", file=out)
    if s.levels:
        print(file=out)
        print(f"{'interval':<12} {'observed median':>15} {'in force':>10} {'Daly':>10}   "
              "(Daly: of the mean cost and the MTBF)", file=out)
        for lc in s.levels.values():
            obs = statistics.median(lc.observed) if lc.observed else None
            basis = (f"cost {_s(lc.cost)} s, MTBF {_d(lc.mtbf)}" if lc.mtbf else "no MTBF configured")
            print(f"  {lc.level:<10} {_d(obs):>15} {_d(lc.interval):>10} {_d(lc.daly):>10}   ({basis})", file=out)
        if not any(lc.mtbf for lc in s.levels.values()):
            print("  (set mtbf or level_mtbf for Daly's interval: docs/INTERVAL.md)", file=out)


def cmd_report(args, out=None):
    """`hpcckpt report`: the table, and the plot with --plot. Exit 0, or 2 on unusable input."""
    out = out or sys.stdout
    if args.plot:
        from . import report_plot
        if not report_plot.available():
            print("hpcckpt report: --plot needs matplotlib: pip install hpcckpt[plot] (or pip install matplotlib)",
                  file=sys.stderr)
            return 2
    events = read(args.events, warn=lambda text: print(f"hpcckpt report: warning: {text}", file=sys.stderr))
    if not events:
        raise HpcCkptError(f"no events in {', '.join(args.events)}")
    s = summarize(events)
    print_table(s, out)
    if args.plot:
        report_plot.plot(s, args.plot)
        print(f"\nplot written to {args.plot}", file=out)
    return 0


def add_subcommands(subparsers):
    """Register `report` on the main parser's subparsers."""
    p = subparsers.add_parser(
        "report", help="summarise event files (events_file): checkpoint costs per level, restarts, intervals",
        description="Summarise the event files a job wrote (config key events_file, docs/EVENTS.md): per level "
                    "the checkpoints' count, bytes and seconds the application waited; restarts and where their "
                    "data came from; fallbacks and failures; the interval observed, in force, and Daly's.")
    p.add_argument("events", nargs="+", metavar="EVENTS", help="an events file (JSON lines); several are merged")
    p.add_argument("--plot", metavar="FILE.png", help="also draw a timeline to this PNG (needs matplotlib)")
    p.set_defaults(func=cmd_report)
    return p

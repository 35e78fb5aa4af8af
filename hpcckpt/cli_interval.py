"""The `hpcckpt interval` and `hpcckpt simulate` subcommands (local; no MPI).

add_subcommands(subparsers) registers them on the main parser's subparsers; each sets
``func(args) -> exit status``. Bad input prints one line on stderr and returns 2.
"""
import math
import sys

import numpy as np

from .errors import HpcCkptError
from .interval import LEVELS, daly, multilevel_plan, waste, young
from .units import format_duration, parse_duration


def _parse_level(text):
    """'name:cost[:mtbf]' -> (name, cost seconds, mtbf seconds or None). Durations without ':'."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0] not in LEVELS:
        raise HpcCkptError(f"--level {text!r}: expected LEVEL:COST[:MTBF] with LEVEL one of "
                           f"{', '.join(LEVELS)}, e.g. local:2s:1h (durations like 2s, 10min, 1d)")
    cost = parse_duration(parts[1], f"--level {parts[0]} cost")
    if cost <= 0:
        raise HpcCkptError(f"--level {text!r}: the cost must be > 0")
    mtbf = None
    if len(parts) == 3:
        mtbf = parse_duration(parts[2], f"--level {parts[0]} MTBF")
        if mtbf <= 0:
            raise HpcCkptError(f"--level {text!r}: the MTBF must be > 0")
    return parts[0], cost, mtbf


def _levels(args):
    """(costs, mtbfs) from --level or from --cost/--mtbf (then a single level: the most resilient)."""
    if args.level:
        if args.cost is not None or args.mtbf is not None:
            raise HpcCkptError("give either --cost/--mtbf or --level, not both")
        costs, mtbfs = {}, {}
        for text in args.level:
            name, cost, mtbf = _parse_level(text)
            if name in costs:
                raise HpcCkptError(f"--level {name} given twice")
            costs[name] = cost
            if mtbf is not None:
                mtbfs[name] = mtbf
        if not mtbfs:
            raise HpcCkptError("--level: give an MTBF for at least one level (LEVEL:COST:MTBF)")
        costs = {lv: costs[lv] for lv in LEVELS if lv in costs}
        return costs, mtbfs
    if args.cost is None or args.mtbf is None:
        raise HpcCkptError("give --cost and --mtbf (e.g. --cost 5min --mtbf 24h), or --level LEVEL:COST:MTBF")
    cost = parse_duration(args.cost, "--cost")
    mtbf = parse_duration(args.mtbf, "--mtbf")
    if cost <= 0 or mtbf <= 0:
        raise HpcCkptError("--cost and --mtbf must be > 0")
    return {LEVELS[-1]: cost}, {LEVELS[-1]: mtbf}


def _fmt(seconds):
    return "never" if math.isinf(seconds) else format_duration(seconds)


def cmd_interval(args, out=None):
    """Print Young's and Daly's intervals, or the multilevel periods."""
    out = out or sys.stdout
    try:
        costs, mtbfs = _levels(args)
        if len(costs) == 1:
            (lv, c), = costs.items()
            m = mtbfs[lv]
            t_young, t_daly = young(c, m), daly(c, m)
            print(f"checkpoint cost {format_duration(c)}, MTBF {format_duration(m)} (the waste takes the restart "
                  "cost equal to the checkpoint cost)", file=out)
            print(f"Young (1974), sqrt(2CM):       {format_duration(t_young)}"
                  f"  (first-order waste {100 * waste(t_young, c, m, c):.2f} %)", file=out)
            print(f"Daly (2006, FGCS eq. 37):      {format_duration(t_daly)}"
                  f"  (first-order waste {100 * waste(t_daly, c, m, c):.2f} %)", file=out)
            _note_first_order(waste(t_daly, c, m, c), out)
            return 0
        rates = {lv: 1.0 / m for lv, m in mtbfs.items()}
        plan = multilevel_plan(costs, rates, inclusive=args.inclusive)
        names = list(costs)
        print(f"{'level':8} {'cost':>10} {'MTBF':>10} {'period':>11} {'Young alone':>12}  nesting", file=out)
        for i, lv in enumerate(names):
            m = mtbfs.get(lv)
            alone = young(costs[lv], m) if m else math.inf
            nest = ""
            if i > 0 and not math.isinf(plan.periods[lv]):
                nest = f"every {plan.ratios[names[i - 1]]} {names[i - 1]}"
            print(f"{lv:8} {format_duration(costs[lv]):>10} {_fmt(m or math.inf):>10} "
                  f"{_fmt(plan.periods[lv]):>11} {_fmt(alone):>12}  {nest}", file=out)
        print(f"pattern {_fmt(plan.pattern)} of compute; first-order waste {100 * plan.waste:.2f} % "
              f"(Benoit et al. 2017, {'inclusive' if args.inclusive else 'non-inclusive'} costs)", file=out)
        _note_first_order(plan.waste, out)
        return 0
    except HpcCkptError as exc:
        print(f"hpcckpt interval: error: {exc}", file=sys.stderr)
        return 2


def _note_first_order(fraction, out):
    """A line when the first-order model is far outside where it holds (costs not small against
    the MTBF): its waste then means nothing, and the job may make no progress at all."""
    if fraction >= 0.5:
        print("note: the checkpoint costs are not small against the MTBF, where the first-order model holds: "
              "the waste above is meaningless (the job may make no progress); `hpcckpt simulate` measures it",
              file=out)


def _simulate_table(args):
    from .simulate import formula_periods, sweep     # numba compile on first use
    costs, mtbfs = _levels(args)
    work = parse_duration(args.work, "--work")
    if work <= 0:
        raise HpcCkptError("--work must be > 0")
    restart = None
    if args.restart is not None:
        r = parse_duration(args.restart, "--restart")
        restart = {lv: r for lv in costs}
    downtime = parse_duration(args.downtime, "--downtime")
    if args.points < 2 or args.trials < 2:
        raise HpcCkptError("--points and --trials must be >= 2")
    if not (0 < args.min_factor < args.max_factor):
        raise HpcCkptError("need 0 < --min-factor < --max-factor")
    failures = {f"fails-{lv}": (m, lv) for lv, m in mtbfs.items()}
    top = list(costs)[-1]
    single = {top: costs[top]}
    total_mtbf = 1.0 / sum(1.0 / m for m in mtbfs.values())
    t_young, t_daly = young(costs[top], total_mtbf), daly(costs[top], total_mtbf)
    intervals = {float(t_daly * f): "" for f in np.geomspace(args.min_factor, args.max_factor, args.points)}
    for name, t in (("young", t_young), ("daly", t_daly)):
        same = [x for x in intervals if abs(x - t) <= 1e-9 * t]
        key = same[0] if same else t
        intervals[key] = (intervals.get(key, "") + " " + name).strip()
    rows = [(note, {top: t}) for t, note in sorted(intervals.items())]
    kw = dict(trials=args.trials, seed=args.seed, restarts=restart, downtime=downtime,
              distribution=args.distribution, shape=args.shape)
    results = list(zip(rows, sweep(work, [p for _, p in rows], single, failures, **kw)))
    if len(costs) > 1:
        ml = ("multilevel", formula_periods("multilevel", costs, failures, restarts=restart))
        results.append((ml, sweep(work, [ml[1]], costs, failures, **kw)[0]))
    return results, top, t_young, t_daly


def cmd_simulate(args, out=None):
    """Print an efficiency table of swept intervals (and the formulas' choices); optional plot."""
    out = out or sys.stdout
    try:
        if args.plot:
            try:
                import matplotlib
                matplotlib.use("Agg")
                import matplotlib.pyplot as plt
            except ImportError:
                print("hpcckpt simulate: error: --plot needs matplotlib "
                      "(pip install matplotlib, or the 'plot' extra: pip install hpcckpt[plot])", file=sys.stderr)
                return 2
        results, top, t_young, t_daly = _simulate_table(args)
    except HpcCkptError as exc:
        print(f"hpcckpt simulate: error: {exc}", file=sys.stderr)
        return 2
    swept = [(r, s) for r, s in results if r[0] != "multilevel"]
    best = max(swept, key=lambda rs: rs[1].efficiency)
    print(f"single level {top!r} (survives every failure) swept around Daly's interval; "
          f"{args.trials} trials, seed {args.seed}", file=out)
    print(f"{'interval':>28} {'efficiency':>16} {'checkpoint':>11} {'lost':>7} {'restart':>8}  note", file=out)
    ordered = swept + [rs for rs in results if rs[0][0] == "multilevel"]
    for (note, periods), s in ordered:
        label = ", ".join(f"{lv} {_fmt(p)}" for lv, p in periods.items())
        notes = [note] if note else []
        if (note, periods) == best[0]:
            notes.append("best")
        print(f"{label:>28} {100 * s.efficiency:9.2f} ± {100 * s.efficiency_sem:4.2f} % "
              f"{100 * s.checkpoint:10.2f}% {100 * s.lost:6.2f}% {100 * s.restart:7.2f}%  {' '.join(notes)}",
              file=out)
    if args.plot:
        xs = [rs[0][1][top] for rs in swept]
        ys = [100 * rs[1].waste for rs in swept]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot(np.array(xs) / 60, ys, "o-", label=f"{top} only (simulated)")
        ax.axvline(t_young / 60, color="tab:green", ls="--", label=f"Young {_fmt(t_young)}")
        ax.axvline(t_daly / 60, color="tab:red", ls=":", label=f"Daly {_fmt(t_daly)}")
        for (note, _), s in results:
            if note == "multilevel":
                ax.axhline(100 * s.waste, color="tab:purple", ls="-.", label="multilevel (Benoit et al.)")
        ax.set_xscale("log")
        ax.set_xlabel(f"checkpoint interval of {top} (min of compute)")
        ax.set_ylabel("waste (% of wall time)")
        ax.legend()
        fig.tight_layout()
        try:
            fig.savefig(args.plot, dpi=100)
        except OSError as exc:
            print(f"hpcckpt simulate: error: cannot write {args.plot}: {exc}", file=sys.stderr)
            return 2
        finally:
            plt.close(fig)
        print(f"plot written to {args.plot}", file=out)
    return 0


def add_subcommands(subparsers):
    """Register `interval` and `simulate` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "interval", help="checkpoint interval from cost and MTBF (Young, Daly, multilevel)",
        description="Young's and Daly's optimum checkpoint interval for one level (--cost, --mtbf), "
                    "or nested multilevel periods (--level LEVEL:COST:MTBF, repeated; MTBF of the "
                    "failures that level is the cheapest to survive). Durations: 90, 2s, 5min, 24h, 1d, 1w.")
    p.add_argument("--cost", help="time to write one checkpoint, e.g. 5min")
    p.add_argument("--mtbf", help="mean time between failures, e.g. 24h")
    p.add_argument("--level", action="append", metavar="LEVEL:COST[:MTBF]",
                   help=f"one level ({', '.join(LEVELS)}), e.g. local:2s:1h; repeat for each level")
    p.add_argument("--inclusive", action="store_true",
                   help="a higher-level checkpoint also pays for all lower levels (Benoit et al.'s model)")
    p.set_defaults(func=cmd_interval)

    s = subparsers.add_parser(
        "simulate", help="simulate failures and compare checkpoint intervals",
        description="Discrete-event simulation: sweeps the interval of the most resilient level around "
                    "Daly's, marks Young's, Daly's and (with several --level) the multilevel periods.")
    s.add_argument("--cost", help="checkpoint cost of the single level, e.g. 5min")
    s.add_argument("--mtbf", help="MTBF, e.g. 24h")
    s.add_argument("--level", action="append", metavar="LEVEL:COST[:MTBF]",
                   help="a level and the MTBF of the failures it is the cheapest to survive; repeat")
    s.add_argument("--work", default="30d", help="compute time the job needs (default 30d)")
    s.add_argument("--restart", help="restart cost of every level (default: its checkpoint cost)")
    s.add_argument("--downtime", default="0", help="time lost per failure before the restart (default 0)")
    s.add_argument("--trials", type=int, default=50, help="runs per interval (default 50)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    s.add_argument("--points", type=int, default=13, help="intervals swept (default 13)")
    s.add_argument("--min-factor", type=float, default=0.25, help="smallest interval / Daly's (default 0.25)")
    s.add_argument("--max-factor", type=float, default=4.0, help="largest interval / Daly's (default 4)")
    s.add_argument("--distribution", choices=("exponential", "weibull"), default="exponential")
    s.add_argument("--shape", type=float, default=0.7, help="Weibull shape (default 0.7)")
    s.add_argument("--plot", metavar="FILE.png", help="write a PNG of waste against interval (needs matplotlib)")
    s.set_defaults(func=cmd_simulate)
    return p, s


def main(argv=None):
    """Stand-alone entry point: python -m hpcckpt.cli_interval {interval,simulate} ..."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m hpcckpt.cli_interval")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

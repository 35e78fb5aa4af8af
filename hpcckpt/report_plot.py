"""The timeline of `hpcckpt report --plot` (local; needs matplotlib, the ``plot`` extra).

Top panel: the seconds the application waited per checkpoint against wall time since the first
event, one colour and marker per level (hollow: the background work that followed it), restarts
as vertical lines labelled with their step and source, failures as red crosses. Bottom panel,
per level: the compute observed between checkpoints covering it (markers), the interval the
policy had in force (a solid step line) and Daly's interval of the mean cost measured so far and
the MTBF (dashed).
"""
import statistics

from .interval import daly
from .levels.registry import LEVELS
from .report import observed_intervals, running_costs

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan",
          "tab:gray")           # no red: restarts and failures are red
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h")


def style(level):
    """(colour, marker) of ``level``, by its place in LEVELS (cheapest first)."""
    i = LEVELS.index(level)
    return COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)]


def available():
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _time_unit(span):
    for unit, scale in (("s", 1.0), ("min", 60.0), ("h", 3600.0)):
        if span <= 300 * scale:
            return unit, scale
    return "d", 86400.0


def plot(s, path):
    """Draw the Summary ``s`` (hpcckpt.report) to the PNG ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit, scale = _time_unit(max(s.events[-1]["t"] - s.t0, 1e-9))

    def x(t):
        return (t - s.t0) / scale

    ckpts = [e for e in s.events if e["event"] == "checkpoint"]
    bg = {(e["run"], e["step"]): e["seconds"] for e in s.events if e["event"] == "background"}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for lv in s.levels:
        color, marker = style(lv)
        mine = [e for e in ckpts if e["level"] == lv]
        top.plot([x(e["t"]) for e in mine], [e["seconds"] for e in mine], marker, color=color, ms=6, ls="none",
                 label=f"{lv} ({len(mine)}, median {statistics.median(e['seconds'] for e in mine):.3g} s)")
        later = [(x(e["t"]), bg[(e["run"], e["step"])]) for e in mine if (e["run"], e["step"]) in bg]
        if later:
            top.plot(*zip(*later), marker, color=color, mfc="none", ms=8, ls="none", label=f"{lv} background")
    for i, e in enumerate(s.restarts):
        top.axvline(x(e["t"]), color="tab:red", lw=1.2, ls="--", label="restart" if i == 0 else None)
        top.annotate(f"restart {e['step']} ({e['source']}, {e['seconds']:.2g} s)", (x(e["t"]), 1.0),
                     xycoords=("data", "axes fraction"), rotation=90, ha="right", va="top", fontsize=8,
                     color="tab:red", xytext=(-2, -4), textcoords="offset points")
    fails = [e for e in s.problems if e["event"] == "failure"]
    if fails:
        top.plot([x(e["t"]) for e in fails], [e.get("seconds") or 0.0 for e in fails], "x", color="red", ms=10,
                 mew=2, ls="none", label="failure")
    top.set_ylabel("seconds per checkpoint\n(application waited)")
    if ckpts:
        values = [e["seconds"] for e in ckpts] + [v for v in bg.values() if v > 0]
        if max(values) > 20 * max(min(v for v in values if v > 0), 1e-6):
            top.set_yscale("log")
    else:
        top.text(0.5, 0.5, "no checkpoints", transform=top.transAxes, ha="center")
    top.grid(alpha=0.3)
    if top.get_legend_handles_labels()[0]:
        top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    top.set_title(_title(s), fontsize=10)

    drawn = False
    for lv, lc in s.levels.items():
        color, marker = style(lv)
        pts = observed_intervals(ckpts, lv, with_times=True)
        if pts:
            bottom.plot([x(t) for t, _ in pts], [v for _, v in pts], marker, color=color, ms=5, ls="none",
                        label=f"{lv} observed")
            drawn = True
        forced = [(x(e["t"]), e["interval"].get(lv)) for e in ckpts if e.get("interval") and
                  e["interval"].get(lv) is not None]
        if forced:
            bottom.step(*zip(*forced), where="post", color=color, lw=1.5, label=f"{lv} in force")
            drawn = True
        if lc.mtbf:
            line = [(x(e["t"]), daly(max(cost, 1e-3), lc.mtbf)) for e, cost in running_costs(ckpts, lv)]
            bottom.plot(*zip(*line), color=color, lw=1.2, ls="--", label=f"{lv} Daly (mean cost so far)")
            drawn = True
    if drawn:
        bottom.set_yscale("log")
        bottom.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        bottom.text(0.5, 0.5, "no interval to show (fewer than two checkpoints per run)", transform=bottom.transAxes,
                    ha="center", va="center")
    if s.levels and not any(lc.mtbf for lc in s.levels.values()):
        bottom.text(0.99, 0.03, "no MTBF configured: no Daly interval", transform=bottom.transAxes, ha="right",
                    fontsize=8, color="gray")
    bottom.set_ylabel("interval (s of compute)")
    bottom.set_xlabel(f"wall time since the first event ({unit})")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def _title(s):
    jobs = sorted({e["job"] for e in s.events if isinstance(e.get("job"), str)})
    ranks = sorted({e["ranks"] for e in s.events})
    return (f"job {', '.join(jobs) or '?'}: {len(s.runs)} run(s) on {', '.join(map(str, ranks))} ranks, "
            f"{sum(len(lc.seconds) for lc in s.levels.values())} checkpoints, {len(s.restarts)} restart(s)")

"""How checkpoint cost grows with the rank count and with the size per rank, per level, from
the grid that bench_levels.py measured (benchmarks/results/levels.json; run that first).

    python benchmarks/bench_scaling.py [--levels FILE] [--out FILE]

Per level and rank count: a least-squares fit seconds = fixed + per_mib x MiB-per-rank over the
sizes measured (fixed: the per-checkpoint latency; 1/per_mib: the per-rank streaming bandwidth),
and per size: aggregate bandwidth at each rank count relative to the smallest rank count
(1.0 = the aggregate does not grow with ranks: this 2-core host is saturated; the limits
measured in the same jobs are scaled the same way for comparison).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULTS, parser, say, write_json  # noqa: E402


def fit(points):
    """Least squares y = a + b x; (a, b), or (None, None) with fewer than 2 distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None, None
    n = len(points)
    mx, my = sum(xs) / n, sum(y for _, y in points) / n
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main(argv=None):
    p = parser(__doc__, "(no effect: this script only reads levels.json)", hidden=())
    p.add_argument("--levels", default=os.path.join(RESULTS, "levels.json"), help="bench_levels.py's JSON")
    a = p.parse_args(argv)
    with open(a.levels) as f:
        lv = json.load(f)
    rows = lv["rows"]
    levels = lv["levels"]
    say(f"scaling: from {a.levels} ({len(rows)} grid points)")
    by_size = {}
    for level in levels:
        for ranks in sorted({r["ranks"] for r in rows}):
            pts = [(r["mib_per_rank"], r["levels"][level]["seconds"]["checkpoint"]) for r in rows if r["ranks"] == ranks]
            fixed, per_mib = fit(pts)
            by_size.setdefault(level, {})[str(ranks)] = {
                "points": pts, "fixed_seconds": fixed, "seconds_per_mib": per_mib,
                "per_rank_mib_s": (1 / per_mib if per_mib and per_mib > 0 else None)}
            if fixed is not None:
                say(f"  {level:8s} {ranks} ranks: {fixed:+.3f} s + {per_mib * 1000:.2f} ms/MiB per rank")
    by_ranks = {}
    for size in sorted({r["mib_per_rank"] for r in rows}):
        pts = sorted((r for r in rows if r["mib_per_rank"] == size), key=lambda r: r["ranks"])
        if len(pts) < 2:
            continue
        base = pts[0]
        entry = {}
        for level in levels + ["limits"]:
            def bw(r, level=level):
                if level == "limits":
                    return r["limits"]["mib_s"]
                return {"checkpoint": r["levels"][level]["mib_s"]["checkpoint"],
                        "restart": r["levels"][level]["mib_s"]["restart"]}
            entry[level] = {str(r["ranks"]): {k: v / bw(base)[k] for k, v in bw(r).items() if k in bw(base)}
                            for r in pts}
            if level != "limits":
                say(f"  {size} MiB/rank {level:8s} aggregate vs {base['ranks']} ranks: " +
                    ", ".join(f"{r['ranks']} ranks {entry[level][str(r['ranks'])]['checkpoint']:.2f}x" for r in pts))
        by_ranks[str(size)] = {"base_ranks": base["ranks"], "relative_aggregate_mib_s": entry}
    path = write_json("scaling", {"source": os.path.relpath(a.levels), "levels_date": lv["machine"]["date"],
                                  "by_size": by_size, "by_ranks": by_ranks}, a.out)
    say(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()

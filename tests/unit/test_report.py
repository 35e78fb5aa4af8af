"""benchmarks/report.py: the verdicts of the targets table (no MPI, no benchmark run)."""
import json

import pytest

from benchmarks import report
from benchmarks.common import FTI_MIB_S


def _row(size, mib_s, new_files=None, levels=("local", "partner", "xor", "rs", "pfs")):
    """A 4-rank row of levels.json with the same checkpoint bandwidth at every level."""
    def level():
        e = {"mib_s": {"checkpoint": mib_s, "restart": mib_s}, "limit": "tmpfs_overwrite",
             "checkpoint_fraction_of_limit": 0.5}
        if new_files is not None:
            e["new_files"] = {"mib_s": {"checkpoint": new_files}}
        return e
    return {"ranks": 4, "mib_per_rank": size, "levels": {lv: level() for lv in levels},
            "limits": {"mib_s": {"memcpy": 1.0, "tmpfs_new": 1.0, "tmpfs_overwrite": 1.0, "disk_fsync": 1.0,
                                 "mpi_ring": 1.0}}}


def test_mark():
    assert report.mark(True) == "**met**"
    assert report.mark(False) == "**not met**"
    assert report.mark(False, comparable=False) == "**not comparable**"
    assert report.mark(True, comparable=False) == "**not comparable**"


def test_a_size_without_an_fti_figure_is_not_comparable_never_not_met():
    rows = {16: _row(16, 1.0, new_files=1.0)}          # far below 2x FTI, but at another size
    for level in report.LEVELS:
        line = report.fti_target(rows, level, same_work_new_files=(level == "pfs"))
        assert "**not comparable**" in line and "not met" not in line, line
        assert "16 MiB" in line


def test_nothing_measured_is_not_measured():
    assert "not measured" in report.fti_target({}, "local")


def test_ratios_are_recomputed_from_the_anchors_not_read_from_the_json():
    rows = {64: _row(64, 3 * FTI_MIB_S["local"][64]), 256: _row(256, 3 * FTI_MIB_S["local"][256])}
    for e in rows[64]["levels"].values():
        e["x_fti"] = 99.0                                  # a stale ratio in the JSON is ignored
    assert report.fti_ratios(rows, "local") == [(64, pytest.approx(3.0)), (256, pytest.approx(3.0))]
    assert report.fti_ratios(rows, "local", new_files=True) == []
    line = report.fti_target(rows, "local")
    assert "3.0× / 3.0×" in line and "**met**" in line and "99" not in line


def test_only_the_sizes_with_an_anchor_are_judged():
    rows = {16: _row(16, 1.0), 64: _row(64, 3 * FTI_MIB_S["rs"][64])}
    line = report.fti_target(rows, "rs")
    assert line.endswith("| **met** |") and "at 64 MiB" in line


def test_pfs_is_judged_on_the_new_files_figure():
    fti = FTI_MIB_S["pfs"]
    rows = {s: _row(s, 2.5 * fti[s], new_files=1.5 * fti[s]) for s in (64, 256)}
    line = report.fti_target(rows, "pfs", same_work_new_files=True)
    assert "new files 1.5× / 1.5×" in line and "reuse_files = true: 2.5× / 2.5×" in line
    assert line.endswith("| **not met** |")
    rows = {s: _row(s, 1.5 * fti[s], new_files=2.5 * fti[s]) for s in (64, 256)}
    assert report.fti_target(rows, "pfs", same_work_new_files=True).endswith("| **met** |")
    # the other levels: judged on the default, the new-files verdict beside it
    line = report.fti_target(rows, "local")
    assert "(new files: " in line and "; new files **" in line


def test_pfs_without_a_new_files_pass_is_not_judged():
    fti = FTI_MIB_S["pfs"]
    rows = {s: _row(s, 2.5 * fti[s]) for s in (64, 256)}
    line = report.fti_target(rows, "pfs", same_work_new_files=True)
    assert line.endswith("| – |") and "not measured" in line


def _session(x, x_new, levels=("local", "pfs")):
    """bench_fti.py's JSON: FTI and hpcckpt in one session, 4 ranks x 64 and 256 MiB."""
    rows = [{"ranks": 4, "mib_per_rank": s, "fti_mib_s": {"L1": 100.0, "L4": 100.0},
             "levels": {lv: {"fti_level": "L1" if lv == "local" else "L4", "mib_s": 100.0 * x,
                             "new_files_mib_s": 100.0 * x_new, "x_fti": x, "x_fti_new_files": x_new}
                        for lv in levels}} for s in (64, 256)]
    return {"machine": {"date": "2026-12-05T22:36:10+0000"}, "rounds": 3, "reps": 3, "rows": rows}


def test_a_same_session_measurement_decides_the_fti_targets():
    fti = FTI_MIB_S["pfs"]
    rows = {s: _row(s, 2.5 * fti[s], new_files=2.5 * fti[s]) for s in (64, 256)}   # met against the anchors
    line = report.fti_target(rows, "pfs", same_work_new_files=True, fti=_session(3.0, 1.9))
    assert "one session" in line and "new files 1.90× / 1.90× at 64/256 MiB" in line
    assert "reuse_files = true: 3.00× / 3.00×" in line and "against the anchors above: 2.50× / 2.50×" in line
    assert line.endswith("| **not met** at 64 MiB (1.900×), 256 MiB (1.900×) |")
    assert report.fti_target(rows, "pfs", same_work_new_files=True, fti=_session(1.5, 2.1)).endswith("| **met** |")
    # the default (reuse_files = true) ratio decides the other levels; a level the session did
    # not measure is judged against the anchors
    assert report.fti_target(rows, "local", fti=_session(2.2, 1.1)).endswith(
        "| **met**; new files **not met** at 64 MiB (1.100×), 256 MiB (1.100×) |")
    assert report.fti_target(rows, "local", fti=_session(1.9, 3.0)).endswith(
        "| **not met** at 64 MiB (1.900×), 256 MiB (1.900×); new files **met** |")
    assert "one session" not in report.fti_target(rows, "rs", fti=_session(1.0, 1.0))


def test_the_pfs_target_states_what_the_disk_alone_allows():
    fti = FTI_MIB_S["pfs"]
    rows = {s: _row(s, 2.5 * fti[s], new_files=2.5 * fti[s]) for s in (64, 256)}
    session = _session(3.0, 1.9)
    line = report.fti_target(rows, "pfs", same_work_new_files=True, fti=session)
    assert "disk alone" not in line                     # a session without the limit says nothing of it
    for r, floor_x in zip(session["rows"], (1.95, 2.4)):
        r["levels"]["pfs"].update(disk_new_files_x_fti=floor_x, new_files_of_disk_new_files=1.9 / floor_x)
    line = report.fti_target(rows, "pfs", same_work_new_files=True, fti=session)
    assert "allows 1.95× / 2.40× at 64/256 MiB" in line and "reaches 97% / 79% of it" in line
    assert line.endswith("| **not met** at 64 MiB (1.900×), 256 MiB (1.900×) (the disk allows at most 1.95× there) |")
    for r in session["rows"]:
        r["levels"]["pfs"]["disk_new_files_x_fti"] = 2.4
    assert report.fti_target(rows, "pfs", same_work_new_files=True, fti=session).endswith(
        "| **not met** at 64 MiB (1.900×), 256 MiB (1.900×) |")
    session["rows"][1]["levels"]["pfs"]["x_fti_new_files"] = 2.1       # met at 256 MiB only
    session["rows"][0]["levels"]["pfs"]["x_fti_new_files"] = 1.995     # 2.00 at two decimals, still short
    session["rows"][1]["levels"]["pfs"]["disk_new_files_x_fti"] = 1.9   # the disk's floor where it is met: not quoted
    assert report.fti_target(rows, "pfs", same_work_new_files=True, fti=session).endswith(
        "| **not met** at 64 MiB (1.995×) |")
    assert report.disk_floor(None) == [] and report.disk_floor(_session(3.0, 1.9)) == []


def test_the_table_quotes_the_same_session_figures(tmp_path):
    (tmp_path / "fti.json").write_text(json.dumps(_session(3.0, 1.9)))
    text = report.table(str(tmp_path))
    assert "FTI 1.6 and hpcckpt interleaved in one session" in text and "pfs 300 / new files 190 vs L4 100" in text


def _recovery(tmp_path, ranks, mib):
    lv = {k: {"seconds": {"total": 1.0, "restart": 0.8, "init": 0.2}} for k in ("local", "partner", "xor", "rs", "pfs")}
    (tmp_path / "recovery.json").write_text(json.dumps({"machine": {"date": "2026-12-04T00:00", "cpu": "x", "nproc": 2,
                                                                    "loadavg": [1.0, 1.0, 1.0]},
                                                        "ranks": ranks, "mib_per_rank": mib, "levels": lv}))
    return [ln for ln in report.table(str(tmp_path)).splitlines() if ln.startswith("| recovery after losing a node")][0]


def test_a_recovery_at_another_size_is_not_comparable(tmp_path):
    line = _recovery(tmp_path, 4, 16)          # 16.9x faster than FTI, but at 16 MiB per rank
    assert line.endswith("| **not comparable** |") and "not met" not in line
    assert "measured at 4 ranks × 16 MiB" in line


def test_a_recovery_at_the_anchor_size_is_judged(tmp_path):
    assert _recovery(tmp_path, 4, 256).endswith("| **met** |")


def _incremental(tmp_path, mib, partner, xor):
    med = {lv: {"full": {"seconds": 0.1, "sent_bytes": 64 << 20}, "incremental": {"seconds": 0.1 * r, "sent_bytes": 6 << 20}}
           for lv, r in (("partner", partner), ("xor", xor), ("rs", 0.5))}
    (tmp_path / "incremental.json").write_text(json.dumps({
        "machine": {"date": "2026-12-04T00:00", "cpu": "x", "nproc": 2, "loadavg": [1.0, 1.0, 1.0]},
        "ranks": 4, "mib_per_rank": mib, "frac": 0.1, "medians": med,
        "summary": {lv: {"time_ratio": med[lv]["incremental"]["seconds"] / 0.1} for lv in med},
        "targets": {lv: {"met": med[lv]["incremental"]["seconds"] / 0.1 <= 0.6} for lv in ("partner", "xor")}}))
    return [ln for ln in report.table(str(tmp_path)).splitlines() if ln.startswith("| with `incremental`")][0]


def test_incremental_target(tmp_path):
    assert _incremental(tmp_path, 64, 0.4, 0.5).endswith("| partner **met**; xor **met** |")
    line = _incremental(tmp_path, 64, 0.4, 0.7)
    assert line.endswith("| partner **met**; xor **not met** |") and "xor 70 vs 100 ms = 0.70×" in line
    assert _incremental(tmp_path, 16, 0.4, 0.5).endswith("| partner **not comparable**; xor **not comparable** |")


def test_a_session_with_time_between_checkpoints_is_judged_beside_the_back_to_back_one():
    fti = FTI_MIB_S["pfs"]
    rows = {s: _row(s, 2.5 * fti[s], new_files=2.5 * fti[s]) for s in (64, 256)}
    spaced = dict(_session(4.0, 2.2), gap_s=0.5)
    line = report.fti_target(rows, "pfs", same_work_new_files=True, fti=_session(3.0, 1.9), fti_gap=spaced)
    assert "with 0.5 s between checkpoints (`bench_fti.py --gap 0.5`" in line and line.count("2.20× / 2.20×") == 1
    assert line.endswith("| back to back **not met** at 64 MiB (1.900×), 256 MiB (1.900×); "
                         "with 0.5 s between checkpoints **met** |")
    for r in spaced["rows"]:
        r["levels"]["pfs"].update(disk_new_files_x_fti=2.5, new_files_of_disk_new_files=0.88)
    line = report.fti_target(rows, "pfs", same_work_new_files=True, fti=_session(3.0, 1.9), fti_gap=spaced)
    assert "2.20× / 2.20× at 64/256 MiB, the disk alone 2.50× / 2.50×, `pfs` at 88% / 88% of it" in line
    spaced["rows"][0]["levels"]["pfs"]["x_fti_new_files"] = 1.8
    assert report.fti_target(rows, "pfs", same_work_new_files=True, fti=_session(3.0, 2.1), fti_gap=spaced).endswith(
        "| back to back **met**; with 0.5 s between checkpoints **not met** at 64 MiB (1.800×) |")
    # a JSON without a gap, or without the level, adds nothing
    for other in (_session(4.0, 2.2), dict(_session(4.0, 2.2, levels=("local",)), gap_s=0.5)):
        assert report.fti_target(rows, "pfs", same_work_new_files=True, fti=_session(3.0, 2.1), fti_gap=other).endswith(
            "| **met** |")
    assert "with 0.5 s" not in report.fti_target(rows, "local", fti=_session(3.0, 2.1), fti_gap=spaced)  # same work only
    assert "`bench_fti.py --gap 0.5`: 0.5 s idle after every checkpoint" in report.session_paragraph(spaced)
    assert "--gap" not in report.session_paragraph(_session(4.0, 2.2))

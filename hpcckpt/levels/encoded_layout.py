"""The layout of an encoded group (xor, rs), pure and local: who keeps which symbol of which
stripe, the code's coefficients, the checks of an ``encoded.json`` read back, and which losses a
group can rebuild.

A group has k ranks on k distinct nodes and m parity symbols per stripe (xor: m = 1). Each rank's
data file, zero-padded to the group's largest, is cut into k - m pieces. There are k stripes;
stripe s holds k symbols, one on each rank: the rank at group position (s + p) mod k keeps
symbol p, which is parity p when p < m and data piece p - m of that rank otherwise. So every rank
stores its own data plus m pieces of parity (m / (k - m) of its data), and losing any m ranks of
a group erases at most m symbols per stripe: recoverable (SCR's XOR layout, generalised to a
systematic Cauchy Reed-Solomon code over GF(2^8); with m = 1 the code is plain XOR).
"""
from ..codecs.rs import rs_parity_matrix
from .delta import SEGMENTS_ONLY, segment_sums_ok

FORMAT = "hpcckpt-encoded"


def code_matrix(kd, m):
    """The parity coefficients (m x kd). Row 0 is all ones, so m = 1 is plain XOR."""
    return rs_parity_matrix(kd, m)


def stripe_symbol_owner(group_len, s, p):
    """Group position of the rank keeping symbol p of stripe s."""
    return (s + p) % group_len


def check_info(info, rank, step, ckpt_id, world_size, where):
    """Local: validate an encoded.json read back from disk (CorruptCheckpointError)."""
    from ..errors import CorruptCheckpointError

    def bad(msg):
        return CorruptCheckpointError(f"{where}: {msg}")
    if not isinstance(info, dict) or info.get("format") != FORMAT or info.get("version") != 1:
        raise bad("not an hpcckpt encoded-level file")
    if info.get("step") != step or info.get("ckpt_id") != ckpt_id:
        raise bad("belongs to another checkpoint")
    group = info.get("group")
    if (not isinstance(group, list) or not group or len(group) > 256
            or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world_size for r in group)
            or len(set(group)) != len(group) or rank not in group or info.get("position") != group.index(rank)):
        raise bad("bad group")
    m, piece = info.get("parity"), info.get("piece")
    if not isinstance(m, int) or not 0 <= m < len(group) or not isinstance(piece, int) or piece < 8 or piece % 8:
        raise bad("bad code parameters")
    sizes, manifests, checks = info.get("sizes"), info.get("manifests"), info.get("parity_checksums")
    if (not isinstance(sizes, list) or len(sizes) != len(group)
            or not all(isinstance(x, int) and 0 <= x <= piece * max(1, len(group) - m) for x in sizes)):
        raise bad("bad sizes")
    if not isinstance(manifests, list) or len(manifests) != len(group):
        raise bad("bad member manifests")
    if not isinstance(checks, list) or len(checks) != m or not all(isinstance(c, str) for c in checks):
        raise bad("bad parity checksums")
    if "segment_checksums" in info or any(c == SEGMENTS_ONLY for c in checks):
        seg = info.get("segment")
        if not isinstance(seg, int) or isinstance(seg, bool) or seg < 8 or not segment_sums_ok(info, m, piece, seg):
            raise bad("bad segment checksums")
    return info


def rebuild_plan(views, data_ok):
    """Local, pure: from every rank's ``(summary, parity_ok)`` (``summary``: the group, parity,
    piece, sizes and manifests of its ``encoded.json``, or None when it has none), the groups
    with ``losses`` set, or None when some loss is unrecoverable: a lost rank no survivor knows
    of, inconsistent groups, or more lost symbols in a stripe than the group has parity."""
    groups, covered = [], {}
    for summary, _ in views:
        if summary is None:
            continue
        key = tuple(summary["group"])
        if any(r in covered and covered[r] != key for r in key):
            return None     # inconsistent layouts: refuse rather than guess
        if key not in {tuple(g["group"]) for g in groups}:
            groups.append(dict(summary))
        for r in key:
            covered[r] = key
    for r, ok in enumerate(data_ok):
        if not ok and r not in covered:
            return None     # a lost rank no survivor knows about
    for g in groups:
        group, m = g["group"], g["parity"]
        k = len(group)
        lost_data = [not data_ok[r] for r in group]
        lost_parity = [views[r][1] is False or views[r][0] is None for r in group]
        g["losses"] = any(lost_data)
        if not g["losses"]:
            continue
        if m == 0:
            return None
        for s in range(k):
            gone = sum(1 for p in range(k)
                       if (lost_parity if p < m else lost_data)[stripe_symbol_owner(k, s, p)])
            if gone > m:
                return None
    return groups

"""Pure layout logic of the pfs level: tiling, intersections, contiguous runs, read plans,
verifier assignment, and validation of COMMITTED.json."""
import copy

import numpy as np
import pytest

from hpcckpt.errors import CorruptCheckpointError, IncompatibleCheckpointError
from hpcckpt.levels import hdf5_layout as lay
from hpcckpt.levels.pfs_index import parse_index


def rows(n, counts):
    out, start = [], 0
    for c in counts:
        out.append(((start, 0), (c, n)))
        start += c
    return out


def test_intersect():
    assert lay.intersect((0, 0), (4, 5), (2, 3), (4, 4)) == ((2, 3), (2, 2))
    assert lay.intersect((0,), (4,), (4,), (3,)) is None
    assert lay.intersect((), (), (), ()) == ((), ())


def test_tiling_accepts_exact_tilings_and_names_problems():
    assert lay.tiling_problem((10, 3), rows(3, [2, 0, 5, 3])) is None
    assert "overlap" in lay.tiling_problem((10, 3), [((0, 0), (6, 3)), ((5, 0), (5, 3))])
    assert "cover 27 of the 30" in lay.tiling_problem((10, 3), rows(3, [2, 5, 2]))
    assert "does not fit" in lay.tiling_problem((10, 3), rows(3, [5, 6]))
    assert lay.tiling_problem((), [((), ())]) is None
    assert "exactly one rank" in lay.tiling_problem((), [((), ()), ((), ())])
    cols = [((0, 0), (4, 2)), ((0, 2), (4, 3))]
    assert lay.tiling_problem((4, 5), cols) is None


@pytest.mark.parametrize("shape,offset,sub,expected", [
    ((4, 5), (1, 0), (2, 5), (5, 10)),       # whole rows
    ((4, 5), (2, 1), (1, 3), (11, 3)),       # part of one row
    ((4, 5), (1, 1), (2, 3), None),          # a box across rows
    ((3, 4, 5), (1, 2, 0), (1, 2, 5), (30, 10)),
    ((3, 4, 5), (1, 0, 0), (2, 4, 5), (20, 40)),
    ((7,), (2,), (3,), (2, 3)),
    ((), (), (), (0, 1)),
    ((4, 5), (0, 0), (0, 5), (0, 0)),
])
def test_contiguous_run(shape, offset, sub, expected):
    assert lay.contiguous_run(shape, offset, sub) == expected
    if expected is not None and expected[1]:
        idx = np.arange(lay.volume(shape)).reshape(shape)
        box = idx[tuple(slice(o, o + n) for o, n in zip(offset, sub))].ravel()
        assert list(box) == list(range(expected[0], expected[0] + expected[1]))


@pytest.mark.parametrize("old_counts,new_counts", [([20, 41, 61, 81], [68, 135]), ([3, 0, 9], [1, 1, 5, 5]),
                                                   ([12], [4, 4, 4]), ([5, 7], [12])])
def test_read_plan_reassembles_the_global_array(old_counts, new_counts):
    n = 6
    total = sum(old_counts)
    g = np.arange(total * n).reshape(total, n)
    old = rows(n, old_counts)
    for off, shape in rows(n, new_counts):
        dst = np.full(shape, -1)
        for q, src_off, dst_off, ext in lay.read_plan(off, shape, old):
            qoff, qshape = old[q]
            block = g[qoff[0]:qoff[0] + qshape[0]]
            dst[tuple(slice(o, o + e) for o, e in zip(dst_off, ext))] = \
                block[tuple(slice(o, o + e) for o, e in zip(src_off, ext))]
        assert np.array_equal(dst, g[off[0]:off[0] + shape[0]])


def test_read_plan_for_column_blocks():
    g = np.arange(4 * 9).reshape(4, 9)
    old = [((0, 0), (4, 2)), ((0, 2), (4, 3)), ((0, 5), (4, 4))]
    new = ((1, 1), (2, 6))           # an arbitrary box
    dst = np.full(new[1], -1)
    plan = lay.read_plan(*new, old)
    assert [p[0] for p in plan] == [0, 1, 2]
    for q, src_off, dst_off, ext in plan:
        qoff, qshape = old[q]
        block = g[:, qoff[1]:qoff[1] + qshape[1]]
        dst[tuple(slice(o, o + e) for o, e in zip(dst_off, ext))] = \
            block[tuple(slice(o, o + e) for o, e in zip(src_off, ext))]
    assert np.array_equal(dst, g[1:3, 1:7])


def test_assign_verifiers_prefers_the_biggest_reader():
    old = rows(2, [10, 10, 10, 10])
    assert lay.assign_verifiers(old, old) == [0, 1, 2, 3]
    assert lay.assign_verifiers(old, rows(2, [15, 25])) == [0, 0, 1, 1]   # a tie goes to the lower rank
    assert lay.assign_verifiers(old, rows(2, [14, 26])) == [0, 1, 1, 1]
    assert lay.assign_verifiers(rows(2, [0, 40]), rows(2, [40, 0])) == [0, 0]


def test_safe_sources():
    lay.check_safe_source("node_000003.h5")
    for bad in ("../node_000003.h5", "/tmp/node_000003.h5", ".", "node_3.h5", "sub/node_000003.h5", None):
        with pytest.raises(ValueError):
            lay.check_safe_source(bad)


GOOD = {
    "format": "hpcckpt-pfs", "version": 1, "name": "job", "step": 4, "ckpt_id": "abc", "world_size": 2,
    "created": 1.5, "checksum_algorithm": "xxh3_64", "master": "checkpoint.h5", "node_of": [0, 0],
    "files": {"node_000000.h5": 4096}, "master_checksum": "0123456789abcdef",
    "arrays": [
        {"name": "u", "dtype": "<f8", "global_shape": [5, 2],
         "blocks": [{"shape": [2, 2], "offset": [0, 0], "checksum": "ab"},
                    {"shape": [3, 2], "offset": [2, 0], "checksum": "cd"}]},
        {"name": "it", "dtype": "<i8", "global_shape": None,
         "blocks": [{"shape": [], "checksum": "01"}, {"shape": [], "checksum": "02"}]},
    ],
}


def test_parse_index_accepts_a_good_document():
    index = parse_index(GOOD, "x")
    assert index.step == 4 and index.world_size == 2 and [e.name for e in index.arrays] == ["u", "it"]
    assert index.arrays[0].blocks[1].offset == (2, 0) and index.arrays[1].blocks[0].offset is None
    assert parse_index(index.to_json(), "again") == index


def _with(path, value):
    doc = copy.deepcopy(GOOD)
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize("path,value", [
    (("format",), "hpcckpt-rank"), (("step",), -1), (("step",), True), (("world_size",), 0),
    (("node_of",), [0]), (("node_of",), [0, 2]), (("files",), {"../x.h5": 1}), (("files",), {}),
    (("checksum_algorithm",), "md5"), (("ckpt_id",), "a/b"), (("master",), "../m.h5"), (("master_checksum",), None), (("master_checksum",), "not hex"),
    (("arrays", 0, "name"), "../u"), (("arrays", 0, "name"), "rank_000001"), (("arrays", 0, "dtype"), "|O"),
    (("arrays", 0, "blocks", 1, "offset"), [1, 0]),          # overlapping blocks
    (("arrays", 0, "blocks", 1, "shape"), [2, 2]),           # not covering
    (("arrays", 0, "blocks", 1, "checksum"), "XYZ"),
    (("arrays", 1, "blocks", 0, "offset"), [0]),
    (("arrays", 1, "blocks"), [{"shape": [], "checksum": "01"}]),
    (("arrays", 0, "global_shape"), "big"), (("created",), float("nan")), (("name",), KeyError),
])
def test_parse_index_refuses_bad_documents(path, value):
    with pytest.raises(CorruptCheckpointError):
        parse_index(_with(path, value), "x")


def test_parse_index_refuses_newer_versions_as_incompatible():
    with pytest.raises(IncompatibleCheckpointError):
        parse_index(_with(("version",), 3), "x")


def test_metadata_extents_are_the_bytes_outside_the_datasets():
    from hpcckpt.levels.pfs_files import metadata_extents
    assert metadata_extents(100, []) == [(0, 100)]
    assert metadata_extents(100, [(10, 20), (30, 0), (60, 40)]) == [(0, 10), (30, 30)]
    assert metadata_extents(100, [(60, 10), (10, 5), (12, 10)]) == [(0, 10), (22, 38), (70, 30)]   # unsorted, overlapping
    assert metadata_extents(50, [(0, 50)]) == []


def test_a_damaged_index_entry_for_node_metadata_is_refused():
    from hpcckpt.levels.pfs_index import _node_metadata
    files = {"node_000000.h5": 100}
    bad = lambda msg: CorruptCheckpointError(msg)      # noqa: E731
    ok = _node_metadata({"node_000000.h5": {"extents": [[0, 10], [20, 80]], "checksum": "ab12"}}, files, bad)
    assert ok == {"node_000000.h5": (((0, 10), (20, 80)), "ab12")}
    for doc in ({"node_000001.h5": {"extents": [], "checksum": "ab"}},              # not a file of the step
                {"node_000000.h5": {"extents": [[10, 5], [0, 5]], "checksum": "ab"}},   # not ascending
                {"node_000000.h5": {"extents": [[90, 20]], "checksum": "ab"}},          # past the end
                {"node_000000.h5": {"extents": [[0, 0]], "checksum": "ab"}},            # empty
                {"node_000000.h5": {"extents": [[0, 5]], "checksum": "../x"}},
                {"node_000000.h5": [0, 5]}):
        with pytest.raises(CorruptCheckpointError):
            _node_metadata(doc, files, bad)

"""The pure placement and planning logic of the redundancy levels, without mpiexec: partner
holders and encoding groups for many rank counts and node shapes (hpcckpt/topology.py), and the
rebuild plans of the partner and encoded levels (which lost ranks can be rebuilt, from whom)."""
import itertools

import pytest

from hpcckpt.topology import encoding_groups, interleaved_order, partner_holders

SHAPES = [[r // rpn for r in range(n)] for n, rpn in itertools.product(range(1, 33), (1, 2, 3, 4, 8))]
SHAPES += [[0, 0, 0, 1], [0, 1, 1, 1, 1, 2], [0, 0, 1, 2, 2, 2, 3], [0] * 5 + [1]]


def test_partner_holders_live_on_another_node():
    for node_of in SHAPES:
        check_partners(node_of)


def check_partners(node_of):
    holders = partner_holders(node_of)
    if len(set(node_of)) == 1:
        assert holders == [None] * len(node_of)
        return
    for r, h in enumerate(holders):
        assert h is not None and node_of[h] != node_of[r]
    counts = {n: node_of.count(n) for n in set(node_of)}
    if len(set(counts.values())) == 1:                 # equal ranks per node: one copy each
        assert sorted(holders) == list(range(len(node_of)))


@pytest.mark.parametrize("group_size", [2, 3, 4, 8])
def test_encoding_groups_cover_every_rank_once_on_distinct_nodes(group_size):
    for node_of in SHAPES:
        check_groups(node_of, group_size)


def check_groups(node_of, group_size):
    groups = encoding_groups(node_of, group_size)
    members = sorted(r for g in groups for r in g)
    assert members == list(range(len(node_of)))
    for g in groups:
        nodes = [node_of[r] for r in g]
        assert len(nodes) == len(set(nodes)), f"group {g} has two ranks on one node"
        if len(set(node_of)) > 1 and len(g) == 1:
            # alone only when no group lacks its node
            assert all(node_of[g[0]] in {node_of[q] for q in other} for other in groups if other is not g)


def test_interleaved_order_alternates_nodes():
    assert interleaved_order([0, 0, 1, 1]) == [0, 2, 1, 3]
    assert interleaved_order([0, 0, 0, 1]) == [0, 3, 1, 2]


# ---------------------------------------------------------------- rebuild plans (failure path)
from hpcckpt.levels import encoded_layout, partner  # noqa: E402


def test_partner_rebuild_plan_serves_each_lost_rank_from_a_verified_copy():
    node_of = [r // 2 for r in range(8)]            # 4 nodes x 2 ranks
    holders = partner_holders(node_of)
    lost = [r for r in range(8) if node_of[r] == 1]  # node 1 lost: its ranks and the copies it held
    offers = [[s for s in lost if holders[s] == r] if r not in lost else [] for r in range(8)]
    plan = partner.rebuild_plan(offers, lost)
    assert sorted(plan) == lost
    for r, h in plan.items():
        assert holders[r] == h and node_of[h] != 1


def test_partner_rebuild_plan_refuses_a_lost_rank_without_a_copy():
    assert partner.rebuild_plan([[], [], [0], []], [0, 1]) is None   # rank 1's copy is gone too
    assert partner.rebuild_plan([[], [0], [0], []], [0]) == {0: 1}   # the lowest offering rank serves
    assert partner.rebuild_plan([[]] * 4, []) == {}


def _views(node_of, group_size, parity, lost_parity=()):
    views = [None] * len(node_of)
    for g in encoding_groups(node_of, group_size):
        for r in g:
            summary = {"group": g, "parity": parity if len(g) > parity else len(g) - 1, "piece": 8,
                       "sizes": [8] * len(g), "manifests": [{}] * len(g)}
            views[r] = (summary, r not in lost_parity)
    return views


def _lose(views, ranks):
    """A lost rank has neither its data nor its encoded.json/parity."""
    return [(None, False) if r in ranks else v for r, v in enumerate(views)]


@pytest.mark.parametrize("parity", [1, 2, 3])
def test_encoded_rebuild_plan_covers_up_to_parity_losses_per_group(parity):
    node_of = list(range(8))                          # 8 nodes, one rank each: one group of 8
    views = _views(node_of, 8, parity)
    for n in range(0, 4):
        for lost in itertools.combinations(range(8), n):
            data_ok = [r not in lost for r in range(8)]
            plan = encoded_layout.rebuild_plan(_lose(views, lost), data_ok)
            if n <= parity:
                assert plan is not None, (parity, lost)
                assert [g["losses"] for g in plan] == [bool(lost)]
            else:
                assert plan is None, (parity, lost)


def test_encoded_rebuild_plan_counts_damaged_parity_as_lost():
    node_of = list(range(4))
    views = _views(node_of, 4, 1, lost_parity={2})   # rank 2's data fine, its parity piece damaged
    data_ok = [True, False, True, True]
    assert encoded_layout.rebuild_plan(_lose(views, {1}), data_ok) is None     # two symbols of one stripe gone
    views = _views(node_of, 4, 2, lost_parity={2})
    assert encoded_layout.rebuild_plan(_lose(views, {1}), data_ok) is not None


def test_encoded_rebuild_plan_groups_are_independent():
    node_of = [r // 2 for r in range(8)]              # 4 nodes x 2: two bands, two groups of 4
    views = _views(node_of, 4, 1)
    groups = encoding_groups(node_of, 4)
    lost = {groups[0][0], groups[1][1]}               # one loss in each group: both recoverable
    plan = encoded_layout.rebuild_plan(_lose(views, lost), [r not in lost for r in range(8)])
    assert plan is not None and sorted(g["losses"] for g in plan) == [True, True]
    lost = {groups[0][0], groups[0][1]}               # two losses in one xor group
    assert encoded_layout.rebuild_plan(_lose(views, lost), [r not in lost for r in range(8)]) is None


def test_encoded_rebuild_plan_refuses_unknown_or_inconsistent_groups():
    views = [(None, False)] * 4                       # nobody has encoded.json
    assert encoded_layout.rebuild_plan(views, [False, True, True, True]) is None
    assert encoded_layout.rebuild_plan(views, [True] * 4) == []
    good = _views(list(range(4)), 4, 1)
    bad = list(good)
    bad[3] = ({**good[3][0], "group": [2, 3]}, True)  # rank 3 claims another group
    assert encoded_layout.rebuild_plan(bad, [False, True, True, True]) is None


class _Comm:
    """The two attributes Topology.given reads (it is local: no MPI call)."""
    def __init__(self, rank, size):
        self.rank, self.size = rank, size


def test_a_given_node_map_is_used_as_is():
    from hpcckpt.topology import Topology
    t = Topology.given(_Comm(3, 5), [0, 0, 1, 1, 2])
    assert t.node_of == (0, 0, 1, 1, 2) and t.node == 1 and t.size == 5


@pytest.mark.parametrize("bad", [[0, 0, 1], [0, 0, 1, 1, 2, 2], [1, 1, 0, 0, 2], [0, 0, 2, 2, 3]])
def test_a_given_node_map_must_fit_and_be_numbered_as_build_numbers_it(bad):
    from hpcckpt.topology import Topology
    with pytest.raises(ValueError):
        Topology.given(_Comm(0, 5), bad)


def test_a_world_map_restricted_to_the_workers_is_renumbered():
    from hpcckpt.topology import renumbered
    # 7 processes 2 per node, the last 2 spares: the workers' map is the world's first 5 entries
    assert renumbered((0, 0, 1, 1, 2, 2, 3)[:5]) == (0, 0, 1, 1, 2)
    assert renumbered((3, 3, 1, 0, 1)) == (0, 0, 1, 2, 1)

"""The pure placement logic of the redundancy levels (hpcckpt/topology.py), without mpiexec:
partner holders and encoding groups for many rank counts and node shapes, including uneven ones."""
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

"""Nodes (failure domains) of an MPI communicator (collective to build, then local)."""
import dataclasses

import numpy as np
from mpi4py import MPI


@dataclasses.dataclass(frozen=True)
class Topology:
    """Which node each rank lives on. ``node_of[r]`` is rank r's node index (0..nnodes-1)."""
    rank: int
    size: int
    node_of: tuple

    @property
    def node(self):
        return self.node_of[self.rank]

    @classmethod
    def build(cls, comm, ranks_per_node="auto"):
        """Collective. ``auto``: MPI shared-memory split (a node is what MPI calls one), numbered
        in order of each node's lowest rank; an int n: node = rank // n. ``auto`` sends one int
        per rank (``Allgather`` of a NumPy buffer, once per Checkpointer): every rank keeps the
        whole map, which partner holders and encoding groups are computed from."""
        if ranks_per_node == "auto":
            shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
            try:
                leader = np.array([comm.rank], dtype=np.int64)
                shared.Bcast(leader, root=0)
            finally:
                shared.Free()
            leaders = np.empty(comm.size, dtype=np.int64)
            comm.Allgather(leader, leaders)
            _, index = np.unique(leaders, return_inverse=True)
            node_of = tuple(int(i) for i in index)
        else:
            node_of = tuple(r // int(ranks_per_node) for r in range(comm.size))
        return cls(comm.rank, comm.size, node_of)

    @classmethod
    def given(cls, comm, node_of):
        """Local: the topology of a rank -> node map decided elsewhere (hpcckpt.online pins the
        original placement across a recovery: a spare stands in for the lost rank's node).
        ``node_of`` must have one node index per rank of ``comm``, numbered 0..k-1 in order of
        each node's lowest rank (as ``build`` numbers them); ValueError otherwise."""
        node_of = tuple(int(n) for n in node_of)
        if len(node_of) != comm.size:
            raise ValueError(f"a node map of {len(node_of)} ranks for a communicator of {comm.size}")
        first = {}
        for n in node_of:
            first.setdefault(n, len(first))
        if any(first[n] != n for n in node_of):
            raise ValueError(f"node map {node_of}: nodes must be numbered 0..k-1 in order of their lowest rank")
        return cls(comm.rank, comm.size, node_of)


def renumbered(node_of):
    """Pure: ``node_of`` with nodes numbered 0..k-1 in order of their lowest rank (as
    ``Topology.build`` numbers them), e.g. a world map restricted to some of its ranks."""
    first = {}
    for n in node_of:
        first.setdefault(n, len(first))
    return tuple(first[n] for n in node_of)


def interleaved_order(node_of):
    """Ranks sorted by (index within their node, node): neighbours sit on different nodes."""
    seen = {}
    local = []
    for r, n in enumerate(node_of):
        local.append(seen.get(n, 0))
        seen[n] = local[-1] + 1
    return sorted(range(len(node_of)), key=lambda r: (local[r], node_of[r]))


def partner_holders(node_of):
    """holder[r]: the rank that keeps rank r's partner copy, on another node (None: one node only).

    Each rank's holder is the next rank in the interleaved order that lives on another node, so
    with equal ranks per node every rank holds exactly one copy. Local, pure.
    """
    order = interleaved_order(node_of)
    size = len(order)
    holder = [None] * size
    for i, r in enumerate(order):
        for j in range(1, size):
            q = order[(i + j) % size]
            if node_of[q] != node_of[r]:
                holder[r] = q
                break
    return holder


def encoding_groups(node_of, group_size):
    """Groups of ranks on distinct nodes for the XOR / Reed-Solomon levels. Local, pure.

    Ranks with the same index within their node form a band (one rank per node); each band is cut
    into groups of ``group_size``; a last piece too small to protect itself (one rank) joins the
    previous group of its band, or else any group without a rank on its node. A rank that fits
    nowhere stays alone (unprotected; the level's placement_warnings says so). Any rank count works.
    """
    seen, local = {}, []
    for r, n in enumerate(node_of):
        local.append(seen.get(n, 0))
        seen[n] = local[-1] + 1
    bands = {}
    for r in sorted(range(len(node_of)), key=lambda r: (local[r], node_of[r])):
        bands.setdefault(local[r], []).append(r)
    groups, loners = [], []
    for band in (bands[k] for k in sorted(bands)):
        pieces = [band[i:i + group_size] for i in range(0, len(band), group_size)]
        if len(pieces) > 1 and len(pieces[-1]) == 1:
            pieces[-2].extend(pieces.pop())
        for piece in pieces:
            (groups if len(piece) > 1 else loners).append(piece)
    for (r,) in loners:
        home = next((g for g in groups if node_of[r] not in {node_of[q] for q in g}), None)
        if home is not None:
            home.append(r)
        else:
            groups.append([r])
    return [sorted(g) for g in groups]


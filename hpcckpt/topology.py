"""Nodes (failure domains) of an MPI communicator (collective to build, then local)."""
import dataclasses

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

    @property
    def nnodes(self):
        return max(self.node_of) + 1

    def ranks_on(self, node):
        """The ranks of one node, ascending."""
        return [r for r, n in enumerate(self.node_of) if n == node]

    @classmethod
    def build(cls, comm, ranks_per_node="auto"):
        """Collective. ``auto``: MPI shared-memory split; an int n: node = rank // n."""
        if ranks_per_node == "auto":
            shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
            try:
                leader = shared.bcast(comm.rank, root=0)
            finally:
                shared.Free()
            leaders = comm.allgather(leader)
            index = {w: i for i, w in enumerate(sorted(set(leaders)))}
            node_of = tuple(index[w] for w in leaders)
        else:
            node_of = tuple(r // int(ranks_per_node) for r in range(comm.size))
        return cls(comm.rank, comm.size, node_of)

"""The 1-D stencil step of the online-recovery test apps (tests/mpi/apps/online_app.py,
tests/vcluster/apps/vc_online_app.py): deterministic, so a recovered run can be compared bit for
bit with a failure-free one."""
import numpy as np
from mpi4py import MPI


def advance(comm, state, i):
    """Collective on ``comm``: exchange one halo value with each neighbour, smooth ``state["u"]``
    in place, and store the global sum of the new field in ``state["total"]``."""
    u = state["u"]
    left = comm.rank - 1 if comm.rank > 0 else MPI.PROC_NULL
    right = comm.rank + 1 if comm.rank < comm.size - 1 else MPI.PROC_NULL
    halo = np.zeros(2)
    comm.Sendrecv(u[:1], dest=left, recvbuf=halo[1:], source=right)
    comm.Sendrecv(u[-1:], dest=right, recvbuf=halo[:1], source=left)
    ext = np.concatenate([halo[:1], u, halo[1:]])
    u[:] = 0.25 * ext[:-2] + 0.5 * ext[1:-1] + 0.25 * ext[2:] + 1e-3 * np.cos(i + comm.rank)
    total = np.zeros(1)
    comm.Allreduce(np.array([u.sum()]), total)
    state["total"][...] = total[0]

"""Write the golden checkpoints of tests/golden/ (run once per format version; the files are
checked in, and tests/mpi/test_golden.py makes every later version restore them bitwise).

    python tests/tools/make_golden.py OUTDIR [--protect-only]

One rank (MPI.COMM_SELF), job name "golden", step 7 at the pfs level (so both the node cache
and the HDF5 files exist): the protected arrays of golden_values(), and unless --protect-only
(for hpcckpt versions before state dicts) its state dict too.
"""
import os
import shutil
import sys

import numpy as np


def golden_values():
    """(protected arrays, state dict) of the golden checkpoints: deterministic, small."""
    protected = {"u": np.arange(100, dtype=np.float64) * 1.5, "grid": np.arange(15, dtype=np.int32).reshape(3, 5),
                 "it": np.array(7, np.int64)}
    rng = np.random.default_rng(1)
    rng.random(3)
    state = {"t": 0.25, "n": 2 ** 70 + 1, "label": "golden", "rng": rng.bit_generator.state,
             "p": {"pos": np.arange(6, dtype=np.float32).reshape(3, 2), "ids": np.arange(3, dtype=np.int64)},
             "x": np.float32(1.25), "pair": (1, None)}
    return protected, state


def main(out, protect_only):
    from mpi4py import MPI
    import hpcckpt
    protected, state = golden_values()
    kwargs = dict(name="golden", cache_dir=os.path.join(out, "cache", "node{node}"), pfs_dir=os.path.join(out, "pfs"),
                  ranks_per_node=1)
    with hpcckpt.Checkpointer(MPI.COMM_SELF, **kwargs) as ckpt:
        for name, a in protected.items():
            ckpt.protect(name, a)
        if protect_only:
            ckpt.checkpoint(7, level="pfs")
        else:
            ckpt.checkpoint(7, state, level="pfs")
    for dirpath, _, files in os.walk(out):
        for f in files:
            if f.startswith(".lock"):
                os.unlink(os.path.join(dirpath, f))
    shutil.rmtree(os.path.join(out, "cache", "node0", "golden", "spare"), ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], "--protect-only" in sys.argv)

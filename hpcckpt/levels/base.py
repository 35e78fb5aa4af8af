"""The protocol every redundancy level follows (partner, xor, rs; see levels/registry.py).

A checkpoint of any level is first a local checkpoint: each rank's data file and manifest in its
node cache (levels/local.py), written and committed by the Checkpointer. A redundancy level then
makes that committed step survive node losses by writing more files into *other* ranks' caches,
under ``step_<S>/held_<R>/``; they are retired with the step directory, so a level has nothing
to retire of its own. The flush level (pfs, levels/pfs.py) writes the committed step elsewhere
and has a store of its own (index, retire, restore across rank counts).

Who calls what: the Checkpointer wraps each call in ``comm.Collective`` (every rank learns of
any rank's failure and raises the same error). Inside, a level keeps every rank in every round of
its exchanges whatever happens to its own files (``comm.Deferred``), so a local error never
deadlocks the others.
"""
import abc


class RedundancyLevel(abc.ABC):
    """One redundancy level for one Checkpointer (``name``: its registry name)."""

    name = None

    @abc.abstractmethod
    def encode(self, step, manifest):
        """Collective: make this rank's committed ``step`` (its ``manifest``) redundant on other
        nodes; raise (on the ranks that failed) when this rank's part could not be written.
        Returns the manifest to commit at the level: ``manifest``, or a copy naming the base step
        an incremental redundancy refers to (levels/delta.py); None means ``manifest``."""

    @abc.abstractmethod
    def recover(self, step, ckpt_id, data_ok):
        """Collective: rebuild, into their caches, the ranks r with ``data_ok[r]`` False (their
        data of ``step``/``ckpt_id`` is missing or damaged), then protect them again. True on
        every rank when every lost rank was rebuilt; False on every rank when the redundancy
        cannot cover these losses (the caller falls back to an older step or another level).
        Rebuilt files are committed only after they were verified."""

    def pinned_steps(self):
        """Local: steps whose files this level still needs beyond ``keep`` (an incremental base)."""
        return ()

    def close(self):
        """Local: free what the level holds (sub-communicators, buffers). Safe to call twice."""

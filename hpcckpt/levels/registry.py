"""The checkpoint levels by name: the one place that maps a level name to what it is (local, pure).

Every level is a local checkpoint first (the node cache, levels/local.py). A *redundant* level
then adds copies or parity in other nodes' caches (an object with collective ``encode(step,
manifest)`` and ``recover(step, ckpt_id, data_ok)``, made by ``make``); a *flushing* level then
writes the committed cache step to the parallel file system (levels/pfs.py). Adding a level
means adding its entry here and its module.
"""
import dataclasses

LEVELS = ("local", "partner", "xor", "rs", "pfs")       # cheapest first


@dataclasses.dataclass(frozen=True)
class LevelSpec:
    name: str
    redundant: bool = False      # partner copies / parity across nodes
    flush: bool = False          # the committed step goes on to the pfs level

    def make(self, cache, comm, topology, cfg):
        """Collective: the redundancy object of a redundant level (modules imported here, so that
        Numba loads only in jobs that use xor or rs)."""
        if self.name == "partner":
            from .partner import PartnerLevel
            return PartnerLevel(cache, comm, topology)
        from .encoded import EncodedLevel
        return EncodedLevel(cache, comm, topology, self.name, 1 if self.name == "xor" else cfg.rs_parity)


SPECS = {spec.name: spec for spec in (
    LevelSpec("local"), LevelSpec("partner", redundant=True), LevelSpec("xor", redundant=True),
    LevelSpec("rs", redundant=True), LevelSpec("pfs", flush=True))}
assert tuple(SPECS) == LEVELS
REDUNDANT = tuple(n for n, s in SPECS.items() if s.redundant)

"""The checkpoint levels by name: the one place that maps a level name to what it is (local, pure).

Every level is a local checkpoint first (the node cache, levels/local.py). A *redundant* level
then adds copies or parity in other nodes' caches (a ``levels.base.RedundancyLevel``: collective
``encode`` and ``recover``, made by its spec's ``factory``); a *flushing* level then
writes the committed cache step to the parallel file system (levels/pfs.py). Adding a level
means adding its entry here and its module.
"""
import dataclasses

LEVELS = ("local", "partner", "xor", "rs", "pfs")       # cheapest first


def _partner(cache, comm, topology, cfg):
    from .partner import PartnerLevel
    return PartnerLevel(cache, comm, topology)


def _xor(cache, comm, topology, cfg):
    from .encoded import EncodedLevel
    return EncodedLevel(cache, comm, topology, "xor", 1)


def _rs(cache, comm, topology, cfg):
    from .encoded import EncodedLevel
    return EncodedLevel(cache, comm, topology, "rs", cfg.rs_parity)


@dataclasses.dataclass(frozen=True)
class LevelSpec:
    name: str
    factory: object = None       # (cache, comm, topology, cfg) -> RedundancyLevel, for a redundant level
    flush: bool = False          # the committed step goes on to the pfs level

    @property
    def redundant(self):
        """Partner copies / parity across nodes (a ``levels.base.RedundancyLevel``)."""
        return self.factory is not None

    def make(self, cache, comm, topology, cfg):
        """Collective: the redundancy object of a redundant level (its module is imported here, so
        that Numba loads only in jobs that use xor or rs)."""
        if self.factory is None:
            raise ValueError(f"the {self.name} level has no redundancy object")
        return self.factory(cache, comm, topology, cfg)


SPECS = {spec.name: spec for spec in (
    LevelSpec("local"), LevelSpec("partner", _partner), LevelSpec("xor", _xor), LevelSpec("rs", _rs),
    LevelSpec("pfs", flush=True))}
assert tuple(SPECS) == LEVELS
REDUNDANT = tuple(n for n, s in SPECS.items() if s.redundant)

"""The pfs level behind the Level interface: the committed cache step flushed to HDF5 under
``<pfs_dir>/<name>`` (the store, its files and its save and restore paths: levels/pfs.py and the
pfs_* modules), restored from directly, on any rank count.

Per checkpoint: ``prepare`` (a sync step with ``pfs_direct_io``: the node files are laid out
before the cache write, which feeds them as it copies), ``protect`` (the flush of the committed
step, or the end of the one prepared), ``retire`` (this run's newest ``keep`` pfs steps).
Per restart: ``offers`` (the committed steps, read by rank 0 without creating anything) and
``restore``. The store and its directory lock are made on first use (collective).
"""
import os

from .. import manifest as mf
from ..comm import Collective
from .base import Level
from .options import Setting
from .pfs import PfsStore, listing, remove_step_dir
from .pfs_catalog import PfsFiles
from .pfs_index import committed_steps, max_index_bytes
from .pfs_items import Item, items_from_manifest
from .registry import register


@register
class PfsLevel(Level):
    """HDF5 on the parallel file system: survives anything short of losing ``pfs_dir``."""
    name, order, restores, any_rank_count = "pfs", 50, True, True
    files = PfsFiles()
    survives = "system"
    settings = {
        "dir": Setting("hpcckpt-pfs", str, flat="pfs_dir", doc="the parallel file system directory (docs/PFS.md)"),
        "direct_io": Setting("auto", bool, flat="pfs_direct_io",
                             doc='true, false or "auto": write large arrays with O_DIRECT (docs/CONFIG.md)'),
        "async_flush": Setting(False, bool, flat="async_flush",
                               doc="return once staged in the cache, flush in the background"),
    }

    def __init__(self, ctx):
        super().__init__(ctx)
        self.cfg = ctx.config
        self.root = os.path.join(self.cfg.pfs_dir, self.cfg.name)
        self.store = None

    def _store(self):
        """Collective: the PfsStore (created, and its directory locked, on first use)."""
        if self.store is None:
            store = PfsStore(self.cfg, self.ctx.comm, self.ctx.topology)
            with Collective(self.ctx.comm, f"locking {store.root}"):
                if self.ctx.comm.rank == 0:
                    self._lock(store.root)
            store.relock = self._lock
            self.store = store       # only once locked: a failed lock is tried again at the next use
        return self.store

    def _lock(self, root):
        self.ctx.lock(os.path.join(root, ".lock"), f"job name {self.cfg.name!r} in {root}")

    # ------------------------------------------------------------------ per checkpoint
    def background(self):
        return bool(self.cfg.async_flush or self.cfg.background)

    def ready(self):
        self._store()

    def prepares(self):
        return bool(self.cfg.direct_io)

    def prepare(self, step, ckpt_id, items, epoch, state_keys):
        return self._store().begin(step, ckpt_id, [Item(n, a, layout, None) for n, a, layout in items],
                                   epoch=epoch, state_keys=state_keys)

    def protect(self, manifest, pending=None):
        store, cache = self._store(), self.ctx.cache
        if pending is None:
            items = items_from_manifest(manifest, cache.mapped_arrays(manifest))
            store.save(manifest.step, manifest.ckpt_id, items, epoch=manifest.epoch,
                       state_keys=cache.state_keys(manifest))
        else:        # the cache file is mapped only if the cache write left bytes to write
            mapped = cache.mapped_arrays(manifest) if pending.incomplete() else None
            items = items_from_manifest(manifest, mapped)
            store.finish(pending, items)
        del items

    def retire(self, manifest, clear_others=False):
        self._store().retire(self.cfg.keep, manifest.epoch, keep_upto=manifest.step, clear_others=clear_others)

    def discard(self, pending):
        if pending is not None and self.store is not None:
            self.store.abandon(pending)

    def clear_earlier(self, epoch):
        with Collective(self.ctx.comm, "removing the pfs checkpoints of earlier runs"):
            if self.ctx.comm.rank == 0:
                for step in committed_steps(self.root) if os.path.isdir(self.root) else []:
                    listed = self.offers().get(step)
                    if listed is None or listed[0] != epoch:
                        remove_step_dir(os.path.join(self.root, mf.step_dir_name(step)))

    # ------------------------------------------------------------------ per restart
    def offers(self, skipped=None):
        return listing(self.root, self.cfg.name, max_index_bytes(self.ctx.comm.size), skipped)

    def restore(self, step, protected, state, layouts):
        self._store().restore(step, protected, state, layouts)

    # ------------------------------------------------------------------ the rest
    def comms(self):
        if self.store is None or self.store.comm is None:
            return ()
        return (self.store.comm, self.store.node_comm)

    def close(self):
        if self.store is not None:
            self.store.close()

    def abandon(self):
        self.store = None

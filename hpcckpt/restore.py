"""The restore protocol (``Checkpointer.restart``), top to bottom. Collective.

  1. files a relaunch left on other hosts are moved to their ranks' hosts (relocate.py);
  2. each rank lists the manifests it can read; rank 0 asks each level that keeps copies of its
     own what it offers (the pfs steps);
  3. only the newest epoch (the newest run) counts; its steps are tried newest first, each chosen
     by one fixed-size reduction;
  4. every rank checks that its protected arrays and state match and re-hashes its data; if any
     rank cannot verify, the step's level rebuilds it (``Level.recover``), else a level that
     keeps its own copy of the step restores it (``Level.restore``), else all fall back to the
     next candidate (nothing is touched until a step verifies);
  5. every rank fills its arrays and state; this run continues that epoch.
"""
import logging

from . import manifest as mf, state as st
from .comm import U64_MAX, Collective, explain, is_different_calls, mark_collective, signals_deferred
from .errors import (CorruptCheckpointError, HpcCkptError, IncompatibleCheckpointError, LayoutChangedError,
                     MismatchError, ProtectError)
from .levels import registry
from .relocate import relocate

log = logging.getLogger("hpcckpt")


def restart(ctx, state, retire):
    """Collective: fill the protected arrays and ``state`` from the newest checkpoint every rank
    can restore; return its step, or None (nothing touched). ``retire(ctx, keep_upto)``: the
    cache retire (save.py), run once a step is restored."""
    other_layout = _relocate(ctx)
    levels = ctx.restoring_levels()
    if ctx.config.start == "fresh":
        ctx.epoch = ctx.scan_epochs(other_layout) + 1
        ctx.clear_others = True
        if ctx.rank == 0:
            log.info("start = 'fresh': not restarting; earlier checkpoints of %r are removed after this "
                     "run's first checkpoint", ctx.config.name)
        ctx.policy.start()
        return None
    with Collective(ctx.comm, "restart: scanning checkpoints") as c:
        if not ctx.arrays and state is None:
            raise HpcCkptError("nothing to restore: protect() arrays or pass a state dict to restart()")
        if state is not None and not isinstance(state, dict):
            raise MismatchError(f"restart: state must be a dict, got {type(state).__name__}")
        both = st.overlapping(state, ctx.arrays) if state is not None else []
        if both:
            raise ProtectError(f"restart: the names {both[:8]} are both protected and in the state dict")
        found = ctx.cache.scan()
        ok = {f.step: f for f in found if f.state == "ok"}
        incompatible = [f for f in found if f.state == "incompatible"] + other_layout
        damaged = [f for f in found if f.state == "damaged"]
        offered = {}         # (level, step) -> epoch key, rank 0
        if ctx.rank == 0:
            for lv in levels:
                skipped = []
                for s, (e, _) in lv.offers(skipped).items():
                    offered[(lv.name, s)] = mf.order_key(e, s)
                for s, reason in skipped[-4:]:
                    log.warning("%s step %d cannot be used: %s", lv.name, s, reason)
        keys = [f.key for f in ok.values()] + list(offered.values())
        # this job's steps written on another rank count or placement (a relaunch on fewer
        # nodes) give way to an older step this layout restores; another job's or a newer
        # format's stop the restart when they are the newest
        other_layout = [f for f in incompatible if f.manifest is not None and f.manifest.name == ctx.config.name]
        foreign = [f for f in incompatible if f not in other_layout]
        epochs = [mf.split_key(k)[0] for k in keys] + [f.manifest.epoch for f in incompatible if f.manifest]
        inc_key = max((f.key or 0 for f in foreign), default=0)
        layout_key = max((f.key for f in other_layout), default=0)
        unknown = max((f.step + 1 for f in foreign if f.key is None), default=0)   # a newer format
        c.words = [max(epochs, default=0), inc_key, 1 if foreign else 0, 1 if damaged else 0, unknown, layout_key]
    newest_epoch, inc_key, any_incompatible, any_damaged, unknown, layout_key = c.result
    if unknown:     # of an unknown epoch: taken as this job's newest, so that it stops the restart
        inc_key = max(inc_key, mf.order_key(max(newest_epoch, 1), unknown - 1))
    if any_damaged:
        text = ctx.first_text(damaged[0].reason if damaged else None)
        if ctx.rank == 0:
            log.warning("a rank manifest cannot be read: %s", text)
    candidates = sorted((k for k in keys if mf.split_key(k)[0] == newest_epoch), reverse=True)
    first = True
    while True:
        # the next candidate: the newest key any rank (or a level's offer) has, one reduction
        with Collective(ctx.comm, "restart: choosing a checkpoint") as c:
            c.words = [candidates[0] if candidates else 0]
        key = c.result[0]
        if first and any_incompatible and (inc_key > key or key == 0):
            _raise_incompatible(ctx, incompatible, inc_key)
        first = False
        if key == 0:
            break
        candidates = [k for k in candidates if k < key]
        step = mf.split_key(key)[1]
        try:
            restored = _try_cache(ctx, step, key, ok.get(step), state)
        except LayoutChangedError:      # agreed: a level that restores another decomposition may place them
            if not _try_levels(ctx, levels, step, key, offered, state, any_rank_count=True):
                raise
            restored = True
        if not restored:
            restored = _try_levels(ctx, levels, step, key, offered, state)
        if restored:
            ctx.epoch, ctx.last_step = newest_epoch, step
            if layout_key > key:
                _report_other_layout(ctx, other_layout, layout_key, step)
                ctx.cache.abandoned_after = step
            retire(ctx, keep_upto=step)
            ctx.policy.start()
            return step
    if layout_key:      # nothing this layout can restore: not a silent start from nothing
        _raise_incompatible(ctx, other_layout, layout_key)
    ctx.epoch = newest_epoch + 1
    if ctx.rank == 0:
        if newest_epoch:
            log.warning("no checkpoint can be restored; the arrays and state are left as they are")
        else:
            log.info("no checkpoint to restart from (nothing committed in %s or the levels' own directories)",
                     ctx.cache.root)
    ctx.policy.start()
    return None


def _relocate(ctx):
    """Collective: move node-cache files that a relaunch left on other hosts than their ranks'
    (relocate.py), before anything looks at the caches: also with start = "fresh", whose
    newest-epoch scan and removal of earlier runs' checkpoints see each rank's own files only.
    A failed move is agreed and warned about; each host keeps what it holds. Returns the
    manifests of another layout it saw (relocate)."""
    try:
        return relocate(ctx.comm, ctx.config, ctx.topology, ctx.cache.root)
    except HpcCkptError as e:
        if is_different_calls(e):
            raise
        if ctx.rank == 0:
            log.warning("restart: moving node-cache files to the hosts of their ranks failed (%s); restarting "
                        "from what each host holds", e)
        return []


def _report_other_layout(ctx, other_layout, layout_key, step):
    """Collective: warn that the newest steps in the node caches are of another rank count or
    placement, and that the restart took ``step``, an older one this job can restore."""
    text = ctx.first_text(next((f.reason for f in other_layout if f.key == layout_key), None))
    if ctx.rank == 0:
        log.warning("the newest checkpoint in the node caches is of another rank count or placement (%s); "
                    "restarted from step %d, the newest this job can restore. Their files stay, except a step "
                    "of the same number as one this run checkpoints, which is replaced", text, step)


def _raise_incompatible(ctx, incompatible, inc_key):
    """Collective: raise IncompatibleCheckpointError with the reason of a rank that has it."""
    mine = next((f.reason for f in incompatible if (f.key or 0) == inc_key), None)
    mine = mine or next((f.reason for f in incompatible if f.key is None), None)
    raise mark_collective(IncompatibleCheckpointError(ctx.first_text(mine)))


def _try_cache(ctx, step, key, found, state):
    """Collective: restore ``step`` (epoch key ``key``) from the node caches; False when some
    rank cannot, even after a rebuild (nothing touched then)."""
    have = found is not None and found.key == key
    with Collective(ctx.comm, f"restart: step {step}") as c:
        c.words = [U64_MAX - ctx.rank if have else 0]
    if not c.result[0]:
        return False
    root = U64_MAX - c.result[0]
    ckpt_id, level = ctx.comm.bcast((found.manifest.ckpt_id, found.manifest.level) if ctx.rank == root
                                    else None, root=root)
    manifest = found.manifest if have and found.manifest.ckpt_id == ckpt_id else None
    return _restore_step(ctx, step, ckpt_id, level, manifest, state)


def _restore_step(ctx, step, ckpt_id, level, manifest, state):
    """Collective: verify ``step`` on every rank, rebuild lost ranks when its level is redundant,
    then fill. False (nothing touched) when it cannot be restored."""
    # 1. every rank re-hashes its own data and plans its restore (MismatchError: agreed, raised)
    with Collective(ctx.comm, f"restart from step {step}") as c:
        reason, manifest, plan = _verify_local(ctx, step, manifest, ckpt_id, state)
        c.words = [1 if reason else 0]
    data_ok = None
    if c.result[0]:
        cls = registry.classes().get(level)
        if cls is None or not cls.redundant:
            _warn_fallback(ctx, step, reason)
            return False
        # 2. rebuild what is lost from partner copies or parity
        data_ok = ctx.comm.allgather(reason is None)       # failure path only
        try:
            with Collective(ctx.comm, f"rebuilding step {step} from the {level} level") as c:
                with signals_deferred():
                    c.words = [0 if ctx.level(level).recover(step, ckpt_id, data_ok) else 1]
        except HpcCkptError as e:
            if ctx.rank == 0:
                log.warning("step %d: the %s rebuild failed (%s); falling back", step, level, e)
                ctx.events.fallback(step, level, f"the {level} rebuild failed: {e}")
            return False
        if c.result[0]:
            _warn_fallback(ctx, step, reason, f"the {level} level cannot rebuild it")
            return False
        with Collective(ctx.comm, f"restart from step {step} after the rebuild") as c:
            if not data_ok[ctx.rank]:
                reason, manifest, plan = _verify_local(ctx, step, None, ckpt_id, state)
            c.words = [1 if reason else 0]
        if c.result[0]:
            _warn_fallback(ctx, step, reason, "the rebuilt data does not verify")
            return False
        if ctx.rank == 0:
            log.warning("step %d: rebuilt rank(s) %s from the %s level", step,
                        [r for r, ok in enumerate(data_ok) if not ok][:16], level)
    # 3. fill the protected arrays in place, then the state dict
    ctx.events.restored(step, level, data_ok)
    with Collective(ctx.comm, f"restoring step {step}"):
        ctx.cache.read_into(manifest, [(n, p.array) for n, p in ctx.arrays.items()] + plan.reads)
        plan.apply()
    return True


def _verify_local(ctx, step, manifest, ckpt_id, state):
    """Local: (None, manifest, plan) when this rank's part of ``step`` verifies, else (reason,
    manifest, None). Raises MismatchError when the arrays or state differ from the checkpoint."""
    cache = ctx.cache
    if manifest is None:
        manifest = cache.read_manifest(step, quiet=True)
        if manifest is None:
            found = cache.examine(step)      # failure path: say why, when the manifest is there
            return (found.reason if found is not None and found.state != "ok" and found.reason else
                    f"no readable manifest ({cache.manifest_path(step)})"), None, None
    if manifest.ckpt_id != ckpt_id:
        return f"its manifest belongs to another attempt (checkpoint {manifest.ckpt_id})", manifest, None
    _check_protected(ctx, manifest)
    _check_blocks(ctx, manifest)
    try:
        cache.verify(manifest)
        doc = cache.read_document(manifest)
    except HpcCkptError as e:
        return str(e), manifest, None
    return None, manifest, _plan(ctx, manifest, doc, state)


def _plan(ctx, manifest, doc, state):
    """Local: the restore plan of the state dict (MismatchError when it does not fit)."""
    where = f"step {manifest.step}"
    if doc is None:
        if state:
            raise MismatchError(f"{where}: the checkpoint holds no state dict, but restart() was given one "
                                f"with {sorted(state)[:8]}")
        return st.Plan([], [])
    if state is None:
        raise MismatchError(f"{where}: the checkpoint holds a state dict with {sorted(doc['items'])[:8]}: "
                            "pass restart(state=...)")
    shapes = {a.name: (a.shape, a.dtype) for a in manifest.arrays}
    refs = {n for enc in doc["items"].values() for n in st.array_refs(enc)}
    if not refs <= set(shapes):
        raise CorruptCheckpointError(f"{where}: the state document refers to arrays that are not in it")
    orphans = sorted(set(shapes) - refs - set(ctx.arrays) - {st.STATE_ENTRY})
    if orphans:
        raise MismatchError(f"{where}: the checkpoint has {orphans[:8]} which are not protected")
    return st.plan_restore(state, doc["items"], shapes, where)


def _check_protected(ctx, manifest):
    """Local: MismatchError unless the protected arrays match ``manifest``. Arrays of the
    checkpoint that are not protected must belong to its state dict (checked in _plan)."""
    theirs = {a.name for a in manifest.arrays}
    has_state = st.STATE_ENTRY in theirs
    missing = sorted(theirs - set(ctx.arrays)) if not has_state else []
    extra = sorted(set(ctx.arrays) - theirs)
    if missing or extra:
        raise st.key_mismatch(f"step {manifest.step}", missing and f"the checkpoint has {missing} which are not "
                              "protected", extra and f"protected {extra} are not in the checkpoint")
    for a in manifest.arrays:
        if a.name not in ctx.arrays:
            continue
        arr = ctx.arrays[a.name].array
        if tuple(arr.shape) != a.shape or arr.dtype.str != a.dtype:
            raise MismatchError(f"step {manifest.step}, array {a.name!r}: the checkpoint holds "
                                f"shape {a.shape} {a.dtype}, the protected array is {tuple(arr.shape)} "
                                f"{arr.dtype.str}")


def _check_blocks(ctx, manifest):
    """Local: raise LayoutChangedError when an array this rank declares as a Block now (its
    global shape or offset) is another block than ``manifest`` holds: the node cache can only
    give each rank back the block it wrote."""
    for a in manifest.arrays:
        protected = ctx.arrays.get(a.name)
        declared = ctx.layouts.get(a.name, protected.layout if protected is not None else None)
        if declared is None or declared.kind != "block" or a.layout != "block":
            continue
        if (declared.global_shape, declared.offset) != (a.global_shape, a.global_offset):
            placing = "/".join(n for n, c in registry.classes().items() if c.any_rank_count)
            raise LayoutChangedError(
                f"step {manifest.step}, array {a.name!r}: rank {ctx.rank} declares the block at offset "
                f"{declared.offset} of global shape {declared.global_shape}, the node cache holds its block at "
                f"offset {a.global_offset} of {a.global_shape}; only the {placing} level restores another "
                f"decomposition, and it has no copy of this step (declare the blocks of the checkpoint, or "
                f"restart from a step checkpointed at level {placing!r})")


def _warn_fallback(ctx, step, reason, why=None):
    """Collective (failure path): rank 0 logs why step ``step`` cannot be restored."""
    def pick(reasons):
        bad = [(r, v) for r, v in enumerate(reasons) if v]
        more = f" (and {len(bad) - 4} more ranks)" if len(bad) > 4 else ""
        return "; ".join(f"rank {r}: {v}" for r, v in bad[:4]) + more + (f"; {why}" if why else "")
    text = explain(ctx.comm, reason, pick)
    if ctx.rank == 0:
        ctx.events.fallback(step, "cache", text)
        log.warning("step %d cannot be restored from the node caches (%s); falling back to its %s copy, if there is "
                    "one, else to an older checkpoint", step, text, "/".join(registry.restoring()))


def _try_levels(ctx, levels, step, key, offered, state, any_rank_count=False):
    """Collective: restore ``step`` from the first level that keeps its own copy of this
    epoch's step (``any_rank_count``: only a level that places blocks on another decomposition)."""
    for lv in levels:
        if any_rank_count and not lv.any_rank_count:
            continue
        with Collective(ctx.comm, f"restart: {lv.name} step {step}") as c:
            c.words = [1 if ctx.rank == 0 and offered.get((lv.name, step)) == key else 0]
        if not c.result[0]:
            continue
        try:
            with Collective(ctx.comm, f"restoring step {step} from the {lv.name} level"):
                lv.restore(step, [(n, p.array, ctx.layouts.get(n, p.layout)) for n, p in ctx.arrays.items()],
                           state, ctx.layouts)
        except CorruptCheckpointError as e:
            if ctx.rank == 0:
                log.warning("%s step %d cannot be restored (%s); falling back to an older checkpoint", lv.name, step, e)
                ctx.events.fallback(step, lv.name, str(e))
            continue
        if ctx.rank == 0:
            log.info("restored step %d from %s", step, lv.name)
        ctx.events.restored(step, lv.name, direct=True)
        return True
    return False


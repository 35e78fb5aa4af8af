"""The save protocol (``Checkpointer.checkpoint``), top to bottom. Collective.

  1. every rank passes the same step and level (one fixed-size reduction; rank 0's checkpoint id
     travels in it);
  2. the level prepares, if it takes the bytes as they are copied (a sync pfs step with direct
     I/O lays out its files first);
  3. each rank writes what it checkpoints — its protected arrays and the state dict it passed —
     into the step directory of its node cache, hashing while writing (no manifest yet: the step
     does not exist);
  4. all ranks agree that every rank wrote its data and that the replicated values are the same
     everywhere — otherwise every rank raises and the previous checkpoints are untouched;
  5. a redundant level protects the step (partner copies, xor/rs parity), then each rank commits
     its manifest atomically (temp + fsync + rename); all agree;
  6. any other level protects the committed step now (the pfs flush) — or, with background work,
     the level's protect runs in a thread (background.py);
  7. only then are this run's checkpoints beyond ``keep`` retired. Checkpoints of earlier runs
     (other epochs) or of other jobs are never removed, except with ``start = "fresh"``.
Every per-call message on the success path is a fixed-size reduction on the library's own
communicator; per-rank details travel only on failure (``comm.explain``).
"""
import dataclasses
import json
import logging
import time
import uuid

import numpy as np

from . import background, dtype_check, faults, manifest as mf, state as st
from .codecs.checksum import digest
from .comm import U64_MAX, Collective, explain, mark_collective, reduce_sum_max
from .errors import CheckpointWriteError, HpcCkptError, IncompatibleCheckpointError, ProtectError
from .levels import registry
from .levels.local import LocalLevel
from .protected import dropped, dropped_message

log = logging.getLogger("hpcckpt")


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What one checkpoint did: bytes over all ranks, seconds of the slowest rank to commit."""
    step: int
    level: str
    bytes: int
    seconds: float

    @property
    def bandwidth(self):
        """Aggregate bytes per second."""
        return self.bytes / self.seconds if self.seconds > 0 else float("inf")


def checkpoint(ctx, step, state, level):
    """Collective: checkpoint the protected arrays and ``state`` as ``step`` at ``level``; return
    a CheckpointInfo (Checkpointer.checkpoint says what the caller sees)."""
    flush_error = background.finish(ctx, raise_error=False, retire=retire)
    t0 = time.perf_counter()

    # 1. the same call on every rank; rank 0's checkpoint id comes with it
    with Collective(ctx.comm, f"checkpoint({step!r}, level={level!r})") as c:
        step = _check_args(ctx, step, level, state)
        if stale := dropped(ctx.arrays):      # the application rebound a protected name
            raise ProtectError(dropped_message(step, stale))
        ident = uuid.uuid4().int if ctx.rank == 0 else 0
        code = level_code(level)
        names = digest_int(sorted(ctx.arrays))      # protect() names: the same on every rank
        c.words = [step, U64_MAX - step, code, U64_MAX - code, ident >> 64, ident & U64_MAX, names, U64_MAX - names]
    hi, lo, code_hi, code_lo, id_hi, id_lo, names_hi, names_lo = c.result
    if hi != U64_MAX - lo or code_hi != U64_MAX - code_lo:
        raise mark_collective(HpcCkptError(
            f"the ranks disagree on checkpoint(step, level): steps {U64_MAX - lo}..{hi}, levels "
            f"{registry.LEVELS[U64_MAX - code_lo - 1]!r}..{registry.LEVELS[code_hi - 1]!r}; every rank must make "
            "the same call"))
    if names_hi != U64_MAX - names_lo:
        _names_differ(ctx)
    ckpt_id = f"{(id_hi << 64) | id_lo:032x}"
    if ctx.epoch is None:
        ctx.epoch = ctx.new_epoch()
    lv = ctx.level(level)
    ctx.cache.keep_spares(1 + sum(other.redundant for other in ctx.levels.values()))
    later = lv.background() and threads_ok(ctx)

    # 2-5. prepare, write, agree, (redundancy,) commit
    try:
        manifest, nbytes, seconds, pending = _write_and_commit(ctx, lv, step, ckpt_id, state, t0, later)
    except HpcCkptError:
        _discard(ctx, step, ckpt_id)  # every rank raises; no rank keeps a piece of this step
        _report_lost_flush(ctx, flush_error)
        raise
    ctx.last_step = step
    if ctx.clear_others and not ctx.committed:
        for other in ctx.restoring_levels():
            with Collective(ctx.comm, f"removing the {other.name} checkpoints of earlier runs"):
                other.clear_earlier(ctx.epoch)
    ctx.committed = True

    # 6. the rest in the background, or a non-redundant level's protect now (the pfs flush)
    if later:
        background.start(ctx, manifest, lv)
    elif not lv.redundant and _defines(lv, "protect"):
        try:
            with Collective(ctx.comm, f"the {level} copy of checkpoint {step}"):
                background.protect(lv, manifest, pending)
            with Collective(ctx.comm, f"retiring at the {level} level after checkpoint {step}"):
                lv.retire(manifest, ctx.clear_others and ctx.committed)
        except HpcCkptError:
            _report_lost_flush(ctx, flush_error)
            raise
        seconds = reduce_sum_max(ctx.comm, 0, time.perf_counter() - t0)[1]
    elif _defines(lv, "retire"):
        with Collective(ctx.comm, f"retiring at the {level} level after checkpoint {step}"):
            lv.retire(manifest, ctx.clear_others and ctx.committed)
    info = CheckpointInfo(step, level, nbytes, seconds)

    if ctx.stopping and level == ctx.final_level:
        background.finish(ctx, raise_error=True, retire=retire)   # the final checkpoint must be durable
        ctx.final_done = True
    # 7. retire what the new checkpoint replaces (local; failures only warn)
    retire(ctx, keep_upto=step)
    if ctx.rank == 0 and level in ctx.policy.measured_levels:
        ctx.policy.record_checkpoint(level, seconds)   # rank 0 only: must not raise alone
    if flush_error is not None:
        err = CheckpointWriteError(f"{flush_error} — step {step} was checkpointed ({level}) all the same")
        err.info = info
        raise mark_collective(err) from flush_error
    return info


def _write_and_commit(ctx, lv, step, ckpt_id, state, t0, later):
    """Collective: steps 2-5; returns this rank's manifest, the bytes over all ranks, the
    seconds of the slowest rank and what the level prepared (or None). ``later`` (background
    work): a redundant level's step is committed as a local one; the background work commits it
    at its level once its protect is complete. An error here discards what the level prepared."""
    items = pending = None
    try:
        if not later and lv.prepares():
            with Collective(ctx.comm, f"checkpoint {step}: the arrays and state"):
                items, replicated_items = _items(ctx, state)
            with Collective(ctx.comm, f"checkpoint {step}: preparing the {lv.name} level"):
                pending = lv.prepare(step, ckpt_id, items, ctx.epoch, _state_keys_of(ctx, state))
        # 3-4. write this rank's data, then agree that every rank did (and that replicated
        # values are equal everywhere: the min and max of their digest, in the same reduction)
        with Collective(ctx.comm, f"writing checkpoint {step}") as c:
            if pending is not None:
                pending.check()         # what the level prepared failed on this rank: nothing is written
            if items is None:
                items, replicated_items = _items(ctx, state)
            try:
                manifest = ctx.cache.write(step, ckpt_id, lv.name, ctx.epoch, items, pipe=pending)
                faults.hit("written", ctx.rank, step)
            except OSError as e:
                raise CheckpointWriteError(f"cannot write {e.filename or ctx.cache.root}: {e.strerror}") from e
            replicated = _replicated_digests(manifest, replicated_items, items)
            h = digest_int(replicated)
            c.words = [h, U64_MAX - h]
        if c.result[0] != U64_MAX - c.result[1]:
            _replicated_differ(ctx, replicated, step)
        if not ctx.committed and (any(registry.level_class(n).any_rank_count for n in ctx.policy.levels)
                                  or ctx.config.end_time is not None):
            dtype_check.check(ctx.comm, dtype_check.described(items, ctx.rank), f"checkpoint {step}")
        # 5. redundancy across nodes (collective, errors agreed), then the commit
        committed = manifest
        ctx.warn_placement((lv.name,))
        if lv.redundant:
            if later:
                committed = dataclasses.replace(manifest, level=LocalLevel.name)
            else:
                with Collective(ctx.comm, f"encoding checkpoint {step} ({lv.name})"):
                    committed = background.protect(lv, manifest)
        with Collective(ctx.comm, f"committing checkpoint {step}"):
            try:
                faults.hit("commit", ctx.rank, step)
                ctx.cache.commit(committed)
            except OSError as e:
                raise CheckpointWriteError(f"cannot write the manifest of step {step}: {e.strerror}") from e
            faults.hit("committed", ctx.rank, step)
        nbytes, seconds = reduce_sum_max(ctx.comm, manifest.data_size, time.perf_counter() - t0)
        return manifest, nbytes, seconds, pending
    except BaseException:
        if pending is not None:
            lv.discard(pending)
        raise


def _items(ctx, state):
    """Local: what this rank checkpoints: [(name, array, Layout)], and the encoded state items
    whose layout is replicated (for the cross-rank check)."""
    items = [(name, p.array, ctx.layouts.get(name, p.layout)) for name, p in ctx.arrays.items()]
    replicated = {}
    if state is not None:
        flat = st.flatten(state)
        for path, array, top in flat.arrays:
            layout = ctx.layouts.get(top, st.PER_RANK)
            if layout.kind in ("block", "rows") and path != top:
                raise ProtectError(f"state[{top!r}]: a {layout.kind} layout needs an array, not a dict of arrays")
            check_layout(path, array, layout, ctx.rank)
            items.append((path, array, layout))
        layouts = {}
        for key in state:
            layout = ctx.layouts.get(key, st.PER_RANK)
            if layout.kind in ("block", "rows") and not isinstance(state[key], np.ndarray):
                raise ProtectError(f"state[{key!r}]: a {layout.kind} layout needs an array, not a "
                                   f"{type(state[key]).__name__} (declare REPLICATED, ROOT or no layout for it)")
            if layout.kind != "rank":
                layouts[key] = layout.to_json()
            if layout.kind == "root" and ctx.rank != 0:
                raise ProtectError(f"state[{key!r}] is declared ROOT (rank 0 only) but rank {ctx.rank} holds it")
            if layout.kind == "replicated":
                replicated[key] = flat.document["items"][key]
        flat.document["layouts"] = layouts
        items.append((st.STATE_ENTRY, st.document_array(flat.document), st.PER_RANK))
    names = [n for n, _, _ in items]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ProtectError(f"the names {dup} are both protected and in the state dict")
    if not items:
        raise ProtectError("nothing to checkpoint: protect() an array or pass a non-empty state dict")
    return items, replicated


def _state_keys_of(ctx, state):
    """Local: {state key: layout kind} of a state dict ({} without one)."""
    return {} if state is None else {k: ctx.layouts.get(k, st.PER_RANK).kind for k in state}


def _names_differ(ctx):
    """Collective (failure path): name the protected arrays that differ between ranks."""
    def pick(everyone):
        r, theirs = next((r, v) for r, v in enumerate(everyone) if v != everyone[0])
        return (f"the ranks disagree on the protected array names: rank 0 has {everyone[0][:8]}, rank {r} has "
                f"{theirs[:8]}; every rank must protect the same names (values that exist on some ranks only "
                "go in the state dict)")
    raise mark_collective(HpcCkptError(explain(ctx.comm, sorted(ctx.arrays), pick)))


def _replicated_differ(ctx, replicated, step):
    """Collective (failure path): name a replicated value that differs, raise everywhere."""
    def pick(everyone):
        for r, theirs in enumerate(everyone):
            keys = sorted(k.removeprefix("state.")          # the user's key, as for an array
                          for k in set(theirs) | set(replicated) if theirs.get(k) != replicated.get(k))
            if keys:
                return (f"checkpoint {step}: the value(s) {keys[:8]} are declared REPLICATED but rank {r} "
                        "holds other values than rank 0 (or lacks them); replicated values must be the same "
                        "on every rank")
        return None
    raise mark_collective(ProtectError(explain(ctx.comm, replicated, pick)))


def _discard(ctx, step, ckpt_id):
    """Local: remove this rank's part of a step that failed to commit (best effort) — never a
    committed manifest of another attempt, run or job that the failed write did not replace."""
    found = ctx.cache.examine(step)
    if found is not None and (found.manifest is None or found.manifest.ckpt_id != ckpt_id):
        return
    try:
        ctx.cache.retire(step)
    except OSError as e:
        log.warning("rank %d: could not clean up failed step %d: %s", ctx.rank, step, e)


def _check_args(ctx, step, level, state):
    """Local: raise on a bad call; return the step as a Python int."""
    step = check_step(step)
    if level not in registry.LEVELS:
        raise HpcCkptError(f"unknown level {level!r}; levels are {', '.join(registry.LEVELS)}")
    if state is not None and not isinstance(state, dict):
        raise ProtectError(f"state must be a dict, got {type(state).__name__}")
    if not ctx.arrays and not state:
        raise ProtectError("nothing to checkpoint: protect() an array or pass a non-empty state dict")
    if ctx.last_step is not None and step <= ctx.last_step:
        raise HpcCkptError(f"step {step} is not newer than the last checkpoint or restart step "
                           f"{ctx.last_step}; steps must increase")
    return step


def threads_ok(ctx):
    """Local: True when background work may run in a thread (the same on every rank); rank 0
    warns once when it may not."""
    if not ctx.threads and ctx.rank == 0 and "threads" not in ctx.warned:
        ctx.warned.add("threads")
        log.warning("background work (async_flush, background) needs MPI_THREAD_MULTIPLE on every rank; "
                    "working synchronously")
    return ctx.threads


def _report_lost_flush(ctx, flush_error):
    if flush_error is not None and ctx.rank == 0:
        log.error("%s", flush_error)


def _defines(level, method):
    """Local: whether ``level`` has a ``method`` of its own (not the interface's no-op)."""
    from .levels.base import Level
    return getattr(type(level), method) is not getattr(Level, method)


def retire(ctx, keep_upto):
    """Local: keep this run's newest ``keep`` committed cache steps up to ``keep_upto``, and the
    newest of each redundant level (local steps taken since must not push out the step a node
    loss needs); remove the rest of this run's (older ones, and newer ones of an abandoned
    attempt) and uncommitted leftovers. Other runs' and other jobs' checkpoints stay, unless
    start = "fresh"."""
    if ctx.flush is not None and ctx.flush.redundant:
        return       # the previous redundant step stays until the new one is complete
    clear = ctx.clear_others and ctx.committed
    redundant = registry.redundant()
    ours, remove, bases, newest_of = [], [], {}, {}
    for step in ctx.cache.steps_on_disk():
        found = ctx.cache.examine(step)
        if found is None:
            remove.append(step)                       # data without a manifest: not a checkpoint
        elif found.state == "ok" and found.manifest.epoch == ctx.epoch:
            ours.append(step)
            if found.manifest.base is not None:
                bases[step] = found.manifest.base[0]
            if step <= keep_upto and found.manifest.level in redundant:
                newest_of[found.manifest.level] = step     # ascending: the newest one wins
        elif clear:
            remove.append(step)
    kept = [s for s in ours if s <= keep_upto][-ctx.config.keep:] + list(newest_of.values())
    # an incremental step's base stays while the step is kept (beyond keep), and so does the
    # base of a level's next incremental step
    kept += [bases[s] for s in kept if s in bases]
    kept += [b for lv in ctx.levels.values() for b in lv.pinned_steps()]
    if ctx.flush is not None:
        kept.append(ctx.flush.step)                 # its files are being read by the background work
    remove += [s for s in ours if s not in kept]
    for step in sorted(set(remove) - set(kept)):
        try:
            ctx.cache.retire(step)
        except OSError as e:
            log.warning("rank %d: could not remove old checkpoint step %d: %s", ctx.rank, step, e)


# ---------------------------------------------------------------------- helpers (local)
def level_code(level):
    """The level's code in reductions: 1 + its index in LEVELS (0 means none)."""
    return registry.LEVELS.index(level) + 1 if level in registry.LEVELS else 0


def check_step(step):
    """Local: ``step`` as a Python int; HpcCkptError unless it is an integer from 0 to MAX_STEP."""
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or not 0 <= step <= mf.MAX_STEP:
        raise HpcCkptError(f"step must be an integer from 0 to {mf.MAX_STEP}, got {step!r}")
    return int(step)


def check_layout(name, array, layout, rank):
    if layout.kind == "block":
        mf.check_global_layout(array.shape, layout.global_shape, layout.offset,
                               lambda msg: ProtectError(f"array {name!r}: {msg}"))
    elif layout.kind == "rows" and array.ndim == 0:
        raise ProtectError(f"array {name!r}: a ROWS layout needs an array of at least one dimension")
    elif layout.kind == "root" and rank != 0:
        raise ProtectError(f"{name!r} is declared ROOT (rank 0 only) but rank {rank} holds it")


def _replicated_digests(manifest, replicated_items, items):
    """{name: text} for this rank's replicated values: arrays by shape, dtype and checksum (of
    their values' bytes: st.value_bytes, where padding makes it differ from the file's), state
    values by their encoding. ``items``: _items' [(name, array, Layout)]."""
    out = {a.name: f"{a.dtype}{list(a.shape)}:{a.checksum}" for a in manifest.arrays if a.layout == "replicated"}
    for name, array, layout in items:
        if layout.kind == "replicated" and name in out and st.has_padding(array.dtype):
            out[name] = f"{array.dtype.str}{list(array.shape)}:{digest(st.value_bytes(array))}"
    out.update({f"state.{k}": json.dumps(v, sort_keys=True) for k, v in replicated_items.items()})
    return out


def digest_int(values):
    return int(digest(json.dumps(values, sort_keys=True).encode()), 16)


def scavenge(ctx):
    """Collective (``hpcckpt scavenge``, the end of a job): protect the newest restorable cache
    checkpoint at the most resilient level that keeps its own copy (pfs), unless that level has
    it already. Returns the step copied, or None."""
    error = background.finish(ctx, raise_error=False, retire=retire)
    if error is not None and ctx.rank == 0:
        log.warning("%s; scavenge copies the newest cache checkpoint instead", error)
    with Collective(ctx.comm, "scavenge: scanning checkpoints") as c:
        found = ctx.cache.scan()
        ok = {f.step: f for f in found if f.state == "ok"}
        c.words = [max((f.key for f in ok.values()), default=0)]
    key = c.result[0]
    if not key:      # an empty cache is nothing to copy; checkpoints it cannot use are an error
        with Collective(ctx.comm, "scavenge: nothing restorable") as c:
            why = ctx.cache.why_unusable(found)
            if why:
                raise IncompatibleCheckpointError(
                    f"scavenge: nothing to copy for job {ctx.config.name!r} on {ctx.comm.size} ranks, but {why}: "
                    "run it with the application's name, number of ranks, placement and configuration")
        return None
    target = ctx.level(ctx.final_level)
    with Collective(ctx.comm, f"scavenge: listing {target.name}") as c:
        offered = target.offers() if ctx.rank == 0 else {}
        step = mf.split_key(key)[1]
        c.words = [1 if step in offered and mf.order_key(offered[step][0], step) >= key else 0]
    if c.result[0]:
        return None
    found = ok.get(step)
    with Collective(ctx.comm, f"scavenge: verifying step {step}") as c:
        manifest = found.manifest if found is not None and found.key == key else None
        bad = manifest is None
        if manifest is not None:
            try:
                ctx.cache.verify(manifest)
            except HpcCkptError:
                bad = True
        h = digest_int(manifest.ckpt_id) if not bad else 0
        c.words = [1 if bad else 0, h, U64_MAX - h]
    if c.result[0] or c.result[1] != U64_MAX - c.result[2]:
        if ctx.rank == 0:
            log.warning("scavenge: step %d cannot be verified on every rank; nothing copied", step)
        return None
    ctx.epoch = mf.split_key(key)[0]
    with Collective(ctx.comm, f"scavenge: the {target.name} copy of step {step}"):
        background.protect(target, manifest)
    with Collective(ctx.comm, f"scavenge: retiring at the {target.name} level"):
        target.retire(manifest, ctx.clear_others and ctx.committed)
    return step

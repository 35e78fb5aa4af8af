"""The decision of an online recovery (hpcckpt.online), pure and local: from the table every
survivor has after the shrink (one row per process left: worker number or -1 for a spare,
original rank, has-a-checkpoint, raised-an-exception), which spare takes which lost worker
number, or why the job cannot go on. Every survivor computes it from the same table, so every
one decides the same without another message.
"""


def decide(table, nworkers, size_before, cause=None):
    """Pure, the same on every survivor (each has the same table): the outcome of a recovery.

    ``table`` rows are (worker number or -1 for a spare, original rank, has-a-checkpoint,
    raised-an-exception) of every process left; ``nworkers`` the workers the job needs;
    ``size_before`` the processes before the failure. Returns (error text or None, {spare's
    original rank: worker number it takes}, whether this run has a checkpoint). Lost numbers go
    in increasing order to the spares in increasing order of their original rank; a process that
    raised ends the job (an error naming the first one, nothing assigned)."""
    present = {int(lg) for lg, _, _, _ in table if lg >= 0}
    missing = sorted(set(range(nworkers)) - present)
    spare_ranks = sorted(int(me) for lg, me, _, _ in table if lg < 0)
    committed = bool(max((int(c) for _, _, c, _ in table), default=0))
    raised = [(int(lg), int(me)) for lg, me, _, r in table if r]
    if raised:
        lg, me = raised[0]
        who = f"worker {lg} (world rank {me})" if lg >= 0 else f"spare process (world rank {me})"
        more = f" and {len(raised) - 1} more process{'es' if len(raised) > 2 else ''}" if len(raised) > 1 else ""
        return (f"{who}{more} raised an exception, which online recovery does not retry (it replaces "
                f"failed processes only)", {}, committed)
    if len(table) == size_before and not missing:
        return (f"an MPI error ({cause}) but no process failed: not a failure online recovery "
                f"can repair", {}, committed)
    if len(missing) > len(spare_ranks):
        return (f"{len(missing)} of the {nworkers} worker ranks are lost (numbers "
                f"{', '.join(map(str, missing[:16]))}) and only {len(spare_ranks)} spare process"
                f"{'es are' if len(spare_ranks) != 1 else ' is'} left: the job cannot go on online. "
                f"Relaunch it (it restarts from the newest checkpoint), with more spares "
                f"(online.run(..., spares=S)) to survive this", {}, committed)
    return None, dict(zip(spare_ranks, missing)), committed

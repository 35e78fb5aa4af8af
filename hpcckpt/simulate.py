"""Discrete-event simulation of a checkpointed application with failures (local; no MPI, no I/O).

The model (all times in seconds):

- The application needs ``work`` seconds of computation. It checkpoints at levels (subset of
  LEVELS, cheapest -> most resilient) with a period per level in seconds of *compute*: level l is
  due when the compute done since the last checkpoint covering l (a checkpoint of level l or
  higher) reaches ``periods[l]``; when several are due only the most resilient is written (it
  covers the lower ones). No checkpoint is written when the work is done. Nested periods
  (integer multiples) give the patterns of interval.multilevel_plan().
- Failures of each class arrive as an independent renewal process (exponential, or Weibull with
  a shape) with the class's MTBF. A class needs a level: the classes are "process", "node" and
  "system", each survived by the levels that declare it or a wider one (``Level.survives``; with
  the built-in levels: local and above, partner and above, pfs), and needs the cheapest of them
  (failure_classes()); a level name can also be used as the class. A failure of class k destroys
  the checkpoints of the levels below the cheapest enabled level surviving it and rolls back to
  the newest checkpoint that survives; if none does, to the start (progress 0). The start counts
  as a checkpoint of the most resilient enabled level (the inputs are on the PFS).
- Failures strike at any time: during computation (the compute since the restored checkpoint is
  lost), during a checkpoint (that checkpoint is not written; the time spent on it counts as
  checkpoint time and the compute before it is lost) and during a restart (the restart starts
  over, from an older checkpoint if the new failure destroyed the one being read; the time spent
  counts as restart time). A restart from a checkpoint of level l costs downtime + restarts[l].
- Accounting is exact: wall = work + checkpoint + lost + restart.

Reproducible: trial i of seed s always sees the same failure trace (numpy Generator seeded with
[s, i, class index], drawn in fixed blocks), whatever the schedule, so sweeps use common random
numbers. The event loop is compiled with numba (cache=True).
"""
import math
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError, HpcCkptError
from .interval import LEVELS, daly, multilevel_periods, ordered_levels, young
from .levels.registry import cheapest_surviving

try:  # numba is a dependency; the pure-Python loop is kept as a fallback
    from numba import njit as _njit
except ImportError:  # pragma: no cover
    _njit = None


def failure_classes():
    """Failure class -> the cheapest registered level that survives it (``Level.survives``)."""
    return cheapest_surviving()


_BLOCK = 256          # failure times are drawn per class in blocks of this size (prefix-stable)
_MAX_SLOWDOWN = 200.0  # give up when the wall time would exceed this many times the work
_MAX_FAILURES = 1_000_000  # ... or when one simulated run would need more failures than this


@dataclass(frozen=True)
class SimResult:
    """One simulated run: seconds of wall time and of each kind of waste, and counts."""
    work: float
    wall: float
    checkpoint: float
    lost: float
    restart: float
    failures: int
    checkpoints: int

    @property
    def efficiency(self):
        return self.work / self.wall

    @property
    def waste(self):
        """Fraction of the wall time not spent on useful work."""
        return 1.0 - self.efficiency


@dataclass(frozen=True)
class SimSummary:
    """Mean over trials. Fractions are of the wall time; *_sem are standard errors of the mean."""
    periods: dict
    trials: int
    efficiency: float
    efficiency_sem: float
    wall: float
    checkpoint: float
    lost: float
    restart: float
    failures: float

    @property
    def waste(self):
        return 1.0 - self.efficiency


def _kernel(work, periods, costs, restarts, downtime, ftimes, flevels, max_wall):
    # periods/costs: per enabled level 0..L-1; restarts: L+1 entries (index L = from the start).
    # ftimes/flevels: failure times and the index of the cheapest enabled level surviving each
    # (L = none); the last entry is a sentinel with level -1 marking the end of the trace.
    # Returns (wall, checkpoint, lost, restart, failures, checkpoints, status);
    # status 0 done, 1 trace too short, 2 gave up (wall > max_wall).
    n_lev = periods.shape[0]
    cover = np.zeros(n_lev + 1)
    src_at = np.full(n_lev + 1, n_lev)
    t = 0.0
    p = 0.0
    ck = 0.0
    lost = 0.0
    rs = 0.0
    nfail = 0
    nck = 0
    fi = 0
    while True:
        nf = ftimes[fi]
        cls = flevels[fi]
        target = math.inf
        for lv in range(n_lev):
            due = cover[lv] + periods[lv]
            if due < target:
                target = due
        lev = -1
        if target < work:
            tol = 1e-9 * max(1.0, target)
            for lv in range(n_lev):
                if cover[lv] + periods[lv] <= target + tol:
                    lev = lv
        else:
            target = work
        dt = target - p
        if t + dt > nf:                       # failure during computation
            if cls < 0:
                return t, ck, lost, rs, nfail, nck, 1
            p_fail = p + (nf - t)
            t = nf
        else:
            t += dt
            p = target
            if lev < 0:
                return t, ck, lost, rs, nfail, nck, 0
            c = costs[lev]
            if t + c > nf:                    # failure during the checkpoint
                if cls < 0:
                    return t, ck, lost, rs, nfail, nck, 1
                ck += nf - t
                t = nf
                p_fail = p
            else:
                t += c
                ck += c
                nck += 1
                for lv in range(lev + 1):
                    cover[lv] = p
                    src_at[lv] = lev
                continue
        while True:                           # failure at time t of class cls
            fi += 1
            nfail += 1
            p0 = cover[cls]
            src = src_at[cls]
            lost += p_fail - p0
            for lv in range(cls):
                cover[lv] = p0
                src_at[lv] = src
            p = p0
            p_fail = p0
            r = downtime + restarts[src]
            nf = ftimes[fi]
            cls = flevels[fi]
            if t > max_wall:
                return t, ck, lost, rs, nfail, nck, 2
            if t + r > nf:                    # failure during the restart
                if cls < 0:
                    return t, ck, lost, rs, nfail, nck, 1
                rs += nf - t
                t = nf
                continue
            t += r
            rs += r
            break


_run_kernel = _njit(cache=True, nogil=True)(_kernel) if _njit is not None else _kernel


def _needs_index(name, spec):
    """(mtbf, index in LEVELS of the cheapest level surviving the class) for one failure class."""
    if isinstance(spec, (tuple, list)):
        if len(spec) != 2:
            raise ConfigError(f"failure class {name!r}: expected (mtbf, level), got {spec!r}")
        mtbf, needs = spec
    else:
        mtbf = spec
        needs = failure_classes().get(name, name)
    if needs not in LEVELS:
        raise ConfigError(f"failure class {name!r}: unknown; use one of "
                          f"{', '.join(failure_classes())} or a level name, or give (mtbf, level)")
    try:
        m = float(mtbf)
    except (TypeError, ValueError):
        raise ConfigError(f"failure class {name!r}: MTBF must be a number of seconds, got {mtbf!r}") from None
    if not math.isfinite(m) or m <= 0:
        raise ConfigError(f"failure class {name!r}: MTBF must be positive and finite, got {mtbf!r}")
    return m, LEVELS.index(needs)


def _classes(failures):
    if not failures:
        raise ConfigError("simulate: give at least one failure class")
    return [(name,) + _needs_index(name, failures[name]) for name in sorted(failures)]


class _Trace:
    """Failure times of one trial, drawn lazily in fixed blocks so that any prefix is stable."""

    def __init__(self, seed, trial, classes, distribution, shape):
        self.classes = classes
        self.gens = [np.random.default_rng([seed, trial, k]) for k in range(len(classes))]
        self.times = [np.empty(0) for _ in classes]
        self.distribution, self.shape = distribution, shape
        self._merged = None

    def _draw(self, k):
        mtbf = self.classes[k][1]
        g = self.gens[k]
        if self.distribution == "exponential":
            gaps = g.exponential(mtbf, _BLOCK)
        else:
            gaps = g.weibull(self.shape, _BLOCK) * (mtbf / math.gamma(1.0 + 1.0 / self.shape))
        start = self.times[k][-1] if self.times[k].size else 0.0
        self.times[k] = np.concatenate([self.times[k], start + np.cumsum(gaps)])

    def merged(self, horizon):
        """(times, class ids, valid horizon) of all failures before a horizon >= ``horizon``."""
        if self._merged is not None and self._merged[2] >= horizon:
            return self._merged
        for k in range(len(self.classes)):
            while not self.times[k].size or self.times[k][-1] < horizon:
                self._draw(k)
        valid = min(t[-1] for t in self.times)
        times = np.concatenate(self.times)
        ids = np.concatenate([np.full(t.size, k, dtype=np.int64) for k, t in enumerate(self.times)])
        keep = times < valid
        times, ids = times[keep], ids[keep]
        order = np.argsort(times, kind="stable")
        times = np.append(times[order], valid)
        ids = np.append(ids[order], -1)
        self._merged = (times, ids, valid)
        return self._merged


@dataclass(frozen=True)
class _Setup:
    work: float
    levels: tuple
    periods: np.ndarray
    costs: np.ndarray
    restarts: np.ndarray
    downtime: float
    class_to_level: np.ndarray   # class id -> enabled level index (len(levels) = none survives)


def _setup(work, periods, costs, classes, restarts, downtime, scratch_restart):
    work = float(work)
    if not math.isfinite(work) or work <= 0:
        raise ConfigError(f"simulate: work must be positive seconds, got {work!r}")
    if not periods:
        raise ConfigError("simulate: give a period for at least one level")
    levels = tuple(ordered_levels(periods))
    restarts = restarts or {}
    per, cst, rst = [], [], []
    for lv in levels:
        if lv not in costs:
            raise ConfigError(f"simulate: no checkpoint cost for level {lv!r}")
        p, c = float(periods[lv]), float(costs[lv])
        r = float(restarts.get(lv, c))
        if not p > 0 or math.isnan(p):
            raise ConfigError(f"simulate: period of {lv} must be > 0 (math.inf: never), got {periods[lv]!r}")
        if not (math.isfinite(c) and c >= 0 and math.isfinite(r) and r >= 0):
            raise ConfigError(f"simulate: costs of {lv} must be finite and >= 0")
        per.append(p)
        cst.append(c)
        rst.append(r)
    rst.append(rst[-1] if scratch_restart is None else float(scratch_restart))
    downtime = float(downtime)
    if not (math.isfinite(downtime) and downtime >= 0):
        raise ConfigError(f"simulate: downtime must be >= 0, got {downtime!r}")
    idx = [LEVELS.index(lv) for lv in levels]
    c2l = []
    for _, _, needs in classes:
        surviving = [i for i, li in enumerate(idx) if li >= needs]
        c2l.append(surviving[0] if surviving else len(levels))
    return _Setup(work, levels, np.array(per), np.array(cst), np.array(rst), downtime,
                  np.array(c2l, dtype=np.int64))


def _run_one(setup, trace):
    horizon = 2.0 * setup.work + 10.0 * float(setup.costs.max() + setup.restarts.max())
    max_wall = _MAX_SLOWDOWN * setup.work
    while True:
        times, ids, valid = trace.merged(horizon)
        flevels = np.where(ids >= 0, setup.class_to_level[np.maximum(ids, 0)], -1)
        out = _run_kernel(setup.work, setup.periods, setup.costs, setup.restarts,
                          setup.downtime, times, flevels, max_wall)
        status = out[6]
        if status == 0:
            wall, ck, lost, rs, nf, nc = out[:6]
            return SimResult(setup.work, float(wall), float(ck), float(lost), float(rs), int(nf), int(nc))
        if status == 2 or valid > max_wall:
            raise HpcCkptError(f"simulate: the run would take more than {_MAX_SLOWDOWN:g} times its work "
                               "(efficiency below 0.5%); check the periods, costs and MTBFs")
        if times.size > _MAX_FAILURES:
            raise HpcCkptError(f"simulate: the run would not end within {_MAX_FAILURES:,} failures (a failure "
                               f"every {valid / times.size:.3g} s on average); check the periods, costs and MTBFs")
        horizon = 2.0 * max(valid, horizon)


def _check_distribution(distribution, shape):
    if distribution not in ("exponential", "weibull"):
        raise ConfigError(f"simulate: distribution must be 'exponential' or 'weibull', got {distribution!r}")
    shape = float(shape)
    if not (math.isfinite(shape) and shape > 0):
        raise ConfigError(f"simulate: Weibull shape must be > 0, got {shape!r}")
    return shape


class _FixedTrace:
    def __init__(self, times, classes):
        times = np.asarray(times, dtype=float)
        self._merged = (np.append(times, math.inf), np.append(np.asarray(classes, dtype=np.int64), -1), math.inf)

    def merged(self, horizon):
        return self._merged


def simulate(work, periods, costs, failures, *, restarts=None, downtime=0.0, distribution="exponential",
             shape=1.0, scratch_restart=None, seed=0, trace=None):
    """Simulate one run (local, deterministic for a seed); returns a SimResult.

    work: compute seconds needed. periods: {level: compute seconds between checkpoints covering
    it} (math.inf: never on its own). costs / restarts: {level: seconds} (restarts default to the
    costs). failures: {class: mtbf seconds} with classes from failure_classes() or level names, or
    {name: (mtbf, level)}. distribution "exponential" or "weibull" (with ``shape``; the scale is
    chosen so the mean is the MTBF). downtime: seconds added to every restart. scratch_restart:
    cost of restarting from the start (default: restart cost of the most resilient level).
    seed: trial 0 of simulate_many(seed=seed). trace: optional (times, class names) list of
    failures to use instead of random ones (for tests and what-if studies).
    """
    shape = _check_distribution(distribution, shape)
    classes = _classes(failures)
    setup = _setup(work, periods, costs, classes, restarts, downtime, scratch_restart)
    if trace is not None:
        times, names = trace
        order = [c[0] for c in classes]
        for n in names:
            if n not in order:
                raise ConfigError(f"simulate: failure class {n!r} in the trace is not in failures")
        if len(times) and (np.any(np.diff(times) < 0) or times[0] < 0):
            raise ConfigError("simulate: trace times must be sorted and >= 0")
        return _run_one(setup, _FixedTrace(times, [order.index(n) for n in names]))
    return _run_one(setup, _Trace(_check_seed(seed), 0, classes, distribution, shape))


def _check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"simulate: seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def sweep(work, schedules, costs, failures, *, trials=100, seed=0, restarts=None, downtime=0.0,
          distribution="exponential", shape=1.0, scratch_restart=None):
    """Simulate each schedule (a periods dict) over the same ``trials`` failure traces (common
    random numbers) and return one SimSummary per schedule (local, deterministic for a seed)."""
    shape = _check_distribution(distribution, shape)
    seed = _check_seed(seed)
    trials = int(trials)
    if trials < 1:
        raise ConfigError(f"simulate: trials must be >= 1, got {trials}")
    classes = _classes(failures)
    setups = [_setup(work, p, costs, classes, restarts, downtime, scratch_restart) for p in schedules]
    results = [[] for _ in setups]
    for i in range(trials):
        trace = _Trace(seed, i, classes, distribution, shape)
        for j, s in enumerate(setups):
            results[j].append(_run_one(s, trace))
    out = []
    for sched, res in zip(schedules, results):
        eff = np.array([r.efficiency for r in res])
        wall = np.array([r.wall for r in res])
        out.append(SimSummary(
            periods=dict(sched), trials=trials, efficiency=float(eff.mean()),
            efficiency_sem=float(eff.std(ddof=1) / math.sqrt(trials)) if trials > 1 else math.nan,
            wall=float(wall.mean()),
            checkpoint=float(np.mean([r.checkpoint / r.wall for r in res])),
            lost=float(np.mean([r.lost / r.wall for r in res])),
            restart=float(np.mean([r.restart / r.wall for r in res])),
            failures=float(np.mean([r.failures for r in res]))))
    return out


def simulate_many(work, periods, costs, failures, *, trials=100, seed=0, **kwargs):
    """Mean of ``trials`` runs of one schedule (trial i uses trace [seed, i]); a SimSummary."""
    return sweep(work, [periods], costs, failures, trials=trials, seed=seed, **kwargs)[0]


def level_rates(levels, failures):
    """{level: rate (1/s) of the failures for which it is the cheapest enabled level surviving}
    for the enabled ``levels`` (pure); classes no enabled level survives are left out."""
    levels = ordered_levels(levels)
    idx = [LEVELS.index(lv) for lv in levels]
    rates = {lv: 0.0 for lv in levels}
    for _, mtbf, needs in _classes(failures):
        surviving = [lv for lv, li in zip(levels, idx) if li >= needs]
        if surviving:
            rates[surviving[0]] += 1.0 / mtbf
    return rates


def formula_periods(kind, costs, failures, levels=None, restarts=None):
    """Periods {level: seconds} chosen by a formula for the enabled ``levels`` (pure).

    kind "young" / "daly": each level gets young()/daly() with the MTBF of the failures for
    which it is the cheapest surviving level (math.inf if there are none); "multilevel":
    interval.multilevel_periods() (nested first-order optimum). ``levels`` defaults to the
    keys of ``costs``.
    """
    levels = ordered_levels(costs if levels is None else levels)
    rates = level_rates(levels, failures)
    if not any(r > 0 for r in rates.values()):
        raise ConfigError("no enabled level survives any of the failure classes")
    if kind == "multilevel":
        return multilevel_periods({lv: costs[lv] for lv in levels}, rates,
                                  restarts={lv: (restarts or costs)[lv] for lv in levels})
    if kind not in ("young", "daly"):
        raise ConfigError(f"unknown formula {kind!r}; use young, daly or multilevel")
    f = young if kind == "young" else daly
    return {lv: (f(costs[lv], 1.0 / rates[lv]) if rates[lv] > 0 else math.inf) for lv in levels}

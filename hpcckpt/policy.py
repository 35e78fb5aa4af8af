"""When to checkpoint, and at which level: the online decision (local, pure Python, no MPI).

The Checkpointer calls a Policy on rank 0 only and broadcasts what it returns:
``start()`` once when computing starts (also after a restart), ``decide(step)`` after each step,
``record_checkpoint(level, seconds)`` after each checkpoint with its cost (slowest rank), and
``should_exit()`` to know when to stop before the job's wall-clock end. Periods, compute time
and step durations are measured on a monotonic clock (``time.monotonic``), so a step of the
system clock cannot delay or hasten a checkpoint; only the comparisons with ``end_time`` (epoch
seconds) use the wall clock (``time.time``). Both clocks are injectable for tests. See
docs/INTERVAL.md for the behaviour and the configuration keys.
"""
import math
import time
from collections import deque

from .errors import ConfigError
from .interval import LEVELS, daly, multilevel_plan, ordered_levels, young
from .units import format_duration, parse_duration

KINDS = ("auto", "fixed", "young", "daly", "multilevel")
DEFAULT_FIXED = ("seconds", 3600.0)
"""Schedule of the most resilient enabled level when kind is "fixed" and no schedule is given."""
UNMEASURED_COST_GUESS = 60.0
"""Checkpoint cost (s) assumed while no checkpoint cost at all has been measured, and the least
assumed for a final checkpoint whose level was never measured."""
MIN_COST = 1e-3
"""Measured costs below this (s) are raised to it before entering a formula."""
COST_WINDOW = 5
"""Number of recent measurements averaged per level (moving average)."""
STEP_WINDOW = 5
"""Number of recent step durations whose maximum estimates the next step."""


def _parse_schedule_entry(level, value):
    what = f"schedule.{level}"
    if isinstance(value, (tuple, list)) and len(value) == 2 and value[0] in ("steps", "seconds"):
        unit, amount = value
    elif isinstance(value, bool):
        raise ConfigError(f"{what}: expected an integer number of steps or a duration, got {value!r}")
    elif isinstance(value, int):
        unit, amount = "steps", value
    elif isinstance(value, str):
        unit, amount = "seconds", value
    else:
        raise ConfigError(f"{what}: expected an integer number of steps, a duration string like '30min', "
                          f"('steps', n) or ('seconds', s); got {value!r}")
    if unit == "steps":
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
            raise ConfigError(f"{what}: number of steps must be an integer >= 1, got {amount!r}")
        return ("steps", amount)
    seconds = parse_duration(amount, what)
    if seconds <= 0:
        raise ConfigError(f"{what}: duration must be > 0, got {amount!r}")
    return ("seconds", seconds)


class Policy:
    """Online checkpoint decision (local state, no MPI). See the module and docs/INTERVAL.md.

    kind: "auto" ("daly" if mtbf or level_mtbf is given, else "fixed"), "fixed", "young", "daly"
    or "multilevel". mtbf: system MTBF (seconds or duration string). level_mtbf: {level: MTBF of
    the failures for which that level is the cheapest able to recover}. schedule (fixed only):
    {level: ("steps", n) | ("seconds", s) | int steps | duration string}. levels: enabled levels (default: the cheapest).
    end_time: epoch seconds of the job's end, or None. final_level: the level of the checkpoint
    taken before end_time (default: pfs if enabled, else the most resilient enabled level; it
    may be a level outside ``levels``, whose costs are then recorded for this use only).
    exit_safety (>= 1): the final checkpoint is requested once now + step + exit_safety *
    (its level's blocking + background time) >= end_time.

    Costs are moving averages per level; the first checkpoint of a level (which pays one-time
    costs: loading kernels, creating files) counts only until a second one is measured.

    clock: the monotonic clock of periods, compute time and step durations (default
    time.monotonic). wall_clock: the clock compared with end_time (default time.time; when only
    ``clock`` is given, that one clock drives both, as a single fake clock in tests does). The
    ``now=`` arguments of the methods are readings of ``clock``, ``wall=`` of ``wall_clock``.
    """

    def __init__(self, *, kind="auto", mtbf=None, level_mtbf=None, schedule=None, levels=None,
                 end_time=None, exit_safety=2.0, final_level=None, clock=None, wall_clock=None):
        if kind not in KINDS:
            raise ConfigError(f"policy: unknown kind {kind!r}; use one of {', '.join(KINDS)}")
        levels = LEVELS[:1] if levels is None else levels          # None: the cheapest level
        if not levels:
            raise ConfigError("policy: at least one checkpoint level must be enabled")
        self.levels = tuple(ordered_levels(levels))
        self.mtbf = None if mtbf is None else parse_duration(mtbf, "mtbf")
        if self.mtbf is not None and self.mtbf <= 0:
            raise ConfigError("mtbf: must be > 0")
        self.level_mtbf = None
        if level_mtbf is not None:
            if not isinstance(level_mtbf, dict) or not level_mtbf:
                raise ConfigError(f"level_mtbf: expected a table level -> duration, got {level_mtbf!r}")
            self.level_mtbf = {}
            for lv, value in level_mtbf.items():
                if lv not in LEVELS:
                    raise ConfigError(f"level_mtbf: unknown level {lv!r}; use {', '.join(LEVELS)}")
                m = parse_duration(value, f"level_mtbf.{lv}")
                if m <= 0:
                    raise ConfigError(f"level_mtbf.{lv}: must be > 0")
                self.level_mtbf[lv] = m
        kind_given = kind
        if kind == "auto":
            kind = "daly" if (self.mtbf is not None or self.level_mtbf is not None) else "fixed"
        if kind in ("young", "daly", "multilevel") and self.mtbf is None and self.level_mtbf is None:
            raise ConfigError(f"policy {kind!r} needs mtbf or level_mtbf")
        if kind == "multilevel" and self.level_mtbf is None:
            raise ConfigError("policy 'multilevel' needs level_mtbf (the MTBF per level)")
        self.kind = kind
        self.schedule = None
        self.default_schedule = kind == "fixed" and schedule is None
        self._default_reason = ("no schedule or mtbf given" if kind_given == "auto" else "no schedule given")
        if kind == "fixed":
            raw = schedule if schedule is not None else {self.levels[-1]: DEFAULT_FIXED}
            if not isinstance(raw, dict) or not raw:
                raise ConfigError(f"schedule: expected a table level -> steps or duration, got {raw!r}")
            self.schedule = {}
            for lv, value in raw.items():
                if lv not in self.levels:
                    raise ConfigError(f"schedule: level {lv!r} is not enabled (enabled: {', '.join(self.levels)})")
                self.schedule[lv] = _parse_schedule_entry(lv, value)
        self.rates = self._rates()
        if kind != "fixed" and not any(r > 0 for r in self.rates.values()):
            raise ConfigError("level_mtbf: none of the given failures is survived by an enabled level")
        if end_time is not None:
            end_time = float(end_time)
            if not math.isfinite(end_time):
                raise ConfigError(f"end_time: must be finite epoch seconds, got {end_time!r}")
        self.end_time = end_time
        exit_safety = float(exit_safety)
        if not (math.isfinite(exit_safety) and exit_safety >= 1.0):
            raise ConfigError(f"exit_safety: must be a number >= 1, got {exit_safety!r}")
        self.exit_safety = exit_safety
        if final_level is not None and final_level not in LEVELS:
            raise ConfigError(f"final_level: unknown level {final_level!r}; use {', '.join(LEVELS)}")
        self.final_level = final_level or self.levels[-1]      # the most resilient of its levels
        self.measured_levels = tuple(ordered_levels(set(self.levels) | {self.final_level}))
        if clock is None:
            clock, wall_clock = time.monotonic, (time.time if wall_clock is None else wall_clock)
        elif wall_clock is None:
            wall_clock = clock
        self.clock = clock
        self.wall_clock = wall_clock
        self._costs = {lv: _Window() for lv in self.measured_levels}
        self._background = {lv: _Window() for lv in self.measured_levels}
        self._steps = deque(maxlen=STEP_WINDOW)
        self._started = False
        self._periods = None
        self._ratios = None
        self._count = {lv: 0 for lv in self.levels}   # multilevel: checkpoints covering lv since one covering the next
        self.final_requested = False
        self.final_taken = False
        self._final_guessed = False      # the final checkpoint was requested on a guessed cost
        self._probe_requested = False

    # -- state -------------------------------------------------------------------------------

    def _rates(self):
        """{enabled level: failure rate (1/s) used to size its period}."""
        rates = {lv: 0.0 for lv in self.levels}
        if self.level_mtbf is not None:
            for lv, m in self.level_mtbf.items():
                surviving = [e for e in self.levels if LEVELS.index(e) >= LEVELS.index(lv)]
                if surviving:            # failures no enabled level survives do not size any period
                    rates[surviving[0]] += 1.0 / m
        elif self.mtbf is not None:      # only the system MTBF: size every level with it (conservative)
            rates = {lv: 1.0 / self.mtbf for lv in self.levels}
        return rates

    def _now(self, now):
        return self.clock() if now is None else float(now)

    def _wall(self, wall):
        return self.wall_clock() if wall is None else float(wall)

    def start(self, now=None):
        """Start (or restart) the timers: called once when the application starts computing."""
        now = self._now(now)
        self._started = True
        self._mark = now                                   # end of the last checkpoint (or start)
        self._since = {lv: 0.0 for lv in self.levels}      # compute since the last covering checkpoint
        self._last_decide = None
        self._ckpt_since_decide = 0.0
        self._count = {lv: 0 for lv in self.levels}

    def set_end_time(self, end_time):
        """Set or clear (None) the job's wall-clock end in epoch seconds."""
        self.end_time = None if end_time is None else float(end_time)

    def cost(self, level):
        """Moving average of the measured cost of a level (s), or None if never measured."""
        values = self._costs[level]
        return sum(values) / len(values) if values else None

    def background_cost(self, level):
        """Moving average of the time a level's background work took (s), or None if it never
        ran in the background. The intervals use :meth:`cost`: what the application waited."""
        values = self._background.get(level)
        return sum(values) / len(values) if values else None

    def record_background(self, level, seconds):
        """Record that the background work of one ``level`` checkpoint took ``seconds`` (slowest
        rank); ``record_checkpoint`` has recorded its blocking time."""
        if level in self._background and math.isfinite(seconds) and seconds >= 0:
            self._background[level].add(float(seconds))

    def _cost_or_guess(self, level):
        c = self.cost(level)
        if c is not None:
            return c
        known = [self.cost(lv) for lv in self.levels if self._costs[lv]]
        return max(known) if known else UNMEASURED_COST_GUESS

    def record_checkpoint(self, level, seconds, now=None):
        """Record one checkpoint of ``level`` that took ``seconds`` (slowest rank), ending at ``now``."""
        if level not in self._costs:
            raise ConfigError(f"record_checkpoint: level {level!r} is not enabled")
        seconds = float(seconds)
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ConfigError(f"record_checkpoint: seconds must be finite and >= 0, got {seconds!r}")
        now = self._now(now)
        if not self._started:
            self.start(now - seconds)
        compute = max(0.0, now - seconds - self._mark)
        for lv in self.levels:               # a checkpoint covers its level and every level below
            covered = LEVELS.index(lv) <= LEVELS.index(level)
            self._since[lv] = 0.0 if covered else self._since[lv] + compute
            if covered and lv != level:
                self._count[lv] = 0
        if level in self._count:
            self._count[level] += 1
        self._mark = now
        self._ckpt_since_decide += seconds
        self._costs[level].add(seconds)
        self._periods = None
        if self.final_requested and level == self.final_level:
            if self._final_guessed and not self._final_due(self._wall(None)):
                # requested on the guess; its measured cost leaves time: an ordinary checkpoint
                self.final_requested = self._final_guessed = False
            else:
                self.final_taken = True

    def compute_since(self, level, now=None):
        """Seconds of computation since the last checkpoint covering ``level`` (or the start)."""
        now = self._now(now)
        return self._since[level] + max(0.0, now - self._mark)

    def periods(self):
        """{level: compute seconds between checkpoints covering it} for the formula kinds
        (math.inf: never on its own; costs not yet measured are guessed), or for "fixed" the
        levels scheduled in seconds."""
        if self.kind == "fixed":
            return {lv: s for lv, (u, s) in self.schedule.items() if u == "seconds"}
        if self._periods is None:
            costs = {lv: max(MIN_COST, self._cost_or_guess(lv)) for lv in self.levels}
            if self.kind == "multilevel":
                plan = multilevel_plan(costs, self.rates)
                self._periods, self._ratios = plan.periods, plan.ratios
            else:
                f = young if self.kind == "young" else daly
                self._periods = {lv: (f(costs[lv], 1.0 / r) if r > 0 else math.inf)
                                 for lv, r in self.rates.items()}
        return self._periods

    def _step_estimate(self):
        return max(self._steps) if self._steps else 0.0

    def _final_cost(self):
        """Seconds from the final checkpoint's start until it is durable: its level's blocking plus
        background time as measured; never measured: the larger of UNMEASURED_COST_GUESS and the
        slowest level measured (it is re-judged once measured, see record_checkpoint)."""
        c = self.cost(self.final_level)
        if c is None:
            return max(UNMEASURED_COST_GUESS, self._cost_or_guess(self.final_level))
        return c + (self.background_cost(self.final_level) or 0.0)

    def _final_due(self, wall):
        if self.end_time is None:
            return False
        return wall + self._step_estimate() + self.exit_safety * self._final_cost() >= self.end_time

    # -- decisions ---------------------------------------------------------------------------

    def decide(self, step, now=None, wall=None):
        """The level to checkpoint after step ``step`` (0-based index of the step just done), or None.

        Order: (1) with end_time, the final checkpoint (pfs, else the most resilient enabled
        level) once now + step estimate + exit_safety * its cost >= end_time, requested once;
        nothing after it — unless its cost was guessed (UNMEASURED_COST_GUESS) and, measured,
        leaves time: then it was an ordinary checkpoint and the final one comes later. (2) formula kinds: the cheapest level at the first call while no cost
        is measured. (3) the most resilient level due: fixed ("steps", n) when (step + 1) % n == 0;
        ("seconds", s) and young/daly periods when the compute since the last checkpoint covering
        the level reaches its period; "multilevel" when the cheapest level's period is reached,
        promoted to the next level on every ratio-th checkpoint covering a level (exact nesting,
        whatever the step length). ``now``: a reading of the monotonic clock; ``wall``: of the
        wall clock (compared with end_time).
        """
        now = self._now(now)
        if not self._started:
            self.start(now)
        if self._last_decide is not None:
            self._steps.append(max(0.0, now - self._last_decide - self._ckpt_since_decide))
        self._last_decide = now
        self._ckpt_since_decide = 0.0
        if self.final_requested or self.final_taken:
            return None
        if self.end_time is not None and self._final_due(self._wall(wall)):
            self.final_requested = True
            self._final_guessed = self.cost(self.final_level) is None
            return self.final_level
        if self.kind != "fixed" and not self._probe_requested and not any(self._costs.values()):
            self._probe_requested = True
            return self.levels[0]
        due = None
        if self.kind == "fixed":
            for lv, (unit, amount) in self.schedule.items():
                ok = (step + 1) % amount == 0 if unit == "steps" else self.compute_since(lv, now) >= amount
                if ok and (due is None or LEVELS.index(lv) > LEVELS.index(due)):
                    due = lv
        elif self.kind == "multilevel":
            periods = self.periods()
            if self.compute_since(self.levels[0], now) >= periods[self.levels[0]]:
                i = 0                        # promote every ratio-th checkpoint covering a level
                while (i + 1 < len(self.levels) and math.isfinite(periods[self.levels[i + 1]])
                       and self._count[self.levels[i]] + 1 >= self._ratios[self.levels[i]]):
                    i += 1
                due = self.levels[i]
        else:
            for lv, period in self.periods().items():
                if self.compute_since(lv, now) >= period:
                    due = lv                 # periods() is ordered cheapest -> most resilient
        return due

    def should_exit(self, wall=None):
        """True once the final checkpoint is recorded, or when another step plus a checkpoint of the
        final level would not end before end_time (``wall``: a reading of the wall clock)."""
        if self.final_taken:
            return True
        if self.end_time is None:
            return False
        wall = self._wall(wall)
        return wall + self._step_estimate() + self._final_cost() >= self.end_time

    def summary(self):
        """One line of plain text: the schedule in force (for the start-up log).

        e.g. "fixed schedule (default: no schedule or mtbf given): local every 60 min of compute",
        "daly, in compute time: local every 2.3 min, pfs every 41 min (MTBF ...; costs ...)".
        """
        if self.kind == "fixed":
            head = "fixed schedule" + (f" (default: {self._default_reason})" if self.default_schedule else "")
            parts = []
            for lv in self.levels:
                if lv in self.schedule:
                    unit, amount = self.schedule[lv]
                    parts.append(f"{lv} every {'step' if amount == 1 else f'{amount} steps'}" if unit == "steps"
                                 else f"{lv} every {format_duration(amount)} of compute")
            text = f"{head}: {', '.join(parts)}"
        else:
            periods = self.periods()
            parts = []
            for i, lv in enumerate(self.levels):
                p = periods[lv]
                if math.isinf(p):
                    parts.append(f"{lv} never on its own")
                elif self.kind == "multilevel" and i > 0:
                    below, n = self.levels[i - 1], int(self._ratios[self.levels[i - 1]])
                    parts.append(f"{lv} {'at every' if n == 1 else f'every {_ordinal(n)}'} {below} checkpoint "
                                 f"({format_duration(p)})")
                else:
                    parts.append(f"{lv} every {format_duration(p)}")
            if self.level_mtbf is None:
                mtbf = f"MTBF {format_duration(self.mtbf)} for every level"
            else:
                mtbf = "MTBF of the failures each level is the cheapest to survive: " + ", ".join(
                    f"{lv} {format_duration(1.0 / r)}" if r > 0 else f"{lv} none"
                    for lv, r in self.rates.items())
            if any(self._costs.values()):
                costs = "costs measured so far: " + ", ".join(
                    f"{lv} {format_duration(self.cost(lv))}" if self._costs[lv]
                    else f"{lv} not yet (assumed {format_duration(self._cost_or_guess(lv))})"
                    for lv in self.levels)
                costs += "".join(f", {lv} {format_duration(self.background_cost(lv))} more in the background"
                                 for lv in self.levels if self._background[lv])
            else:
                costs = (f"no cost measured yet: {format_duration(UNMEASURED_COST_GUESS)} assumed "
                         f"until a first {self.levels[0]} checkpoint measures it")
            text = f"{self.kind}, in compute time: {', '.join(parts)} ({mtbf}; {costs})"
        if self.end_time is not None:
            text += (f"; final {self.final_level} checkpoint before the job's end at "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.end_time))}")
        return text

    def describe(self):
        """A JSON-able dict for logs: kind, levels, periods, schedule, costs, MTBFs, end state."""
        return {
            "kind": self.kind,
            "levels": list(self.levels),
            "periods": ({lv: (None if math.isinf(p) else p) for lv, p in self.periods().items()}),
            "schedule": (None if self.schedule is None else {lv: list(v) for lv, v in self.schedule.items()}),
            "costs": {lv: self.cost(lv) for lv in self.levels},
            "mtbf": {lv: (1.0 / r if r > 0 else None) for lv, r in self.rates.items()},
            "end_time": self.end_time,
            "exit_safety": self.exit_safety,
            "final_level": self.final_level,
            "final_requested": self.final_requested,
            "final_taken": self.final_taken,
            "step_estimate": self._step_estimate(),
        }


class _Window(deque):
    """Local: a level's recent measurements (their mean is its cost). The level's first one pays
    one-time costs (kernels loaded, files created) and is dropped when the second arrives."""

    def __init__(self):
        super().__init__(maxlen=COST_WINDOW)
        self.first = True

    def add(self, seconds):
        if self.first and self:
            self.clear()
            self.first = False
        self.append(seconds)


def _ordinal(n):
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"

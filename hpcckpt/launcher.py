"""The restart loop behind ``hpcckpt run``: rerun a launch command until it succeeds (local).

SCR's scr_srun idea: inside one allocation, when a run fails (a rank dies, a node goes down),
relaunch it from the newest checkpoint (the application calls restart()) up to N times.
Usable without SLURM: any command works. The launch command runs in its own process group;
SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 received by the loop are forwarded to that group,
and after any of them the loop makes no further attempt (the job is being stopped).

Each attempt gets ``CKPT_RUN_ATTEMPT`` (0, 1, ...) in its environment, and, after a failure
with ``exclude_failed_node``, ``CKPT_FAILED_NODES`` (comma-separated). When the launch command
is ``srun ...`` those nodes are also excluded with ``srun --exclude=NODES`` (leave spare nodes
in the allocation for that: srun -N must still fit).
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

from .errors import HpcCkptError
from . import slurm

ATTEMPT_ENV = "CKPT_RUN_ATTEMPT"
FAILED_NODES_ENV = "CKPT_FAILED_NODES"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
KILL_GRACE = 10.0   # seconds between SIGTERM and SIGKILL when an attempt times out

# srun's report of a failed task: "srun: error: n2: task 1: Killed" / "tasks 0-3: Exited with ..."
_SRUN_ERROR = re.compile(r"^srun: error: ([^\s:]+): tasks? [0-9,\-]+: ")


def exit_status(returncode):
    """Pure: a Popen returncode as a shell exit status (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def failed_nodes_from_srun(lines):
    """Pure: the nodes srun reports failed tasks on, in order of appearance, up to the moment srun
    starts terminating the step (with --kill-on-bad-exit, the tasks killed after that on other
    nodes are collateral: "srun: ... Terminating StepId=...")."""
    nodes = []
    for line in lines:
        line = line.strip()
        if "Terminating StepId" in line or "Terminating job step" in line:
            break
        m = _SRUN_ERROR.match(line)
        if m and m.group(1) not in nodes:
            nodes.append(m.group(1))
    return nodes


def unhealthy_nodes(sinfo_text):
    """Pure: nodes that are down, drained, failing or not responding, from
    ``sinfo -h -N -o "%N %t"`` output (state codes like down*, drain, fail, idle*)."""
    bad = []
    for line in sinfo_text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, state = parts[0], parts[1].lower()
        if state.endswith("*") or state.rstrip("*~#!%$@^-") in ("down", "drain", "drng", "fail", "failg", "maint"):
            if name not in bad:
                bad.append(name)
    return bad


def with_exclusion(command, nodes):
    """Pure: ``srun ...`` with ``--exclude=NODES`` added after the srun word; other commands as is."""
    if not nodes or not command or os.path.basename(command[0]) != "srun":
        return list(command)
    return [command[0], "--exclude=" + ",".join(nodes)] + list(command[1:])


def _allocation_unhealthy():
    """Local: unhealthy nodes of this job's allocation per sinfo ([] outside SLURM or on error)."""
    nodes = slurm.node_list()
    exe = shutil.which("sinfo")
    if not nodes or exe is None:
        return []
    try:
        proc = subprocess.run([exe, "-h", "-N", "-o", "%N %t", "-n", ",".join(nodes)], capture_output=True,
                              text=True, timeout=slurm.SCONTROL_TIMEOUT, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return unhealthy_nodes(proc.stdout) if proc.returncode == 0 else []


class RestartLoop:
    """Run ``command`` up to 1 + ``max_restarts`` times until it exits 0 (local).

    ``run()`` returns the exit status of the last attempt (128 + N when killed by signal N).
    ``timeout``: seconds per attempt (None: no limit); an attempt over it gets SIGTERM, then
    SIGKILL after KILL_GRACE seconds, and counts as a failure (status 124 unless it dies of
    the signal). ``delay``: seconds to wait before each relaunch.
    """

    def __init__(self, command, max_restarts=0, *, exclude_failed_node=False, timeout=None, delay=0.0,
                 env=None, out=None):
        if not command:
            raise HpcCkptError("no launch command given (usage: hpcckpt run [options] -- COMMAND ...)")
        if max_restarts < 0:
            raise HpcCkptError(f"--max-restarts must be >= 0, got {max_restarts}")
        if timeout is not None and timeout <= 0:
            raise HpcCkptError(f"--timeout must be > 0, got {timeout}")
        if delay < 0:
            raise HpcCkptError(f"--delay must be >= 0, got {delay}")
        self.command = list(command)
        self.max_restarts = max_restarts
        self.exclude_failed_node = exclude_failed_node
        self.timeout = timeout
        self.delay = delay
        self.env = dict(os.environ if env is None else env)
        self.out = out or sys.stderr
        self.excluded = []
        self.attempts = []          # (attempt, exit status, seconds)
        self._child = None
        self._signalled = None
        self._stop = threading.Event()      # set by a forwarded signal: ends the wait before a relaunch

    def say(self, text):
        print(f"hpcckpt run: {text}", file=self.out, flush=True)

    # -- signals: forward to the child's process group, make no further attempt
    def _forward(self, signum, frame):
        self._signalled = signum
        self._stop.set()
        child = self._child
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _install(self):
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {s: signal.signal(s, self._forward) for s in FORWARDED}

    def run(self):
        """Local: the loop; returns the exit status of the last attempt."""
        previous = self._install()
        try:
            return self._loop()
        finally:
            for s, old in previous.items():
                signal.signal(s, old if old is not None else signal.SIG_DFL)

    def _loop(self):
        total = self.max_restarts + 1
        status = 0
        for attempt in range(total):
            command = with_exclusion(self.command, self.excluded)
            self.say(f"attempt {attempt + 1} of {total}: {shlex.join(command)}")
            t0 = time.monotonic()
            status, srun_failed = self._attempt(attempt, command)
            seconds = time.monotonic() - t0
            self.attempts.append((attempt, status, seconds))
            if status == 0:
                self.say(f"attempt {attempt + 1} succeeded after {seconds:.1f} s")
                return 0
            what = f"attempt {attempt + 1} failed with exit status {status} after {seconds:.1f} s"
            if self._signalled is not None:
                self.say(f"{what}; got {signal.Signals(self._signalled).name}: no further attempt")
                return status
            if attempt + 1 == total:
                self.say(f"{what}; no restarts left")
                return status
            if self.exclude_failed_node:
                for node in srun_failed + _allocation_unhealthy():
                    if node not in self.excluded:
                        self.excluded.append(node)
                if self.excluded:
                    what += f"; excluding node(s) {','.join(self.excluded)}"
            self.say(f"{what}; relaunching ({total - attempt - 1} restart(s) left)")
            if self.delay:
                self._stop.wait(self.delay)
            if self._signalled is not None:
                self.say(f"got {signal.Signals(self._signalled).name} while waiting to relaunch: no further attempt")
                return status
        return status

    def _attempt(self, attempt, command):
        """Run one attempt; returns (exit status, nodes srun reported failed tasks on)."""
        env = dict(self.env)
        env[ATTEMPT_ENV] = str(attempt)
        if self.excluded:
            env[FAILED_NODES_ENV] = ",".join(self.excluded)
        watch = self.exclude_failed_node
        try:
            self._child = subprocess.Popen(command, env=env, start_new_session=True,
                                           stderr=subprocess.PIPE if watch else None,
                                           text=watch, errors="replace" if watch else None, bufsize=1 if watch else -1)
        except OSError as e:
            raise HpcCkptError(f"cannot start {command[0]!r}: {e.strerror}") from None
        lines = []
        reader = None
        if watch:
            reader = threading.Thread(target=self._tee, args=(self._child.stderr, lines), daemon=True)
            reader.start()
        status = self._wait(self._child)
        if reader is not None:
            reader.join(timeout=5)
        self._child = None
        return status, failed_nodes_from_srun(lines)

    @staticmethod
    def _tee(stream, lines):
        for line in stream:
            sys.stderr.write(line)
            sys.stderr.flush()
            lines.append(line)

    def _wait(self, child):
        try:
            return exit_status(child.wait(timeout=self.timeout))
        except subprocess.TimeoutExpired:
            self.say(f"attempt over its time limit of {self.timeout:g} s: sending SIGTERM")
            _killpg(child, signal.SIGTERM)
            try:
                rc = child.wait(timeout=KILL_GRACE)
            except subprocess.TimeoutExpired:
                _killpg(child, signal.SIGKILL)
                rc = child.wait()
            return 124 if rc == 0 else exit_status(rc)
        finally:
            if child.poll() is None:          # an exception while waiting: leave nothing behind
                _killpg(child, signal.SIGKILL)
                child.wait()


def _killpg(child, sig):
    try:
        os.killpg(child.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_with_restarts(command, max_restarts=0, **options):
    """Local: RestartLoop(command, max_restarts, **options).run() -> exit status of the last attempt."""
    return RestartLoop(command, max_restarts, **options).run()

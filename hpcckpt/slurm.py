"""The SLURM environment: job id, restart count, nodes, end time, and stop signals.

Everything here is local (no MPI) and pure where possible: the readers take an optional
``environ`` mapping (default ``os.environ``) so they can be tested without SLURM.

Stop requests. ``install_stop_handler()`` installs a handler for SIGUSR1 and SIGTERM that only
records the signal (no MPI, no I/O in a signal handler); ``stop_requested()`` reports it. The
Checkpointer turns that into one agreed final ``pfs`` checkpoint and ``should_exit()``.
As a second way in, when the environment variable ``CKPT_STOP_FILE`` names a file,
``stop_requested()`` also returns True once that file exists (checked at most once a second).
The job templates in jobs/ touch the stop file from their batch-shell trap (restart-loop.sbatch
also forwards the signal to `hpcckpt run`, which passes it on to the ranks): a signal alone can
be lost -- MPICH's MPI_Init installs a SIGUSR1 handler of its own, so a rank that gets it while
starting neither dies nor stops.

The other way out: when ``CKPT_STOPPED_FILE`` names a file, rank 0 writes one line to it when
``should_exit()`` first tells the application to stop (a stop request or the job's end time),
so the job script can tell a run that stopped early -- and must be resubmitted or requeued --
from one that finished. (The names do not start with ``HPCCKPT_``: those are configuration keys.)
"""
import os
import re
import shutil
import signal
import subprocess
import threading
import time

STOP_FILE_ENV = "CKPT_STOP_FILE"
STOPPED_FILE_ENV = "CKPT_STOPPED_FILE"
STOP_FILE_POLL = 1.0           # seconds between checks of the stop file
SCONTROL_TIMEOUT = 10.0        # seconds

_stop_signal = None            # the number of the first stop signal received, or None
_previous = {}                 # signal number -> the handler before install_stop_handler()
_stop_file_seen = None         # the stop file found, or None
_last_poll = None


# ---------------------------------------------------------------- environment (pure)
def in_slurm(environ=None):
    """Local: True inside a SLURM job (SLURM_JOB_ID is set)."""
    return job_id(environ) is not None


def job_id(environ=None):
    """Local: the SLURM job id as a string, or None outside SLURM."""
    environ = os.environ if environ is None else environ
    value = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    return value.strip() if value and value.strip() else None


def restart_count(environ=None):
    """Local: how many times this job was requeued (SLURM_RESTART_COUNT); 0 when unset or invalid."""
    environ = os.environ if environ is None else environ
    try:
        return max(0, int(environ.get("SLURM_RESTART_COUNT", "0")))
    except ValueError:
        return 0


def node_list(environ=None):
    """Local: the job's node names, expanded from SLURM_JOB_NODELIST (e.g. 'n[1-3]' -> n1 n2 n3);
    [] outside SLURM."""
    environ = os.environ if environ is None else environ
    text = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    return expand_hostlist(text)


def expand_hostlist(text):
    """Pure: expand a SLURM host list such as 'n[1-2,5],gpu[01-02]x' into a list of names.

    Ranges keep their zero padding ('[08-10]' -> 08 09 10); several bracket groups in one name
    are expanded in order. Raises ValueError on an unbalanced or malformed list.
    """
    names = []
    for item in _split_top_level(text.strip()):
        names.extend(_expand_one(item))
    return names


def _split_top_level(text):
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"host list {text!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"host list {text!r}: unbalanced '['")
    items.append(text[start:])
    return [s.strip() for s in items if s.strip()]


def _expand_one(item):
    m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", item)
    if not m:
        return [item]
    prefix, ranges, rest = m.groups()
    tails = _expand_one(rest) if rest else [""]
    out = []
    for part in ranges.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"host list item {item!r}: bad range {part!r}")
        width = len(lo)
        for n in range(int(lo), int(hi if sep else lo) + 1):
            for tail in tails:
                out.append(f"{prefix}{n:0{width}d}{tail}")
    return out


# ---------------------------------------------------------------- scontrol
def parse_scontrol(text):
    """Pure: ``scontrol show job`` output (one line with -o, or several) -> {key: value} of the
    first record. Values keep inner '=' (TRES=cpu=4,node=2) and spaces up to the next key."""
    record = text.strip().split("\n\n")[0]
    pairs = re.findall(r"(?:^|\s)([A-Za-z][\w:/.]*)=(.*?)(?=\s+[A-Za-z][\w:/.]*=|\s*$)", record, re.S)
    return {k: v.strip() for k, v in pairs}


def parse_slurm_time(text):
    """Pure: a SLURM timestamp such as '2024-05-01T12:34:56' (local time) -> epoch seconds;
    None for 'Unknown', 'None', 'N/A' or anything unparseable."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError, AttributeError):
        return None


def end_time_from_scontrol(text):
    """Pure: the job's EndTime in epoch seconds from ``scontrol show job`` output; None when the
    time limit is UNLIMITED or the EndTime is unknown."""
    fields = parse_scontrol(text)
    if fields.get("TimeLimit", "").upper() in ("UNLIMITED", "INFINITE"):
        return None
    return parse_slurm_time(fields.get("EndTime", ""))


def scontrol_show_job(job=None, environ=None, timeout=SCONTROL_TIMEOUT):
    """Local: the text of ``scontrol show job -o JOB`` (default: this job), or None when there is
    no job, no scontrol, or it fails or times out."""
    job = job if job is not None else job_id(environ)
    exe = shutil.which("scontrol")
    if job is None or exe is None:
        return None
    try:
        proc = subprocess.run([exe, "show", "job", "-o", str(job)], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 and proc.stdout.strip() else None


def job_end_time(job_id=None, environ=None):
    """Local: the job's end (epoch seconds) from ``scontrol show job`` EndTime; None outside SLURM,
    for an unlimited job, or when scontrol fails. Calls scontrol: call it once, on one rank."""
    text = scontrol_show_job(job_id, environ)
    return None if text is None else end_time_from_scontrol(text)


# ---------------------------------------------------------------- stop requests
def _signum(sig):
    if isinstance(sig, int):
        return signal.Signals(sig)
    name = str(sig).upper()
    return signal.Signals[name if name.startswith("SIG") else "SIG" + name]


def _on_stop_signal(signum, frame):
    """The handler: record the signal, nothing else (no MPI, no I/O)."""
    global _stop_signal
    if _stop_signal is None:
        _stop_signal = signum


def install_stop_handler(signals=("USR1", "TERM")):
    """Local: on each of ``signals`` (names like "USR1" or numbers) only record a stop request.

    Returns True when installed; False when not in the main thread (Python allows signal
    handlers only there). Calling it again is harmless. Note: with SIGTERM handled, a plain
    ``scancel`` (or the end of the time limit) no longer kills the process at once; the
    application is expected to checkpoint and exit before SLURM's KillWait ends with SIGKILL.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in signals:
        num = _signum(sig)
        if num not in _previous:
            _previous[num] = signal.signal(num, _on_stop_signal)
    return True


def uninstall_stop_handler():
    """Local: restore the handlers that install_stop_handler() replaced."""
    if threading.current_thread() is not threading.main_thread():
        return
    for num, old in list(_previous.items()):
        signal.signal(num, old if old is not None else signal.SIG_DFL)
        del _previous[num]


def handler_installed():
    """Local: True while install_stop_handler() is in effect."""
    return bool(_previous)


def stop_file(environ=None):
    """Local: the stop file named by CKPT_STOP_FILE, or None."""
    environ = os.environ if environ is None else environ
    return environ.get(STOP_FILE_ENV) or None


def report_stopped(text, environ=None):
    """Local: write ``text`` (one line) to the file named by CKPT_STOPPED_FILE, if any, replacing
    it whole (a temporary file renamed). Returns the path, or None when no file is named."""
    environ = os.environ if environ is None else environ
    path = environ.get(STOPPED_FILE_ENV) or None
    if path:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text.rstrip("\n") + "\n")
        os.replace(tmp, path)
    return path


def stop_requested(environ=None):
    """Local: True once a stop signal arrived or the stop file (CKPT_STOP_FILE) exists.

    The file is checked at most once per STOP_FILE_POLL seconds, so calling this every step is
    cheap. The Checkpointer agrees on it collectively; on its own it is this process's view.
    """
    global _last_poll, _stop_file_seen
    if _stop_signal is not None or _stop_file_seen is not None:
        return True
    path = stop_file(environ)
    if path:
        now = time.monotonic()
        if _last_poll is None or now - _last_poll >= STOP_FILE_POLL:
            _last_poll = now
            if os.path.exists(path):
                _stop_file_seen = path
                return True
    return False


def stop_reason():
    """Local: why a stop was requested ('signal SIGUSR1', 'stop file PATH'), or None."""
    if _stop_signal is not None:
        return f"signal {signal.Signals(_stop_signal).name}"
    if _stop_file_seen is not None:
        return f"stop file {_stop_file_seen}"
    return None


def clear_stop():
    """Local: forget a recorded stop request (the stop file itself is not removed)."""
    global _stop_signal, _stop_file_seen, _last_poll
    _stop_signal = None
    _stop_file_seen = None
    _last_poll = None

"""Unit tests of the pure and local parts of hpcckpt.slurm, hpcckpt.launcher and `hpcckpt run`."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hpcckpt import launcher, slurm
from hpcckpt.launcher import RestartLoop

# `scontrol show job -o 1` and `scontrol show job 1` on the local test cluster (slurm-wlm 22.05)
SHOW_JOB_ONELINE = (
    "JobId=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=00:05:00 TimeMin=N/A "
    "SubmitTime=2026-12-02T12:08:17 EligibleTime=2026-12-02T12:08:17 AccrueTime=2026-12-02T12:08:17 "
    "StartTime=2026-12-02T12:08:18 EndTime=2026-12-02T12:13:18 Deadline=N/A SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-12-02T12:08:18 Scheduler=Backfill Partition=debug "
    "AllocNode:Sid=localhost:16618 ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-2] BatchHost=n1 "
    "NumNodes=2 NumCPUs=4 NumTasks=4 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=4,node=2,billing=4 "
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=(null) WorkDir=/tmp StdErr=/tmp/slurm-1.out StdIn=/dev/null StdOut=/tmp/slurm-1.out Power= \n")
SHOW_JOB_MULTILINE = """\
JobId=1 JobName=wrap
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:01 TimeLimit=00:05:00 TimeMin=N/A
   StartTime=2026-12-02T12:08:18 EndTime=2026-12-02T12:13:18 Deadline=N/A
   NodeList=n[1-2]
   TRES=cpu=4,node=2,billing=4
   Command=(null)
   Power=

"""
# what srun printed when rank 3 was SIGKILLed under --kill-on-bad-exit=1
SRUN_KILLED = """\
CRASH rank 3 after step 34
srun: error: n2: task 3: Killed
srun: launch/slurm: _step_signal: Terminating StepId=4.0
slurmstepd-n1: error: *** STEP 4.0 ON n1 CANCELLED AT 2026-12-02T12:14:09 ***
srun: error: n2: task 2: Killed
srun: error: n1: tasks 0-1: Killed
srun: Force Terminated StepId=4.0
""".splitlines()


# ---------------------------------------------------------------- environment
def test_job_id_restart_count_and_in_slurm():
    env = {"SLURM_JOB_ID": "1234", "SLURM_RESTART_COUNT": "2"}
    assert slurm.job_id(env) == "1234" and slurm.in_slurm(env) and slurm.restart_count(env) == 2
    assert slurm.job_id({"SLURM_JOBID": "77"}) == "77"
    assert slurm.job_id({}) is None and not slurm.in_slurm({}) and slurm.restart_count({}) == 0
    assert slurm.restart_count({"SLURM_RESTART_COUNT": "x"}) == 0
    assert slurm.restart_count({"SLURM_RESTART_COUNT": "-3"}) == 0


@pytest.mark.parametrize("text, names", [
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[1-2,5],gpu[08-10]", ["n1", "n2", "n5", "gpu08", "gpu09", "gpu10"]),
    ("node1,node7", ["node1", "node7"]),
    ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
    ("", []),
])
def test_expand_hostlist(text, names):
    assert slurm.expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-3", "n1-3]", "n[a-b]", "n[1-]"])
def test_expand_hostlist_rejects_malformed(text):
    with pytest.raises(ValueError):
        slurm.expand_hostlist(text)


def test_node_list_from_environment():
    assert slurm.node_list({"SLURM_JOB_NODELIST": "n[3-4]"}) == ["n3", "n4"]
    assert slurm.node_list({"SLURM_NODELIST": "a,b"}) == ["a", "b"]
    assert slurm.node_list({}) == []


# ---------------------------------------------------------------- scontrol
@pytest.mark.parametrize("text", [SHOW_JOB_ONELINE, SHOW_JOB_MULTILINE])
def test_parse_scontrol_show_job(text):
    f = slurm.parse_scontrol(text)
    assert f["JobId"] == "1" and f["JobState"] == "RUNNING" and f["NodeList"] == "n[1-2]"
    assert f["TRES"] == "cpu=4,node=2,billing=4" and f["Power"] == "" and f["Restarts"] == "0"
    assert slurm.end_time_from_scontrol(text) == time.mktime((2026, 12, 2, 12, 13, 18, 0, 0, -1))


def test_end_time_unknown_or_unlimited_is_none():
    assert slurm.end_time_from_scontrol("JobId=5 TimeLimit=UNLIMITED EndTime=2030-01-01T00:00:00") is None
    assert slurm.end_time_from_scontrol("JobId=5 TimeLimit=01:00:00 EndTime=Unknown") is None
    assert slurm.parse_slurm_time("None") is None


def test_job_end_time_outside_slurm_or_without_scontrol(monkeypatch):
    assert slurm.job_end_time(environ={}) is None                 # no job
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    assert slurm.job_end_time("1") is None                        # no scontrol


# ---------------------------------------------------------------- stop requests
def test_stop_handler_only_records_the_signal():
    before = signal.getsignal(signal.SIGUSR1)
    slurm.clear_stop()
    try:
        assert slurm.install_stop_handler() and slurm.handler_installed()
        assert not slurm.stop_requested(environ={})
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert slurm.stop_requested(environ={}) and slurm.stop_reason() == "signal SIGUSR1"
        slurm.clear_stop()
        assert not slurm.stop_requested(environ={}) and slurm.stop_reason() is None
    finally:
        slurm.uninstall_stop_handler()
        slurm.clear_stop()
    assert not slurm.handler_installed() and signal.getsignal(signal.SIGUSR1) == before


def test_stop_file(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "STOP_FILE_POLL", 0.0)
    path = tmp_path / "stop"
    env = {slurm.STOP_FILE_ENV: str(path)}
    slurm.clear_stop()
    try:
        assert slurm.stop_file(env) == str(path) and not slurm.stop_requested(env)
        path.touch()
        assert slurm.stop_requested(env) and slurm.stop_reason() == f"stop file {path}"
    finally:
        slurm.clear_stop()


# ---------------------------------------------------------------- launcher (pure)
def test_failed_nodes_from_srun_stops_at_termination():
    assert launcher.failed_nodes_from_srun(SRUN_KILLED) == ["n2"]
    assert launcher.failed_nodes_from_srun(["srun: error: n4: tasks 0-3: Exited with exit code 1"]) == ["n4"]
    assert launcher.failed_nodes_from_srun(["ordinary output"]) == []


def test_unhealthy_nodes_and_exclusion():
    assert launcher.unhealthy_nodes("n1 idle\nn2 down*\nn3 drain\nn4 alloc\nn5 idle*\n") == ["n2", "n3", "n5"]
    assert launcher.with_exclusion(["srun", "-n", "4", "app"], ["n2"]) == ["srun", "--exclude=n2", "-n", "4", "app"]
    assert launcher.with_exclusion(["mpiexec", "-n", "4"], ["n2"]) == ["mpiexec", "-n", "4"]
    assert launcher.with_exclusion(["srun", "x"], []) == ["srun", "x"]


def test_exit_status():
    assert launcher.exit_status(0) == 0 and launcher.exit_status(3) == 3
    assert launcher.exit_status(-signal.SIGKILL) == 137


# ---------------------------------------------------------------- the run loop
def flaky_script(tmp_path, failures):
    """A command that exits 3 on its first ``failures`` runs, then 0; it logs each attempt."""
    script = tmp_path / "flaky.py"
    script.write_text(textwrap.dedent(f"""\
        import os, sys
        count = os.path.join({str(tmp_path)!r}, "count")
        n = int(open(count).read()) if os.path.exists(count) else 0
        open(count, "w").write(str(n + 1))
        with open(os.path.join({str(tmp_path)!r}, "attempts"), "a") as f:
            f.write(os.environ.get("CKPT_RUN_ATTEMPT", "?") + "\\n")
        sys.exit(3 if n < {failures} else 0)
        """))
    return [sys.executable, str(script)]


def test_run_loop_retries_until_success(tmp_path, capsys):
    loop = RestartLoop(flaky_script(tmp_path, 2), max_restarts=3)
    assert loop.run() == 0
    assert [s for _, s, _ in loop.attempts] == [3, 3, 0]
    assert (tmp_path / "attempts").read_text().split() == ["0", "1", "2"]
    err = capsys.readouterr().err
    assert "attempt 1 of 4" in err and "attempt 3 succeeded" in err


def test_run_loop_gives_up_with_the_last_status(tmp_path):
    loop = RestartLoop(flaky_script(tmp_path, 5), max_restarts=1, out=open(os.devnull, "w"))
    assert loop.run() == 3 and len(loop.attempts) == 2


def test_run_loop_status_of_a_killed_command(tmp_path):
    cmd = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    assert RestartLoop(cmd, 0, out=open(os.devnull, "w")).run() == 137


def test_run_loop_timeout_terminates_the_attempt():
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    loop = RestartLoop(cmd, 0, timeout=0.5, out=open(os.devnull, "w"))
    assert loop.run() == 128 + signal.SIGTERM


def test_run_loop_forwards_usr1_and_stops_restarting(tmp_path):
    """USR1 to `hpcckpt run` reaches the command's process group; no further attempt follows."""
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(f"""\
        import signal, sys, time, os
        got = []
        signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
        open({str(tmp_path / 'ready')!r}, "w").close()
        t = time.time()
        while not got and time.time() - t < 30:
            time.sleep(0.02)
        open({str(tmp_path / 'got')!r}, "a").write("usr1\\n" if got else "none\\n")
        sys.exit(5)
        """))
    code = ("import sys; from hpcckpt.launcher import run_with_restarts; "
            f"sys.exit(run_with_restarts([sys.executable, {str(child)!r}], 3))")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the child did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "got").read_text().split() == ["usr1"]     # one attempt, and it got the signal
    assert proc.returncode == 5, err
    assert "got SIGUSR1: no further attempt" in err


def test_run_loop_stopped_while_waiting_to_relaunch_says_so(tmp_path):
    """TERM during --delay: the wait ends, no further attempt, and the reason is printed."""
    code = ("import sys; from hpcckpt.launcher import RestartLoop; "
            "sys.exit(RestartLoop([sys.executable, '-c', 'raise SystemExit(3)'], 3, delay=60).run())")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        assert "relaunching" in proc.stderr.readline() + proc.stderr.readline()   # attempt 1, its failure
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)             # well before the 60 s delay ends
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3 and "got SIGTERM while waiting to relaunch: no further attempt" in err, err


# ---------------------------------------------------------------- the command line
def hpcckpt_main(argv):
    """`hpcckpt ARGV` through the real parser (run/scavenge added if cli.py does not register them yet)."""
    from hpcckpt import cli, cli_slurm
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    if "run" not in sub.choices:
        cli_slurm.add_subcommands(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_run(tmp_path, capsys):
    assert hpcckpt_main(["run", "--max-restarts", "2", "--", *flaky_script(tmp_path, 1)]) == 0
    assert (tmp_path / "attempts").read_text().split() == ["0", "1"]
    assert hpcckpt_main(["run", "--max-restarts", "0", "--", sys.executable, "-c", "raise SystemExit(4)"]) == 4


@pytest.mark.parametrize("argv, message", [
    (["run", "--max-restarts", "-1", "--", "true"], "--max-restarts must be >= 0"),
    (["run", "--"], "no launch command"),
    (["run", "--timeout", "soon", "--", "true"], "--timeout"),
    (["run", "--", "/nonexistent/launcher"], "cannot start"),
])
def test_cli_run_bad_input_is_one_line_exit_2(argv, message, capsys):
    assert hpcckpt_main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("hpcckpt run: attempt")]
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]



def test_cli_scavenge_copies_the_newest_cache_checkpoint_once(tmp_path, capsys, monkeypatch):
    """One rank (MPI.COMM_WORLD of this process): local checkpoints 0 and 1 -> scavenge copies 1."""
    import numpy as np
    from mpi4py import MPI
    import hpcckpt
    for var in [v for v in os.environ if v.startswith(("HPCCKPT_", "SLURM_"))]:
        monkeypatch.delenv(var)
    cache, pfs = str(tmp_path / "cache" / "node{node}"), str(tmp_path / "pfs")
    with hpcckpt.Checkpointer(MPI.COMM_WORLD, name="scv", cache_dir=cache, pfs_dir=pfs) as ckpt:
        u = np.arange(10.0)
        ckpt.protect("u", u)
        ckpt.checkpoint(0, level="local")
        u += 1
        ckpt.checkpoint(1, level="local")
    opts = ["--name", "scv", "--cache-dir", cache, "--pfs-dir", pfs]
    assert hpcckpt_main(["scavenge", *opts]) == 0
    assert "copied step 1" in capsys.readouterr().out
    assert hpcckpt_main(["scavenge", *opts]) == 0
    assert "nothing to copy" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["scavenge", "--ranks-per-node", "two"], "--ranks-per-node"),
    (["scavenge", "--name", "bad name!", "--cache-dir", "c/{node}"], "name"),
    (["scavenge", "--config", "missing.toml"], "missing.toml"),
])
def test_cli_scavenge_bad_input_is_one_line_exit_2(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hpcckpt_main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]

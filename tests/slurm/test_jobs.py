"""Real sbatch jobs on a running SLURM (jobs/local-slurm-setup.sh): the job templates of jobs/
with the small deterministic application tests/slurm/app.py.

Skipped when no cluster answers (failed instead when CI=true). Every wait has a timeout and
every job still running at the end is cancelled (fixture slurm_jobs).
"""
import importlib.util
import os
import subprocess

import numpy as np
import pytest

from slurm_harness import APP, launch, mpi

pytestmark = pytest.mark.slurm
N = 2000            # elements of u per rank
RANKS = 4


def _reference_module():
    spec = importlib.util.spec_from_file_location("slurm_app", APP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def assert_bitwise_equal_to_failure_free(out_dir, steps, job):
    """The arrays every rank wrote equal a failure-free run, bit for bit."""
    app = _reference_module()
    for rank in range(RANKS):
        want = app.reference(rank, N, steps)
        for name, arr in want.items():
            path = os.path.join(out_dir, f"rank_{rank}_{name}.npy")
            assert os.path.exists(path), f"{path} missing\n{job}"
            got = np.load(path)
            assert got.dtype == arr.dtype and got.shape == arr.shape, f"rank {rank} {name}\n{job}"
            assert got.tobytes() == arr.tobytes(), f"rank {rank} {name} differs from a failure-free run\n{job}"


def test_walltime_signal_pfs_checkpoint_requeue_and_restart(slurm_jobs, tmp_path):
    """USR1 to the batch shell -> final pfs checkpoint, clean exit, requeue; the second run
    (SLURM_RESTART_COUNT=1) restarts from it (the cache was wiped) and ends bitwise equal."""
    steps, out, ready = 150, tmp_path / "out", tmp_path / "ready"
    app = f"{APP} --steps {steps} --every 10 --n {N} --step-sleep 0.04 --out {out} --ready-file {ready}"
    job = slurm_jobs("walltime-requeue.sbatch", ["--nodes=2", "--ntasks-per-node=2"],
                     APP=app, LAUNCH=launch(RANKS))      # this Python's mpiexec inside SLURM
    job.wait_for_file(str(ready), timeout=120)       # the first checkpoint is taken: the app runs
    proc = subprocess.run(["scancel", "--signal=USR1", "--batch", job.id], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    info = job.wait_done(timeout=180, restarts=1)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{job}"
    assert info["Restarts"] == "1", f"{info}\n{job}"

    assert job.lines("RESTART_COUNT") == ["0", "1"], job
    restarts = job.lines("RESTART ")
    stopped = job.lines("STOPPED")
    pfs_ckpts = [int(s.split()[0]) for s in job.lines("CKPT") if s.endswith(" pfs")]
    assert len(stopped) == 1 and len(pfs_ckpts) == 1, job
    final = pfs_ckpts[0]
    assert stopped[0].startswith(f"{final} "), job          # stopped right after the pfs checkpoint
    assert final < steps - 1, job                           # ... before the end: the signal did it
    assert restarts == ["None", str(final)], job            # run 2 restarted from it
    assert job.lines("DONE") == [str(final), str(steps - 1)], job
    assert os.listdir(tmp_path / "pfs"), "nothing written under pfs_dir"
    assert_bitwise_equal_to_failure_free(out, steps, job)


def test_a_stop_signal_before_the_application_is_ready_still_requeues(slurm_jobs, tmp_path):
    """USR1 while the ranks run but have no Checkpointer yet (as when a run starts with less
    than the lead time left): the template passes it on as the stop file only (a forwarded
    signal can kill a rank without hpcckpt's handler); the first run stops at its first step,
    the job requeues and the second run ends bitwise equal."""
    steps, out, starting = 40, tmp_path / "out", tmp_path / "starting"
    app = f"{APP} --steps {steps} --every 10 --n {N} --step-sleep 0.04 --out {out} --starting-file {starting}"
    srun = f"srun --nodes=2 --ntasks={RANKS} --ntasks-per-node=2 --mpi={mpi().flavour.srun_mpi} --kill-on-bad-exit=1"
    job = slurm_jobs("walltime-requeue.sbatch", ["--nodes=2", "--ntasks-per-node=2"], APP=app, LAUNCH=srun)
    job.wait_for_file(str(starting), timeout=120)      # the ranks run; no Checkpointer (no handler) yet
    proc = subprocess.run(["scancel", "--signal=USR1", "--batch", job.id], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    info = job.wait_done(timeout=180, restarts=1)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0" and info["Restarts"] == "1", f"{info}\n{job}"
    assert len(job.lines("STOPPED")) == 1 and job.lines("DONE")[-1] == str(steps - 1), job
    assert_bitwise_equal_to_failure_free(out, steps, job)


def test_restart_loop_relaunches_after_a_rank_dies(slurm_jobs, tmp_path):
    """A rank killed inside the allocation: `hpcckpt run` relaunches (without the failed node)
    and the job completes with the failure-free result."""
    steps, out = 60, tmp_path / "out"
    app = (f"{APP} --steps {steps} --every 10 --n {N} --crash-at 34 --crash-rank 3 "
           f"--crash-once {tmp_path / 'crashed'} --out {out}")
    # srun with this MPI's PMI (the template's default is MPICH's pmi2; Open MPI needs pmix)
    srun = f"srun --nodes=2 --ntasks={RANKS} --ntasks-per-node=2 --mpi={mpi().flavour.srun_mpi} --kill-on-bad-exit=1"
    job = slurm_jobs("restart-loop.sbatch", ["--nodes=3", "--ntasks-per-node=2"], APP=app, MAX_RESTARTS=2, LAUNCH=srun,
                     RUN_OPTIONS="--exclude-failed-node --timeout 60")   # an attempt never hangs the test
    info = job.wait_done(timeout=180)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{job}"
    text = job.text()
    assert "CRASH rank 3 after step 34" in text, job
    assert "hpcckpt run: attempt 1 failed" in text and "hpcckpt run: attempt 2 succeeded" in text, job
    assert job.lines("RESTART ") == ["None", "29"], job
    assert job.lines("DONE") == [str(steps - 1)], job
    excluded = [ln for ln in text.splitlines() if "excluding node(s)" in ln]
    assert excluded, f"the failed node was not excluded\n{job}"
    assert_bitwise_equal_to_failure_free(out, steps, job)


def test_restart_loop_passes_a_stop_signal_that_comes_while_the_ranks_start(slurm_jobs, tmp_path):
    """USR1 while the ranks start (MPICH's MPI_Init takes SIGUSR1 over: a forwarded signal alone is
    lost there): the trap's stop file makes them take a final pfs checkpoint and stop; the job
    ends with status 75 (not finished), not COMPLETED as if no signal had come."""
    steps, starting = 60, tmp_path / "starting"
    app = f"{APP} --steps {steps} --every 10 --n {N} --step-sleep 0.05 --starting-file {starting}"
    srun = f"srun --nodes=2 --ntasks={RANKS} --ntasks-per-node=2 --mpi={mpi().flavour.srun_mpi} --kill-on-bad-exit=1"
    job = slurm_jobs("restart-loop.sbatch", ["--nodes=3", "--ntasks-per-node=2"], APP=app, LAUNCH=srun,
                     RUN_OPTIONS="--timeout 60")
    job.wait_for_file(str(starting), timeout=120)
    proc = subprocess.run(["scancel", "--signal=USR1", "--batch", job.id], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    info = job.wait_done(timeout=180)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "75:0", f"{info}\n{job}"
    final = [int(s.split()[0]) for s in job.lines("CKPT") if s.endswith(" pfs")]
    assert len(final) == 1 and job.lines("STOPPED")[0].startswith(f"{final[0]} ") and final[0] < steps - 1, job


def test_scavenge_leaves_the_newest_checkpoint_on_pfs(slurm_jobs, tmp_path):
    """A job fails after local-only checkpoints; `hpcckpt scavenge` at its end copies the newest
    one to pfs; a new job with an empty cache restarts from it and ends bitwise equal."""
    steps, out = 60, tmp_path / "out"
    app = f"{APP} --steps {steps} --every 10 --n {N} --crash-at 44 --crash-rank 2"
    job = slurm_jobs("scavenge.sbatch", ["--nodes=2", "--ntasks-per-node=2"], APP=app, LAUNCH=launch(RANKS))
    info = job.wait_done(timeout=150)
    assert info["JobState"] == "FAILED", f"the application should have failed: {info}\n{job}"
    assert job.lines("CKPT") == ["9 local", "19 local", "29 local", "39 local"], job
    assert "hpcckpt scavenge: copied step 39" in job.text(), job

    job2 = slurm_jobs("plain.sbatch", ["--nodes=2", "--ntasks-per-node=2"],
                      APP=f"{APP} --steps {steps} --every 10 --n {N} --out {out}", LAUNCH=launch(RANKS))
    info = job2.wait_done(timeout=150)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{job2}"
    assert job2.lines("RESTART ") == ["39"], job2           # a fresh cache: only pfs had it
    assert job2.lines("DONE") == [str(steps - 1)], job2
    assert_bitwise_equal_to_failure_free(out, steps, job2)


def test_a_job_that_stops_on_its_own_near_the_time_limit_ends_75_and_the_next_one_goes_on(slurm_jobs, tmp_path):
    """The application schedules only local checkpoints; with one minute of job time (less
    end_margin = 20 s) hpcckpt takes a final pfs checkpoint before the end and tells it to stop:
    plain.sbatch ends with status 75, not COMPLETED with its node-local checkpoints deleted, and
    the next job restarts from that pfs step and ends bitwise equal to a failure-free run."""
    app = f"{APP} --steps 100000 --every 10 --n {N} --step-sleep 0.1"
    job = slurm_jobs("plain.sbatch", ["--nodes=2", "--ntasks-per-node=2", "--time=1"], APP=app,
                     LAUNCH=launch(RANKS), HPCCKPT_END_MARGIN="20s")
    info = job.wait_done(timeout=150)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "75:0", f"{info}\n{job}"
    final = [int(s.split()[0]) for s in job.lines("CKPT") if s.endswith(" pfs")][-1]
    assert job.lines("STOPPED")[0].startswith(f"{final} "), job
    assert f"stopped for the job's end time: final pfs checkpoint of step {final}" in job.text(), job

    steps, out = final + 21, tmp_path / "out"
    job2 = slurm_jobs("plain.sbatch", ["--nodes=2", "--ntasks-per-node=2"],
                      APP=f"{APP} --steps {steps} --every 10 --n {N} --out {out}", LAUNCH=launch(RANKS))
    info = job2.wait_done(timeout=150)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{job2}"
    assert job2.lines("RESTART ") == [str(final)], job2
    assert_bitwise_equal_to_failure_free(out, steps, job2)

"""An online-recovery job for the virtual-cluster tests (tests/vcluster/test_online_vcluster.py),
run by ``jobs/vcluster mpirun --ft``: hpcckpt.online.run over a 1-D stencil (a halo exchange and
an Allreduce on the worker communicator each step), ranks_per_node = "auto".

  vc_online_app.py --config RUN.TOML --spares S --steps N --every K --level L --out FILE
                   [--pause-at STEP --signal-dir DIR]

--pause-at: at the start of STEP (once in the job), worker 0 writes DIR/paused and waits (at most
60 s) for DIR/resume: the test loses a node meanwhile (jobs/vcluster kill), so the failure comes
at a known step. Prints "HOST <worker or spare> <world rank> <hostname>" per process at the start,
"RECOVERED <json>" on every worker after each recovery, "DONE <json>" on worker 0 at the end (worker 0
writes the whole final field to --out, .npy), "SPARE-DONE" on each spare never used,
"ONLINE-ERROR <message>" (exit 3) when the job cannot go on.
"""
import argparse
import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

import hpcckpt
from hpcckpt import online

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "mpi", "apps"))
from stencil1d import advance  # noqa: E402 - tests/mpi/apps

p = argparse.ArgumentParser()
p.add_argument("--config", required=True)
p.add_argument("--spares", type=int, default=1)
p.add_argument("--steps", type=int, default=16)
p.add_argument("--every", type=int, default=3)
p.add_argument("--level", default="partner")
p.add_argument("--n", type=int, default=20000)
p.add_argument("--out", required=True)
p.add_argument("--pause-at", type=int, default=-1)
p.add_argument("--signal-dir", default=None)
p.add_argument("--timeout", type=float, default=60.0)
a = p.parse_args()


def say(line):
    """One write per line, so lines of different ranks never interleave."""
    os.write(1, (line + "\n").encode())


world = MPI.COMM_WORLD
say(f"HOST {'spare' if world.rank >= world.size - a.spares else 'worker'} {world.rank} {socket.gethostname()}")


def init(comm):
    r = comm.rank
    u = np.sin(np.arange(a.n, dtype=np.float64) * (r + 1) * 1e-3) + r
    return {"u": u, "total": np.zeros((), np.float64)}


def pause(comm, i):
    if i != a.pause_at or comm.rank != 0:
        return
    paused = os.path.join(a.signal_dir, "paused")
    if os.path.exists(paused):       # once in the job: not again when the step is redone after the recovery
        return
    open(paused, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(a.signal_dir, "resume")) and time.monotonic() < deadline:
        time.sleep(0.05)


def step(comm, state, i):
    pause(comm, i)
    advance(comm, state, i)


def recovered(r):
    say("RECOVERED " + json.dumps({"world_rank": world.rank, "host": socket.gethostname(), "lost": list(r.lost),
                                   "by": list(r.replaced_by), "from": r.restarted_from, "attempts": r.attempts}))


try:
    out = online.run(world, init, step, a.steps, spares=a.spares, config=a.config, recovery_timeout=a.timeout,
                     on_recovery=recovered, schedule={a.level: a.every})
except hpcckpt.OnlineRecoveryError as e:
    say(f"ONLINE-ERROR {e}")
    raise SystemExit(3)
if not out.worker:
    say("SPARE-DONE")
else:
    w = out.comm
    parts = w.gather(out.state["u"], root=0)
    if w.rank == 0:
        np.save(a.out, np.concatenate(parts))
        say("DONE " + json.dumps({"recoveries": len(out.recoveries), "spares_left": out.spares_left,
                                  "host": socket.gethostname()}))

"""A deterministic MPI application run by hpcckpt.online (a 1-D stencil with a halo exchange on
the worker communicator each step), driven by tests/mpi/test_online.py.

  --spares S --steps N --every K --level LEVEL --cache DIR (with {node}) --rpn R --out FILE
  --kill RANK:STEP[:rmnode][,RANK:STEP...]   worker RANK SIGKILLs itself at the start of STEP, once
                                             (a marker file in --markers); rmnode: first remove its
                                             node's cache directory (a lost node)
  --raise RANK:STEP[,RANK:STEP...]          worker RANK raises RuntimeError in STEP (every time it runs it)
  --bad-state-at STEP                        every worker puts a value checkpoint() refuses into its state
                                             at STEP (a ProtectError raised on every worker)
  --config-json JSON                         extra Checkpointer keyword arguments
Prints "RECOVERED <json>" on worker 0 after each recovery, "DONE <json>" on worker 0 at the end
(recoveries, spares left, the step calls it made),
"SPARE-DONE" on each spare never used; worker 0 writes the whole final field to --out (.npy).
An OnlineRecoveryError prints "ONLINE-ERROR <message>" on each survivor and exits 3; without
ULFM each rank prints "REFUSED <message>" and exits 2.
"""
import argparse
import json
import os
import shutil
import signal

import numpy as np
from mpi4py import MPI

import hpcckpt
from hpcckpt import online
from stencil1d import advance  # noqa: E402 - beside this script

p = argparse.ArgumentParser()
p.add_argument("--spares", type=int, default=1)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--every", type=int, default=5)
p.add_argument("--level", default="local")
p.add_argument("--cache", required=True)
p.add_argument("--rpn", default="1")
p.add_argument("--n", type=int, default=5000)
p.add_argument("--out", required=True)
p.add_argument("--kill", default="")
p.add_argument("--markers", default=None)
p.add_argument("--raise", dest="raises", default="")
p.add_argument("--bad-state-at", type=int, default=-1)
p.add_argument("--config-json", default="{}")
p.add_argument("--timeout", type=float, default=60.0)
a = p.parse_args()
rpn = a.rpn if a.rpn == "auto" else int(a.rpn)
kills = {}
for item in filter(None, a.kill.split(",")):
    parts = item.split(":")
    kills.setdefault(int(parts[1]), []).append((int(parts[0]), len(parts) > 2 and parts[2] == "rmnode"))
raises = {tuple(int(x) for x in item.split(":")) for item in filter(None, a.raises.split(","))}


def say(line):
    os.write(1, (line + "\n").encode())


def init(comm):
    r = comm.rank
    MPI_rank_is_zero[0] = r == 0
    u = np.sin(np.arange(a.n, dtype=np.float64) * (r + 1) * 1e-3) + r
    return {"u": u, "total": np.zeros((), np.float64)}


def step(comm, state, i):
    if kills.get(i):
        comm.Barrier()     # every worker at step i: victims of the same step die in the same failure
    for victim, rmnode in kills.get(i, ()):
        if victim == comm.rank:
            marker = os.path.join(a.markers or os.path.dirname(a.out), f"killed-{victim}-{i}")
            if not os.path.exists(marker):
                open(marker, "w").close()
                if rmnode:
                    node = comm.rank // rpn
                    shutil.rmtree(a.cache.replace("{node}", str(node)), ignore_errors=True)
                os.kill(os.getpid(), signal.SIGKILL)
    if (comm.rank, i) in raises:
        raise RuntimeError(f"application bug on worker {comm.rank} at step {i}")
    if i == a.bad_state_at:
        state["bad"] = object()
    advance(comm, state, i)


MPI_rank_is_zero = [False]
steps_run = [0]         # step calls on this process (a run restarted from step S makes nsteps - S - 1)


def recovered(r):
    if MPI_rank_is_zero[0]:
        say("RECOVERED " + json.dumps({"lost": list(r.lost), "by": list(r.replaced_by),
                                       "from": r.restarted_from, "seconds": r.seconds, "attempts": r.attempts}))



def step_and_note(comm, state, i):
    MPI_rank_is_zero[0] = comm.rank == 0
    steps_run[0] += 1
    step(comm, state, i)


kwargs = dict(name="online", cache_dir=a.cache, ranks_per_node=rpn,
              pfs_dir=os.path.join(os.path.dirname(a.out), "pfs"), schedule={a.level: a.every})
kwargs.update(json.loads(a.config_json))
try:
    out = online.run(MPI.COMM_WORLD, init, step_and_note, a.steps, spares=a.spares, recovery_timeout=a.timeout,
                     on_recovery=recovered, **kwargs)
except hpcckpt.OnlineRecoveryError as e:
    say(f"ONLINE-ERROR {e}")
    raise SystemExit(3)
except hpcckpt.ULFMUnsupportedError as e:
    say(f"REFUSED {e}")
    raise SystemExit(2)
if not out.worker:
    say("SPARE-DONE")
else:
    w = out.comm
    parts = w.gather(out.state["u"], root=0)
    if w.rank == 0:
        np.save(a.out, np.concatenate(parts))
        say("DONE " + json.dumps({"recoveries": len(out.recoveries), "spares_left": out.spares_left, "steps_run": steps_run[0],
                                  "total": float(out.state["total"])}))

"""Shared helpers of the benchmark scripts: machine description, JSON output, mpiexec."""
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MiB = 1 << 20


def machine():
    """A description of this machine for the JSON results."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    versions = {}
    for mod in ("numpy", "numba", "mpi4py", "h5py", "xxhash"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = None
    return {"cpu": cpu, "nproc": os.cpu_count(), "memory_bytes": mem, "python": platform.python_version(),
            "platform": platform.platform(), "versions": versions,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def write_json(name, payload, out=None):
    """Write ``payload`` (plus the machine description) to benchmarks/results/<name>.json or ``out``."""
    path = out or os.path.join(RESULTS, f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    payload = {"benchmark": name, "machine": machine(), **payload}
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    return path


def median(values):
    return statistics.median(values)


def mpiexec():
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.path.exists(local) else shutil.which("mpiexec")


def run_mpi(nprocs, args, timeout=600):
    """Run ``python <args>`` on ``nprocs`` ranks; return stdout (raise on failure)."""
    cmd = [mpiexec(), "-n", str(nprocs), sys.executable, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc.stdout

"""Shared helpers of the benchmark scripts: machine description, JSON output, mpiexec, the
limits every result is compared against, FTI's figures (../shared/ANCHORS.md) and a progress line.

Conventions of every script: time = the slowest rank between two barriers; aggregate bandwidth
= ranks x bytes per rank / time; MiB/s = 2**20 bytes/s, GB/s = 1e9 bytes/s; medians.
"""
import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib

from hpcckpt import mpi_launch

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MiB = 1 << 20
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
DISK = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()   # pfs_dir lives on disk, never tmpfs

# FTI 1.6, 4 ranks, aggregate MiB/s at 64 and 256 MiB per rank (ANCHORS.md). FTI_MIB_S: measured
# interleaved with bench_levels.py workers in one session (2026-12-03, 9 samples per cell, medians);
# the ratios and targets use these. FTI_MIB_S_EARLIER: FTI alone, an earlier session (2026-12-02,
# mean of 3), in which it ran about 2x slower; quoted for reference only.
# FTI has no XOR level: its erasure-coded level is L3 (Reed-Solomon); xor is compared to it.
FTI_SOURCE = "FTI 1.6 interleaved with bench_levels.py in one session (ANCHORS.md, 2026-12-03)"
FTI_MIB_S = {"local": {64: 985.0, 256: 1089.0}, "partner": {64: 604.0, 256: 521.0},
             "rs": {64: 262.0, 256: 277.0}, "xor": {64: 262.0, 256: 277.0},
             "pfs": {64: 542.0, 256: 399.0}}
FTI_MIB_S_EARLIER = {"local": {64: 466.0, 256: 450.0}, "partner": {64: 328.0, 256: 170.0},
                      "rs": {64: 121.0, 256: 102.0}, "xor": {64: 121.0, 256: 102.0},
                      "pfs": {64: 162.0, 256: 216.0}}
# hpcckpt / FTI within that session (bench_levels.py workers interleaved with FTI, ANCHORS.md), at
# 64 / 256 MiB: with reuse_files true (the default) and false (new files, as FTI writes them).
FTI_SESSION_X = {"local": {64: 8.1, 256: 7.8}, "partner": {64: 4.8, 256: 6.4}, "rs": {64: 6.2, 256: 6.3},
                 "pfs": {64: 1.5, 256: 2.6}}
FTI_SESSION_X_NEW_FILES = {"local": {64: 1.8, 256: 1.9}, "partner": {64: 1.5, 256: 2.9}, "rs": {64: 2.7, 256: 3.1},
                           "pfs": {64: 1.3, 256: 1.6}}
FTI_RANKS = 4                                   # every FTI figure is 4 ranks, one node per rank
FTI_LEVEL_NAME = {"local": "L1", "partner": "L2", "xor": "L3 (RS)", "rs": "L3", "pfs": "L4"}
# FTI recovery (init + read), 4 ranks x 256 MiB per rank, L2 and L3 after losing a node; measured
# in the 2026-12-02 session only (not measured again in the interleaved one).
FTI_RECOVERY_S = {"local": 2.1, "partner": 4.9, "rs": 16.9, "xor": 16.9, "pfs": 2.7}
FTI_RECOVERY_MIB, FTI_RECOVERY_RANKS = 256, 4
# Single-process kernel figures (GB/s of data input) from ANCHORS.md, by block MiB.
ANCHOR_XOR_FUSED = {64: 13.4, 512: 10.0}
ANCHOR_XOR_NUMPY = {64: 7.8, 512: 5.8}          # NumPy chained, same table
ANCHOR_ZFEC = {64: 0.47, 512: 0.45}
ANCHOR_ISAL = {64: 0.53, 512: 0.52}


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
    for mod in ("numpy", "numba", "mpi4py", "h5py", "xxhash", "zfec", "pyeclib"):
        try:
            m = __import__(mod)
            versions[mod] = getattr(m, "__version__", None) or getattr(m, "VERSION", None) or "installed"
        except Exception:
            versions[mod] = None
    try:
        m = mpi_launch.detect()
        versions["mpi"] = f"{m.flavour.title} {m.version}".strip()
    except mpi_launch.MPINotFoundError:
        versions["mpi"] = None
    return {"cpu": cpu, "nproc": os.cpu_count(), "memory_bytes": mem, "python": platform.python_version(),
            "platform": platform.platform(), "versions": versions, "loadavg": list(os.getloadavg()),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def write_json(name, payload, out=None):
    """Write ``payload`` (plus the machine description) to benchmarks/results/<name>.json or ``out``
    (a file, or a directory that gets <name>.json)."""
    path = out or os.path.join(RESULTS, f"{name}.json")
    if os.path.isdir(path):
        path = os.path.join(path, f"{name}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    payload = {"benchmark": name, "machine": machine(), **payload}
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    return path


def median(values):
    return statistics.median(values)


def say(msg):
    """One progress line (flushed), prefixed with the wall-clock time."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------- a script's command line
def parser(doc, quick_help, hidden=("size", "shm", "disk")):
    """The options every script has: --quick, --out, and the hidden ones its mpiexec workers get
    (--worker, plus ``hidden``: --size MiB per rank, --shm / --disk scratch directories)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--out", default=None, help="the JSON file (default benchmarks/results/<name>.json)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in hidden:
        p.add_argument(f"--{name}", type=int if name == "size" else str, help=argparse.SUPPRESS)
    return p


def command(script, argv):
    """The command line a result came from, for its JSON."""
    return " ".join(["python", f"benchmarks/{script}"] + list(argv if argv is not None else sys.argv[1:]))


@contextlib.contextmanager
def scratch(tag):
    """(shm, disk): a fresh directory on tmpfs (caches) and one on disk (pfs_dir), removed afterwards."""
    shm = tempfile.mkdtemp(prefix=f"hpcckpt-bench-{tag}-", dir=SHM)
    disk = tempfile.mkdtemp(prefix=f"hpcckpt-bench-{tag}-", dir=DISK)
    try:
        yield shm, disk
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)


# ---------------------------------------------------------------------- mpiexec
def mpi():
    """The MPI of this Python (hpcckpt.mpi_launch: MPICH or Open MPI; command, env, cleanup)."""
    try:
        return mpi_launch.detect()
    except mpi_launch.MPINotFoundError as e:
        raise SystemExit(f"benchmarks: {e}") from None


def env_for_jobs():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env.setdefault("NUMBA_CACHE_DIR", os.path.join(root, ".numba-cache"))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


MPI_STARTED = "MPI-STARTED"     # rank 0 of a worker prints it once every rank is past MPI_Init (world())
STARTUP_S = (15, 45, 120)       # not printed by then: the job hung starting up; killed, started again


def world():
    """A worker's COMM_WORLD: imports mpi4py (MPI_Init); once every rank is there, rank 0 tells
    run_mpi that the job started."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    comm.Barrier()
    if comm.rank == 0:
        print(MPI_STARTED, flush=True)
    return comm


def _run_job(cmd, timeout, env, startup):
    """One mpiexec job: (returncode, stdout, stderr), or None when its ranks did not all get past
    MPI_Init within ``startup`` seconds (the job is killed). Raises SystemExit on a timeout."""
    leftovers = mpi().snapshot()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    out, err, started = [], [], threading.Event()

    def read_out():
        tail = ""
        for line in proc.stdout:       # ranks' output can share a line: look at the text, not lines
            out.append(line)
            if MPI_STARTED in tail + line:
                started.set()
            tail = (tail + line)[-len(MPI_STARTED):]
        started.set()                  # the job ended (or closed stdout): nothing more to wait for

    readers = [threading.Thread(target=read_out, daemon=True),
               threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)]
    for t in readers:
        t.start()

    def stop(*_):
        raise KeyboardInterrupt("terminated")

    def kill():
        mpi_launch.kill_job(proc)          # the whole job: Open MPI's ranks are outside its process group
        for t in readers:
            t.join()
        leftovers.remove()
    old = signal.signal(signal.SIGTERM, stop) if threading.current_thread() is threading.main_thread() else None
    t0 = time.monotonic()
    try:
        if not started.wait(min(startup, timeout)):
            kill()
            return None
        proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        kill()
        raise SystemExit(f"benchmark run timed out after {timeout} s: {' '.join(cmd)}")
    except BaseException:           # Ctrl-C, SIGTERM: the job (its own session) goes too
        kill()
        raise
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    for t in readers:
        t.join()
    if mpi_launch.job_processes(proc.pid):
        mpi_launch.kill_job(proc)
    leftovers.remove()
    return proc.returncode, "".join(out), "".join(err)


def run_mpi(nprocs, args, timeout=900, env=None, fault_tolerant=False, check=True, executable=sys.executable):
    """Run ``python <args>`` (``executable`` None: the program ``args[0]``) on ``nprocs`` ranks;
    return stdout (raise on failure). The script's worker must call world() (a program prints
    MPI_STARTED the same way): a job whose ranks are not all past MPI_Init within STARTUP_S[i] is
    killed and started again. (MPI_Init hangs for good when another process deletes the job's
    /dev/shm/mpich_shm_* segment while it starts, as a clean-up of "new mpich files" run by a
    concurrent job does.) On a timeout every process of the job is killed; the MPI's files the job
    left behind are removed. ``fault_tolerant``: a ULFM launch (hpcckpt.online); ``check=False``:
    a failed job returns its stdout too (a job killed on purpose)."""
    m = mpi()
    cmd = m.command(nprocs, ([executable] if executable else []) + list(args), fault_tolerant=fault_tolerant)
    for attempt, startup in enumerate(STARTUP_S, 1):
        res = _run_job(cmd, timeout, m.env(env or env_for_jobs(), nprocs=nprocs), startup)
        if res is not None:
            break
        say(f"   MPI start-up hung (not every rank past MPI_Init in {startup} s); job killed"
            + (", starting it again" if attempt < len(STARTUP_S) else ""))
    else:
        raise SystemExit(f"benchmark run never started ({len(STARTUP_S)} tries): {' '.join(cmd)}")
    code, out, err = res
    if check and code != 0:
        raise SystemExit(f"benchmark run failed ({code}): {' '.join(cmd)}\n{err[-3000:]}")
    return out


def result_line(out):
    """The JSON after 'RESULT ' that rank 0 of a worker prints."""
    return json.loads(next(ln[7:] for ln in out.splitlines() if ln.startswith("RESULT ")))


# ---------------------------------------------------------------------- inside a worker (MPI)
def _start_end(comm, fn):
    """This rank's (start, end) of ``fn()`` run after a barrier (collective)."""
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    return t0, time.perf_counter()


def timed(comm, fn):
    """Slowest rank's time of ``fn()`` started together after a barrier (collective)."""
    from mpi4py import MPI
    t0, t1 = _start_end(comm, fn)
    return comm.allreduce(t1 - t0, op=MPI.MAX)


def timed_together(comm, fn):
    """What ``fn()`` on every rank at once takes (collective): from the first rank's start to the
    last rank's end after a barrier, on the clock every process of a host shares
    (time.perf_counter, CLOCK_MONOTONIC). A rank's own interval (timed()) leaves out the time it
    waited for a core after the barrier: with more ranks than cores, ranks that ran one after
    the other would each look as fast as one alone. On several hosts: timed()."""
    from mpi4py import MPI
    if not one_host(comm):
        return timed(comm, fn)
    t0, t1 = _start_end(comm, fn)
    return comm.allreduce(t1, op=MPI.MAX) - comm.allreduce(t0, op=MPI.MIN)


_ONE_HOST = {}


def one_host(comm):
    """Whether every rank of ``comm`` runs on this host (collective the first time per comm)."""
    from mpi4py import MPI
    key = MPI.Comm.py2f(comm)
    if key not in _ONE_HOST:
        name = zlib.crc32(MPI.Get_processor_name().encode())
        _ONE_HOST[key] = comm.allreduce(name, op=MPI.MIN) == comm.allreduce(name, op=MPI.MAX)
    return _ONE_HOST[key]


def write_file(data, path, flags, fsync=False, chunk=1 << 20):
    """Write ``data``'s bytes to ``path`` with plain os.write (the raw limit), optionally fsynced."""
    fd = os.open(path, flags, 0o600)
    try:
        view = memoryview(data).cast("B")
        for s in range(0, len(view), chunk):
            os.write(fd, view[s:s + chunk])
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_disk_ways(data, path, aligned, existing):
    """The ways of putting ``data``'s bytes in a file on disk, durably (fsync), that the disk
    limit takes the fastest of: {way: function()}. ``path``: a new file (removed by the caller
    after each way); ``existing``: a file of the same size that the overwrite ways write over.
    ``aligned``: the same bytes in a 4 KiB-aligned buffer (for direct I/O)."""
    from hpcckpt import storage
    new = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    view = memoryview(data).cast("B")
    piece = 8 << 20

    def buffered_1mib():
        write_file(data, path, new, fsync=True)

    def pieces_writeback(target=path, flags=new):   # large pwrites, the kernel starts writing each at once
        fd = os.open(target, flags, 0o600)
        try:
            for s in range(0, len(view), piece):
                storage.pwrite_all(fd, view[s:s + piece], s)
                storage.start_writeback(fd, s, min(piece, len(view) - s))
            os.fsync(fd)
        finally:
            os.close(fd)

    def direct(target=path, flags=new):             # O_DIRECT from an aligned buffer (the tail buffered)
        fd = os.open(target, flags, 0o600)
        dfd = storage.open_direct(target)
        try:
            storage.write_pieces_at(fd, dfd, aligned, 0, piece)
            os.fsync(fd)
        finally:
            os.close(fd)
            if dfd is not None:
                os.close(dfd)
    return {"buffered_1mib": buffered_1mib, "pwrite_8mib_writeback": pieces_writeback, "direct": direct,
            "overwrite_8mib_writeback": lambda: pieces_writeback(existing, os.O_WRONLY),
            "overwrite_direct": lambda: direct(existing, os.O_WRONLY)}


LIMITS = ("memcpy", "tmpfs_new", "tmpfs_overwrite", "disk_fsync", "disk_new_files", "mpi_ring")


def disk_new_files(comm, data, aligned, disk_dir, steps, gap=0.0):
    """What a checkpoint with new files at every step asks of the disk, done by hand and back to
    back (collective): per step every rank writes a new file of ``data``'s size with direct I/O
    from ``aligned`` and fsyncs it, then the previous step's file is unlinked by a thread while
    the next step writes (as the pfs level with ``reuse_files = false`` removes the step it
    retires, and FTI removes its previous checkpoint). No copy, no HDF5, no checksum: the most
    the disk allows that work here (on a file system mounted with ``discard`` an unlink is
    device work). ``steps`` timed steps (slowest rank each) after two untimed ones: the removal
    that starts after step k unlinks step k-1's file, so step 2 is the first one that a removal
    runs into, as every checkpoint's does in the steady state. ``gap``: seconds every rank idles
    after each step (an application computing between checkpoints; the removal then runs in it)."""
    import threading
    times, previous, remover = [], None, None
    for k in range(steps + 2):
        path = os.path.join(disk_dir, f"new_files_{comm.rank}_{k}.dat")
        t = timed_together(comm, write_disk_ways(data, path, aligned, None)["direct"])
        if k >= 2:
            times.append(t)
        if remover is not None:
            remover.join()
        if previous is not None:
            remover = threading.Thread(target=os.unlink, args=(previous,))
            remover.start()
        previous = path
        time.sleep(gap)
    if remover is not None:
        remover.join()
    os.unlink(previous)
    return times


def compile_nt_copy():
    """The copy loop of hpcckpt's copy-and-checksum kernel without the checksum: one 64-byte load
    and one 64-byte non-temporal store per stripe, the source prefetched 4 KiB ahead (the fastest
    copy we know here), written with the same LLVM helpers as the kernel."""
    import numba
    import numpy as np
    from numba import types
    from numba.extending import intrinsic
    from hpcckpt.codecs import xxh3_kernel as K
    from hpcckpt.codecs.xxh3 import _aligned_empty

    @intrinsic
    def copy_stripe(typingctx, src, dst, at):
        def codegen(context, builder, signature, args):
            src_data = context.make_array(signature.args[0])(context, builder, args[0]).data
            dst_data = context.make_array(signature.args[1])(context, builder, args[1]).data
            K._prefetch(builder, builder.gep(src_data, [builder.add(args[2], K.ir.Constant(K._I64, K.PREFETCH_WORDS))]))
            data = builder.load(K._vector_at(builder, src_data, args[2]), align=8)
            K._store_nontemporal(builder, data, K._vector_at(builder, dst_data, args[2]))
            return context.get_dummy_value()
        return types.void(src, dst, at), codegen

    @numba.njit(boundscheck=False)
    def nt_copy(src, dst):
        for i in range(np.uint64(src.size // 8)):
            copy_stripe(src, dst, i * np.uint64(8))
        K.store_fence()
    nt_copy(np.zeros(64, np.uint64), _aligned_empty(512).view(np.uint64))   # compile now, not in a timed run
    return nt_copy


def tmpfs_overwrite_ways(data, path):
    """The ways of overwriting the existing tmpfs file ``path`` (``data``'s size) with ``data``
    that the tmpfs limit takes the fastest of: ``write``, os.write of 1 MiB per call; through a
    mapping of the file kept open (made here, outside the timing, as data_file.Mappings keeps the
    local level's), ``mapped_memcpy`` (np.copyto) and ``mapped_ntcopy`` (the non-temporal copy
    loop of hpcckpt's kernel without the checksum). Returns ({way: fn}, close)."""
    import mmap
    import numpy as np
    src = np.frombuffer(memoryview(data).cast("B"), np.uint8)
    fd = os.open(path, os.O_RDWR)
    mapping = mmap.mmap(fd, src.size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    os.close(fd)
    dst = np.frombuffer(mapping, np.uint8)
    nt_copy = compile_nt_copy()
    whole = src.size // 64 * 64

    def ntcopy():
        nt_copy(src[:whole].view(np.uint64), dst[:whole].view(np.uint64))
        dst[whole:] = src[whole:]

    def close():
        nonlocal dst
        del dst
        mapping.close()
    return {"write": lambda: write_file(data, path, os.O_WRONLY), "mapped_memcpy": lambda: np.copyto(dst, src),
            "mapped_ntcopy": ntcopy}, close


def _aligned_copy(data):
    """``data``'s bytes in a page-aligned buffer (an anonymous mapping)."""
    import mmap
    import numpy as np
    view = memoryview(data).cast("B")
    out = np.frombuffer(mmap.mmap(-1, max(1, len(view))), np.uint8)[:len(view)]
    out[:] = np.frombuffer(view, np.uint8)
    return out


def measure_limits(comm, data, scratch, shm_dir, disk_dir, reps, which=LIMITS, gap=0.0):
    """Every rank at once, ``reps`` samples each (seconds from the first rank's start to the last
    rank's end, timed_together):
    memcpy into a touched buffer, a new / an overwritten tmpfs file (the fastest of
    tmpfs_overwrite_ways: write() or a copy into its kept mapping, as the local level writes; each
    also kept as ``tmpfs_overwrite_<way>``), a new disk file + fsync,
    and an MPI ring (Sendrecv to rank+1 from rank-1) of the whole buffer. ``scratch`` is a
    touched buffer the size of ``data``. The disk limit ("disk_fsync") is, per sample, the
    fastest of write_disk_ways (a new file: 1 MiB writes, 8 MiB writes with early writeback,
    direct I/O; an existing file overwritten: the last two), each also kept as ``disk_<way>``:
    a limit that a hand-written file or the pfs level beats would be no limit; a new file is
    removed after its way, and the directory synced, untimed (on a file system mounted with
    ``discard`` the removal is device work that would slow the next way). ``disk_new_files``:
    the rotation of new files of disk_new_files() (``reps`` steps after the loop above), the
    limit of a checkpoint with new files at every step (``gap`` seconds idle after each step)."""
    import numpy as np
    from hpcckpt import storage
    res = {k: [] for k in which}
    aligned = None
    r = comm.rank
    shm = os.path.join(shm_dir, f"limit_{r}.dat")
    disk = os.path.join(disk_dir, f"limit_{r}.dat")
    existing = os.path.join(disk_dir, f"limit_{r}.old")
    for _ in range(reps):
        if "memcpy" in res:
            res["memcpy"].append(timed_together(comm, lambda: np.copyto(scratch, data)))
        if "tmpfs_new" in res or "tmpfs_overwrite" in res:
            if os.path.exists(shm):
                os.unlink(shm)
            t = timed_together(comm, lambda: write_file(data, shm, os.O_WRONLY | os.O_CREAT))
            if "tmpfs_new" in res:
                res["tmpfs_new"].append(t)
            if "tmpfs_overwrite" in res:     # the fastest of tmpfs_overwrite_ways (tmpfs_overwrite_<way>)
                ways, close = tmpfs_overwrite_ways(data, shm)
                best = None
                for way, fn in ways.items():
                    t = timed_together(comm, fn)
                    res.setdefault(f"tmpfs_overwrite_{way}", []).append(t)
                    best = t if best is None else min(best, t)
                close()
                res["tmpfs_overwrite"].append(best)
            os.unlink(shm)
        if "disk_fsync" in res:      # the fastest of several ways, each timed here (disk_<way>)
            if aligned is None:
                aligned = _aligned_copy(data)
                write_file(data, existing, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, fsync=True)
            best = None
            for way, fn in write_disk_ways(data, disk, aligned, existing).items():
                t = timed_together(comm, fn)
                res.setdefault(f"disk_{way}", []).append(t)
                best = t if best is None else min(best, t)
                if os.path.exists(disk):
                    os.unlink(disk)
                    storage.fsync_dir(disk_dir)     # the removal's device work (discard) done here, untimed
            res["disk_fsync"].append(best)
        if "mpi_ring" in res and comm.size > 1:
            dst, src = (r + 1) % comm.size, (r - 1) % comm.size
            res["mpi_ring"].append(timed_together(comm, lambda: comm.Sendrecv(data, dst, 7, scratch, src, 7)))
    if "disk_new_files" in res:
        aligned = _aligned_copy(data) if aligned is None else aligned
        res["disk_new_files"] = disk_new_files(comm, data, aligned, disk_dir, reps, gap)
    if os.path.exists(existing):
        os.unlink(existing)
    return {k: v for k, v in res.items() if v}


def parse_grid(text):
    """"RANKSxMIB,..." (e.g. "4x64,4x256") -> [(ranks, MiB per rank)]."""
    cells = []
    for cell in text.split(","):
        ranks, mib = cell.strip().lower().split("x")
        cells.append((int(ranks), int(mib)))
    return cells


def summarize(samples, total_mib):
    """{key: samples} -> {"seconds": medians, "mib_s": aggregate bandwidth, "samples": ...}."""
    sec = {k: median(v) for k, v in samples.items() if v}
    return {"seconds": sec, "mib_s": {k: total_mib / t for k, t in sec.items()}, "samples": samples}

"""Moving file bytes between ranks in chunks (collective helpers for the redundancy levels).

Every rank takes part in every round whatever happens to its files: a local I/O error is kept
and reported after the exchange, so a failing disk on one rank never deadlocks the others.
"""
import json
import os

import numpy as np

from .. import storage
from ..comm import InFlight

TAG_META, TAG_DATA, TAG_META_TEXT = 7101, 7102, 7103


def read_range(fd, buf, offset):
    """pread into ``buf`` from ``offset``; zero what lies past the end of the file."""
    view = memoryview(buf)
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    if done < len(view):
        buf[done:] = 0
    return done


def exchange_files(comm, sends, recvs, chunk, deferred, mode=0o600):
    """Collective: stream whole files between ranks.

    ``sends``: list of (dest_rank, meta, src_path, size) — ``meta`` is a small JSON-able object
    (sent as JSON text);
    ``src_path`` may instead be a uint8 array of ``size`` bytes, sent from where it lies (a
    mapped data file: no copy into a buffer), a callable ``read(buf, offset)`` that fills ``buf``
    with the bytes of a virtual stream from ``offset`` (the changed blocks of an incremental
    step), or None (what could not be read: the exchange goes on, the caller has the error).
    ``recvs``: list of (source_rank, dst_path_for(meta) -> path). Every rank must know its own
    sends and recvs; the pairs must match across ranks (one file per (source, dest) pair).
    Returns {source_rank: meta} of what was received. The receiver writes each file with the
    sender's size (truncated or extended), created with ``mode``.
    """
    # 1. metadata (a small JSON document) and sizes: a fixed header (its length, the file size), then the text
    texts = [json.dumps(meta).encode() for _, meta, _, _ in sends]
    heads = [np.array([len(t), size], np.int64) for t, (_, _, _, size) in zip(texts, sends)]
    got = [np.zeros(2, np.int64) for _ in recvs]
    with InFlight() as flight:
        flight.wait([flight.send(comm, h, d, TAG_META) for h, (d, _, _, _) in zip(heads, sends)]
                    + [flight.recv(comm, g, s, TAG_META) for g, (s, _) in zip(got, recvs)])
        bodies = [bytearray(int(g[0])) for g in got]
        flight.wait([flight.send(comm, t, d, TAG_META_TEXT) for t, (d, _, _, _) in zip(texts, sends)]
                    + [flight.recv(comm, b, s, TAG_META_TEXT) for b, (s, _) in zip(bodies, recvs)])
    metas = {s: (json.loads(b), int(g[1])) for b, g, (s, _) in zip(bodies, got, recvs)}
    # 2. open files
    send_fds, recv_fds = [], []
    for d, _, path, size in sends:
        send_fds.append(deferred.run(os.open, path, os.O_RDONLY | os.O_NOFOLLOW) if isinstance(path, (str, bytes))
                        else None)
    for s, path_for in recvs:
        meta, size = metas[s]
        path = deferred.run(path_for, meta)
        fd = deferred.run(_open_for_write, path, mode) if path else None
        recv_fds.append((fd, size))
    nsend = [-(-size // chunk) for _, _, _, size in sends]
    nrecv = [-(-size // chunk) for _, size in recv_fds]
    rounds = max(nsend + nrecv + [0])
    sbufs = [None if isinstance(src, np.ndarray) else np.empty(chunk, np.uint8) for _, _, src, _ in sends]
    rbufs = [np.empty(chunk, np.uint8) for _ in recvs]
    # 3. rounds: every pair moves one chunk per round
    with InFlight() as flight:
        for i in range(rounds):
            requests = []
            for k, (d, _, src, size) in enumerate(sends):
                if i < nsend[k]:
                    n = min(chunk, size - i * chunk)
                    if isinstance(src, np.ndarray):
                        buf = src[i * chunk:i * chunk + n]
                    else:
                        buf = sbufs[k][:n]
                        if callable(src):
                            deferred.run(src, buf, i * chunk)
                        elif send_fds[k] is not None:
                            deferred.run(read_range, send_fds[k], buf, i * chunk)
                    requests.append(flight.send(comm, buf, d, TAG_DATA))
            pending = []
            for k, (s, _) in enumerate(recvs):
                if i < nrecv[k]:
                    n = min(chunk, recv_fds[k][1] - i * chunk)
                    requests.append(flight.recv(comm, rbufs[k][:n], s, TAG_DATA))
                    pending.append((k, n))
            flight.wait(requests)
            for k, n in pending:
                fd = recv_fds[k][0]
                if fd is not None:
                    deferred.run(storage.pwrite_all, fd, rbufs[k][:n], i * chunk)
    for fd in send_fds:
        if fd is not None:
            os.close(fd)
    for fd, size in recv_fds:
        if fd is not None:
            deferred.run(os.ftruncate, fd, size)
            os.close(fd)
    return {s: metas[s][0] for s, _ in recvs}


def _open_for_write(path, mode):
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, mode)

"""hpcckpt list / verify / inspect on cache checkpoints fabricated in one process (no MPI):
missing ranks, files that are not files, unreadable directories, state documents, epochs.
The same commands on checkpoints written by real MPI jobs (cache and pfs): tests/mpi/test_cli.py."""
import contextlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys

import numpy as np
import pytest

from hpcckpt import cli, manifest as mf, state as st
from hpcckpt.codecs.checksum import digest

CKPT_ID = "c0ffee" * 4


def write_rank(root, step, rank, world=4, ranks_per_node=2, name="job", epoch=1, ckpt_id=CKPT_ID, state=None):
    """One rank's committed part of a local checkpoint, as the library lays it out."""
    node = rank // ranks_per_node
    step_dir = os.path.join(root, f"node{node}", name, mf.step_dir_name(step))
    os.makedirs(step_dir, exist_ok=True)
    arrays = [("u", np.arange(10 + rank, dtype=np.float64)), ("it", np.array(step, np.int64))]
    if state is not None:                     # a state-dict checkpoint: its arrays and its document
        flat = st.flatten(state)
        arrays = [(n, a) for n, a, _ in flat.arrays]
        arrays.append((st.STATE_ENTRY, st.document_array(flat.document)))
    entries, blob = [], bytearray()
    for aname, a in arrays:
        off = -len(blob) % 64 + len(blob)
        blob.extend(b"\0" * (off - len(blob)))
        raw = a.tobytes()
        blob.extend(raw)
        entries.append(mf.ArrayEntry(aname, a.dtype.str, a.shape, off, len(raw), digest(raw)))
    with open(os.path.join(step_dir, mf.data_file_name(rank)), "wb") as f:
        f.write(blob)
    m = mf.RankManifest(name=name, world_size=world, rank=rank, node=node, step=step, level="local", ckpt_id=ckpt_id,
                        created=1.7e9 + step, data_file=mf.data_file_name(rank), data_size=len(blob),
                        arrays=tuple(entries), epoch=epoch)
    with open(os.path.join(step_dir, mf.manifest_file_name(rank)), "w") as f:
        json.dump(m.to_json(), f)
    return step_dir


def write_step(root, step, world=4, **kw):
    return [write_rank(root, step, r, world, **kw) for r in range(world)]


def run(*args):
    """(exit status, stdout, stderr) of the hpcckpt command, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in args])
        except SystemExit as e:       # argparse
            rc = e.code
    text, errs = out.getvalue(), err.getvalue()
    assert "Traceback" not in text + errs and "(None)" not in text + errs, text + errs
    return rc, text, errs


@pytest.fixture(autouse=True)
def no_hang():
    """A check that opened a FIFO would block forever: fail instead."""
    def boom(*_):
        raise AssertionError("hpcckpt blocked (opened a FIFO?)")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_complete_step_is_intact(tmp_path):
    write_step(tmp_path, 9)
    rc, out, _ = run("verify", tmp_path)
    assert rc == 0 and "cache: 4 of 4 files intact" in out


def test_a_node_whose_cache_is_gone_is_missing_ranks(tmp_path):
    write_step(tmp_path, 4)
    write_step(tmp_path, 9)
    shutil.rmtree(tmp_path / "node1")
    rc, out, _ = run("verify", tmp_path)
    assert rc == 1
    for step in (4, 9):
        for r in (2, 3):
            assert f"MISSING step {step} rank {r}: no manifest under {tmp_path}" in out
    assert "4 rank part(s) MISSING" in out
    rc, out, _ = run("verify", tmp_path, "--step", 9)
    assert rc == 1 and "step 4" not in out
    # one node's own cache: --partial checks what is there and names the ranks it cannot see
    rc, out, _ = run("verify", tmp_path / "node0", "--partial")
    assert rc == 0 and "rank(s) 2, 3 of 4 are not under" in out
    assert run("verify", tmp_path / "node0")[0] == 1


def test_data_without_manifest_is_named(tmp_path):
    dirs = write_step(tmp_path, 9)
    os.unlink(os.path.join(dirs[3], mf.manifest_file_name(3)))
    rc, out, _ = run("verify", tmp_path)
    assert rc == 1 and "MISSING step 9 rank 3" in out and "without a manifest" in out


@pytest.mark.parametrize("what", ["manifest-fifo", "data-fifo", "data-symlink", "manifest-dir", "data-dir"])
def test_files_that_are_not_files(tmp_path, what):
    step_dir = write_step(tmp_path, 9)[1]
    path = os.path.join(step_dir, mf.manifest_file_name(1) if what.startswith("manifest") else mf.data_file_name(1))
    os.unlink(path)
    {"fifo": os.mkfifo, "dir": os.mkdir, "symlink": lambda p: os.symlink("/nonexistent", p)}[what.split("-")[1]](path)
    rc, out, _ = run("verify", tmp_path)
    assert rc == 1 and "DAMAGED step 9 rank 1" in out and path in out
    expected = {"fifo": "not a regular file", "dir": "is a directory", "symlink": "symbolic link"}
    assert expected[what.split("-")[1]] in out
    assert run("list", tmp_path)[0] == 0


def test_step_and_held_names_that_are_not_directories(tmp_path):
    step_dirs = write_step(tmp_path, 9)
    open(os.path.join(step_dirs[0], "held_000000"), "w").close()
    os.symlink("/nonexistent", os.path.join(os.path.dirname(step_dirs[2]), mf.step_dir_name(3)))
    open(os.path.join(os.path.dirname(step_dirs[0]), mf.step_dir_name(5)), "w").close()
    rc, out, err = run("verify", tmp_path)
    assert rc == 1
    assert "held_000000: a held-redundancy folder that is not a directory" in out
    assert "step_0000000003: named like a step directory but is a symbolic link; not followed" in out
    assert "step_0000000005: named like a step directory but is not a directory" in out
    assert len(out.splitlines()) == 4          # three problems, one summary line
    rc, out, err = run("list", tmp_path)
    assert rc == 0 and len(err.splitlines()) == 3 and "not a directory" in err


def test_pieces_of_two_checkpoints_in_one_step(tmp_path):
    write_step(tmp_path, 9)
    write_rank(tmp_path, 9, 3, ckpt_id="0ther" + "0" * 10)
    rc, out, _ = run("verify", tmp_path)
    assert rc == 1 and "DAMAGED step 9 rank 3: " in out and "belongs to another checkpoint" in out
    assert "MISSING step 9 rank 3: no manifest under " in out and "another checkpoint is in its place" in out
    rc, out, _ = run("list", tmp_path)
    assert "committed on 3 of 4 ranks here; MIXED: rank(s) [3] of another checkpoint in its directories" in out


def test_two_checkpoints_of_one_step_in_separate_trees(tmp_path):
    write_step(tmp_path / "a", 9)
    write_step(tmp_path / "b", 9, ckpt_id="b" * 12, epoch=2)
    rc, out, _ = run("verify", tmp_path)
    assert rc == 0 and "cache: 8 of 8 files intact" in out, out
    shutil.rmtree(tmp_path / "b" / "node1")
    rc, out, _ = run("verify", tmp_path)
    assert rc == 1 and "MISSING step 9 (checkpoint bbbbbbbbbbbb) rank 2" in out, out
    out = run("list", tmp_path)[1]
    lines = [ln.split() for ln in out.splitlines()[1:] if ln.strip()[:1].isdigit()]
    assert [(ln[2], ln[5]) for ln in lines] == [("1", "4/4"), ("2", "2/4")]
    assert "restart() considers only the newest epoch (2)" in out


def test_many_missing_ranks_are_collapsed(tmp_path):
    for r in range(3):
        write_rank(tmp_path, 9, r, world=40, ranks_per_node=40)
    rc, out, _ = run("verify", tmp_path)
    assert rc == 1 and "MISSING step 9 ranks 3-39: no manifest under" in out and "37 rank part(s) MISSING" in out


def test_list_shows_epochs_and_sorts_by_them(tmp_path):
    write_step(tmp_path, 9, epoch=1)
    write_step(tmp_path, 4, epoch=2, ckpt_id="e2" * 8)
    rc, out, _ = run("list", tmp_path)
    rows = [ln.split() for ln in out.splitlines()[1:] if ln.strip()[:1].isdigit()]
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in rows] == [("9", "local", "1", "cache", "4/4"),
                                                               ("4", "local", "2", "cache", "4/4")]
    assert "checkpoints of epochs 1, 2; restart() considers only the newest epoch (2)" in out


def test_inspect_lists_state_keys(tmp_path):
    state = {"u": np.arange(5.0), "t": 0.25, "step": 9, "params": {"dt": 1e-3, "walls": (0.0, 1.0)}, "note": None}
    write_step(tmp_path, 9, state=state)
    rc, out, _ = run("inspect", tmp_path, 9)
    assert rc == 0, out
    assert "state dict keys (the state documents of 4 rank(s)):" in out
    table = out.split("state dict keys")[1].splitlines()[2:]          # after the title and the header
    keys = {ln.split()[0]: ln.split()[1:] for ln in table}
    assert set(keys) == {"u", "t", "step", "params", "note"}
    assert keys["u"][:3] == ["rank", "array", "u"] and keys["t"][:2] == ["rank", "float"]
    assert keys["params"][1:4] == ["dict", "(2", "keys)"] and keys["step"][-1] == "all"
    # a damaged state document is damage: inspect says so (exit 1) and still lists the arrays
    step_dir = os.path.join(tmp_path, "node0", "job", mf.step_dir_name(9))
    m = mf.parse(json.load(open(os.path.join(step_dir, mf.manifest_file_name(0)))), "m")
    with open(os.path.join(step_dir, mf.data_file_name(0)), "r+b") as f:
        f.seek(m.array(st.STATE_ENTRY).offset + 3)
        f.write(b"#")
    rc, out, _ = run("inspect", tmp_path, 9)
    assert rc == 1 and "rank 0: state document unreadable" in out and "fails its checksum" in out
    assert "state documents of 3 rank(s)" in out


def test_usage_errors_are_one_line(tmp_path):
    rc, out, err = run("verify")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "required" in err
    rc, out, err = run("inspect", tmp_path, "nine")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    rc, out, err = run("verify", tmp_path / "nope")
    assert rc == 2 and err.strip() == f"hpcckpt verify: {tmp_path / 'nope'}: no such directory"
    open(tmp_path / "file", "w").close()
    assert run("list", tmp_path / "file")[0] == 2
    assert run("verify", tmp_path)[0] == 2          # nothing there
    assert run("inspect", tmp_path, 3)[0] == 2


def _unprivileged(tmp_path):
    """A command prefix under which permission bits apply (root: drop the DAC capabilities), or
    None when there is none."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        return None
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir(mode=0)
    try:
        probe = subprocess.run(prefix + [sys.executable, "-c", f"import os; os.listdir({str(probe_dir)!r})"],
                               capture_output=True, timeout=60)
    finally:
        probe_dir.rmdir()
    return prefix if probe.returncode != 0 else None


@pytest.mark.parametrize("where", ["held", "step", "job"])
def test_unreadable_directories_are_reported(tmp_path, where):
    prefix = _unprivileged(tmp_path)
    if prefix is None:
        pytest.skip("running as root without setpriv able to drop CAP_DAC_OVERRIDE: chmod does not stop reads")
    step_dirs = write_step(tmp_path, 9)
    held = os.path.join(step_dirs[0], "held_000000")
    os.mkdir(held)
    target = {"held": held, "step": step_dirs[2], "job": os.path.dirname(step_dirs[2])}[where]
    os.chmod(target, 0)
    try:
        res = subprocess.run(prefix + [sys.executable, "-m", "hpcckpt", "verify", str(tmp_path)], capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL)
    finally:
        os.chmod(target, stat.S_IRWXU)
    assert res.returncode == 1, res
    assert "Traceback" not in res.stderr and "(None)" not in res.stdout
    assert f"{target}: cannot be read (Permission denied)" in res.stdout
    if where != "held":                       # the ranks in it are not there either: named
        assert "MISSING step 9 rank 2" in res.stdout and "MISSING step 9 rank 3" in res.stdout

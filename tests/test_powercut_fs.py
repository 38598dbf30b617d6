"""The power-cut file system (lab/powercut.py) keeps its rules, shown on plain files:
a write never synced is lost and a synced one kept; under the lenient rule a
create, rename or unlink is durable at once, under the strict rule only once
its directory is synced; SQLite's -shm files go with the cut; a cut kills the
processes it names and refuses to cut under one it does not.

Each test mounts through the ``power_cut`` fixture (tests/conftest.py), which
unmounts after the test, pass or fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.processes import Proc


def write(path: Path, data: bytes, *, sync: bool, mode: int = os.O_CREAT | os.O_WRONLY | os.O_TRUNC) -> None:
    fd = os.open(path, mode, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def listing(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("dirs", ["lenient", "strict"])
def test_a_write_never_synced_is_lost_and_a_synced_one_kept(power_cut, dirs):
    disk = power_cut(dirs)
    m = disk.path
    write(m / "kept", b"old", sync=True)
    write(m / "lost", b"old", sync=True)
    disk.sync_tree()
    write(m / "kept", b"new and longer", sync=True)
    write(m / "lost", b"new and longer", sync=False)
    # Before the cut every reader sees every write, synced or not.
    assert listing(m) == {"kept": b"new and longer", "lost": b"new and longer"}
    report = disk.cut()
    assert listing(m) == {"kept": b"new and longer", "lost": b"old"}
    assert report.lost_files == 1 and report.entries == 0, report


@pytest.mark.parametrize("dirs", ["lenient", "strict"])
def test_fdatasync_and_a_sync_of_part_of_a_file(power_cut, dirs):
    disk = power_cut(dirs)
    m = disk.path
    write(m / "f", b"a" * 10000, sync=True)
    disk.sync_tree()
    fd = os.open(m / "f", os.O_RDWR)
    try:
        os.pwrite(fd, b"B" * 10, 5000)
        os.fdatasync(fd)
        os.pwrite(fd, b"C" * 10, 100)  # after the last sync: lost
        os.ftruncate(fd, 20000)
    finally:
        os.close(fd)
    assert len((m / "f").read_bytes()) == 20000
    disk.cut()
    assert (m / "f").read_bytes() == b"a" * 5000 + b"B" * 10 + b"a" * 4990


@pytest.mark.parametrize("sync", [False, True])
def test_a_truncate_is_lost_unless_synced(power_cut, sync):
    disk = power_cut("lenient")
    m = disk.path
    write(m / "f", b"x" * 9000, sync=True)
    disk.sync_tree()
    fd = os.open(m / "f", os.O_RDWR)
    try:
        os.ftruncate(fd, 100)
        os.pwrite(fd, b"y" * 50, 100)  # past the truncation: the gap rule, not stale bytes
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    assert (m / "f").read_bytes() == b"x" * 100 + b"y" * 50
    disk.cut()
    assert (m / "f").read_bytes() == (b"x" * 100 + b"y" * 50 if sync else b"x" * 9000)


# The directory rules: (rule, whether the directory is synced) -> what the cut leaves.
CREATE = {("lenient", False): {"new": b"data"}, ("strict", False): {}, ("strict", True): {"new": b"data"}}
RENAME = {("lenient", False): {"b": b"A"}, ("strict", False): {"a": b"A", "b": b"B"}, ("strict", True): {"b": b"A"}}
UNLINK = {("lenient", False): {}, ("strict", False): {"a": b"A"}, ("strict", True): {}}


@pytest.mark.parametrize("dirs,dir_synced", list(CREATE))
def test_create_under_each_rule(power_cut, dirs, dir_synced):
    disk = power_cut(dirs)
    m = disk.path
    write(m / "new", b"data", sync=True)  # the file's data is synced; its name is the question
    if dir_synced:
        sync_dir(m)
    assert listing(m) == {"new": b"data"}
    disk.cut()
    assert listing(m) == CREATE[dirs, dir_synced]


@pytest.mark.parametrize("dirs,dir_synced", list(RENAME))
def test_rename_over_a_file_under_each_rule(power_cut, dirs, dir_synced):
    disk = power_cut(dirs)
    m = disk.path
    write(m / "a", b"A", sync=True)
    write(m / "b", b"B", sync=True)
    disk.sync_tree()
    os.rename(m / "a", m / "b")  # the way an atomic replace is written
    if dir_synced:
        sync_dir(m)
    assert listing(m) == {"b": b"A"}
    report = disk.cut()
    assert listing(m) == RENAME[dirs, dir_synced]
    assert report.entries == (0 if dirs == "lenient" or dir_synced else 2), report


@pytest.mark.parametrize("dirs,dir_synced", list(UNLINK))
def test_unlink_under_each_rule(power_cut, dirs, dir_synced):
    disk = power_cut(dirs)
    m = disk.path
    write(m / "a", b"A", sync=True)
    disk.sync_tree()
    write(m / "a", b"never synced", sync=False)
    os.unlink(m / "a")  # the way SQLite commits a rollback-journal transaction
    if dir_synced:
        sync_dir(m)
    assert listing(m) == {}
    disk.cut()
    assert listing(m) == UNLINK[dirs, dir_synced]  # back with its synced content, not the last write


def test_strict_recreate_after_unlink_returns_the_synced_file(power_cut):
    """A journal deleted and created again between two directory syncs: the synced one comes back."""
    disk = power_cut("strict")
    m = disk.path
    write(m / "j", b"first", sync=True)
    disk.sync_tree()
    os.unlink(m / "j")
    write(m / "j", b"second", sync=True)
    disk.cut()
    assert listing(m) == {"j": b"first"}


def test_files_in_a_subdirectory_follow_their_own_directory(power_cut):
    disk = power_cut("strict")
    m = disk.path
    (m / "sub").mkdir()  # directories are durable at once under both rules
    write(m / "sub" / "f", b"F", sync=True)
    sync_dir(m)  # the parent's sync does not make the child directory's entries durable
    disk.cut()
    assert listing(m / "sub") == {}


@pytest.mark.parametrize("dirs", ["lenient", "strict"])
def test_the_cut_drops_sqlite_shm_files(power_cut, dirs):
    disk = power_cut(dirs)
    m = disk.path
    write(m / "x.db-shm", b"\0" * 100, sync=True)
    write(m / "x.db", b"data", sync=True)
    disk.sync_tree()
    report = disk.cut()
    assert listing(m) == {"x.db": b"data"} and report.shm == 1, report


def test_a_cut_kills_the_processes_it_names_and_reaps_them(power_cut, tmp_path):
    disk = power_cut("lenient")
    m = disk.path
    script = ("import os, sys, time\n"
              "fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)\n"
              "os.write(fd, b'synced'); os.fsync(fd); os.write(fd, b' and not'); print('written', flush=True)\n"
              "time.sleep(600)\n")
    writer = Proc("writer", [sys.executable, "-c", script, str(m / "f")])
    try:
        writer.wait_for_line("written", timeout=30)
        assert (m / "f").read_bytes() == b"synced and not"
        disk.cut(writer)
        assert not writer.alive() and writer.popen.returncode == -9
        assert (m / "f").read_bytes() == b"synced"
    finally:
        writer.kill()


def test_a_cut_refuses_while_a_process_it_does_not_name_holds_a_file(power_cut):
    disk = power_cut("lenient")
    m = disk.path
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'w'); "
                               "print('open', flush=True); time.sleep(600)", str(m / "held")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(RuntimeError, match=rf"still has files open there: \['{holder.pid} python"):
            disk.cut()
    finally:
        holder.kill()
        holder.wait()


def test_the_fixture_leaves_no_mount_behind(power_cut):
    disk = power_cut("strict")
    assert os.path.ismount(disk.path)
    disk.close()
    assert not os.path.ismount(disk.path)
    disk.close()  # twice is harmless: the finalizer calls it again


# SQLite on the fixture: whether a commit survives depends on its journal mode, its sync level and
# the directory rule (docs/powercut.md has the strace behind it). A rollback-journal commit's last
# step is the journal's unlink, synced to the directory only at EXTRA; a WAL commit at FULL is one
# synced append; at NORMAL the WAL is synced only at a checkpoint, which a killed process never runs.
SQLITE = [
    ("delete", "FULL", "lenient", 2), ("delete", "FULL", "strict", 1), ("delete", "EXTRA", "strict", 2),
    ("wal", "FULL", "lenient", 2), ("wal", "FULL", "strict", 2), ("wal", "NORMAL", "lenient", 1),
]


@pytest.mark.parametrize("journal,level,dirs,rows", SQLITE)
def test_a_sqlite_commit_survives_by_its_journal_mode_and_sync_level(power_cut, journal, level, dirs, rows):
    import sqlite3

    disk = power_cut(dirs)
    db = disk.path / "x.db"
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute(f"PRAGMA journal_mode={journal}")
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
    conn.close()  # the last connection: a WAL file is checkpointed into the database
    disk.sync_tree()
    script = ("import sqlite3, sys, time\n"
              "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              f"c.execute('PRAGMA synchronous={level}')\n"
              "c.execute('INSERT INTO t VALUES (2)')\n"  # autocommit: committed when execute returns
              "print('committed', flush=True)\n"
              "time.sleep(600)\n")
    writer = Proc("writer", [sys.executable, "-c", script, str(db)])
    try:
        writer.wait_for_line("committed", timeout=30)
        disk.cut(writer)
    finally:
        writer.kill()
    with sqlite3.connect(db) as conn:
        found = conn.execute("SELECT count(*) FROM t").fetchone()[0]
    conn.close()
    assert found == rows, f"{journal} at {level} under the {dirs} rule kept {found} row(s), not {rows}"

"""The power cuts of checks 1 and 3: a commit the record acknowledged is on the disk when it returns
(``lab/powercut.py``).

A SIGKILL leaves the kernel's page cache, which reaches the disk whether or not anything was synced, so a
kill cannot tell a record whose COMMIT waits for the disk from one that never syncs (``synchronous=OFF``
passed every kill of checks 1-3). So check 1's kills right after each commit (``grader.launch``'s
``GRADER_KILL_AFTER_COMMIT``) run with the learner's ``RECORD_DB`` on the lab's power-cut file system,
which loses every write that was never synced, and each is followed by a power cut:

- the run's rows as they stand right after the kill (read through the mount, page cache and all) are what
  commit k acknowledged; check 1's kill checks judge them as before;
- the power is cut (``PowerCut.cut``: unmount, drop what was never synced, mount again over the rest);
- every one of those rows must still be there: a row lost fails, naming commit k, what it lost, the
  committing connection's ``synchronous`` and ``journal_mode`` (the bootstrap's stderr line: a hint for the
  message, never evidence) and the syncs the file system saw.

Check 1 cuts that way after every commit, each on a run of its own: the run's first commit (its row),
each commit that records a step's result and moves the run on, and, from exercise 2's program on, each
intent's. That costs no process (the kills ran anyway), one cut each (about half a second to a second:
unmount, the daemon's exit, a new mount), two mounts side by side as the kills run. Check 3's run killed at
every step boundary keeps its record on a mount too, and between step 2 and step 3 the power goes before
the resume: the resume then works from what a power cut leaves (one cut; check 3 alone, ``--only 3``, still
catches a record that does not sync).

Directory entries follow the ``strict`` rule (durable once their directory is synced: all POSIX promises;
a rollback journal at FULL loses its last commit under it) unless ``GRADER_POWERCUT_DIRS=lenient``; the
solutions pass under both (tests/test_grader_powercut.py).

Where FUSE is not available (``lab.powercut.unavailable()``: no ``/dev/fuse``, no ``fusermount3``, no
libfuse3, no rights) the kills run on the harness's record as before and no power is cut: checks 1 and 3
show the reason (``power cuts skipped: ...``) among their lines, pass or fail on their kills alone, and the
exit code does not change.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sqlite3
import threading
from contextlib import closing
from pathlib import Path

from grader.evidence import Record, read_record
from grader.harness import Failed, Harness, Outcome, Run, Stopped
from grader.todos import todo
from lab.powercut import DIR_RULES, CutReport, PowerCut, unavailable

DIRS = os.environ.get("GRADER_POWERCUT_DIRS") or "strict"
SKIPPED = "power cuts skipped"  # how check 1's line begins when FUSE is not available
_SETTINGS = re.compile(r"GRADER_KILL_AFTER_COMMIT=\d+: killing process \d+ with SIGKILL \((?P<settings>[^)]*)\)")
_DB = "record.db"
LANES = 2  # check 1 kills two runs at a time (commits k+1 and k+2): one mount each, cut independently
MOUNT_SECONDS = 10.0  # a mount (and an unmount) takes under a second here, loaded; past this it failed
_LIVE: dict[PowerCut, threading.Lock] = {}  # every mount not yet closed, held while it mounts or cuts


class PowerCuts:
    """Records on power-cut mounts, one per lane (a lane runs one process at a time), and the cuts between a
    kill and what comes next. ``record_db(lane)``: where a run keeps its record (``Run.record_db``);
    ``record(run, lane)``: the run's rows as the last kill left them (what the kill checks judge, and what the
    cut must keep); ``cut(...)``: the power cut and the comparison; ``shown()``: what a check reports of it.
    Without FUSE a run keeps the harness's record, nothing is cut, and ``shown()`` says why."""

    def __init__(self, h: Harness, name: str = "powercut", lanes: int = LANES) -> None:
        self.h, self.name, self.lanes = h, name, lanes
        self.skipped = unavailable()
        self.disks: list[PowerCut] = []
        self.cuts: dict[str, CutReport] = {}  # when -> what the cut dropped

    def __enter__(self) -> PowerCuts:
        if self.skipped:
            return self
        if DIRS not in DIR_RULES:
            raise ValueError(f"GRADER_POWERCUT_DIRS={DIRS!r}: give one of {', '.join(DIR_RULES)}")
        try:
            for lane in range(self.lanes):
                self.disks.append(_mount(self.h, self.h.work / f"{self.name}-{lane}"))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for disk in self.disks:  # whatever happened: no mount outlives the check
            with _LIVE.pop(disk, threading.Lock()):
                disk.close()

    def record_db(self, lane: int) -> Path | None:
        """Where a run of ``lane`` keeps its record (None: the harness's, no FUSE here)."""
        return None if self.skipped else self.disks[lane].path / _DB

    def kept(self, lane: int) -> Path | None:
        """The record of ``lane`` as the disk keeps it once the mount is gone (for reading after the check)."""
        return None if self.skipped else self.disks[lane].backing / _DB

    def record(self, run: Run, lane: int) -> Record:
        if self.skipped:
            return self.h.record(run)
        return _snapshot(self.disks[lane], run, self.h.work / f"{run.run_id}-{len(self.cuts)}-before-the-cut")

    def cut(self, run: Run, lane: int, outcome: Outcome, before: Record, when: str) -> None:
        """The power cut ``when`` (the program is dead already, killed there): every row ``before`` holds must
        still be there."""
        if self.skipped:
            return
        disk = self.disks[lane]
        with _LIVE.get(disk, threading.Lock()):
            _refuse_if_stopping(self.h)
            report = self.cuts[when] = disk.cut()  # nothing else holds the mount: the program was killed
        after = _snapshot(disk, run, self.h.work / f"{run.run_id}-{len(self.cuts)}-after-the-cut")
        lost = _lost(before, after)
        if not lost:
            return
        found = _SETTINGS.search(outcome.output)
        settings = f" (the connection committed at {found['settings']})" if found else ""
        raise Failed(
            f"a power cut {when} of run {run.run_id} lost {'; '.join(lost)}: the commit had returned, and its "
            f"write was not on the disk{settings}",
            expected=(f"every row the record held when the process was killed, still there after the power cut "
                      f"({DIRS} directory rule): {before.describe()}"),
            seen=(f"after the cut: {after.describe() if after.exists else _unreadable(after)}; the file system saw "
                  f"{report.seen.get('fsync', 0)} fsync/fdatasync call(s) since the last cut; it dropped "
                  f"{report.lost_files} file(s)' unsynced writes and put back {report.entries} directory "
                  "entr(ies) never synced"),
            look_at=todo(1, "what a COMMIT must promise: on the disk when it returns, since the program goes on "
                            "as if it were (a power cut, not a kill: a kill leaves the page cache)"))

    def shown(self, what: str) -> str:
        """``what`` was cut (the caller's words), or why nothing was."""
        if self.skipped:
            return f"{SKIPPED}: {self.skipped}"
        dropped = sum(r.lost_files for r in self.cuts.values())
        return (f"{what} ({DIRS} directory rule): every row a commit had acknowledged was on the disk (the "
                f"cut{'s' if len(self.cuts) > 1 else ''} dropped unsynced writes of {dropped} file(s))")


def _mount(h: Harness, where: Path) -> PowerCut:
    """A mount whose record is set up as the harness sets up its own (an empty database in WAL mode, made before
    any learner process opens it), made on the backing directory before mounting: on the disk already, and
    every sync the mount then sees is the learner's."""
    disk = PowerCut(where / "disk", where / "mnt", dirs=DIRS, timeout=MOUNT_SECONDS)
    disk.backing.mkdir(parents=True)
    with closing(sqlite3.connect(disk.backing / _DB)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
    lock = threading.Lock()
    with lock:
        _LIVE[disk] = lock
        _refuse_if_stopping(h)
        try:
            return disk.mount()
        except BaseException:  # its daemon may be up already
            disk.close()
            raise


def _refuse_if_stopping(h: Harness) -> None:
    if h.stopping or _closed:  # Ctrl-C or SIGTERM meanwhile: mount nothing the cleanup could miss
        raise Stopped("the grading was stopped: no new mount, no cut")


_closed = False


@atexit.register
def _close_left_mounts() -> None:
    """A grading stopped by a signal does not always wait for the thread that holds a mount (one of
    side_by_side's), so no daemon and no mount may depend on it: at exit every mount still open is closed,
    each once its lock says no mount or cut is under way, and none is made after (``PowerCut.close`` works from
    any state)."""
    global _closed
    _closed = True
    for disk, lock in list(_LIVE.items()):
        with lock:
            disk.close()


def _snapshot(disk: PowerCut, run: Run, into: Path) -> Record:
    """The run's rows as the database on the mount holds them now: a copy of its files, read off the mount."""
    into.mkdir()
    # The database and its journal (a -wal, or a rollback -journal that a cut may leave hot), not its -shm: an
    # index SQLite rebuilds from the WAL.
    for name in os.listdir(disk.path):
        if name in (_DB, f"{_DB}-wal", f"{_DB}-journal"):
            shutil.copyfile(disk.path / name, into / name)
    copy = into / _DB
    try:
        # A writable connection first, on the copy: it rebuilds the WAL's index and folds the WAL in, which a
        # read-only reader (read_record) cannot do for a WAL without its -shm.
        with closing(sqlite3.connect(copy)) as conn:
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return read_record(copy, run.run_id)
    except sqlite3.DatabaseError as err:
        return Record(exists=False, tables={f"the file is not a database: {err}": 0})


def _unreadable(after: Record) -> str:
    """What a record with no tables after a cut is: no tables, or no database at all (``_snapshot``)."""
    return next(iter(after.tables), "no tables at all")


def _lost(before: Record, after: Record) -> list[str]:
    """What ``before`` holds of the run that ``after`` does not."""
    if before.run is None:
        return []  # nothing of this run was acknowledged yet
    if not after.exists:
        return ["the whole record (after the cut it holds no tables)"]
    if after.run is None:
        return ["the run's row"]
    lost = [f"{column} {before.run.get(column)!r} (after the cut: {after.run.get(column)!r})"
            for column in ("status", "current_step", "error") if before.run.get(column) != after.run.get(column)]
    lost += [f"{step}'s result" for step in before.steps if after.steps.get(step) != before.steps[step]]
    have = {(i["step"], i["attempt"]) for i in after.intents}
    lost += [f"the intent of {i['step']} (attempt {i['attempt']})" for i in before.intents
             if (i["step"], i["attempt"]) not in have]
    return lost

"""Check 1's power cuts (grader/power_cuts.py): a record whose COMMIT returns before its write is on the disk
fails, naming the commit it lost and the setting; the solutions pass under both directory rules; and where FUSE
is missing the cuts are skipped, the reason printed, the exit code unchanged.

A kill cannot show any of this (the page cache outlives the process): every wrong answer here passes check 1's
kills, which is why each fails only at the cut. The grader runs as the learner runs it, against real processes,
on the lab's power-cut file system (root and /dev/fuse, as the power-cut tests need).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lab.powercut import unavailable
from tests.test_grader import FOLDERS, grade

pytestmark = [pytest.mark.process, pytest.mark.fuse]

SOLUTION_1 = FOLDERS[1] / "solution" / "flow.py"
PRAGMA = 'conn.execute("PRAGMA synchronous=FULL")'


def needs_fuse() -> None:
    why = unavailable()
    if why:  # as the power_cut fixture does: `make test` installs fuse3
        pytest.fail(f"the power-cut tests need FUSE: {why}")


def changed_solution(tmp_path: Path, old: str, new: str) -> Path:
    solution = SOLUTION_1.read_text()
    assert solution.count(old) == 1, "the solution no longer has the line this answer changes"
    (tmp_path / "flow.py").write_text(solution.replace(old, new))
    return tmp_path


@pytest.mark.parametrize(("exercise", "dirs", "commits"), [(1, "strict", 4), (1, "lenient", 4), (3, "strict", 6),
                                                           (3, "lenient", 6)])
def test_the_solutions_keep_every_commit_under_both_directory_rules(exercise, dirs, commits, monkeypatch):
    """Exercise 1's program (4 commits: the run, three results) with check 1; exercise 3's (6: the intents too)
    with checks 1-3, check 3's run cut between step 2 and step 3 and then resumed."""
    needs_fuse()
    monkeypatch.setenv("GRADER_POWERCUT_DIRS", dirs)
    done = grade(exercise, "solution")
    assert done.returncode == 0, done.stdout
    assert f"killed right after each of its {commits} commits in turn" in done.stdout, done.stdout
    assert (f"the power cut right after each of those {commits} commits, each on its own run ({dirs} directory "
            "rule): every row a commit had acknowledged was on the disk") in done.stdout, done.stdout
    if exercise == 3:
        assert f"the power cut between step 2 and step 3, before that resume ({dirs} directory rule)" in done.stdout


WRONG = {
    # (the change to exercise 1's solution, what the grader must say)
    "never syncs (synchronous=OFF)": (
        (PRAGMA, 'conn.execute("PRAGMA synchronous=OFF")'),
        ("a power cut right after commit #1 of run", "lost the whole record", "synchronous=OFF, journal_mode=wal",
         "0 fsync/fdatasync call(s) since the last cut")),
    "syncs only at checkpoints (synchronous=NORMAL)": (
        (PRAGMA, 'conn.execute("PRAGMA synchronous=NORMAL")'),
        ("a power cut right after commit #1 of run", "lost the whole record", "synchronous=NORMAL, journal_mode=wal")),
    "a rollback journal at FULL (its deletion, the commit point, is never synced)": (
        ('conn.execute("PRAGMA journal_mode=WAL")', 'conn.execute("PRAGMA journal_mode=DELETE")'),
        ("a power cut right after commit #1 of run", "lost the run's row", "synchronous=FULL, journal_mode=delete",
         "put back 1 directory entr(ies) never synced")),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_commit_not_on_the_disk_fails_naming_the_commit_and_the_setting(name, tmp_path, monkeypatch):
    needs_fuse()
    monkeypatch.setenv("GRADER_POWERCUT_DIRS", "strict")  # the default, said: the rollback journal needs it
    (old, new), message = WRONG[name]
    done = grade(1, changed_solution(tmp_path, old, new))
    assert done.returncode == 1, done.stdout
    # Only the cut fails it: the kills judged every record sound (check 1's one failure is the power cut's).
    failed = [line for line in done.stdout.splitlines() if "FAIL" in line]
    assert len(failed) == 1 and "FAIL: a power cut right after commit" in failed[0], done.stdout
    for needle in (*message, "the commit had returned, and its write was not on the disk",
                   "TODO 1 (exercise 1) in flow.py: what a COMMIT must promise"):
        assert needle in done.stdout, f"{name}: expected {needle!r} in:\n{done.stdout}"


def test_exercise_3s_resume_after_a_power_cut_finds_what_was_lost(tmp_path, monkeypatch):
    """Check 3 alone (check 1's cuts not run): its run cut between step 2 and step 3 finds the loss first."""
    needs_fuse()
    monkeypatch.setenv("GRADER_POWERCUT_DIRS", "strict")
    solution = (FOLDERS[3] / "solution" / "flow.py").read_text()
    assert solution.count(PRAGMA) == 1
    (tmp_path / "flow.py").write_text(solution.replace(PRAGMA, 'conn.execute("PRAGMA synchronous=OFF")'))
    done = grade(3, tmp_path, "--only", "3")
    assert done.returncode == 1, done.stdout
    for needle in ("a power cut after the kill at record_outcome:before of run g3-every-kill",
                   "lost the whole record", "TODO 1 (exercise 1) in flow.py: what a COMMIT must promise"):
        assert needle in done.stdout, done.stdout


def test_without_fuse_the_cuts_are_skipped_saying_why_and_the_exit_code_is_the_kills(tmp_path, monkeypatch):
    """No fusermount3 on PATH: lab.powercut.unavailable() says so. synchronous=OFF then passes, as it passes every
    kill: exit 0, with the reason printed."""
    fusermount = shutil.which("fusermount3")
    path = [d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "fusermount3").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    impl = changed_solution(tmp_path, PRAGMA, 'conn.execute("PRAGMA synchronous=OFF")')
    done = grade(1, impl)
    assert done.returncode == 0, done.stdout
    reason = "fusermount3 is missing" if fusermount else unavailable() or ""
    assert f"  - power cuts skipped: {reason}" in done.stdout, done.stdout
    assert "every check passed" in done.stdout, done.stdout

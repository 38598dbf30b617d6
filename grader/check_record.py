"""Check 1. **The run record** (exercise 1): killed as step 2 begins, as step 3
begins, and run to the end: each time the record holds the run, its
current step and each completed step's result, the very result the model
or the provider gave; the same run id started again runs nothing. Then
killed right after each of the program's commits in turn: at every one,
the record's current step is the first step without a result (the result
and the advance are one transaction), and every effect the provider
applied is covered by the record; and with the record on the lab's
power-cut file system, the power is cut after each of those kills: every
row a commit acknowledged must survive it (``grader.power_cuts``; skipped,
saying why, where FUSE is not available).
"""

from __future__ import annotations

from functools import partial

from grader.check import Check
from grader.expect import (
    STEPS,
    executions,
    expect_completed,
    expect_consistent,
    expect_killed,
    expect_position,
    expect_results_true,
)
from grader.harness import Failed, Harness
from grader.power_cuts import PowerCuts
from grader.todos import todo


def check_record(h: Harness) -> list[str]:
    def killed_as(point: str, done: tuple[str, ...]) -> str:
        run = h.new_run("g1")
        step = point.split(":")[0]
        expect_killed(h, h.start(run, crash_at=point), f"as step {step} began")
        record = h.record(run)
        results = f"the result of {' and '.join(done)}" if done else "no result yet"
        expect_position(record, run, done, f"(killed as {step} began, {results} recorded before)")
        expect_results_true(h, run, record)
        return f"killed as {step} began: the record holds the run at {step}, with {results}"

    def to_the_end() -> str:
        run = h.new_run("g1")
        expect_completed(h, h.start(run, env={"GRADER_COMMITS_FILE": str(commits_file)}), "`python flow.py start`")
        record = h.record(run)
        expect_position(record, run, STEPS, "after it completed")
        expect_results_true(h, run, record)
        before = h.witnesses(run)
        again = h.start(run)  # the same run id started a second time: it names a run, used once
        after, record = h.witnesses(run), h.record(run)
        if after != before or record.run is None or record.run.get("status") != "completed":
            raise Failed(f"starting run {run.run_id} a second time ran it again",
                         expected="a run id names one run: starting it again starts nothing (say so, exit 2)",
                         seen=f"{executions(before, after)}; {record.describe()}; exit {again.code}",
                         look_at=todo(1, "a run id that is already in the record: say so and return 2"))
        return ("run to the end: the record holds it completed, with all three results; started again, "
                "it ran nothing")

    def killed_after_commit(commit: int) -> bool:
        """Killed right after commit ``commit``; False when the program finished with fewer commits."""
        run = h.new_run("g1")
        run.record_db = cuts.record_db(commit % cuts.lanes)  # a mount of its own: the other run's goes on
        outcome = h.start(run, kill_after_commit=commit)
        if not outcome.killed:
            expect_completed(h, outcome, f"`python flow.py start` (not killed: it made fewer than {commit} commits)")
            return False
        record = cuts.record(run, commit % cuts.lanes)
        expect_consistent(h, run, record, commit)
        cuts.cut(run, commit % cuts.lanes, outcome, record, f"right after commit #{commit}")
        return True

    commits_file = h.work / "commits-of-a-whole-run"
    shown = h.side_by_side(lambda: killed_as("draft:before", ()),  # the run's row must come before any result
                           lambda: killed_as("send_confirmation:before", ("draft",)),
                           lambda: killed_as("record_outcome:before", ("draft", "send_confirmation")), to_the_end)
    try:  # how many commits a whole run made, so that no round of kills is spent finding the end
        whole = int(commits_file.read_text())
    except (OSError, ValueError):
        whole = 0  # not written (the program left by os._exit): find the end by running past it
    commits = 0
    # A kill leaves the page cache: only a power cut shows whether a commit was on the disk when it returned,
    # so each kill after a commit is followed by one (grader.power_cuts), where FUSE is available.
    with PowerCuts(h) as cuts:
        while True:  # two at a time: commits k+1 and k+2
            pair = [k for k in (commits + 1, commits + 2) if not whole or k <= whole]
            killed = h.side_by_side(*(partial(killed_after_commit, k) for k in pair))
            commits += sum(killed)
            if not all(killed) or commits == whole:
                break
    shown.append(f"killed right after each of its {commits} commits in turn: the record never ran ahead of what "
                 "was done")
    shown.append(cuts.shown(f"the power cut right after each of those {commits} commits, each on its own run"))
    return shown


CHECK = Check(1, "the run record: the run, its current step, each completed step's result", check_record,
              seconds=60.0)

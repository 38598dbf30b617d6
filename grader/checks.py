"""The checks of exercises 1-3, in the lesson's words.

Each check drives the learner's program through real processes and real
SIGKILLs, then compares what the learner's record says with what the
outside world saw (``grader.evidence``). A check returns what it showed (for
the report) or raises ``Failed`` (expected, seen, where to look) or
``CouldNotRun`` (the learner's own exception).

1. **The run record** (exercise 1): killed as step 2 begins, as step 3
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
2. **Each effect recorded before the step advances** (exercise 2): killed
   right after the provider accepted the email, and the ticket: the record
   holds the attempt's intent (the key the provider got, the request it
   applied), not a completed step, and not nothing.
3. **Resume by run id** (exercise 3): the lesson's scenario (killed between
   step 2 and step 3, then resumed), then one run killed at every step's
   boundary in turn and resumed each time: each resume starts at the
   recorded step, runs no completed step again (draft calls at the model,
   requests at the provider), builds its requests from the recorded results,
   and every effect is applied once; that run's record is on a power-cut
   mount, and between step 2 and step 3 the power is cut before the resume.
"""

from __future__ import annotations

import json
import re
from functools import partial

from grader.check import Check
from grader.evidence import KIND_OF_STEP, WORDS, Record, Witnesses
from grader.harness import CouldNotRun, Failed, Harness, Hung, Outcome, Run
from grader.power_cuts import PowerCuts
from grader.temporal import check_temporal
from grader.todos import todo

# The exercises' flow, as their files spell it (exercises/*/flow.py, STEPS): the grader judges that flow,
# so it names it itself rather than taking the lab's plan (steps/plan.py), which may grow steps.
STEPS = ("draft", "send_confirmation", "record_outcome")
EFFECT_STEPS = ("send_confirmation", "record_outcome")




# ---------------------------------------------------------------- shared expectations


def expect_killed(h: Harness, outcome: Outcome, where: str) -> None:
    """The process must have died by the kill the grader armed, not of its own accord."""
    if outcome.killed:
        return
    h.raise_could_not_run(outcome)
    raise Failed(
        f"`{' '.join(outcome.argv[:3])}` ended (exit {outcome.code}) before it reached {where}",
        expected=f"the process to be killed {where}",
        seen=f"it exited {outcome.code}; its last lines: {outcome.last_lines()}",
        look_at="that the program runs the three steps in order (compare with the exercise's README)")


def expect_completed(h: Harness, outcome: Outcome, what: str) -> None:
    if outcome.code == 0:
        return
    h.raise_could_not_run(outcome)
    raise Failed(f"{what} exited {outcome.code} instead of completing the run",
                 expected="exit 0 and the run completed",
                 seen=f"exit {outcome.code}; its last lines: {outcome.last_lines()}",
                 look_at="the program's output above")


def next_step(step: str) -> str | None:
    i = STEPS.index(step) + 1
    return STEPS[i] if i < len(STEPS) else None


def expect_position(record: Record, run: Run, done: tuple[str, ...], why: str) -> None:
    """The record holds ``run`` with exactly ``done`` completed and the step after them current."""
    current = STEPS[len(done)] if len(done) < len(STEPS) else None
    if record.run is None:
        raise Failed(
            f"the record holds no run {run.run_id} {why}",
            expected=f"a row in `runs` for {run.run_id}: status 'running', current_step {current!r}",
            seen=record.describe(),
            look_at=todo(1, "create the run's row, committed, before its first step runs"))
    status = "completed" if current is None else "running"
    have = tuple(s for s in STEPS if s in record.steps)
    if have != done or record.run.get("current_step") != current or record.run.get("status") != status:
        raise Failed(
            f"the record of run {run.run_id} is not where the run got to {why}",
            expected=(f"results of {list(done) or 'no step'} in `steps`; in `runs`, current_step {current!r} "
                      f"and status {status!r}"),
            seen=record.describe(),
            look_at=todo(2, "record each step's result and move current_step on, in one transaction"))
    for step in done:
        if record.result(step) is None:
            raise Failed(f"the recorded result of {step} for run {run.run_id} is not a JSON object",
                         expected=f"`steps.result` of {step}: the step's result as JSON, e.g. json.dumps(result)",
                         seen=f"{record.steps[step][:200]!r}",
                         look_at=todo(2, "the row keeps the result the step returned, readable back as it was"))


def expect_results_true(h: Harness, run: Run, record: Record) -> None:
    """Each recorded result is what the model or the provider really gave."""
    drafted = record.result("draft")
    if drafted is not None:
        calls = h.model.calls(run.task)
        if not any(drafted.get("body") == c.body and drafted.get("subject") == c.subject for c in calls):
            raise Failed(
                f"the draft recorded for run {run.run_id} is not one the model wrote",
                expected=f"`steps.result` of draft: the draft step's result ({len(calls)} draft(s) written)",
                seen=f"subject {drafted.get('subject')!r}", look_at=todo(2, "record the step's own result"))
    for step, field in (("send_confirmation", "message_id"), ("record_outcome", "ticket_id")):
        mine = record.result(step)
        if mine is None:
            continue
        applied = [e.response.get(field) for e in h.effects(run) if e.applied and e.response
                   and e.kind == KIND_OF_STEP[step]]
        if mine.get(field) not in applied:
            raise Failed(
                f"the {field} recorded for {step} of run {run.run_id} is not one the provider gave",
                expected=f"the provider's {field}: {applied or 'none applied'}",
                seen=f"{mine.get(field)!r}", look_at=todo(2, "record the step's own result"))


# ---------------------------------------------------------------- check 1


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
                         seen=f"{_executions(before, after)}; {record.describe()}; exit {again.code}",
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


# ---------------------------------------------------------------- check 2


def check_intents(h: Harness) -> list[str]:
    def intent_kept(step: str) -> str:
        run = h.new_run("g2")
        expect_killed(h, h.start(run, crash_at=f"{step}:after_effect"), f"right after the provider applied {step}")
        applied = h.witnesses(run).applied(step)
        record = h.record(run)
        if not record.intents_of(step) and applied:
            explain_missing_intent(h, run, step, applied[0].key, record)
        expect_intent(run, record, step, applied)
        return (f"killed right after the provider applied {WORDS[step]}: the record holds its intent "
                f"(key {applied[0].key}), not a completed step")

    return h.side_by_side(*(partial(intent_kept, step) for step in EFFECT_STEPS))


def explain_missing_intent(h: Harness, run: Run, step: str, key: str, record: Record) -> None:
    """No intent right after the send: tell "never recorded" from "recorded only after sending" by a
    run left to finish, whose record shows whether the program writes intents at all."""
    whole = h.new_run("g2")
    h.start(whole)
    later = h.record(whole).intents_of(step)
    words = WORDS[step]
    first = (f"the provider applied {words} for run {run.run_id} (key {key}), but the record holds no intent "
             f"for {step}")
    if later:
        raise Failed(
            f"{first}: your program records the intent only after the request went out (run {whole.run_id}, "
            "left to finish, has one), so a crash in between loses it",
            expected=f"the intent for {step} committed BEFORE the step sends its request",
            seen=f"killed right after the send: {record.describe()}",
            look_at=todo(4, "move the intent's transaction before the call to the step"))
    raise Failed(
        f"{first}: a crash right after the send leaves no trace that it may have gone out",
        expected=f"a row in `intents` for {step}, committed BEFORE the request was sent",
        seen=record.describe(),
        look_at=todo(4, "commit the intent (key and request) before calling the step"))


def expect_intent(run: Run, record: Record, step: str, applied: list) -> None:
    words = WORDS[step]
    if len(applied) != 1:
        raise Failed(f"the provider holds {len(applied)} applied {KIND_OF_STEP[step]}(s) for run {run.run_id}",
                     expected=f"one: {words}, sent once before the kill", seen=str([e.key for e in applied]),
                     look_at=todo(3, "one key per step of a run"))
    effect = applied[0]
    current = record.run.get("current_step") if record.run else None
    if record.run is not None and current != step and step not in record.steps:
        raise Failed(
            f"the record says run {run.run_id} is at step {current!r}, but holds no result for {step}: "
            "the run advanced before the effect was recorded",
            expected=f"current_step {step!r} until {step}'s result is recorded, in the same transaction",
            seen=record.describe(),
            look_at=todo(2, "move current_step on in the transaction that records the result, after the step ran"))
    intents = record.intents_of(step)
    if not any(i["idempotency_key"] == effect.key for i in intents):
        raise Failed(
            f"the intent recorded for {step} of run {run.run_id} names another key than the one sent",
            expected=f"the key the provider got: {effect.key}",
            seen=", ".join(i["idempotency_key"] for i in intents),
            look_at=todo(4, "record the key of the request you send"))
    sent = next(i for i in intents if i["idempotency_key"] == effect.key)
    try:
        request = json.loads(sent["request"])
    except (TypeError, ValueError):
        request = None
    fields = ("to", "subject", "body") if step == "send_confirmation" else ("summary", "email_message_id")
    applied_body = effect.request or {}
    if not isinstance(request, dict) or any(request.get(f) != applied_body.get(f) for f in fields):
        raise Failed(
            f"the intent recorded for {step} of run {run.run_id} is not the request the provider applied",
            expected=f"`intents.request`: the request as JSON, with {', '.join(fields)} as sent",
            seen=f"{str(sent['request'])[:200]!r}",
            look_at=todo(4, "the intent keeps the whole request the step sends, its key included"))
    if step in record.steps:
        raise Failed(f"the record holds a result for {step} although the process died before the step returned",
                     expected="no result until the step returned", seen=record.describe(),
                     look_at=todo(2, "record the result only after the step returned it"))


def expect_consistent(h: Harness, run: Run, record: Record, commit: int) -> None:
    if record.run is None:
        return  # killed before the run's row was committed: nothing recorded, nothing sent (checked below)
    current = record.run.get("current_step")
    done = STEPS[:STEPS.index(current)] if current in STEPS else STEPS
    have = tuple(s for s in STEPS if s in record.steps)
    where = f"killed right after the program's commit #{commit}"
    if have != done:
        missing = [s for s in done if s not in have]
        ahead = [s for s in have if s not in done]
        raise Failed(
            (f"{where}, the record says run {run.run_id} is at step {current!r} but holds no result for "
             f"{', '.join(missing)}: the run advanced before the step's result was recorded"
             if missing else
             f"{where}, the record holds the result of {', '.join(ahead)} but still says run {run.run_id} is at "
             f"step {current!r}: the result was recorded without moving the run on"),
            expected="current_step is the first step without a result, at every commit",
            seen=record.describe(),
            look_at=todo(2, "record the result and move current_step on in ONE transaction"))
    for step in EFFECT_STEPS:
        applied = h.witnesses(run).applied(step)
        if applied and step not in record.steps and not record.intents_of(step):
            raise Failed(f"{where}, the provider had applied {WORDS[step]} of run {run.run_id} but the record "
                         f"holds neither its intent nor its result",
                         expected="the record to cover every effect that went out", seen=record.describe(),
                         look_at=todo(2, "record each step's result as soon as it returns"))


# ---------------------------------------------------------------- check 3

BOUNDARIES = ("draft:before", "send_confirmation:before", "send_confirmation:after_effect",
              "record_outcome:before", "record_outcome:after_effect")


def reached(point: str | None) -> tuple[str, ...]:
    """The steps that reach the outside world before a process is killed at ``point`` (None: all)."""
    if point is None:
        return STEPS
    step, when = point.split(":")
    i = STEPS.index(step)
    return STEPS[:i + 1] if when == "after_effect" else STEPS[:i]


def check_resume(h: Harness) -> list[str]:
    def scenario() -> str:
        """The lesson's scenario: killed between step 2 and step 3, resumed."""
        run = h.new_run("g3-scenario")
        expect_killed(h, h.start(run, crash_at="record_outcome:before"), "as step record_outcome began")
        resume_and_judge(h, run, "record_outcome:before", None)
        expect_done(h, run)
        before = h.witnesses(run)
        again = h.resume(run)  # a completed run resumed: there is nothing left to do
        after, record = h.witnesses(run), h.record(run)
        if after != before or record.run is None or record.run.get("status") != "completed":
            raise Failed(f"resuming run {run.run_id}, already completed, ran it again",
                         expected="a completed run has no current step: resume runs nothing and says so",
                         seen=f"{_executions(before, after)}; {record.describe()}; exit {again.code}",
                         look_at=todo(5, "read the run back: only a run still running has a step to continue at"))
        h.evidence_runs["scenario"] = run  # the report quotes its evidence
        return ("killed between step 2 and step 3, resumed: only record_outcome ran; one email, one ticket; "
                "resumed once more, completed, it ran nothing")

    def every_kill() -> str:
        """One run killed at every boundary in turn, resumed each time."""
        run = h.new_run("g3-every-kill")
        # Its record on a power-cut mount, and between step 2 and step 3 the power goes too, before the resume.
        with PowerCuts(h, "g3-powercut", lanes=1) as cuts:
            run.record_db = cuts.record_db(0)
            expect_killed(h, h.start(run, crash_at=BOUNDARIES[0]), "as step draft began")
            for killed_at, next_kill in zip(BOUNDARIES, (*BOUNDARIES[1:], None), strict=True):
                if killed_at == "record_outcome:before":
                    cuts.cut(run, 0, run.outcomes[-1], cuts.record(run, 0), f"after the kill at {killed_at}")
                resume_and_judge(h, run, killed_at, next_kill)
            expect_done(h, run)
        run.record_db = cuts.kept(0)
        h.evidence_runs["every_kill"] = run
        return (f"one run killed at each of {len(BOUNDARIES)} step boundaries in turn and resumed each time: "
                "each resume began at the recorded step; every effect applied once; "
                + cuts.shown("the power cut between step 2 and step 3, before that resume"))

    return h.side_by_side(scenario, every_kill)


def resume_and_judge(h: Harness, run: Run, killed_at: str, next_kill: str | None) -> None:
    step = killed_at.split(":")[0]
    before = h.witnesses(run)
    outcome = h.resume(run, crash_at=next_kill or "")
    after = h.witnesses(run)
    record = h.record(run)
    context = f"killed at {killed_at}, then resumed"
    expect_no_missing_result(h, run, outcome, step)
    expect_once(run, after, context)
    expect_built_from_record(h, run, record, after, context)
    ran = [s for s in STEPS if after.executions(s) > before.executions(s)]
    done_before = STEPS[:STEPS.index(step)]
    again = [s for s in ran if s in done_before]
    if again:
        raise Failed(
            f"resume ran {', '.join(again)} again for run {run.run_id} ({context}), although the record holds "
            f"{'its' if len(again) == 1 else 'their'} result",
            expected=f"resume to start at the recorded step, {step}, and run nothing before it",
            seen=_executions(before, after),
            look_at=todo(6, "go on at the step the record says is next, with the recorded results"))
    expected_ran = [s for s in reached(next_kill) if s not in done_before]
    skipped = [s for s in expected_ran if s not in ran]
    if skipped:
        h.raise_could_not_run(outcome)
        raise Failed(
            f"resume did not run {', '.join(skipped)} for run {run.run_id} ({context}); it exited {outcome.code}",
            expected=f"resume to continue at the recorded step, {step}",
            seen=f"{_executions(before, after)}; its last lines: {outcome.last_lines()}",
            look_at=todo(5, "read the run back") + "; " + todo(6, "go on at the step the record says is next"))
    if next_kill is None:
        expect_completed(h, outcome, "`python flow.py resume`")
    else:
        expect_killed(h, outcome, f"at {next_kill}")


def expect_no_missing_result(h: Harness, run: Run, outcome: Outcome, current: str) -> None:
    """A resume that died looking up a step's result it never read (``KeyError: 'draft'``) ran a step past the
    recorded one: said in the lesson's words above the learner's traceback."""
    died = h.could_not_run(outcome)
    last = died.traceback.strip().splitlines()[-1] if died else ""
    missing = next((s for s in STEPS if last in (f"KeyError: '{s}'", f'KeyError: "{s}"')), None)
    if died is None or missing is None:
        return
    raise CouldNotRun(
        f"resume of run {run.run_id} died looking up the result of {missing} ({last}): resume did not start at "
        f"current_step. The record says the run is at {current!r} with the results of "
        f"{', '.join(STEPS[:STEPS.index(current)]) or 'no step'} recorded, so a resume that starts at {current!r} "
        f"has every result it needs; look at "
        + todo(6, "continue at the step the record says is current, with the recorded results"),
        died.traceback)


def _executions(before: Witnesses, after: Witnesses) -> str:
    return (f"draft calls at the model {before.drafts} -> {after.drafts}; requests at the provider: email "
            f"{before.requests('send_confirmation')} -> {after.requests('send_confirmation')}, ticket "
            f"{before.requests('record_outcome')} -> {after.requests('record_outcome')}")


def expect_once(run: Run, seen: Witnesses, context: str) -> None:
    for step in EFFECT_STEPS:
        applied = seen.applied(step)
        if len(applied) > 1:
            raise Failed(
                f"the provider applied {WORDS[step]} {len(applied)} times for run {run.run_id} ({context}; keys "
                f"{', '.join(e.key for e in applied)}): resume sent a different key",
                expected=f"{WORDS[step]} applied once, every attempt under one key",
                seen="; ".join(f"{e.key}: {e.requests} request(s), applied" for e in applied),
                look_at=todo(3, "build the key from the run id and the step name"))


def expect_built_from_record(h: Harness, run: Run, record: Record, seen: Witnesses, context: str) -> None:
    """What the provider applied is what the recorded results say: the requests were built from the record."""
    drafted, sent = record.result("draft"), record.result("send_confirmation")
    checks = [("send_confirmation", "body", drafted, "body", "the email's body", "the recorded draft's body"),
              ("record_outcome", "summary", drafted, "summary", "the ticket's summary", "the recorded draft's"),
              ("record_outcome", "email_message_id", sent, "message_id", "the ticket's email message id",
               "the recorded email's message id")]
    for step, field, recorded, source, what, theirs in checks:
        for effect in seen.applied(step):
            if recorded is None or effect.request is None or effect.request.get(field) == recorded.get(source):
                continue
            calls = h.model.calls(run.task)
            mine, theirs_text = where_differ(str(recorded.get(source)), str(effect.request.get(field)))
            lead = f"the model wrote {len(calls)} drafts for run {run.run_id}, which needed one: " if len(calls) > 1 \
                else ""
            if len(calls) > 1 and drafted is not None and drafted.get("body") == calls[-1].body:
                # The record holds the newest draft: the draft step itself ran again and was recorded over the
                # first, so resume did not start at the recorded step (TODO 6), whatever it read back.
                raise Failed(
                    f"{lead}the resume ran draft again ({context}) and recorded its new draft over the first, and "
                    f"{what} is not {theirs}",
                    expected=f"resume to continue at the step the record says is current, with the recorded "
                             f"results (one draft in all); {what}, where the texts differ: {mine}",
                    seen=f"{theirs_text} (the model numbers its drafts: a different number is a draft written again)",
                    look_at=todo(6, "continue at the step the record says is current, with the recorded results: "
                                    "no completed step runs again"))
            raise Failed(
                f"{lead}resume sent a request not built from the record for run {run.run_id} ({context}): {what} is "
                f"not {theirs}",
                expected=f"{what}, where the texts differ: {mine}",
                seen=f"{theirs_text} (the model wrote {len(calls)} draft(s) in all)",
                look_at=todo(5, "read each completed step's recorded result into `results`, and build the "
                                "requests from them: a step run again writes different words"))


def where_differ(expected: str, seen: str, before: int = 25, after: int = 45) -> tuple[str, str]:
    """Both texts around their first difference, so that two long texts cut to the same prefix stay apart."""
    i = next((k for k, (a, b) in enumerate(zip(expected, seen, strict=False)) if a != b), min(len(expected), len(seen)))
    start = max(0, i - before)

    def cut(text: str) -> str:
        piece = text[start:i + after]
        return f"{'...' if start else ''}{piece!r}{'...' if i + after < len(text) else ''} (from character {start})"

    return cut(expected), cut(seen)


def expect_done(h: Harness, run: Run) -> None:
    record = h.record(run)
    expect_position(record, run, STEPS, "after its last resume")
    expect_results_true(h, run, record)
    seen = h.witnesses(run)
    for step in EFFECT_STEPS:
        if len(seen.applied(step)) != 1:
            raise Failed(f"{WORDS[step]} of run {run.run_id} was applied {len(seen.applied(step))} times",
                         expected="once", seen=str([e.key for e in seen.applied(step)]),
                         look_at=todo(3, "one key per step of a run"))
    if seen.drafts != 1:
        raise Failed(f"the model drafted {seen.drafts} times for run {run.run_id}", expected="once",
                     seen=f"{seen.drafts} draft calls", look_at=todo(6, "go on at the step the record says is next"))


# ---------------------------------------------------------------- check 4

MEMORY_BUDGET = 300
MEMORY_APPENDS = 3000


def check_memory(h: Harness) -> list[str]:
    # Side by side: the long exchange is one process of CPU, the flows mostly wait on processes starting.
    return h.side_by_side(partial(long_exchange, h), partial(memory_in_the_flow, h))


def long_exchange(h: Harness) -> str:
    played = h.probe_memory(MEMORY_BUDGET, MEMORY_APPENDS)
    if not played.get("ok"):
        if played.get("rule") == "exception":
            raise CouldNotRun("bounded_memory.py raised during the long exchange", played["traceback"])
        hints = {"budget": "evict whole blocks, oldest first, until the window fits the budget",
                 "pinned": "the system message counts and never goes",
                 "split": "a tool result joins the block of its call; blocks go whole",
                 "once": "an evicted message never comes back",
                 "oversize": "a block too large to keep on its own goes at once",
                 "oldest-first": "evict the oldest block first",
                 "too-much": "evict only while over the budget; a block too large goes alone",
                 "returned": "return the ids this append evicted",
                 "late": "a result whose round was already evicted never enters the window: it goes on arrival",
                 "pinned-evicts": "a new system message counts at once: older blocks make room for it",
                 "pinned-refused": "a system message that leaves no room is refused, the window untouched",
                 "finished-answer": "write BoundedMemory yourself"}
        raise Failed(played["headline"], expected=played["expected"], seen=played["seen"],
                     look_at=todo(played["todo"], hints.get(played["rule"], "the rule in the README")))
    return (f"{played['appends']} appends ({played['tool rounds']} tool rounds, {played.get('late results', 0)} "
            "results arriving after their round was evicted, one message larger than the budget, a larger system "
            f"message replacing the first and one refused, ids appended twice) under a budget of {played['budget']} "
            f"tokens: the rule held after every one ({played['evicted']} messages evicted)")


def memory_in_the_flow(h: Harness) -> str:
    """Memory feeds the prompt, and is never the record."""
    customer = f"ada-{h.new_run('c').run_id[-6:]}@example.com"
    first, second = h.new_run("g4-first"), h.new_run("g4-second")
    first.email = second.email = customer
    expect_completed(h, h.start(first), "`python flow.py start` (the customer's first run)")
    kept = h.saved_memory(customer)
    if f"{first.run_id}/task" not in kept or f"{first.run_id}/reply" not in kept:
        raise Failed(f"run {first.run_id} completed, but its exchange is not in the customer's memory",
                     expected=f"messages {first.run_id}/task and {first.run_id}/reply in MEMORY_FILE, conversation "
                              f"{customer}", seen=f"ids there: {sorted(kept) or 'none'}",
                     look_at=todo(10, "remember the exchange once the run is complete") + "; and "
                             + todo(9, "what a run appends must reach the memory you wrote, or the next draft sees "
                                     "nothing of it"))
    expect_killed(h, h.start(second, crash_at="record_outcome:before"), "as step record_outcome began")
    prompt = h.model.calls(second.task)[0].messages if h.model.calls(second.task) else []
    said = " ".join(str(m.get("content") or "") for m in prompt)
    reply = (h.record(first).result("draft") or {}).get("body", "")
    if first.task not in said or not reply or reply not in said:
        raise Failed(f"the draft of run {second.run_id} was not given the customer's earlier exchange",
                     expected=f"run {first.run_id}'s task and reply among the draft prompt's messages",
                     seen=f"the model got {len(prompt)} message(s): {[m.get('role') for m in prompt]}",
                     look_at=todo(9, "the draft's prompt must be fed from the memory you wrote"))
    h.wipe_memory()
    resume_and_judge(h, second, "record_outcome:before", None)
    expect_done(h, second)
    return (f"run {second.run_id}'s draft got the customer's earlier exchange from memory; memory wiped "
            "between step 2 and step 3, the resume still ran only record_outcome: memory is not the record")


# ---------------------------------------------------------------- check 5

BUDGET_SECONDS = 2.0
LONG_BUDGET_SECONDS = 7.0  # beside the short one: see `outage` for why these two
SETTLE_SECONDS = 6.0  # beyond the budget: how long a process may take to give up and record it
LATE_SECONDS = 0.5  # a request this far past the budget was sent after it was spent
FIRST_PAUSE_SECONDS = 0.5  # the README's schedule starts "at about 0.2 s": up to this much passes


def earliest_give_up(budget: float) -> float:
    """The shortest span (first request to last) of a schedule the README allows: pauses doubling from at most
    FIRST_PAUSE_SECONDS, given up once the next pause would end past the budget. The last try is at d(2^k - 1) and
    the next pause would end at d(2^(k+1) - 1) > budget, so the span is over (budget - d) / 2."""
    return (budget - FIRST_PAUSE_SECONDS) / 2


def states_seconds(error: str, budget: float, run_id: str) -> bool:
    """``error`` gives ``budget`` as a number of its own (2, 2.0, 2 s, 2s), outside the run id and any key (which
    hold the budget: g5-outage2s-...)."""
    text = re.sub(rf"\S*{re.escape(run_id)}\S*", "<run>", error)
    return re.search(rf"(?<![\w.]){budget:g}(\.0+)?(?!\.?\d)", text) is not None


def expect_failed(h: Harness, run: Run, outcome: Outcome, step: str, *, reasons: tuple[str, ...], why: str) -> str:
    """The run ended, recorded failed at ``step`` with an error naming the step and one of ``reasons``."""
    record = h.record(run)
    status = record.run.get("status") if record.run else None
    error = str(record.run.get("error") or "") if record.run else ""
    if status != "failed":
        died = h.could_not_run(outcome)
        if died and not died.traceback.splitlines()[-1].startswith("steps.errors."):
            raise died  # not the step's error escaping: the program could not run
        raise Failed(
            f"run {run.run_id} did not end in its failed state after {why}",
            expected=f"`runs.status` 'failed', `runs.error` naming {step} and the reason; the process exits 1",
            seen=f"{record.describe()}; the process exited {outcome.code}"
                 + (f" with an exception: {died.traceback.splitlines()[-1]}" if died else
                    f"; its last lines: {outcome.last_lines()}"),
            look_at=todo(11, "a step that fails for good ends the run: failed, recorded, naming the step "
                                 "and the reason"))
    # An idempotency key (agentlab/<run>/<step>) inside the step's own error text does not name the step.
    if step not in re.sub(rf"\S*/{re.escape(run.run_id)}/\S*", "<key>", error):
        raise Failed(f"the failed run {run.run_id} does not say which step failed",
                     expected=f"`runs.error` naming the step, {step} (its name inside an idempotency key does not "
                              "count), and the reason", seen=f"error {error!r}",
                     look_at=todo(11, 'error "step <name> failed: <reason>"'))
    if reasons and not any(r in error for r in reasons):
        raise Failed(f"the failed run {run.run_id} names the step but not why it failed after {why}",
                     expected=f"`runs.error` giving the reason ({' or '.join(reasons)})", seen=f"error {error!r}",
                     look_at=todo(11, 'error "step <name> failed: <reason>", the reason the step\'s error'))
    if record.run and record.run.get("current_step") != step:
        raise Failed(f"the failed run {run.run_id} names {step}, but its record says it is at step "
                     f"{record.run.get('current_step')!r}",
                     expected=f"current_step {step!r}: a failed run stays at the step that failed, so that the record "
                              "says where it stopped", seen=record.describe(),
                     look_at=todo(11, "the failed state leaves the run where it stopped: at the step that failed"))
    if outcome.code != 1:
        raise Failed(f"run {run.run_id} was recorded failed after {why}, but the process exited {outcome.code}",
                     expected="exit 1: a run that ended failed says so to whatever started it (a script, an operator)",
                     seen=f"exit {outcome.code}; its last lines: {outcome.last_lines()}",
                     look_at=todo(11, "the program exits 1 when the run ended in its failed state"))
    return error


def check_terminal(h: Harness) -> list[str]:
    def hard_bounce() -> str:
        """A permanent error: the provider's hard bounce for the reserved .invalid domain."""
        run = h.new_run("g5-bounce")
        run.email = f"nobody-{run.run_id[-6:]}@mailbox.invalid"
        try:  # with a short budget, so that a program retrying it does not hide behind a long one
            outcome = h.start(run, env={"LAB_RETRY_BUDGET_SECONDS": f"{BUDGET_SECONDS:g}"},
                              timeout=BUDGET_SECONDS + SETTLE_SECONDS)
        except Hung as hung:
            if h.witnesses(run).requests("send_confirmation") <= 1:
                raise
            outcome = hung.outcome
        requests = h.witnesses(run).requests("send_confirmation")
        if requests > 1:
            raise Failed(f"the provider got {requests} requests for run {run.run_id}'s email, a hard bounce (422 "
                         "recipient_rejected): a permanent error was retried",
                         expected="one request: retrying the same request cannot help", seen=f"{requests} requests",
                         look_at=todo(12, "only a transient failure is tried again; a permanent one fails the step at "
                                          "once"))
        error = expect_failed(h, run, outcome, "send_confirmation", reasons=("rejected",), why="a hard bounce")
        return f"a hard bounce: one request, the run failed at once: {error[:90]}..."

    def two_503s() -> str:
        """A transient error that passes: two 503s, then the provider is back."""
        run = h.new_run("g5-blip")
        with h.faults(fail_next=2, kinds=["email"]):
            outcome = h.start(run)
        if outcome.code != 0:
            expect_failed(h, run, outcome, "send_confirmation", reasons=("503",), why="two 503s")
            raise Failed(f"run {run.run_id} failed after two 503s that a retry would have ridden out",
                         expected="the step retried: three requests, one email, the run completed",
                         seen=f"{h.witnesses(run).requests('send_confirmation')} request(s); "
                              f"{h.record(run).describe()}",
                         look_at=todo(12, "a transient failure is tried again within the budget"))
        return (f"two 503s, then the provider back: {h.witnesses(run).requests('send_confirmation')} requests, "
                "one email, completed")

    def outage(budget: float) -> tuple[Run, str]:
        """A transient error that lasts: the budget is spent and the run fails saying so. Run under two
        budgets at once, so that no count of tries fits both."""
        run = h.new_run(f"g5-outage{budget:g}s")
        outcome = h.start(run, env={"LAB_RETRY_BUDGET_SECONDS": f"{budget:g}"}, timeout=budget + SETTLE_SECONDS,
                          hung=(f"with a retry budget of {budget:g} s and the email API answering 503, the step kept "
                                "retrying: a retry must stop when its budget is spent",
                                todo(12, "give up once the time since the first try passes the budget")))
        seen_at_provider = h.witnesses(run)
        requests = seen_at_provider.requests("send_confirmation")
        email = [e for e in seen_at_provider.effects if e.kind == KIND_OF_STEP["send_confirmation"]]
        error = expect_failed(h, run, outcome, "send_confirmation", reasons=(), why=(
            f"the email API answered 503 for longer than the {budget:g} s budget"))
        if requests < 2:
            raise Failed(f"run {run.run_id} gave up on a 503 without retrying it",
                         expected="several requests within the budget", seen=f"{requests} request(s); error {error!r}",
                         look_at=todo(12, "a transient failure is tried again within the budget"))
        # The provider's clock, not the learner's: from the first request to the last. The README's schedule
        # (pauses doubling from about 0.2 s, none that would end past the budget) spans 1.4 s of a 2 s budget and
        # 6.2 s of a 7 s one. Accepted: [earliest_give_up(b), b + LATE_SECONDS], i.e. [0.75, 2.5] s and
        # [3.25, 7.5] s. The two windows are disjoint, and a count of tries (or any schedule that ignores the
        # budget) spans the same time under both budgets, so it falls outside at least one of them.
        span = max(e.seconds_between_first_and_last_request() for e in email)
        seen = f"{requests} requests over {span:.1f} s; error {error!r}"
        if span < earliest_give_up(budget):
            raise Failed(f"run {run.run_id} stopped retrying the 503s {span:.1f} s after its first request, well "
                         f"within its {budget:g} s budget: the budget is time, not a number of tries",
                         expected=f"requests for at least {earliest_give_up(budget):g} s (the provider's clock), then "
                                  "failed naming the budget", seen=seen,
                         look_at=todo(12, "retry while the time since the first try is within "
                                          "LAB_RETRY_BUDGET_SECONDS"))
        if span > budget + LATE_SECONDS:
            raise Failed(f"run {run.run_id} sent a request {span:.1f} s after its first one, past its {budget:g} s "
                         "budget: the budget is time, not a number of tries, and it is checked before each pause",
                         expected=f"no request later than {budget:g} s after the first (the provider's clock)",
                         seen=seen, look_at=todo(12, "before pausing, give up if the pause would end past the "
                                                     "budget"))
        if "budget" not in error or "503" not in error:
            raise Failed(f"run {run.run_id} gave up when its budget was spent, but its error does not say so",
                         expected="an error naming the budget and the last error (the 503)", seen=f"error {error!r}",
                         look_at=todo(12, "once the budget is spent, the step fails for good, saying the budget and "
                                          "the last error"))
        if not states_seconds(error, budget, run.run_id):
            raise Failed(f"run {run.run_id} spent a retry budget of {budget:g} s, but its error does not give those "
                         "seconds", expected=f"`runs.error` stating the budget that was spent, {budget:g} s (the "
                         "README's wording: the budget in seconds and the last error), from LAB_RETRY_BUDGET_SECONDS",
                         seen=f"error {error!r}",
                         look_at=todo(12, "the error of a spent budget says which budget: its seconds, as configured"))
        return run, (f"the email API down past a {budget:g} s budget: {requests} requests over {span:.1f} s, then "
                     f"failed: {error[:70]}...")

    def resume_failed(run: Run) -> str:
        """A failed run resumed runs nothing. Done while the email API is still down (the next outage goes on
        beside it): a resume that wrongly tries again meets 503s, gives up within a short budget, and its
        requests show at the provider."""
        before = h.witnesses(run)
        again = h.resume(run, env={"LAB_RETRY_BUDGET_SECONDS": f"{BUDGET_SECONDS:g}"},
                         timeout=BUDGET_SECONDS + SETTLE_SECONDS,
                         hung=("resuming a failed run did not end", todo(11, "failed is terminal")))
        after, record = h.witnesses(run), h.record(run)
        if after != before or not record.run or record.run.get("status") != "failed":
            raise Failed(f"resuming the failed run {run.run_id} ran it again",
                         expected="a failed run is terminal: resume runs nothing, and it stays failed",
                         seen=f"{_executions(before, after)}; {record.describe()}; exit {again.code}",
                         look_at=todo(11, "a failed run is not 'running': resume leaves it alone"))
        return "resuming the failed run ran nothing: failed is terminal"

    def short_outage_then_resume() -> list[str]:
        run, short = outage(BUDGET_SECONDS)
        return [short, resume_failed(run)]

    def long_outage() -> list[str]:
        return [outage(LONG_BUDGET_SECONDS)[1]]

    def outages() -> list[str]:
        with h.faults(fail_next=100_000, kinds=["email"]):
            (short, resumed), (longer,) = h.side_by_side(short_outage_then_resume, long_outage)
        return [short, longer, resumed]

    def crashes() -> str:
        """A crash is not an error: killed three times in a row right after the provider took the email, the
        run completes (three, so that a limit of three attempts, counting crashes, is caught)."""
        run = h.new_run("g5-crashes")
        kill = "send_confirmation:after_effect"
        outcome = h.start(run, crash_at=kill)
        kills = 0
        while outcome.killed and kills < 3:  # killed, resumed, killed again: no error has happened yet
            kills += 1
            outcome = h.resume(run, crash_at=kill if kills < 3 else "")
        record = h.record(run)
        if record.run is None or record.run.get("status") != "completed":
            status = record.run.get("status") if record.run else "not in the record"
            # Said in the README's terms: three kills in a row, each resumed, then the last resume completes.
            if kills == 3:
                what = (f"killed right after the provider took its email three times in a row, resumed after each "
                        f"kill, with no error anywhere: resume 3, the one left to finish, exited {outcome.code}")
            else:
                process = f"resume {kills}" if kills else "the start"
                what = (f"killed right after the provider took its email {kills} time(s) of the check's three, with "
                        f"no error anywhere: {process} (where kill {kills + 1} was armed) exited {outcome.code} "
                        "before the email went out again")
            raise Failed(f"run {run.run_id}, {what}; the run is {status}, not completed",
                         expected="a crash spends no retry budget: the resume after the last kill completes the run",
                         seen=f"{record.describe()}; exit {outcome.code}; {outcome.last_lines()}",
                         look_at=todo(12, "only a step's own error counts, not a process that died"))
        expect_done(h, run)
        return ("killed three times right after the email was applied: no error counted, the run completed "
                "with one email")

    shown = h.side_by_side(hard_bounce, crashes)  # no faults injected while these run
    return [shown[0], two_503s(), *outages(), shown[1]]


CHECKS = {
    1: Check(1, "the run record: the run, its current step, each completed step's result", check_record,
             seconds=60.0),
    2: Check(2, "each effect recorded before the step advances", check_intents),
    3: Check(3, "resume by run id: at the recorded step, nothing completed run again, each effect once",
             check_resume),
    4: Check(4, "bounded memory: the rule after every append; it feeds the prompt and is never the record",
             check_memory),
    5: Check(5, "the terminal failure: permanent errors stop the run, transient ones retry within a budget",
             check_terminal),
    6: Check(6, "the flow on Temporal: effects in activities, the worker killed mid-run, each effect once",
             check_temporal, seconds=180.0, main_file="worker.py",
             stands_alone="exercise 6 moves the flow onto Temporal: its check stands alone"),
}
